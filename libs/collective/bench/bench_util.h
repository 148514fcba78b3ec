// Shared by the allreduce benchmarks: sizes, iteration counts, the
// nccl-tests style report line, and forking ranks.
//
// Definitions (nccl-tests): algbw = bytes / time; allreduce busbw =
// algbw * 2(n-1)/n, the bandwidth each rank's link would need if the
// algorithm were the ideal ring. GB is 1e9 bytes.
#ifndef DTRAIN_LIBS_COLLECTIVE_BENCH_BENCH_UTIL_H_
#define DTRAIN_LIBS_COLLECTIVE_BENCH_BENCH_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace dtrain {
namespace collective {
namespace bench {

// Powers of two from min_bytes to max_bytes.
inline std::vector<size_t> Sizes(size_t min_bytes, size_t max_bytes) {
  std::vector<size_t> out;
  for (size_t b = min_bytes; b <= max_bytes; b *= 2) out.push_back(b);
  return out;
}

// Iterations per timed round: about 32 MiB of payload, 5 to 200.
inline int Iterations(size_t bytes) {
  size_t iters = (size_t{32} << 20) / std::max<size_t>(bytes, 1);
  if (iters < 5) iters = 5;
  if (iters > 200) iters = 200;
  return static_cast<int>(iters);
}

inline double BusBandwidth(double algbw, int ranks) {
  return ranks > 1 ? algbw * 2.0 * (ranks - 1) / ranks : algbw;
}

// Prints the report line; returns busbw in GB/s.
inline double Report(int ranks, const std::string& transport, size_t bytes, double seconds,
                     const std::string& algo) {
  const double algbw = bytes / seconds / 1e9;
  const double busbw = BusBandwidth(algbw, ranks);
  std::printf(
      "allreduce ranks=%d transport=%s bytes=%zu time_us=%.1f algbw_GBps=%.3f busbw_GBps=%.3f "
      "algo=%s\n",
      ranks, transport.c_str(), bytes, seconds * 1e6, algbw, busbw, algo.c_str());
  std::fflush(stdout);
  return busbw;
}

// Forks `n` children running fn(rank) (its result is the exit status) and
// waits for them. Returns true if all exited with 0.
inline bool ForkRanks(int n, const std::function<int(int)>& fn) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = fn(r);
      std::fflush(stdout);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

// A fresh temporary directory.
inline std::string MakeTempDir(const char* name) {
  std::string tmpl = std::string("/tmp/") + name + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  return std::string(buf.data());
}

inline void RemoveTree(const std::string& dir) {
  std::string cmd = "rm -rf '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
}

}  // namespace bench
}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_BENCH_BENCH_UTIL_H_
