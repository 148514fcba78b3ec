#include "libs/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/checkpoint/crc32c.h"

namespace dtrain {
namespace checkpoint {
namespace {

// Whether a stored CRC differs from the computed one. Fuzzing builds
// (tools/fuzz, which defines the macro) accept any CRC so that the fuzzer
// reaches the parsing behind the checksums; no other build defines it.
bool CrcMismatch(uint32_t stored, uint32_t computed) {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  (void)stored;
  (void)computed;
  return false;
#else
  return stored != computed;
#endif
}

constexpr char kMagic[16] = {'\x89', 'D', 'T', 'R', 'A',  'I',  'N',    '-',
                             'C',    'K', 'P', 'T', '\r', '\n', '\x1a', '\n'};
constexpr size_t kMagicSize = sizeof(kMagic);
// Bytes 0-27 (magic, major, minor, header_size) are the same in every version.
constexpr size_t kStablePrefixSize = kMagicSize + 12;
// The smallest header any version can have: the stable prefix and a CRC.
constexpr uint32_t kMinAnyHeaderSize = kStablePrefixSize + 4;
constexpr uint32_t kHeaderSizeV1 = 48;
constexpr size_t kFooterSize = 12;
// Empty key and value: two lengths and a CRC.
constexpr uint64_t kMinMetadataEntrySize = 12;
// One-byte name, rank 0: name length, name, dtype, rank, data length, two CRCs.
constexpr uint64_t kMinTensorRecordSize = 4 + 1 + 4 + 4 + 8 + 4 + 4;

// Large payloads are checksummed and transferred in pieces of this size, so
// each piece is still in cache for its second pass.
constexpr size_t kChunkSize = 1 << 20;

// ---------------------------------------------------------------------------
// Little-endian encoding.

void PutU32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out->append(b, 4);
}

void PutU64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out->append(b, 8);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Product of non-negative `dims`; false when it overflows int64.
bool ElementCount(const std::vector<int64_t>& dims, int64_t* count) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  *count = n;
  return true;
}

std::string Quote(absl::string_view s) { return absl::StrCat("'", absl::CHexEscape(s), "'"); }

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string HexCrc(uint32_t crc) { return absl::StrCat("0x", absl::Hex(crc, absl::kZeroPad8)); }

// ---------------------------------------------------------------------------
// Writing.

// Buffered writes to a file descriptor, keeping a CRC of everything written.
class FileWriter {
 public:
  FileWriter(int fd, std::string context) : fd_(fd), context_(std::move(context)) {
    buffer_.reserve(kChunkSize);
  }

  // Appends data[0, n), also extending `*record_crc` when not null.
  absl::Status Append(const char* data, size_t n, uint32_t* record_crc = nullptr) {
    if (n < kChunkSize) {
      if (buffer_.size() + n > kChunkSize) DT_RETURN_IF_ERROR(Flush());
      Account(data, n, record_crc);
      buffer_.append(data, n);
      return absl::OkStatus();
    }
    DT_RETURN_IF_ERROR(Flush());
    while (n > 0) {
      size_t piece = std::min(n, kChunkSize);
      Account(data, piece, record_crc);
      DT_RETURN_IF_ERROR(WriteAll(data, piece));
      data += piece;
      n -= piece;
    }
    return absl::OkStatus();
  }

  absl::Status Append(absl::string_view s, uint32_t* record_crc = nullptr) {
    return Append(s.data(), s.size(), record_crc);
  }

  absl::Status Flush() {
    absl::Status status = WriteAll(buffer_.data(), buffer_.size());
    buffer_.clear();
    return status;
  }

  uint32_t file_crc() const { return crc_; }
  uint64_t offset() const { return offset_; }

 private:
  void Account(const char* data, size_t n, uint32_t* record_crc) {
    crc_ = crc32c::Extend(crc_, data, n);
    if (record_crc != nullptr) *record_crc = crc32c::Extend(*record_crc, data, n);
    offset_ += n;
  }

  absl::Status WriteAll(const char* data, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, data, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, context_);
      }
      data += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

  int fd_;
  std::string context_;
  std::string buffer_;
  uint32_t crc_ = 0;
  uint64_t offset_ = 0;
};

// Checks `ckpt` against the format's rules; returns the size of its file.
absl::StatusOr<uint64_t> PlanFile(const std::string& path, const Checkpoint& ckpt) {
  auto invalid = [&path](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("write checkpoint ", path, ": ", what));
  };
  constexpr uint64_t kMaxCount = std::numeric_limits<uint32_t>::max();
  if (ckpt.metadata.size() > kMaxCount) return invalid("too many metadata entries");
  if (ckpt.tensors.size() > kMaxCount) return invalid("too many tensors");

  uint64_t size = kHeaderSizeV1 + kFooterSize;
  for (const auto& [key, value] : ckpt.metadata) {
    if (key.size() > kMaxKeyLength) {
      return invalid(absl::StrCat("metadata key of ", key.size(), " bytes exceeds the limit of ",
                                  kMaxKeyLength));
    }
    if (value.size() > kMaxValueLength) {
      return invalid(absl::StrCat("metadata value for key ", Quote(key), " has ", value.size(),
                                  " bytes, above the limit of ", kMaxValueLength));
    }
    size += kMinMetadataEntrySize + key.size() + value.size();
  }

  absl::flat_hash_map<absl::string_view, size_t> index;
  for (size_t i = 0; i < ckpt.tensors.size(); ++i) {
    const TensorRecord& t = ckpt.tensors[i];
    std::string where = absl::StrCat("tensor ", i, " ", Quote(t.name), ": ");
    if (t.name.empty()) return invalid(absl::StrCat("tensor ", i, " has an empty name"));
    if (t.name.size() > kMaxNameLength) {
      return invalid(absl::StrCat(where, "name of ", t.name.size(), " bytes exceeds the limit of ",
                                  kMaxNameLength));
    }
    auto [it, inserted] = index.emplace(t.name, i);
    if (!inserted) {
      return invalid(absl::StrCat("duplicate tensor name ", Quote(t.name), " (tensors ", it->second,
                                  " and ", i, ")"));
    }
    if (t.shape.size() > kMaxRank) {
      return invalid(
          absl::StrCat(where, "rank ", t.shape.size(), " exceeds the limit of ", kMaxRank));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return invalid(absl::StrCat(where, "negative dimension in shape ", ShapeString(t.shape)));
      }
    }
    int64_t elements = 0;
    if (!ElementCount(t.shape, &elements)) {
      return invalid(
          absl::StrCat(where, "element count of shape ", ShapeString(t.shape), " overflows int64"));
    }
    size += kMinTensorRecordSize - 1 + t.name.size() + 8 * t.shape.size() + t.data.size();
  }
  return size;
}

// Writes the complete file for `ckpt` (`file_size` bytes) to `fd`.
absl::Status WriteContents(int fd, const std::string& tmp, const Checkpoint& ckpt,
                           uint64_t file_size) {
  FileWriter out(fd, absl::StrCat("write ", tmp));

  std::string header(kMagic, kMagicSize);
  PutU32(&header, kMajorVersion);
  PutU32(&header, kMinorVersion);
  PutU32(&header, kHeaderSizeV1);
  PutU32(&header, static_cast<uint32_t>(ckpt.metadata.size()));
  PutU32(&header, static_cast<uint32_t>(ckpt.tensors.size()));
  PutU64(&header, file_size);
  PutU32(&header, crc32c::Value(header.data(), header.size()));
  DT_CHECK(header.size() == kHeaderSizeV1) << header.size();
  DT_RETURN_IF_ERROR(out.Append(header));

  std::string scratch;
  for (const auto& [key, value] : ckpt.metadata) {
    uint32_t crc = 0;
    scratch.clear();
    PutU32(&scratch, static_cast<uint32_t>(key.size()));
    DT_RETURN_IF_ERROR(out.Append(scratch, &crc));
    DT_RETURN_IF_ERROR(out.Append(key, &crc));
    scratch.clear();
    PutU32(&scratch, static_cast<uint32_t>(value.size()));
    DT_RETURN_IF_ERROR(out.Append(scratch, &crc));
    DT_RETURN_IF_ERROR(out.Append(value, &crc));
    scratch.clear();
    PutU32(&scratch, crc);
    DT_RETURN_IF_ERROR(out.Append(scratch));
  }

  for (const TensorRecord& t : ckpt.tensors) {
    scratch.clear();
    PutU32(&scratch, static_cast<uint32_t>(t.name.size()));
    scratch += t.name;
    PutU32(&scratch, static_cast<uint32_t>(t.dtype));
    PutU32(&scratch, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) PutU64(&scratch, static_cast<uint64_t>(d));
    PutU64(&scratch, t.data.size());
    PutU32(&scratch, crc32c::Value(scratch.data(), scratch.size()));
    DT_RETURN_IF_ERROR(out.Append(scratch));
    uint32_t data_crc = 0;
    DT_RETURN_IF_ERROR(out.Append(t.data, &data_crc));
    scratch.clear();
    PutU32(&scratch, data_crc);
    DT_RETURN_IF_ERROR(out.Append(scratch));
  }

  scratch.clear();
  PutU64(&scratch, file_size);
  DT_RETURN_IF_ERROR(out.Append(scratch));
  scratch.clear();
  PutU32(&scratch, out.file_crc());
  DT_RETURN_IF_ERROR(out.Append(scratch));
  DT_RETURN_IF_ERROR(out.Flush());
  DT_CHECK(out.offset() == file_size)
      << "wrote " << out.offset() << " bytes, planned " << file_size;
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// ---------------------------------------------------------------------------
// Reading.

// Buffered reads from a file descriptor, keeping a CRC of everything read.
class FileReader {
 public:
  explicit FileReader(int fd) : fd_(fd), buffer_(64 << 10) {}

  // Reads exactly n bytes into dst, also extending `*record_crc` when not
  // null. Running out of bytes is an error: the caller has already checked
  // the file's size, so the file changed while being read.
  absl::Status Read(char* dst, size_t n, uint32_t* record_crc = nullptr) {
    while (n > 0) {
      if (pos_ == end_) {
        if (n >= buffer_.size()) {
          // Large reads bypass the buffer.
          size_t piece = std::min(n, kChunkSize);
          DT_RETURN_IF_ERROR(ReadFully(dst, piece));
          Account(dst, piece, record_crc);
          dst += piece;
          n -= piece;
          continue;
        }
        DT_RETURN_IF_ERROR(Fill());
      }
      size_t take = std::min(n, end_ - pos_);
      std::memcpy(dst, buffer_.data() + pos_, take);
      pos_ += take;
      Account(dst, take, record_crc);
      dst += take;
      n -= take;
    }
    return absl::OkStatus();
  }

  uint64_t offset() const { return offset_; }
  uint32_t file_crc() const { return crc_; }

 private:
  void Account(const char* data, size_t n, uint32_t* record_crc) {
    crc_ = crc32c::Extend(crc_, data, n);
    if (record_crc != nullptr) *record_crc = crc32c::Extend(*record_crc, data, n);
    offset_ += n;
  }

  absl::Status ReadSome(char* dst, size_t n, size_t* got) {
    while (true) {
      ssize_t r = ::read(fd_, dst, n);
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, absl::StrCat("read at offset ", offset_));
      }
      if (r == 0) {
        return absl::DataLossError(absl::StrCat("unexpected end of file at offset ", offset_,
                                                " (did the file change while being read?)"));
      }
      *got = static_cast<size_t>(r);
      return absl::OkStatus();
    }
  }

  absl::Status ReadFully(char* dst, size_t n) {
    while (n > 0) {
      size_t got = 0;
      DT_RETURN_IF_ERROR(ReadSome(dst, n, &got));
      dst += got;
      n -= got;
    }
    return absl::OkStatus();
  }

  absl::Status Fill() {
    pos_ = 0;
    end_ = 0;
    return ReadSome(buffer_.data(), buffer_.size(), &end_);
  }

  int fd_;
  std::vector<char> buffer_;
  size_t pos_ = 0;
  size_t end_ = 0;
  uint64_t offset_ = 0;
  uint32_t crc_ = 0;
};

class Parser {
 public:
  Parser(const std::string& path, int fd, uint64_t actual_size)
      : path_(path), in_(fd), actual_size_(actual_size) {}

  absl::StatusOr<Checkpoint> Parse() {
    DT_RETURN_IF_ERROR(ParseHeader());
    Checkpoint ckpt;
    for (uint32_t i = 0; i < metadata_count_; ++i) {
      DT_RETURN_IF_ERROR(ParseMetadataEntry(i, &ckpt.metadata));
    }
    absl::flat_hash_map<std::string, uint32_t> index;
    ckpt.tensors.reserve(std::min<uint32_t>(tensor_count_, 1 << 16));
    for (uint32_t i = 0; i < tensor_count_; ++i) {
      TensorRecord record;
      DT_RETURN_IF_ERROR(ParseTensorRecord(i, &record));
      auto [it, inserted] = index.emplace(record.name, i);
      if (!inserted) {
        return Corrupt(absl::StrCat("duplicate tensor name ", Quote(record.name),
                                    " (tensor records ", it->second, " and ", i, ")"));
      }
      ckpt.tensors.push_back(std::move(record));
    }
    DT_RETURN_IF_ERROR(ParseFooter());
    return ckpt;
  }

 private:
  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": ", what));
  }

  absl::Status Annotated(const absl::Status& status) const {
    return Annotate(status, absl::StrCat("checkpoint ", path_));
  }

  absl::Status Read(char* dst, size_t n, uint32_t* record_crc = nullptr) {
    return Annotated(in_.Read(dst, n, record_crc));
  }

  absl::Status ReadU32(uint32_t* v, uint32_t* record_crc = nullptr) {
    char b[4];
    DT_RETURN_IF_ERROR(Read(b, 4, record_crc));
    *v = GetU32(b);
    return absl::OkStatus();
  }

  absl::Status ReadU64(uint64_t* v, uint32_t* record_crc = nullptr) {
    char b[8];
    DT_RETURN_IF_ERROR(Read(b, 8, record_crc));
    *v = GetU64(b);
    return absl::OkStatus();
  }

  // Bytes between the read position and the footer.
  uint64_t BodyLeft() const { return file_size_ - kFooterSize - in_.offset(); }

  // Fails unless `n` more bytes of `what` fit before the footer.
  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n <= BodyLeft()) return absl::OkStatus();
    return Corrupt(absl::StrCat(what, " at offset ", in_.offset(), " needs ", n,
                                " bytes, but only ", BodyLeft(),
                                " remain before the footer (corrupt length or count)"));
  }

  absl::Status Truncated(uint64_t needed) const {
    return Corrupt(
        absl::StrCat("truncated: file has ", actual_size_, " bytes, expected at least ", needed));
  }

  absl::Status ParseHeader() {
    // Magic. A short file that matches as far as it goes was cut off.
    char magic[kMagicSize];
    size_t have = static_cast<size_t>(std::min<uint64_t>(actual_size_, kMagicSize));
    DT_RETURN_IF_ERROR(Read(magic, have));
    if (std::memcmp(magic, kMagic, have) != 0) {
      std::string hint;
      if (have >= 12 && std::memcmp(magic, kMagic, 12) == 0) {
        hint = "; its line endings look altered (copied in text mode?)";
      }
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", path_, ": not a dtrain checkpoint (file starts with \"",
                       absl::CHexEscape(absl::string_view(magic, have)), "\", expected \"",
                       absl::CHexEscape(absl::string_view(kMagic, kMagicSize)), "\")", hint));
    }
    if (actual_size_ < kStablePrefixSize) return Truncated(kHeaderSizeV1 + kFooterSize);

    char prefix[kStablePrefixSize - kMagicSize];
    DT_RETURN_IF_ERROR(Read(prefix, sizeof(prefix)));
    uint32_t major = GetU32(prefix);
    uint32_t minor = GetU32(prefix + 4);
    uint32_t header_size = GetU32(prefix + 8);
    std::string version = absl::StrCat(major, ".", minor);
    if (major == 0) return Corrupt(absl::StrCat("invalid format version ", version));
    const bool newer = major > kMajorVersion;
    uint32_t min_header = newer ? kMinAnyHeaderSize : kHeaderSizeV1;
    bool size_ok = header_size >= min_header && header_size <= kMaxHeaderSize &&
                   (newer || minor > 0 || header_size == kHeaderSizeV1);
    if (!size_ok) {
      return Corrupt(
          absl::StrCat("invalid header size ", header_size, " for format version ", version));
    }
    uint64_t min_file = header_size + (newer ? 0 : kFooterSize);
    if (actual_size_ < min_file) return Truncated(min_file);

    // The rest of the header and its CRC.
    std::string header(header_size, '\0');
    std::memcpy(&header[0], kMagic, kMagicSize);
    std::memcpy(&header[kMagicSize], prefix, sizeof(prefix));
    DT_RETURN_IF_ERROR(Read(&header[kStablePrefixSize], header_size - kStablePrefixSize));
    uint32_t stored = GetU32(&header[header_size - 4]);
    uint32_t actual = crc32c::Value(header.data(), header_size - 4);
    if (CrcMismatch(stored, actual)) {
      return Corrupt(absl::StrCat(
          "header checksum mismatch (stored ", HexCrc(stored), ", computed ", HexCrc(actual), ")",
          newer ? absl::StrCat("; the header claims format version ", version) : ""));
    }
    if (newer) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", path_, ": unsupported format version ", version,
                       "; this build reads format version ", kMajorVersion, ".x (up to ",
                       kMajorVersion, ".", kMinorVersion, "). Was it written by a newer dtrain?"));
    }

    metadata_count_ = GetU32(&header[28]);
    tensor_count_ = GetU32(&header[32]);
    file_size_ = GetU64(&header[36]);
    if (file_size_ > actual_size_) {
      return Corrupt(absl::StrCat("truncated: header says the file has ", file_size_,
                                  " bytes, but it has ", actual_size_));
    }
    if (file_size_ < actual_size_) {
      return Corrupt(absl::StrCat("file has ", actual_size_, " bytes, but its header says ",
                                  file_size_, " (data appended after the footer?)"));
    }
    // Counts must fit in the file before anything is sized by them.
    uint64_t min_body = metadata_count_ * kMinMetadataEntrySize +
                        static_cast<uint64_t>(tensor_count_) * kMinTensorRecordSize;
    if (min_body > BodyLeft()) {
      return Corrupt(absl::StrCat(metadata_count_, " metadata entries and ", tensor_count_,
                                  " tensor records cannot fit in ", BodyLeft(), " bytes of body"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseMetadataEntry(uint32_t i, std::map<std::string, std::string>* metadata) {
    std::string what = absl::StrCat("metadata entry ", i);
    uint32_t crc = 0;
    uint32_t key_length = 0, value_length = 0;
    DT_RETURN_IF_ERROR(Need(4, what));
    DT_RETURN_IF_ERROR(ReadU32(&key_length, &crc));
    if (key_length > kMaxKeyLength) {
      return Corrupt(
          absl::StrCat(what, ": key length ", key_length, " exceeds the limit of ", kMaxKeyLength));
    }
    DT_RETURN_IF_ERROR(Need(uint64_t{key_length} + 4, what));
    std::string key(key_length, '\0');
    DT_RETURN_IF_ERROR(Read(&key[0], key_length, &crc));
    DT_RETURN_IF_ERROR(ReadU32(&value_length, &crc));
    if (value_length > kMaxValueLength) {
      return Corrupt(absl::StrCat(what, ": value length ", value_length, " exceeds the limit of ",
                                  kMaxValueLength));
    }
    DT_RETURN_IF_ERROR(Need(uint64_t{value_length} + 4, what));
    std::string value(value_length, '\0');
    DT_RETURN_IF_ERROR(Read(&value[0], value_length, &crc));
    uint32_t stored = 0;
    DT_RETURN_IF_ERROR(ReadU32(&stored));
    if (CrcMismatch(stored, crc)) {
      return Corrupt(absl::StrCat("checksum mismatch in ", what, " (stored ", HexCrc(stored),
                                  ", computed ", HexCrc(crc), ")"));
    }
    if (metadata->count(key) != 0) {
      return Corrupt(absl::StrCat(what, ": duplicate metadata key ", Quote(key)));
    }
    metadata->emplace(std::move(key), std::move(value));
    return absl::OkStatus();
  }

  absl::Status ParseTensorRecord(uint32_t i, TensorRecord* record) {
    std::string what = absl::StrCat("tensor record ", i);
    uint32_t crc = 0;
    uint32_t name_length = 0;
    DT_RETURN_IF_ERROR(Need(4, what));
    DT_RETURN_IF_ERROR(ReadU32(&name_length, &crc));
    if (name_length == 0 || name_length > kMaxNameLength) {
      return Corrupt(
          absl::StrCat(what, ": name length ", name_length, " is outside 1..", kMaxNameLength));
    }
    DT_RETURN_IF_ERROR(Need(uint64_t{name_length} + 8, what));
    record->name.assign(name_length, '\0');
    DT_RETURN_IF_ERROR(Read(&record->name[0], name_length, &crc));
    uint32_t dtype = 0, rank = 0;
    DT_RETURN_IF_ERROR(ReadU32(&dtype, &crc));
    DT_RETURN_IF_ERROR(ReadU32(&rank, &crc));
    if (rank > kMaxRank) {
      return Corrupt(absl::StrCat(what, ": rank ", rank, " exceeds the limit of ", kMaxRank));
    }
    DT_RETURN_IF_ERROR(Need(8 * uint64_t{rank} + 12, what));
    record->dtype = static_cast<int32_t>(dtype);
    record->shape.resize(rank);
    for (uint32_t d = 0; d < rank; ++d) {
      uint64_t dim = 0;
      DT_RETURN_IF_ERROR(ReadU64(&dim, &crc));
      record->shape[d] = static_cast<int64_t>(dim);
    }
    uint64_t data_length = 0;
    DT_RETURN_IF_ERROR(ReadU64(&data_length, &crc));
    uint32_t stored = 0;
    DT_RETURN_IF_ERROR(ReadU32(&stored));
    if (CrcMismatch(stored, crc)) {
      return Corrupt(absl::StrCat("checksum mismatch in the header of ", what, " (stored ",
                                  HexCrc(stored), ", computed ", HexCrc(crc), ")"));
    }
    // The record header is intact from here on, so the name can be trusted.
    what = absl::StrCat("tensor ", Quote(record->name), " (record ", i, ")");
    for (int64_t d : record->shape) {
      if (d < 0) {
        return Corrupt(
            absl::StrCat(what, ": negative dimension in shape ", ShapeString(record->shape)));
      }
    }
    int64_t elements = 0;
    if (!ElementCount(record->shape, &elements)) {
      return Corrupt(absl::StrCat(what, ": element count of shape ", ShapeString(record->shape),
                                  " overflows int64"));
    }
    if (data_length > BodyLeft() || BodyLeft() - data_length < 4) {
      return Corrupt(absl::StrCat(what, ": data length ", data_length, " plus its checksum does ",
                                  "not fit in the ", BodyLeft(),
                                  " bytes left before the footer (corrupt length or count)"));
    }
    record->data.resize(static_cast<size_t>(data_length));
    uint32_t data_crc = 0;
    DT_RETURN_IF_ERROR(Read(&record->data[0], record->data.size(), &data_crc));
    DT_RETURN_IF_ERROR(ReadU32(&stored));
    if (CrcMismatch(stored, data_crc)) {
      return Corrupt(absl::StrCat("checksum mismatch in the data of ", what, " (stored ",
                                  HexCrc(stored), ", computed ", HexCrc(data_crc), ")"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseFooter() {
    if (BodyLeft() != 0) {
      return Corrupt(absl::StrCat(BodyLeft(), " unexpected bytes at offset ", in_.offset(),
                                  ", after the last tensor record"));
    }
    uint64_t footer_size = 0;
    DT_RETURN_IF_ERROR(ReadU64(&footer_size));
    uint32_t actual = in_.file_crc();
    uint32_t stored = 0;
    DT_RETURN_IF_ERROR(ReadU32(&stored));
    if (footer_size != file_size_) {
      return Corrupt(absl::StrCat("footer says the file has ", footer_size,
                                  " bytes, the header says ", file_size_));
    }
    if (CrcMismatch(stored, actual)) {
      return Corrupt(absl::StrCat("whole-file checksum mismatch (stored ", HexCrc(stored),
                                  ", computed ", HexCrc(actual), ")"));
    }
    return absl::OkStatus();
  }

  const std::string& path_;
  FileReader in_;
  const uint64_t actual_size_;
  uint64_t file_size_ = 0;
  uint32_t metadata_count_ = 0;
  uint32_t tensor_count_ = 0;
};

}  // namespace

const TensorRecord* Checkpoint::Find(absl::string_view name) const {
  for (const TensorRecord& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt) {
  if (path.empty()) return absl::InvalidArgumentError("write checkpoint: empty path");
  DT_ASSIGN_OR_RETURN(uint64_t file_size, PlanFile(path, ckpt));

  static std::atomic<uint64_t> sequence{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", sequence.fetch_add(1));
  const std::string context = absl::StrCat("write checkpoint ", path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return ErrnoToStatus(errno, absl::StrCat(context, ": create temporary file ", tmp));
  }
  absl::Status status = Annotate(WriteContents(fd, tmp, ckpt, file_size), context);
  if (status.ok() && ::fsync(fd) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat(context, ": fsync ", tmp));
  }
  if (::close(fd) != 0 && status.ok()) {
    status = ErrnoToStatus(errno, absl::StrCat(context, ": close ", tmp));
  }
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat(context, ": rename ", tmp, " to ", path));
  }
  if (!status.ok()) {
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) {
      DT_LOG(WARNING) << "could not remove temporary checkpoint file " << tmp << ": "
                      << std::strerror(errno);
    }
    return status;
  }

  // The rename is durable only once the directory entry is.
  const std::string dir = DirName(path);
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    return ErrnoToStatus(
        errno, absl::StrCat(context, ": written, but open directory ", dir, " for fsync"));
  }
  if (::fsync(dir_fd) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat(context, ": written, but fsync directory ", dir));
  }
  ::close(dir_fd);
  return status;
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("checkpoint ", path, ": open"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status status = ErrnoToStatus(errno, absl::StrCat("checkpoint ", path, ": fstat"));
    ::close(fd);
    return status;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, ": not a regular file (a directory?)"));
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  absl::StatusOr<Checkpoint> result = Parser(path, fd, static_cast<uint64_t>(st.st_size)).Parse();
  ::close(fd);
  return result;
}

absl::Status ValidateRecord(const TensorRecord& record, int64_t dtype_size) {
  std::string what = absl::StrCat("tensor ", Quote(record.name), " (dtype ", record.dtype,
                                  ", shape ", ShapeString(record.shape), ")");
  if (dtype_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": element size ", dtype_size, " is not positive"));
  }
  if (record.shape.size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", record.shape.size(), " exceeds the limit of ", kMaxRank));
  }
  for (int64_t d : record.shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative dimension"));
  }
  int64_t elements = 0, bytes = 0;
  if (!ElementCount(record.shape, &elements) ||
      __builtin_mul_overflow(elements, dtype_size, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": byte size overflows int64"));
  }
  if (record.data.size() != static_cast<uint64_t>(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": data has ", record.data.size(),
                                                   " bytes, expected ", bytes, " (", elements,
                                                   " elements of ", dtype_size, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace checkpoint
}  // namespace dtrain
