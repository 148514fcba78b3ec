#include "libs/scheduler/wal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"

namespace dtrain {
namespace scheduler {
namespace {

constexpr size_t kHeaderBytes = 8;

void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

absl::Status WriteAll(int fd, const char* data, size_t n, const std::string& what) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, what);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t Crc32(absl::string_view data) {
  static const auto* table = [] {
    auto* t = new uint32_t[256];
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char ch : data) crc = table[(crc ^ ch) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

absl::StatusOr<std::unique_ptr<Wal>> Wal::Open(const std::string& path,
                                               std::vector<std::string>* records) {
  records->clear();
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", path));
  std::string data;
  char buf[1 << 16];
  while (true) {
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoToStatus(errno, absl::StrCat("reading ", path));
      close(fd);
      return s;
    }
    if (r == 0) break;
    data.append(buf, static_cast<size_t>(r));
  }
  size_t pos = 0;
  while (pos < data.size()) {
    size_t left = data.size() - pos;
    std::string damage;
    uint32_t len = 0;
    if (left < kHeaderBytes) {
      damage = absl::StrCat("a torn header of ", left, " bytes");
    } else {
      len = GetU32(data.data() + pos);
      uint32_t crc = GetU32(data.data() + pos + 4);
      if (len > kMaxRecordBytes) {
        damage = absl::StrCat("a record length of ", len, " bytes");
      } else if (left - kHeaderBytes < len) {
        damage = absl::StrCat("a torn record (", left - kHeaderBytes, " of ", len, " bytes)");
      } else if (Crc32(absl::string_view(data.data() + pos + kHeaderBytes, len)) != crc) {
        if (pos + kHeaderBytes + len != data.size()) {
          close(fd);
          return absl::DataLossError(absl::StrCat(path,
                                                  ": checksum mismatch in the record at offset ",
                                                  pos, ", which is not the last one"));
        }
        damage = "a checksum mismatch in the last record";
      }
    }
    if (!damage.empty()) {
      if (len > kMaxRecordBytes && left >= kHeaderBytes + kMaxRecordBytes) {
        close(fd);
        return absl::DataLossError(
            absl::StrCat(path, ": ", damage, " at offset ", pos, ", not at the end of the log"));
      }
      DT_LOG(WARNING) << path << ": cutting off " << damage << " at offset " << pos
                      << " (an interrupted append)";
      if (ftruncate(fd, static_cast<off_t>(pos)) != 0 || fsync(fd) != 0) {
        absl::Status s = ErrnoToStatus(errno, absl::StrCat("truncating ", path));
        close(fd);
        return s;
      }
      data.resize(pos);
      break;
    }
    records->emplace_back(data.data() + pos + kHeaderBytes, len);
    pos += kHeaderBytes + len;
  }
  if (lseek(fd, 0, SEEK_END) < 0) {
    absl::Status s = ErrnoToStatus(errno, absl::StrCat("seeking ", path));
    close(fd);
    return s;
  }
  return std::unique_ptr<Wal>(new Wal(fd, static_cast<int64_t>(data.size())));
}

absl::StatusOr<std::unique_ptr<Wal>> Wal::Rewrite(const std::string& path,
                                                  const std::vector<std::string>& records) {
  const std::string tmp = absl::StrCat(path, ".compact");
  std::remove(tmp.c_str());
  {
    std::vector<std::string> none;
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Wal> out, Open(tmp, &none));
    std::string frames;
    for (const std::string& r : records) {
      if (r.size() > kMaxRecordBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("WAL record of ", r.size(), " bytes exceeds ", kMaxRecordBytes));
      }
      char header[kHeaderBytes];
      PutU32(static_cast<uint32_t>(r.size()), header);
      PutU32(Crc32(r), header + 4);
      frames.append(header, kHeaderBytes);
      frames.append(r);
    }
    DT_RETURN_IF_ERROR(WriteAll(out->fd_, frames.data(), frames.size(), "writing " + tmp));
    if (fsync(out->fd_) != 0) return ErrnoToStatus(errno, "syncing " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("renaming ", tmp, " to ", path));
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  std::vector<std::string> check;
  DT_ASSIGN_OR_RETURN(std::unique_ptr<Wal> wal, Open(path, &check));
  if (check.size() != records.size()) {
    return absl::InternalError(absl::StrCat(path, ": compacted log holds ", check.size(),
                                            " records, expected ", records.size()));
  }
  return wal;
}

Wal::~Wal() { close(fd_); }

absl::Status Wal::Append(absl::string_view record) {
  if (record.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("WAL record of ", record.size(), " bytes exceeds ", kMaxRecordBytes));
  }
  std::string frame(kHeaderBytes, '\0');
  PutU32(static_cast<uint32_t>(record.size()), &frame[0]);
  PutU32(Crc32(record), &frame[4]);
  frame.append(record.data(), record.size());
  DT_RETURN_IF_ERROR(WriteAll(fd_, frame.data(), frame.size(), "appending to the WAL"));
  if (fdatasync(fd_) != 0) return ErrnoToStatus(errno, "syncing the WAL");
  size_ += static_cast<int64_t>(frame.size());
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace dtrain
