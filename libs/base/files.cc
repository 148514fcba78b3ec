#include "libs/base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/base/status.h"

namespace dtrain {
namespace {

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return ErrnoToStatus(err, absl::StrCat("cannot read ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  if (path.empty()) return absl::InvalidArgumentError("WriteFileAtomically: empty path");
  // mkstemp: a unique name even when several processes write the same path.
  std::string tmp = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0)
    return ErrnoToStatus(errno, absl::StrCat("cannot create a temporary file for ", path));
  // Others read port files and cluster descriptions: 0644, not mkstemp's
  // 0600 (umask(2) cannot be read without changing it for every thread).
  fchmod(fd, 0644);
  auto fail = [&](absl::string_view step) {
    const int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return ErrnoToStatus(err, absl::StrCat("cannot write ", path, " (", step, " ", tmp, ")"));
  };
  absl::string_view data = contents;
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  if (fsync(fd) != 0) return fail("fsync");
  if (close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, absl::StrCat("cannot write ", path, " (close ", tmp, ")"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  // The rename is durable once the directory is.
  const int dir = open(DirName(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
  return absl::OkStatus();
}

absl::Status EnsurePrivateDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat("mkdir ", dir, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
      (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", dir, "' is not a private directory of this uid"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PrivateRuntimeDir(absl::string_view name) {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  std::string dir = runtime != nullptr && runtime[0] == '/'
                        ? absl::StrCat(runtime, "/", name)
                        : absl::StrCat("/tmp/", name, "-", getuid());
  DT_RETURN_IF_ERROR(EnsurePrivateDir(dir));
  return dir;
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

}  // namespace dtrain
