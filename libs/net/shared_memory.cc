#include "libs/net/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/status.h"

namespace dtrain {
namespace net {
namespace {

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

}  // namespace

SharedMemory::SharedMemory(SharedMemory&& other) noexcept { *this = std::move(other); }

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
    other.name_.clear();
  }
  return *this;
}

SharedMemory::~SharedMemory() { Release(); }

void SharedMemory::Release() {
  Unlink();
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

void SharedMemory::Unlink() {
  if (name_.empty()) return;
  shm_unlink(name_.c_str());
  name_.clear();
}

absl::StatusOr<SharedMemory> SharedMemory::CreateSealed(const char* name, uint64_t bytes) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::UnavailableError(Errno("memfd_create"));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    std::string error = Errno("sizing the segment");
    close(fd);
    return absl::UnavailableError(error);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    std::string error = Errno("mmap");
    close(fd);
    return absl::UnavailableError(error);
  }
  SharedMemory m;
  m.data_ = static_cast<char*>(p);
  m.size_ = bytes;
  m.fd_ = fd;
  return m;
}

absl::StatusOr<SharedMemory> SharedMemory::MapSealed(int fd, int64_t max_bytes) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    close(fd);
    return absl::InvalidArgumentError(
        "the shared-memory segment is not a memfd sealed with F_SEAL_SHRINK (a shrink would "
        "fault the server)");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size > max_bytes) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory segment of ", st.st_size, " bytes (1 to ", max_bytes, ")"));
  }
  void* p =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return absl::InvalidArgumentError(Errno("mmap of segment"));
  SharedMemory m;
  m.data_ = static_cast<char*>(p);
  m.size_ = static_cast<uint64_t>(st.st_size);
  return m;
}

absl::StatusOr<SharedMemory> SharedMemory::CreateNamed(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("shm_open(create) ", name));
  SharedMemory m;
  m.name_ = name;  // unlinked from here on if anything fails
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("ftruncate ", name));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return ErrnoToStatus(err, absl::StrCat("mmap ", name));
  m.data_ = static_cast<char*>(p);
  m.size_ = bytes;
  return m;
}

absl::StatusOr<SharedMemory> SharedMemory::OpenNamed(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("shm_open ", name));
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory segment ", name, " has an unexpected size"));
  }
  // Only segments our own user made, readable by nobody else: another user
  // who guessed the name cannot plant one for us to map.
  if (st.st_uid != ::geteuid() || (st.st_mode & 0077) != 0) {
    ::close(fd);
    return absl::PermissionDeniedError(
        absl::StrCat("shared-memory segment ", name, " belongs to uid ", st.st_uid, " with mode ",
                     absl::StrFormat("%o", st.st_mode & 0777), "; this process (uid ", ::geteuid(),
                     ") maps only its own user's 0600 segments"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return ErrnoToStatus(err, absl::StrCat("mmap ", name));
  SharedMemory m;
  m.data_ = static_cast<char*>(p);
  m.size_ = bytes;
  return m;
}

}  // namespace net
}  // namespace dtrain
