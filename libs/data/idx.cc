#include "libs/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "libs/base/status.h"

namespace dtrain::data {
namespace {

// Upper bound on the payload a header may describe (1 TiB). Memory is only
// allocated as data actually arrives, so a lying header costs nothing; the
// bound just keeps the size arithmetic far from overflow.
constexpr int64_t kMaxPayloadBytes = int64_t{1} << 40;
// Largest single gzread() request, and zlib's input buffer size.
constexpr int64_t kReadChunk = int64_t{16} << 20;
constexpr unsigned kGzBufferBytes = 128 << 10;

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzCloser>;

// Outcome of reading up to n bytes.
struct ReadResult {
  int64_t got = 0;
  int zerr = Z_OK;           // gzerror() code after the read
  std::string zlib_message;  // gzerror() text, without zlib's "path: " prefix
};

// True when the stream is damaged (as opposed to merely ending early).
bool IsCorrupt(const ReadResult& r) { return r.zerr != Z_OK && r.zerr != Z_BUF_ERROR; }

ReadResult ReadUpTo(gzFile file, const std::string& path, uint8_t* buf, int64_t n) {
  ReadResult r;
  while (r.got < n) {
    const unsigned want = static_cast<unsigned>(std::min(n - r.got, kReadChunk));
    const int k = gzread(file, buf + r.got, want);
    if (k <= 0) break;  // end of stream (k == 0) or error (k < 0)
    r.got += k;
  }
  int zerr = Z_OK;
  const char* msg = gzerror(file, &zerr);
  r.zerr = zerr;
  if (zerr != Z_OK && msg != nullptr) {
    absl::string_view text(msg);
    const std::string prefix = absl::StrCat(path, ": ");
    if (absl::StartsWith(text, prefix)) text.remove_prefix(prefix.size());
    r.zlib_message = std::string(text);
  }
  return r;
}

absl::Status CorruptError(const std::string& path, absl::string_view what, const ReadResult& r) {
  return absl::DataLossError(absl::StrCat(path, ": corrupt gzip data (zlib: ", r.zlib_message,
                                          "), detected while reading ", what,
                                          "; the file is damaged, download it again"));
}

// Error for a read that returned fewer than `expected` bytes.
absl::Status ShortReadError(const std::string& path, absl::string_view what, int64_t expected,
                            const ReadResult& r) {
  if (IsCorrupt(r)) return CorruptError(path, what, r);
  std::string zlib_note;
  if (r.zerr == Z_BUF_ERROR) zlib_note = absl::StrCat(" (zlib: ", r.zlib_message, ")");
  return absl::DataLossError(absl::StrCat(path, ": file is truncated: expected ", expected,
                                          " bytes of ", what, ", got ", r.got, zlib_note,
                                          "; the file is incomplete, download it again"));
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

const char* IdxTypeName(uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return nullptr;
  }
}

absl::Status CheckMagic(const std::string& path, uint32_t magic) {
  const uint8_t type = (magic >> 8) & 0xFF;
  const uint8_t ndims = magic & 0xFF;
  if ((magic >> 16) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not an IDX file: bad magic number 0x%08X (expected 0x%08X for labels or 0x%08X for "
        "images)",
        path, magic, kIdxMagicU8Vector, kIdxMagicU8Images));
  }
  if (type != 0x08) {
    const char* name = IdxTypeName(type);
    if (name == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: not an IDX file: invalid element type 0x%02X in magic number 0x%08X",
                          path, type, magic));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported IDX element type 0x%02X (%s) in magic number 0x%08X; only unsigned "
        "bytes (0x08) are supported",
        path, type, name, magic));
  }
  if (magic != kIdxMagicU8Vector && magic != kIdxMagicU8Images) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported number of IDX dimensions %d (magic number 0x%08X); expected 1 (labels, "
        "0x%08X) or 3 (images, 0x%08X)",
        path, ndims, magic, kIdxMagicU8Vector, kIdxMagicU8Images));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, int64_t max_items) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("cannot open IDX file ", path));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, expected an IDX file"));
  }
  errno = 0;
  GzFilePtr file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    if (errno != 0) return ErrnoToStatus(errno, absl::StrCat("cannot open IDX file ", path));
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot open IDX file ", path, ": zlib could not allocate its state"));
  }
  gzbuffer(file.get(), kGzBufferBytes);

  // Magic number.
  uint8_t header[4];
  ReadResult r = ReadUpTo(file.get(), path, header, sizeof(header));
  if (r.got < 4) {
    if (r.got == 0 && r.zerr == Z_OK) {
      return absl::DataLossError(
          absl::StrCat(path,
                       ": file is empty (truncated before the IDX header); the file is incomplete, "
                       "download it again"));
    }
    return ShortReadError(path, "IDX header (magic number)", 4, r);
  }
  if (IsCorrupt(r)) return CorruptError(path, "the IDX header", r);
  const uint32_t magic = BigEndian32(header);
  DT_RETURN_IF_ERROR(CheckMagic(path, magic));

  // Dimensions.
  const int ndims = magic & 0xFF;
  uint8_t dim_bytes[4 * 3];
  r = ReadUpTo(file.get(), path, dim_bytes, 4 * ndims);
  if (r.got < 4 * ndims) {
    return ShortReadError(path, absl::StrCat("IDX header (", ndims, " dimensions)"), 4 * ndims, r);
  }
  if (IsCorrupt(r)) return CorruptError(path, "the IDX header", r);
  IdxArray array;
  for (int i = 0; i < ndims; ++i) array.dims.push_back(BigEndian32(dim_bytes + 4 * i));
  const bool has_zero = std::find(array.dims.begin(), array.dims.end(), 0) != array.dims.end();
  int64_t expected = has_zero ? 0 : 1;
  for (int64_t dim : array.dims) {
    if (has_zero) break;
    if (expected > kMaxPayloadBytes / dim) {  // expected * dim would exceed the bound
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": IDX dimensions ", absl::StrJoin(array.dims, " x "), " describe more than the ",
          kMaxPayloadBytes, " bytes this reader supports; the header is corrupt"));
    }
    expected *= dim;
  }
  const std::string what = absl::StrCat("data for dimensions ", absl::StrJoin(array.dims, " x "));
  // Only the first max_items along the first dimension (see idx.h).
  const bool partial = max_items > 0 && max_items < array.dims[0];
  if (partial) {
    expected = expected / array.dims[0] * max_items;
    array.dims[0] = max_items;
  }

  // Payload, read in chunks so that memory grows only with the data present.
  while (static_cast<int64_t>(array.data.size()) < expected) {
    const int64_t have = array.data.size();
    const int64_t want = std::min(expected - have, kReadChunk);
    array.data.resize(have + want);
    r = ReadUpTo(file.get(), path, array.data.data() + have, want);
    if (r.got < want) {
      r.got += have;
      return ShortReadError(path, what, expected, r);
    }
    if (IsCorrupt(r)) return CorruptError(path, what, r);
  }

  if (partial) return array;

  // The stream must end here. Reading on also makes zlib check the gzip
  // trailer (CRC-32 and length) of the last member.
  constexpr int64_t kMaxTrailingCount = int64_t{1} << 20;
  uint8_t scratch[4096];
  int64_t trailing = 0;
  while (trailing < kMaxTrailingCount) {
    r = ReadUpTo(file.get(), path, scratch, sizeof(scratch));
    trailing += r.got;
    if (r.got < static_cast<int64_t>(sizeof(scratch)) || r.zerr != Z_OK) break;
  }
  if (IsCorrupt(r)) return CorruptError(path, "the end of the file", r);
  if (r.zerr == Z_BUF_ERROR && trailing == 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": file is truncated: the gzip stream ends before its trailer (zlib: ",
                     r.zlib_message, "); the file is incomplete, download it again"));
  }
  if (trailing > 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", (trailing >= kMaxTrailingCount ? "at least " : ""), trailing,
                     " unexpected bytes after the ", expected, " bytes of ", what,
                     "; the header does not match the data, the file is corrupt"));
  }
  return array;
}

}  // namespace dtrain::data
