// Test helpers for a real full disk: a small tmpfs mounted in a mount
// namespace of the test process's own, and a file that fills it.
//
//   absl::StatusOr<std::string> dir = MountSmallTmpfs("wal", 64 << 10);
//   ASSERT_TRUE(dir.ok()) << dir.status();   // fails loudly, never skips
//   absl::StatusOr<int64_t> n = FillDisk(*dir + "/filler");   // now ENOSPC
//   std::remove((*dir + "/filler").c_str());                  // space again
//
// The first call moves the calling thread (call it from the test's main
// thread before starting other threads) into a new mount namespace
// (unshare(CLONE_NEWNS), mounts made private), so the tmpfs is invisible
// outside the test and disappears with it; child processes started
// afterwards see it. Needs CAP_SYS_ADMIN (root, as the tests run here).
#ifndef DTRAIN_LIBS_SCHEDULER_TMPFS_FOR_TEST_H_
#define DTRAIN_LIBS_SCHEDULER_TMPFS_FOR_TEST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dtrain {
namespace scheduler {

// Mounts a tmpfs of `bytes` at $TEST_TMPDIR/<name> (created) and returns
// that directory. Errors name the failing call and the OS error.
absl::StatusOr<std::string> MountSmallTmpfs(const std::string& name, int64_t bytes);

// Writes `path` until the filesystem is full (ENOSPC); returns the bytes
// written. Other write errors are returned.
absl::StatusOr<int64_t> FillDisk(const std::string& path);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_TMPFS_FOR_TEST_H_
