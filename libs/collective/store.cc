#include "libs/collective/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/status.h"

namespace dtrain {
namespace collective {
namespace {

absl::StatusOr<int64_t> ParseCounter(absl::string_view key, absl::string_view text) {
  int64_t value = 0;
  if (!text.empty() && !absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key '", key, "' holds '", text, "', not an integer counter"));
  }
  return value;
}

absl::Status MissingKey(absl::string_view key, absl::Duration timeout) {
  return absl::DeadlineExceededError(
      absl::StrCat("store key '", key, "' was not set within ", absl::FormatDuration(timeout)));
}

// Closes a descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// Reads a whole file. NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  FdCloser closer(fd);
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

absl::Status StoreBarrier(Store& store, absl::string_view key, int64_t count,
                          absl::Duration timeout) {
  DT_ASSIGN_OR_RETURN(int64_t arrived, store.Add(key, 1));
  std::string done_key = absl::StrCat(key, "/done");
  if (arrived == count) return store.Set(done_key, "1");
  return store.Get(done_key, timeout).status();
}

// ---------------------------------------------------------------- InMemoryStore

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  values_[std::string(key)] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [this, key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return values_.find(key) != values_.end();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return MissingKey(key, timeout);
  }
  return values_.find(key)->second;
}

absl::StatusOr<int64_t> InMemoryStore::Add(absl::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  std::string& slot = values_[std::string(key)];
  DT_ASSIGN_OR_RETURN(int64_t value, ParseCounter(key, slot));
  value += delta;
  slot = absl::StrCat(value);
  return value;
}

// -------------------------------------------------------------------- FileStore

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {}

absl::Status FileStore::EnsureDirectory() {
  // mkdir -p, tolerating concurrent creators.
  std::string partial;
  for (size_t i = 0; i <= directory_.size(); ++i) {
    if (i == directory_.size() || (directory_[i] == '/' && i > 0)) {
      partial = directory_.substr(0, i);
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoToStatus(errno, absl::StrCat("mkdir ", partial));
      }
    }
  }
  return absl::OkStatus();
}

std::string FileStore::PathFor(absl::string_view key) const {
  std::string name;
  name.reserve(key.size());
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || (c == '.' && !name.empty())) {
      name.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&name, "%%%02X", c);
    }
  }
  if (name.empty()) name = "%";  // the empty key
  return absl::StrCat(directory_, "/", name);
}

absl::Status FileStore::WriteAtomically(const std::string& path, absl::string_view value) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = absl::StrCat(directory_, "/.tmp.", ::getpid(), ".", counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
  size_t written = 0;
  while (written < value.size()) {
    ssize_t n = ::write(fd, value.data() + written, value.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoToStatus(err, absl::StrCat("write ", tmp));
    }
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, absl::StrCat("rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  DT_RETURN_IF_ERROR(EnsureDirectory());
  return WriteAtomically(PathFor(key), value);
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key, absl::Duration timeout) {
  const std::string path = PathFor(key);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  while (true) {
    absl::StatusOr<std::string> value = ReadFile(path);
    if (value.ok() || !absl::IsNotFound(value.status())) return value;
    absl::Time now = absl::Now();
    if (now >= deadline) return MissingKey(key, timeout);
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  DT_RETURN_IF_ERROR(EnsureDirectory());
  const std::string path = PathFor(key);
  // "%l" never occurs in an escaped key name (escapes are %XX in hex).
  const std::string lock_path = absl::StrCat(path, "%lock");
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", lock_path));
  FdCloser closer(fd);  // closing the descriptor also releases the lock
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoToStatus(errno, absl::StrCat("flock ", lock_path));
  }
  absl::StatusOr<std::string> current = ReadFile(path);
  std::string text;
  if (current.ok()) {
    text = *std::move(current);
  } else if (!absl::IsNotFound(current.status())) {
    return current.status();
  }
  DT_ASSIGN_OR_RETURN(int64_t value, ParseCounter(key, text));
  value += delta;
  DT_RETURN_IF_ERROR(WriteAtomically(path, absl::StrCat(value)));
  return value;
}

// ------------------------------------------------------------------ PrefixStore

std::string PrefixStore::Key(absl::string_view key) const { return absl::StrCat(prefix_, key); }

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  return base_->Set(Key(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(absl::string_view key, absl::Duration timeout) {
  return base_->Get(Key(key), timeout);
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  return base_->Add(Key(key), delta);
}

}  // namespace collective
}  // namespace dtrain
