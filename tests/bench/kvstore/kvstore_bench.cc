// kvstore_bench: push+pull throughput and latency of the kvstore on loopback.
//
//   bazel run //tests/bench/kvstore:kvstore_bench -- --workers=2 --servers=2 --bytes=67108864
//   bazel run //tests/bench/kvstore:kvstore_bench -- --bytes=4096 --keys=1 --steps=2000
//
// Starts --servers kvstore_server processes on 127.0.0.1 (the binary from
// runfiles, or --server_binary) and runs --workers workers as threads of
// this process, each with its own KVClient (own TCP connections). A job with
// SYNC consistency and server-side SGD holds --keys keys of --bytes bytes in
// all (f32); every step each worker push-pulls all keys (one PushPull call:
// the gradients go up, the round's weights come back). After --warmup steps,
// --steps steps are timed. Prints one line:
//
//   kvstore workers=<w> servers=<s> bytes=<b> pushpull_GBps=<x> p50_us=<y> p99_us=<z>
//
// pushpull_GBps = 2 * workers * bytes * steps / wall time / 1e9: all bytes
// moved (pushed and pulled, every worker) per second, comparable to the
// single-stream loopback TCP figure of iperf3 (see compare.sh). p50_us and
// p99_us are percentiles of the duration of one worker's push-pull step.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/kvstore/client.h"
#include "libs/kvstore/malloc_tuning.h"
#include "services/kvstore/testing/server_process.h"

ABSL_FLAG(int, workers, 2, "workers (threads with their own client and connections)");
ABSL_FLAG(int, servers, 2, "kvstore_server processes");
ABSL_FLAG(int64_t, bytes, 64 << 20, "parameter bytes in all (f32)");
ABSL_FLAG(int, keys, 8, "keys the bytes are split into");
ABSL_FLAG(int, steps, 0, "timed steps (0: 20 for >= 1 MiB, else 2000)");
ABSL_FLAG(int, warmup, 0, "untimed steps first (0: steps / 10, at least 2)");
ABSL_FLAG(std::string, optimizer, "sgd", "server-side optimizer: sgd or none");
ABSL_FLAG(std::string, compression, "none", "push compression: none, f16, bf16");
ABSL_FLAG(int64_t, chunk_bytes, 1 << 20, "value bytes per message");
ABSL_FLAG(int64_t, max_message_bytes, 4 << 20, "gRPC message limit (clients and servers)");
ABSL_FLAG(std::string, server_binary, "", "kvstore_server to run (default: from runfiles)");

namespace dtrain {
namespace kvstore {
namespace {

int Run(const char* argv0) {
  const int workers = absl::GetFlag(FLAGS_workers);
  const int servers = absl::GetFlag(FLAGS_servers);
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int keys = absl::GetFlag(FLAGS_keys);
  int steps = absl::GetFlag(FLAGS_steps);
  if (steps <= 0) steps = bytes >= (1 << 20) ? 20 : 2000;
  int warmup = absl::GetFlag(FLAGS_warmup);
  if (warmup <= 0) warmup = std::max(2, steps / 10);
  if (workers < 1 || servers < 1 || keys < 1 || bytes < 4 * keys) {
    std::fprintf(stderr, "kvstore_bench: bad --workers, --servers, --keys or --bytes\n");
    return 2;
  }
  std::string binary = absl::GetFlag(FLAGS_server_binary);
  if (binary.empty()) {
    absl::StatusOr<std::string> found = KVStoreServerBinary(argv0);
    if (!found.ok()) {
      std::fprintf(stderr, "kvstore_bench: %s\n", found.status().ToString().c_str());
      return 1;
    }
    binary = *found;
  }
  std::vector<std::unique_ptr<ServerProcess>> procs;
  std::vector<std::string> addresses;
  for (int i = 0; i < servers; ++i) {
    auto p = std::make_unique<ServerProcess>();
    absl::Status s = p->Start(
        binary, {absl::StrCat("--shard_index=", i), "--snapshot_interval_s=0",
                 absl::StrCat("--max_message_bytes=", absl::GetFlag(FLAGS_max_message_bytes))});
    if (!s.ok()) {
      std::fprintf(stderr, "kvstore_bench: %s\n", s.ToString().c_str());
      return 1;
    }
    addresses.push_back(p->address());
    procs.push_back(std::move(p));
  }

  JobConfig config;
  config.job = "bench";
  config.num_workers = workers;
  config.consistency = Consistency::kSync;
  if (absl::GetFlag(FLAGS_optimizer) == "sgd") {
    config.optimizer = OptimizerKind::kSgd;
    config.learning_rate = 1e-6;  // keeps the weights finite over many steps
  }
  Compression compression = Compression::kNone;
  if (absl::GetFlag(FLAGS_compression) == "f16") compression = Compression::kF16;
  if (absl::GetFlag(FLAGS_compression) == "bf16") compression = Compression::kBF16;

  const int64_t elements = bytes / 4;
  std::vector<int64_t> key_elements;
  for (int k = 0; k < keys; ++k) {
    key_elements.push_back(elements * (k + 1) / keys - elements * k / keys);
  }
  std::vector<std::vector<double>> durations(static_cast<size_t>(workers));
  std::atomic<int> failures{0};
  std::atomic<int> ready{0};
  absl::Time start, end;
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions options;
      options.servers = addresses;
      options.job = config.job;
      options.worker = w;
      options.compression = compression;
      options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
      options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
      auto client = KVClient::Connect(options);
      if (!client.ok() || !(*client)->CreateJob(config).ok()) {
        std::fprintf(stderr, "worker %d: cannot connect or create the job\n", w);
        ++failures;
        return;
      }
      std::vector<std::vector<float>> grads, values;
      std::vector<KeySpec> specs;
      for (int k = 0; k < keys; ++k) {
        grads.emplace_back(static_cast<size_t>(key_elements[k]), 0.001f * (w + 1));
        values.emplace_back(static_cast<size_t>(key_elements[k]), 0.0f);
        specs.push_back({absl::StrCat("param", k), {key_elements[k]}, DType::kF32, nullptr});
      }
      absl::Status s = (*client)->Init(specs);
      if (!s.ok()) {
        std::fprintf(stderr, "worker %d: %s\n", w, s.ToString().c_str());
        ++failures;
        return;
      }
      std::vector<PushPullItem> items;
      for (int k = 0; k < keys; ++k) {
        items.push_back({absl::StrCat("param", k), grads[k].data(), values[k].data()});
      }
      for (int step = 0; step < warmup + steps; ++step) {
        if (step == warmup) {
          // Line up the workers; the last to arrive starts the clock.
          if (++ready == workers) start = absl::Now();
          while (ready.load() < workers) std::this_thread::yield();
        }
        absl::Time t0 = absl::Now();
        s = (*client)->PushPull(items);
        if (!s.ok()) {
          std::fprintf(stderr, "worker %d step %d: %s\n", w, step, s.ToString().c_str());
          ++failures;
          return;
        }
        if (step >= warmup) {
          durations[static_cast<size_t>(w)].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  end = absl::Now();
  if (failures > 0) return 1;
  std::vector<double> all;
  for (const auto& d : durations) all.insert(all.end(), d.begin(), d.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    size_t i = static_cast<size_t>(p * (all.size() - 1) + 0.5);
    return all[std::min(i, all.size() - 1)];
  };
  const double seconds = absl::ToDoubleSeconds(end - start);
  const double moved = 2.0 * workers * static_cast<double>(elements * 4) * steps;
  std::printf(
      "kvstore workers=%d servers=%d bytes=%lld pushpull_GBps=%.3f p50_us=%.0f p99_us=%.0f\n",
      workers, servers, static_cast<long long>(elements * 4), moved / seconds / 1e9, pct(0.50),
      pct(0.99));
  std::fflush(stdout);
  for (auto& p : procs) (void)p->Kill(SIGTERM);
  for (auto& p : procs) (void)p->Wait();
  return 0;
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  dtrain::kvstore::TuneMallocForBulkTransfers();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as kvstore_server does
  return dtrain::kvstore::Run(argv[0]);
}
