#include "libs/base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
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

}  // namespace dtrain
