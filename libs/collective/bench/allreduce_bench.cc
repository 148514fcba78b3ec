// Allreduce bandwidth of libs/collective, ranks as processes on this host.
//
//   bazel run //libs/collective/bench:allreduce_bench -- --ranks=2 --transports=tcp,shm
//
// For each transport the program forks --ranks processes that meet through a
// FileStore in a temporary directory (TCP on 127.0.0.1). For each message
// size (powers of two, --min_bytes to --max_bytes) the ranks check one
// allreduce for exact results, run a warm-up, then --rounds timed rounds of
// back-to-back float32 sum allreduces, each round preceded by a barrier.
// Rank 0 reports the best round, one line per size:
//
//   allreduce ranks=2 transport=tcp bytes=67108864 time_us=... algbw_GBps=... busbw_GBps=...
//   algo=ring
//
// and the parent ends with
//
//   summary ranks=2 bytes=<max> tcp_busbw_GBps=... shm_busbw_GBps=...
//
// (`tcp_tls`: TCP with collective TLS, TcpOptions::tls; with both tcp and
// tcp_tls the summary adds tls_over_tcp_busbw_ratio at the largest size.)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libs/collective/bench/bench_util.h"
#include "libs/collective/communicator.h"
#include "libs/collective/reduce.h"

ABSL_FLAG(int, ranks, 2, "processes to run");
ABSL_FLAG(std::string, transports, "tcp,shm",
          "comma-separated: tcp, tcp_tls (TCP with collective TLS), shm");
ABSL_FLAG(int64_t, min_bytes, 4096, "smallest message");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "largest message");
ABSL_FLAG(int, rounds, 5, "timed rounds per size; the best is reported");
ABSL_FLAG(std::string, algorithm, "auto", "auto, ring, bidir_ring, hd, rd");
ABSL_FLAG(std::string, large_algorithm, "ring", "algorithm for large messages under auto");
ABSL_FLAG(int64_t, chunk_bytes, 0, "pipeline chunk (0: library default)");
ABSL_FLAG(int64_t, shm_ring_bytes, 0, "shared-memory ring size (0: library default)");
ABSL_FLAG(int, tcp_socket_buffer, -1, "SO_SNDBUF/SO_RCVBUF (-1: library default, 0: auto-tuning)");

namespace dtrain {
namespace collective {
namespace {

using Clock = std::chrono::steady_clock;

int RunRank(int rank, int ranks, TransportKind transport, bool tls, const std::string& label,
            const std::string& dir) {
  CommunicatorOptions options;
  options.transport = transport;
  options.timeout = absl::Seconds(120);
  options.tcp.host = "127.0.0.1";
  options.tcp.secret = "allreduce_bench attempt secret";
  options.tcp.tls = tls;
  auto algorithm = ParseAlgorithm(absl::GetFlag(FLAGS_algorithm));
  auto large = ParseAlgorithm(absl::GetFlag(FLAGS_large_algorithm));
  if (!algorithm.ok() || !large.ok()) {
    std::fprintf(stderr, "bad --algorithm or --large_algorithm\n");
    return 2;
  }
  options.algorithm = *algorithm;
  options.large_algorithm = *large;
  if (absl::GetFlag(FLAGS_chunk_bytes) > 0) options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (absl::GetFlag(FLAGS_shm_ring_bytes) > 0) {
    options.shm.ring_bytes = absl::GetFlag(FLAGS_shm_ring_bytes);
  }
  if (absl::GetFlag(FLAGS_tcp_socket_buffer) >= 0) {
    options.tcp.socket_buffer_bytes = absl::GetFlag(FLAGS_tcp_socket_buffer);
  }
  FileStore store(dir);
  auto comm = Communicator::Create(rank, ranks, &store, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 1;
  }
  const size_t max_bytes = absl::GetFlag(FLAGS_max_bytes);
  std::vector<float> buf(max_bytes / sizeof(float));
  double last_busbw = 0;
  for (size_t bytes : bench::Sizes(absl::GetFlag(FLAGS_min_bytes), max_bytes)) {
    const size_t count = bytes / sizeof(float);
    // Correctness first: integers, so the sum is exact.
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((i % 13) + rank);
    absl::Status s = (*comm)->Allreduce(buf.data(), count, DType::kF32);
    for (size_t i = 0; s.ok() && i < count; ++i) {
      float want = static_cast<float>(ranks * (i % 13) + ranks * (ranks - 1) / 2);
      if (buf[i] != want) s = absl::InternalError(absl::StrCat("wrong sum at ", i));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      return 1;
    }
    for (size_t i = 0; i < count; ++i) buf[i] = 1e-3f * static_cast<float>(rank + 1);
    const int iters = bench::Iterations(bytes);
    for (int i = 0; i < std::min(iters, 3); ++i)
      s.Update((*comm)->Allreduce(buf.data(), count, DType::kF32));
    double best = 1e30;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds) && s.ok(); ++round) {
      s.Update((*comm)->Barrier());
      auto t0 = Clock::now();
      for (int i = 0; i < iters && s.ok(); ++i) {
        s.Update((*comm)->Allreduce(buf.data(), count, DType::kF32));
      }
      double seconds = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      best = std::min(best, seconds);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      return 1;
    }
    if (rank == 0) {
      last_busbw = bench::Report(ranks, label, bytes, best,
                                 AlgorithmName((*comm)->AllreduceAlgorithmFor(bytes)));
    }
  }
  if (rank == 0) {
    std::ofstream(dir + "/result") << last_busbw;
  }
  return 0;
}

}  // namespace
}  // namespace collective
}  // namespace dtrain

int main(int argc, char** argv) {
  using namespace dtrain::collective;
  absl::ParseCommandLine(argc, argv);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  std::string summary =
      absl::StrCat("summary ranks=", ranks, " bytes=", absl::GetFlag(FLAGS_max_bytes),
                   " reduce_kernels=", UsingVectorKernels() ? "avx2+f16c" : "portable");
  bool ok = true;
  double tcp_busbw = 0, tls_busbw = 0;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_transports), ',')) {
    const bool tls = name == "tcp_tls";
    auto transport = ParseTransportKind(tls ? "tcp" : name);
    if (!transport.ok() || *transport == TransportKind::kInProcess) {
      std::fprintf(stderr, "bad transport '%s' (use tcp, tcp_tls or shm)\n",
                   std::string(name).c_str());
      return 2;
    }
    const std::string dir = bench::MakeTempDir("allreduce_bench");
    const std::string label(name);
    if (!bench::ForkRanks(
            ranks, [&](int rank) { return RunRank(rank, ranks, *transport, tls, label, dir); })) {
      std::fprintf(stderr, "%s: a rank failed\n", std::string(name).c_str());
      ok = false;
    }
    std::ifstream in(dir + "/result");
    double busbw = 0;
    in >> busbw;
    absl::StrAppend(&summary, " ", name, "_busbw_GBps=", absl::StrFormat("%.3f", busbw));
    if (name == "tcp") tcp_busbw = busbw;
    if (tls) tls_busbw = busbw;
    bench::RemoveTree(dir);
  }
  if (tcp_busbw > 0 && tls_busbw > 0) {
    absl::StrAppend(&summary,
                    " tls_over_tcp_busbw_ratio=", absl::StrFormat("%.3f", tls_busbw / tcp_busbw));
  }
  std::printf("%s\n", summary.c_str());
  return ok ? 0 : 1;
}
