// Allreduce bandwidth of Gloo (Debian's libgloo-dev), measured exactly like
// allreduce_bench: ranks as forked processes on this host, rendezvous through
// Gloo's FileStore, Gloo's TCP transport on 127.0.0.1, float32 sum, one
// correctness check, a warm-up and the best of --rounds timed rounds per size.
//
//   bazel run //libs/collective/bench:gloo_allreduce_bench -- --ranks=2
//
// Prints, per size and algorithm,
//
//   allreduce ranks=2 transport=gloo_tcp bytes=... time_us=... algbw_GBps=... busbw_GBps=...
//   algo=ring
//
// with algo one of
//   ring          gloo::allreduce() with Algorithm::RING (what PyTorch's
//                 ProcessGroupGloo runs for dense CPU tensors);
//   ring_chunked  gloo::AllreduceRingChunked;
//   ring_legacy   gloo::AllreduceRing (whole buffer around the ring);
//   hd            gloo::AllreduceHalvingDoubling;
// and finally
//   summary ranks=2 bytes=<max> gloo_ring_busbw_GBps=... gloo_best_busbw_GBps=... (best algo)
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libs/collective/bench/bench_util.h"

ABSL_FLAG(int, ranks, 2, "processes to run");
ABSL_FLAG(std::string, algos, "ring,ring_chunked,ring_legacy,hd", "Gloo algorithms to run");
ABSL_FLAG(int64_t, min_bytes, 4096, "smallest message");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "largest message");
ABSL_FLAG(int, rounds, 5, "timed rounds per size; the best is reported");

namespace {

using Clock = std::chrono::steady_clock;
namespace bench = dtrain::collective::bench;

// One allreduce of `count` floats at `data`, for the chosen algorithm.
class Runner {
 public:
  Runner(const std::string& algo, std::shared_ptr<gloo::Context> context, float* data, size_t count)
      : algo_(algo), context_(std::move(context)), data_(data), count_(count) {
    const std::vector<float*> ptrs = {data};
    if (algo == "ring_chunked") {
      legacy_ = std::make_unique<gloo::AllreduceRingChunked<float>>(context_, ptrs, count);
    } else if (algo == "ring_legacy") {
      legacy_ = std::make_unique<gloo::AllreduceRing<float>>(context_, ptrs, count);
    } else if (algo == "hd") {
      legacy_ = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context_, ptrs, count);
    }
  }

  void Run() {
    if (legacy_) {
      legacy_->run();
      return;
    }
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data_, count_);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
  }

 private:
  std::string algo_;
  std::shared_ptr<gloo::Context> context_;
  float* data_;
  size_t count_;
  std::unique_ptr<gloo::Algorithm> legacy_;
  uint32_t tag_ = 0;
};

void Barrier(const std::shared_ptr<gloo::Context>& context) {
  gloo::BarrierOptions opts(context);
  gloo::barrier(opts);
}

int RunRank(int rank, int ranks, const std::string& algo, const std::string& dir) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(dir);
    gloo::rendezvous::PrefixStore store(algo, file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
    context->setTimeout(std::chrono::seconds(120));
    context->connectFullMesh(store, device);

    const size_t max_bytes = absl::GetFlag(FLAGS_max_bytes);
    std::vector<float> buf(max_bytes / sizeof(float));
    double last_busbw = 0;
    for (size_t bytes : bench::Sizes(absl::GetFlag(FLAGS_min_bytes), max_bytes)) {
      const size_t count = bytes / sizeof(float);
      Runner runner(algo, context, buf.data(), count);
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((i % 13) + rank);
      runner.Run();
      for (size_t i = 0; i < count; ++i) {
        float want = static_cast<float>(ranks * (i % 13) + ranks * (ranks - 1) / 2);
        if (buf[i] != want) {
          std::fprintf(stderr, "gloo %s rank %d: wrong sum at %zu\n", algo.c_str(), rank, i);
          return 1;
        }
      }
      for (size_t i = 0; i < count; ++i) buf[i] = 1e-3f * static_cast<float>(rank + 1);
      const int iters = bench::Iterations(bytes);
      for (int i = 0; i < std::min(iters, 3); ++i) runner.Run();
      double best = 1e30;
      for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
        Barrier(context);
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) runner.Run();
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / iters);
      }
      if (rank == 0) last_busbw = bench::Report(ranks, "gloo_tcp", bytes, best, algo);
    }
    if (rank == 0) std::ofstream(dir + "/result." + algo) << last_busbw;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo %s rank %d: %s\n", algo.c_str(), rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  std::string summary =
      absl::StrCat("summary ranks=", ranks, " bytes=", absl::GetFlag(FLAGS_max_bytes));
  double best = 0;
  std::string best_algo;
  bool ok = true;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_algos), ',')) {
    const std::string algo(name);
    const std::string dir = bench::MakeTempDir("gloo_bench");
    if (!bench::ForkRanks(ranks, [&](int rank) { return RunRank(rank, ranks, algo, dir); })) {
      ok = false;
    }
    std::ifstream in(dir + "/result." + algo);
    double busbw = 0;
    in >> busbw;
    absl::StrAppend(&summary, " gloo_", algo, "_busbw_GBps=", absl::StrFormat("%.3f", busbw));
    if (busbw > best) {
      best = busbw;
      best_algo = algo;
    }
    bench::RemoveTree(dir);
  }
  absl::StrAppend(&summary, " gloo_best_busbw_GBps=", absl::StrFormat("%.3f", best),
                  " gloo_best_algo=", best_algo);
  std::printf("%s\n", summary.c_str());
  return ok ? 0 : 1;
}
