// Test helpers: deterministic rank data with exact sums, running ranks as
// threads or as forked processes.
#ifndef DTRAIN_LIBS_COLLECTIVE_TEST_UTIL_H_
#define DTRAIN_LIBS_COLLECTIVE_TEST_UTIL_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "libs/tensor/dtype.h"

namespace dtrain {
namespace collective {
namespace testing {

// Element i of a buffer of `dtype`, as float (and back).
float GetElement(DType dtype, const void* buf, size_t i);
void SetElement(DType dtype, void* buf, size_t i, float value);

// The value rank `rank` of `size` contributes at element i: small integers
// chosen so that every partial sum is exact even in bf16 and the sum over all
// ranks is size * Base(i), making the average exactly Base(i).
float Base(size_t i);
float Contribution(int rank, int size, size_t i);

// Fills `buf` with Contribution(rank, size, i + offset).
void FillContribution(DType dtype, void* buf, size_t count, int rank, int size, size_t offset = 0);

// Compares buf[i] with expected(i) for all i; on mismatch returns an error
// naming the first bad index and the number of bad elements.
absl::Status CheckBuffer(DType dtype, const void* buf, size_t count,
                         const std::function<float(size_t)>& expected);

// Runs fn(rank) for rank in [0, n) on n threads; returns their results.
std::vector<absl::Status> RunThreads(int n, const std::function<absl::Status(int)>& fn);

// The outcome of one forked rank.
struct ProcessResult {
  int exit_code = -1;  // when it exited normally
  int signal = 0;      // when a signal ended it
  absl::Duration elapsed;
};

// Forks n children running fn(rank) (its return value is the exit code) and
// waits for all, killing any still running after `limit`. `on_started`, if
// given, runs in the parent with the children's pids before waiting.
std::vector<ProcessResult> RunProcesses(
    int n, const std::function<int(int)>& fn, absl::Duration limit,
    const std::function<void(const std::vector<int>&)>& on_started = nullptr);

// A fresh directory under TEST_TMPDIR (or /tmp).
std::string NewTempDir(const std::string& name);

// Names of entries in /dev/shm starting with `prefix`. Other tests running
// beside this one make and remove their own "dtrain-" segments: to check
// what a job left, ask for "dtrain-<its job id>" (ShmTransport's names).
std::vector<std::string> ShmEntries(const std::string& prefix = "dtrain-");

}  // namespace testing
}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_TEST_UTIL_H_
