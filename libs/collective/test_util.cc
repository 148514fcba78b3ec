#include "libs/collective/test_util.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace collective {
namespace testing {

float GetElement(DType dtype, const void* buf, size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(buf)[i];
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::kBF16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::kI32:
      return static_cast<float>(static_cast<const int32_t*>(buf)[i]);
    case DType::kI64:
      return static_cast<float>(static_cast<const int64_t*>(buf)[i]);
    case DType::kU8:
      return static_cast<float>(static_cast<const uint8_t*>(buf)[i]);
  }
  return 0;
}

void SetElement(DType dtype, void* buf, size_t i, float value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(buf)[i] = value;
      return;
    case DType::kF16:
      static_cast<uint16_t*>(buf)[i] = FloatToHalf(value);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(buf)[i] = FloatToBFloat16(value);
      return;
    case DType::kI32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(value);
      return;
    case DType::kI64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(value);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(value);
      return;
  }
}

float Base(size_t i) { return static_cast<float>(static_cast<int>((i * 7 + i / 16) % 16) - 4); }

float Contribution(int rank, int size, size_t i) {
  return Base(i) + static_cast<float>(2 * rank - (size - 1));
}

void FillContribution(DType dtype, void* buf, size_t count, int rank, int size, size_t offset) {
  for (size_t i = 0; i < count; ++i)
    SetElement(dtype, buf, i, Contribution(rank, size, i + offset));
}

absl::Status CheckBuffer(DType dtype, const void* buf, size_t count,
                         const std::function<float(size_t)>& expected) {
  size_t bad = 0;
  size_t first = 0;
  float got_first = 0, want_first = 0;
  for (size_t i = 0; i < count; ++i) {
    float got = GetElement(dtype, buf, i);
    float want = expected(i);
    if (got != want) {
      if (bad == 0) {
        first = i;
        got_first = got;
        want_first = want;
      }
      ++bad;
    }
  }
  if (bad == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(bad, " of ", count, " elements wrong; first at ", first,
                                          ": got ", got_first, ", want ", want_first));
}

std::vector<absl::Status> RunThreads(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { results[r] = fn(r); });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::vector<ProcessResult> RunProcesses(
    int n, const std::function<int(int)>& fn, absl::Duration limit,
    const std::function<void(const std::vector<int>&)>& on_started) {
  std::vector<int> pids(n);
  const absl::Time start = absl::Now();
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = fn(r);
      ::_exit(code);
    }
    pids[r] = pid;
  }
  if (on_started) on_started(pids);
  std::vector<ProcessResult> results(n);
  int left = n;
  const absl::Time deadline = start + limit;
  while (left > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] != pid) continue;
        results[r].elapsed = absl::Now() - start;
        if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
        pids[r] = -1;
        --left;
      }
      continue;
    }
    if (absl::Now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] > 0) ::kill(pids[r], SIGKILL);
      }
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  return results;
}

std::string NewTempDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name, "-", ::getpid(), "-",
                                 counter.fetch_add(1));
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::vector<std::string> ShmEntries(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) out.push_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

}  // namespace testing
}  // namespace collective
}  // namespace dtrain
