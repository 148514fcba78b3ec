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

// Writes all of data at `offset`.
absl::Status PwriteAll(int fd, const char* data, size_t n, off_t offset, const std::string& what) {
  while (n > 0) {
    ssize_t w = pwrite(fd, data, n, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, what);
    }
    data += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return absl::OkStatus();
}

// Appends the frame of `record` to `out`.
absl::Status Frame(absl::string_view record, std::string* out) {
  if (record.size() > Wal::kMaxRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("WAL record of ", record.size(), " bytes exceeds ", Wal::kMaxRecordBytes));
  }
  char header[kHeaderBytes];
  PutU32(static_cast<uint32_t>(record.size()), header);
  PutU32(Crc32(record), header + 4);
  out->append(header, kHeaderBytes);
  out->append(record.data(), record.size());
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
  return std::unique_ptr<Wal>(
      new Wal(path, fd, static_cast<int64_t>(data.size()), static_cast<int64_t>(records->size())));
}

absl::Status Wal::Compact(const std::vector<std::string>& records) {
  std::string frames;
  for (const std::string& r : records) DT_RETURN_IF_ERROR(Frame(r, &frames));
  const std::string tmp = absl::StrCat(path_, ".compact");
  int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", tmp));
  absl::Status s = PwriteAll(fd, frames.data(), frames.size(), 0, "writing " + tmp);
  if (s.ok() && fsync(fd) != 0) s = ErrnoToStatus(errno, "syncing " + tmp);
  if (s.ok() && std::rename(tmp.c_str(), path_.c_str()) != 0) {
    s = ErrnoToStatus(errno, absl::StrCat("renaming ", tmp, " to ", path_));
  }
  if (!s.ok()) {
    close(fd);
    std::remove(tmp.c_str());
    return s;
  }
  // The new file is in place; fd, opened on it under its old name, now
  // appends to it.
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || fsync(dfd) != 0) {
    // The rename may not be durable yet; either file holds the same state.
    DT_LOG(WARNING) << "syncing " << dir << " after compacting " << path_ << ": "
                    << std::strerror(errno);
  }
  if (dfd >= 0) close(dfd);
  close(fd_);
  fd_ = fd;
  size_ = static_cast<int64_t>(frames.size());
  records_ = static_cast<int64_t>(records.size());
  dirty_tail_ = false;
  return absl::OkStatus();
}

Wal::~Wal() { close(fd_); }

absl::Status Wal::Append(absl::string_view record) {
  std::string frame;
  DT_RETURN_IF_ERROR(Frame(record, &frame));
  return WriteFrames(frame, 1);
}

absl::Status Wal::AppendAll(const std::vector<std::string>& records) {
  std::string frames;
  for (const std::string& r : records) DT_RETURN_IF_ERROR(Frame(r, &frames));
  return WriteFrames(frames, static_cast<int64_t>(records.size()));
}

absl::Status Wal::WriteFrames(const std::string& frames, int64_t count) {
  if (dirty_tail_) {
    if (ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("cutting a torn append off ", path_));
    }
    dirty_tail_ = false;
  }
  absl::Status s = PwriteAll(fd_, frames.data(), frames.size(), static_cast<off_t>(size_),
                             absl::StrCat("appending to ", path_));
  if (s.ok() && fdatasync(fd_) != 0) s = ErrnoToStatus(errno, absl::StrCat("syncing ", path_));
  if (!s.ok()) {
    // Part of the frames may be in the file (or in the page cache, after a
    // failed sync): cut them off so the next append follows the last good
    // frame.
    if (ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      DT_LOG(ERROR) << "cutting a failed append off " << path_ << ": " << std::strerror(errno)
                    << "; retried before the next append";
      dirty_tail_ = true;
    }
    return s;
  }
  size_ += static_cast<int64_t>(frames.size());
  records_ += count;
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace dtrain
