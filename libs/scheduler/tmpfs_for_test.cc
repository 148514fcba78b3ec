#include "libs/scheduler/tmpfs_for_test.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"

namespace dtrain {
namespace scheduler {

absl::StatusOr<std::string> MountSmallTmpfs(const std::string& name, int64_t bytes) {
  static bool unshared = false;
  if (!unshared) {
    if (unshare(CLONE_NEWNS) != 0) {
      return ErrnoToStatus(errno, "unshare(CLONE_NEWNS) for a test tmpfs (needs CAP_SYS_ADMIN)");
    }
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      return ErrnoToStatus(errno, "making mounts private for a test tmpfs");
    }
    unshared = true;
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating ", dir));
  }
  const std::string opts = absl::StrCat("size=", bytes);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("mount -t tmpfs -o ", opts, " tmpfs ", dir));
  }
  return dir;
}

absl::StatusOr<int64_t> FillDisk(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", path));
  char block[512];
  std::memset(block, 'f', sizeof(block));
  int64_t total = 0;
  // Small writes, then single bytes, so every last free byte is taken.
  for (size_t n : {sizeof(block), size_t{1}}) {
    while (true) {
      ssize_t w = write(fd, block, n);
      if (w > 0) {
        total += w;
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno != ENOSPC) {
        absl::Status s = ErrnoToStatus(errno, absl::StrCat("writing ", path));
        close(fd);
        return s;
      }
      break;
    }
  }
  close(fd);
  return total;
}

}  // namespace scheduler
}  // namespace dtrain
