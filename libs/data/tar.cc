#include "libs/data/tar.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dtrain::data {
namespace {

constexpr int64_t kBlock = 512;

// Reads [offset, offset + n) of the archive into *out; fewer bytes at its end.
using ReadFn = std::function<absl::Status(int64_t offset, int64_t n, std::string* out)>;

int64_t Padded(int64_t size) { return (size + kBlock - 1) / kBlock * kBlock; }

// A NUL-terminated (or full-width) field.
std::string Field(const char* p, size_t width) { return std::string(p, strnlen(p, width)); }

// An octal number field (or GNU base-256 when the top bit is set).
bool ParseNumber(const unsigned char* p, size_t width, int64_t* out) {
  if (p[0] & 0x80) {
    if ((p[0] & 0x40) != 0) return false;  // negative
    uint64_t v = p[0] & 0x3f;
    for (size_t i = 1; i < width; ++i) {
      if (v >> 55) return false;
      v = (v << 8) | p[i];
    }
    if (v > static_cast<uint64_t>(INT64_MAX / 2)) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  size_t i = 0;
  while (i < width && p[i] == ' ') ++i;
  int64_t v = 0;
  bool any = false;
  for (; i < width && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v > (INT64_MAX >> 4)) return false;
    v = v * 8 + (p[i] - '0');
    any = true;
  }
  for (; i < width; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return false;
  }
  *out = v;
  return any;
}

absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("empty member name");
  if (name[0] == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("member '", name, "' has an absolute name; refused"));
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("member '", name, "' has a '..' component; refused"));
    }
  }
  if (name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("member name with a NUL byte; refused");
  }
  return absl::OkStatus();
}

// The "path" record of a pax extended header, if any.
absl::StatusOr<std::string> PaxPath(absl::string_view records) {
  std::string path;
  while (!records.empty()) {
    size_t space = records.find(' ');
    if (space == absl::string_view::npos || space == 0 || space > 20) {
      return absl::InvalidArgumentError("malformed pax extended header");
    }
    int64_t len = 0;
    for (char c : records.substr(0, space)) {
      if (c < '0' || c > '9') return absl::InvalidArgumentError("malformed pax record length");
      len = len * 10 + (c - '0');
    }
    if (len <= static_cast<int64_t>(space) + 1 || len > static_cast<int64_t>(records.size()) ||
        records[len - 1] != '\n') {
      return absl::InvalidArgumentError("malformed pax record");
    }
    absl::string_view record = records.substr(space + 1, len - space - 2);
    size_t eq = record.find('=');
    if (eq == absl::string_view::npos) return absl::InvalidArgumentError("malformed pax record");
    if (record.substr(0, eq) == "path") path = std::string(record.substr(eq + 1));
    records.remove_prefix(len);
  }
  return path;
}

absl::StatusOr<std::vector<TarMember>> Parse(
    int64_t archive_size, const ReadFn& read,
    const std::function<bool(absl::string_view)>& want_contents) {
  std::vector<TarMember> members;
  std::string block;
  std::string long_name;  // from a GNU 'L' or pax header, for the next member
  int64_t offset = 0;
  int64_t index = 0;
  while (offset < archive_size) {
    auto where = [&](absl::string_view what) {
      return absl::StrCat("tar header ", index, " at byte ", offset, ": ", what);
    };
    if (absl::Status s = read(offset, kBlock, &block); !s.ok()) return s;
    if (static_cast<int64_t>(block.size()) < kBlock) {
      return absl::DataLossError(where("truncated header (the archive is cut short)"));
    }
    const auto* h = reinterpret_cast<const unsigned char*>(block.data());
    if (std::all_of(h, h + kBlock, [](unsigned char c) { return c == 0; })) break;  // the end
    int64_t stored = 0;
    if (!ParseNumber(h + 148, 8, &stored)) {
      return absl::DataLossError(where("unreadable checksum field; not a tar archive?"));
    }
    int64_t sum = 0;
    for (int i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    if (sum != stored) {
      return absl::DataLossError(
          where(absl::StrCat("checksum ", sum, " != stored ", stored, "; not a tar archive?")));
    }
    int64_t size = 0;
    if (!ParseNumber(h + 124, 12, &size)) return absl::DataLossError(where("bad size field"));
    const char type = static_cast<char>(h[156]);
    std::string name;
    if (!long_name.empty()) {
      name = std::move(long_name);
      long_name.clear();
    } else {
      name = Field(block.data(), 100);
      if (std::memcmp(h + 257, "ustar", 5) == 0) {
        std::string prefix = Field(block.data() + 345, 155);
        if (!prefix.empty()) name = absl::StrCat(prefix, "/", name);
      }
    }
    const int64_t data = offset + kBlock;
    if (size > archive_size - data) {
      return absl::DataLossError(where(absl::StrCat("member '", name, "' of ", size,
                                                    " bytes runs past the end of the archive (",
                                                    archive_size, " bytes)")));
    }
    auto contents = [&](std::string* out) -> absl::Status {
      if (absl::Status s = read(data, size, out); !s.ok()) return s;
      if (static_cast<int64_t>(out->size()) != size) {
        return absl::DataLossError(where("member contents cut short"));
      }
      return absl::OkStatus();
    };
    if (type == 'L' || type == 'x') {
      if (size > 65536) return absl::InvalidArgumentError(where("long name over 64 KiB"));
      std::string text;
      if (absl::Status s = contents(&text); !s.ok()) return s;
      if (type == 'L') {
        long_name = Field(text.data(), text.size());
      } else {
        absl::StatusOr<std::string> path = PaxPath(text);
        if (!path.ok()) return absl::InvalidArgumentError(where(path.status().message()));
        long_name = *path;
      }
      if (type == 'L' && long_name.empty()) {
        return absl::InvalidArgumentError(where("empty GNU long name"));
      }
    } else if (type == 'g' || type == '5') {
      // A pax global header or a directory: nothing to index.
    } else if (type == '0' || type == '\0' || type == '7') {
      if (absl::Status s = CheckName(name); !s.ok()) {
        return absl::InvalidArgumentError(where(s.message()));
      }
      TarMember m;
      m.name = std::move(name);
      m.offset = data;
      m.size = size;
      if (want_contents && want_contents(m.name)) {
        if (absl::Status s = contents(&m.content); !s.ok()) return s;
      }
      members.push_back(std::move(m));
    } else {
      return absl::InvalidArgumentError(
          where(absl::StrCat("member '", name, "' has type '", std::string(1, type),
                             "' (a link, device or FIFO); only regular files are accepted")));
    }
    offset = data + Padded(size);
    ++index;
  }
  if (!long_name.empty()) {
    return absl::DataLossError("tar archive ends after a long-name header without its member");
  }
  return members;
}

}  // namespace

absl::StatusOr<std::vector<TarMember>> ParseTar(absl::string_view archive) {
  ReadFn read = [archive](int64_t offset, int64_t n, std::string* out) {
    const int64_t size = static_cast<int64_t>(archive.size());
    const int64_t begin = std::min(offset, size);
    const absl::string_view part = archive.substr(begin, std::min(n, size - begin));
    out->assign(part.data(), part.size());
    return absl::OkStatus();
  };
  return Parse(static_cast<int64_t>(archive.size()), read, nullptr);
}

absl::StatusOr<std::vector<TarMember>> ParseTarStream(
    int fd, int64_t file_size, const std::function<bool(absl::string_view)>& want_contents) {
  ReadFn read = [fd](int64_t offset, int64_t n, std::string* out) -> absl::Status {
    out->resize(n);
    int64_t done = 0;
    while (done < n) {
      ssize_t got = pread(fd, out->data() + done, n - done, offset + done);
      if (got < 0) {
        if (errno == EINTR) continue;
        return absl::DataLossError(
            absl::StrCat("read error at byte ", offset + done, ": ", std::strerror(errno)));
      }
      if (got == 0) break;
      done += got;
    }
    out->resize(done);
    return absl::OkStatus();
  };
  return Parse(file_size, read, want_contents);
}

void TarWriter::Header(absl::string_view name, int64_t size, char type) {
  char h[kBlock] = {};
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = type;
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < kBlock; ++i) sum += static_cast<unsigned char>(h[i]);
  std::snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
  out_.append(h, kBlock);
}

void TarWriter::Add(absl::string_view name, absl::string_view content) {
  if (name.size() > 100) {
    std::string long_name(name);
    long_name.push_back('\0');
    Header("././@LongLink", long_name.size(), 'L');
    out_.append(long_name);
    out_.append(Padded(long_name.size()) - long_name.size(), '\0');
  }
  Header(name, content.size(), '0');
  out_.append(content.data(), content.size());
  out_.append(Padded(content.size()) - content.size(), '\0');
}

std::string TarWriter::Finish() {
  out_.append(2 * kBlock, '\0');
  return std::move(out_);
}

}  // namespace dtrain::data
