// kvstore_bench: push+pull throughput and latency of the kvstore on loopback.
//
//   bazel run //tests/bench/kvstore:kvstore_bench -- --workers=2 --servers=2 --bytes=67108864
//   bazel run //tests/bench/kvstore:kvstore_bench -- --bytes=4096 --keys=1 --steps=2000
//
// Every connection is mutual TLS unless --notls (the configuration a user
// gets: a CA and certificates made for the run in a temporary directory; the
// bench calls as the cluster's admin identity, so no per-job token is sent).
// Starts --servers kvstore_server processes on 127.0.0.1 (the binary from
// runfiles, or --server_binary) and runs --workers workers as threads of
// this process, each with its own KVClient (own TCP connections). A job with
// SYNC consistency and server-side SGD holds --keys keys of --bytes bytes in
// all (f32); every step each worker push-pulls all keys (one PushPull call:
// the gradients go up, the round's weights come back). After --warmup steps,
// --steps steps are timed. Prints one line per --replicas value:
//
//   kvstore workers=<w> servers=<s> replicas=<r> bytes=<b> keys=<k> tls=<on|off>
//           callback=<on|off> data_path=<auto|tcp|grpc> reply_spin_us=<n> shards_per_round=<n>
//           pushpull_GBps=<x> p50_us=<y> p99_us=<z> compression=<c> answer_at_tail=<0|1>
//           replica_spin_us=<n>
//
// --data_path picks the clients' data path (ClientOptions.data_path): auto
// (the default: the shards' data port over their Unix sockets and shared
// memory, since the workers run on the shards' host), tcp (the data port
// over TCP, mutual TLS unless --notls), grpc (KVStoreData over gRPC).
// --reply_spin_us is ClientOptions.reply_spin (0 shows what polling for
// replies saves). shards_per_round is how many shards one worker's round
// touches: keys under --colocate_below_bytes live on the job's home shard
// (placement.h), so the 4 KiB shapes use one shard whatever --keys is, and
// --colocate_below_bytes=0 spreads them over the shards by name.
//
// With --replicas=1,2 (the default) every shard also runs as a chain of 2
// replicas (a scheduler_server owns the shard map), the same workload again,
// and a last line gives the cost of replication in the same run:
//
//   kvstore_replication replicas=2 p50_ratio=<p50 r2 / p50 r1> GBps_ratio=<r2 / r1>
//
// pushpull_GBps = 2 * workers * bytes * steps / wall time / 1e9: all bytes
// moved (pushed and pulled, every worker) per second, comparable to the
// single-stream loopback TCP figure of iperf3 (see compare.sh). p50_us and
// p99_us are percentiles of the duration of one worker's push-pull step.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/base/status.h"
#include "libs/kvstore/client.h"
#include "libs/kvstore/malloc_tuning.h"
#include "libs/rpc/credentials.h"
#include "libs/security/certs.h"
#include "protos/replication.grpc.pb.h"
#include "services/kvstore/testing/server_process.h"

ABSL_FLAG(int, workers, 2, "workers (threads with their own client and connections)");
ABSL_FLAG(int, servers, 2, "kvstore shards");
ABSL_FLAG(std::string, replicas, "1,2",
          "replicas per shard, one run each (comma-separated; > 1 starts a scheduler_server to "
          "own the shard map)");
ABSL_FLAG(int64_t, bytes, 64 << 20, "parameter bytes in all (f32)");
ABSL_FLAG(int, keys, 8, "keys the bytes are split into");
ABSL_FLAG(int64_t, colocate_below_bytes, dtrain::kvstore::PlacementOptions().colocate_below_bytes,
          "keys of fewer bytes live on the job's home shard (PlacementOptions; 0: every key is "
          "placed by its own name, so small keys spread over the shards)");
ABSL_FLAG(int, steps, 0, "timed steps (0: 20 for >= 1 MiB, else 2000)");
ABSL_FLAG(int, warmup, 0, "untimed steps first (0: steps / 10, at least 2)");
ABSL_FLAG(std::string, optimizer, "sgd", "server-side optimizer: sgd or none");
ABSL_FLAG(std::string, compression, "none",
          "push compression: none, f16, bf16, topk or topk:<ratio> (as trainctl's "
          "--gradient_compression)");
ABSL_FLAG(int64_t, chunk_bytes, 1 << 20, "value bytes per message");
ABSL_FLAG(int64_t, max_message_bytes, 4 << 20, "gRPC message limit (clients and servers)");
ABSL_FLAG(bool, tls, true,
          "mutual TLS on every connection (certificates made for the run); --notls: plain text");
ABSL_FLAG(bool, callback_data, false,
          "the servers serve small pushes and pulls on gRPC's callback API (--callback_data)");
ABSL_FLAG(std::string, data_path, "auto",
          "how pushes and pulls travel (ClientOptions.data_path): auto (the data port, Unix socket "
          "and shared memory on this host), tcp (the data port over TCP, TLS unless --notls), "
          "grpc");
ABSL_FLAG(int, replica_spin_us, 0, "the servers' --replica_spin_us");
ABSL_FLAG(int, replica_round_hold_us, 2000, "the servers' --replica_round_hold_us");
ABSL_FLAG(
    int, reply_spin_us, 0,
    "how long a worker polls for a data port reply before sleeping (ClientOptions.reply_spin; "
    "0: sleep at once)");
ABSL_FLAG(bool, answer_at_tail, true,
          "with replicas, the chain's tail answers the push-pulls (ClientOptions.answer_at_tail)");
ABSL_FLAG(std::string, server_binary, "", "kvstore_server to run (default: from runfiles)");

namespace dtrain {
namespace kvstore {
namespace {

struct Result {
  double gbps = 0, p50 = 0, p99 = 0;
};

absl::StatusOr<Result> RunOnce(const char* argv0, int replicas) {
  const int workers = absl::GetFlag(FLAGS_workers);
  const int servers = absl::GetFlag(FLAGS_servers);
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int keys = absl::GetFlag(FLAGS_keys);
  int steps = absl::GetFlag(FLAGS_steps);
  if (steps <= 0) steps = bytes >= (1 << 20) ? 20 : 2000;
  int warmup = absl::GetFlag(FLAGS_warmup);
  if (warmup <= 0) warmup = std::max(2, steps / 10);
  std::string binary = absl::GetFlag(FLAGS_server_binary);
  if (binary.empty()) {
    DT_ASSIGN_OR_RETURN(binary, KVStoreServerBinary(argv0));
  }
  std::vector<std::unique_ptr<ServerProcess>> procs;
  std::vector<std::string> addresses;
  std::string scheduler;
  if (replicas > 1) {
    DT_ASSIGN_OR_RETURN(std::string scheduler_binary,
                        RunfilesBinary("services/scheduler/scheduler_server", argv0));
    auto p = std::make_unique<ServerProcess>();
    DT_RETURN_IF_ERROR(p->Start(scheduler_binary, {}));
    scheduler = p->address();
    procs.push_back(std::move(p));
  }
  for (int i = 0; i < servers; ++i) {
    for (int j = 0; j < replicas; ++j) {
      auto p = std::make_unique<ServerProcess>();
      std::vector<std::string> flags = {
          absl::StrCat("--shard_index=", i), "--snapshot_interval_s=0",
          absl::StrCat("--max_message_bytes=", absl::GetFlag(FLAGS_max_message_bytes))};
      flags.push_back(absl::StrCat("--callback_data=", absl::GetFlag(FLAGS_callback_data)));
      flags.push_back(absl::StrCat("--replica_spin_us=", absl::GetFlag(FLAGS_replica_spin_us)));
      flags.push_back(
          absl::StrCat("--replica_round_hold_us=", absl::GetFlag(FLAGS_replica_round_hold_us)));
      if (replicas > 1) {
        flags.push_back("--scheduler=" + scheduler);
        flags.push_back(absl::StrCat("--replica_index=", j));
        flags.push_back(absl::StrCat("--num_shards=", servers));
      }
      DT_RETURN_IF_ERROR(p->Start(binary, flags));
      addresses.push_back(p->address());
      procs.push_back(std::move(p));
    }
  }
  if (replicas > 1) {
    // Until every chain has all its replicas ACTIVE.
    auto stub = v1::Replica::NewStub(dtrain::rpc::NewChannel(addresses[0]));
    for (absl::Time end = absl::Now() + absl::Seconds(30);;
         absl::SleepFor(absl::Milliseconds(50))) {
      grpc::ClientContext ctx;
      v1::ShardMap map;
      int active = 0;
      if (stub->GetShardMap(&ctx, v1::GetShardMapRequest(), &map).ok()) {
        for (const v1::Chain& c : map.chains()) {
          for (const v1::ChainMember& m : c.members()) active += m.state() == v1::REPLICA_ACTIVE;
        }
      }
      if (active == servers * replicas) break;
      if (absl::Now() > end) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the shard map has ", active, " ACTIVE replicas after 30 s, not ", servers * replicas));
      }
    }
  }

  JobConfig config;
  config.job = "bench";
  config.num_workers = workers;
  config.consistency = Consistency::kSync;
  if (absl::GetFlag(FLAGS_optimizer) == "sgd") {
    config.optimizer = OptimizerKind::kSgd;
    config.learning_rate = 1e-6;  // keeps the weights finite over many steps
  }
  absl::StatusOr<CompressionSpec> compression = ParseCompression(absl::GetFlag(FLAGS_compression));
  if (!compression.ok()) return Annotate(compression.status(), "--compression");

  const int64_t elements = bytes / 4;
  std::vector<int64_t> key_elements;
  for (int k = 0; k < keys; ++k) {
    key_elements.push_back(elements * (k + 1) / keys - elements * k / keys);
  }
  std::vector<std::vector<double>> durations(static_cast<size_t>(workers));
  std::atomic<int> failures{0};
  std::atomic<int> shards_per_round{0};  // shards one worker's round touches
  std::atomic<int> ready{0};
  absl::Time start, end;
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions options;
      options.servers = addresses;
      options.replicas = replicas;
      options.job = config.job;
      options.worker = w;
      options.compression = *compression;
      options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
      options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
      options.data_path = *ParseDataPath(absl::GetFlag(FLAGS_data_path));
      options.reply_spin = absl::Microseconds(absl::GetFlag(FLAGS_reply_spin_us));
      options.answer_at_tail = absl::GetFlag(FLAGS_answer_at_tail);
      options.placement.colocate_below_bytes = absl::GetFlag(FLAGS_colocate_below_bytes);
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
      std::set<int> touched;
      for (int k = 0; k < keys; ++k) {
        items.push_back({absl::StrCat("param", k), grads[k].data(), values[k].data()});
        absl::StatusOr<std::vector<PlacedSlice>> placed = (*client)->Placement(items.back().key);
        if (!placed.ok()) {
          std::fprintf(stderr, "worker %d: %s\n", w, placed.status().ToString().c_str());
          ++failures;
          return;
        }
        for (const PlacedSlice& p : *placed) touched.insert(p.server);
      }
      if (w == 0) shards_per_round = static_cast<int>(touched.size());
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
  if (failures > 0) return absl::InternalError("a worker failed");
  std::vector<double> all;
  for (const auto& d : durations) all.insert(all.end(), d.begin(), d.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    size_t i = static_cast<size_t>(p * (all.size() - 1) + 0.5);
    return all[std::min(i, all.size() - 1)];
  };
  const double seconds = absl::ToDoubleSeconds(end - start);
  const double moved = 2.0 * workers * static_cast<double>(elements * 4) * steps;
  Result result{moved / seconds / 1e9, pct(0.50), pct(0.99)};
  std::printf(
      "kvstore workers=%d servers=%d replicas=%d bytes=%lld keys=%d tls=%s callback=%s "
      "data_path=%s reply_spin_us=%d shards_per_round=%d pushpull_GBps=%.3f p50_us=%.0f "
      "p99_us=%.0f compression=%s answer_at_tail=%d replica_spin_us=%d\n",
      workers, servers, replicas, static_cast<long long>(elements * 4), keys,
      absl::GetFlag(FLAGS_tls) ? "on" : "off", absl::GetFlag(FLAGS_callback_data) ? "on" : "off",
      absl::GetFlag(FLAGS_data_path).c_str(), absl::GetFlag(FLAGS_reply_spin_us),
      shards_per_round.load(), result.gbps, result.p50, result.p99,
      DescribeCompression(*compression).c_str(),
      replicas > 1 && absl::GetFlag(FLAGS_answer_at_tail) ? 1 : 0,
      replicas > 1 ? absl::GetFlag(FLAGS_replica_spin_us) : 0);
  std::fflush(stdout);
  for (auto it = procs.rbegin(); it != procs.rend(); ++it) (void)(*it)->Kill(SIGTERM);
  for (auto& p : procs) (void)p->Wait();
  return result;
}

int Run(const char* argv0) {
  const int workers = absl::GetFlag(FLAGS_workers);
  const int servers = absl::GetFlag(FLAGS_servers);
  const int keys = absl::GetFlag(FLAGS_keys);
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  if (!ParseDataPath(absl::GetFlag(FLAGS_data_path)).ok()) {
    std::fprintf(stderr, "kvstore_bench: %s\n",
                 ParseDataPath(absl::GetFlag(FLAGS_data_path)).status().ToString().c_str());
    return 2;
  }
  if (workers < 1 || servers < 1 || keys < 1 || bytes < 4 * keys) {
    std::fprintf(stderr, "kvstore_bench: bad --workers, --servers, --keys or --bytes\n");
    return 2;
  }
  std::vector<int> replicas;
  for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_replicas), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(r, &n) || n < 1) {
      std::fprintf(stderr, "kvstore_bench: --replicas takes counts >= 1, got '%s'\n",
                   std::string(r).c_str());
      return 2;
    }
    replicas.push_back(n);
  }
  std::string cert_dir;
  // Removes the run's certificates on every return.
  struct RemoveDir {
    const std::string& dir;
    ~RemoveDir() {
      std::error_code ignored;
      if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
    }
  } remove_cert_dir{cert_dir};
  if (absl::GetFlag(FLAGS_tls)) {
    // A CA and certificates for this run; servers started from here get the
    // same credentials (ServerProcess passes the process's default ones).
    char dir_template[] = "/tmp/kvstore_bench_certs.XXXXXX";
    if (mkdtemp(dir_template) == nullptr) {
      std::perror("kvstore_bench: mkdtemp");
      return 1;
    }
    cert_dir = dir_template;
    const std::string& dir = cert_dir;
    absl::Status s = security::InitCertDir(dir, {});
    absl::StatusOr<std::shared_ptr<const rpc::Credentials>> credentials =
        s.ok() ? rpc::Credentials::Load({dir + "/ca.pem", dir + "/admin.pem", dir + "/admin.key"})
               : absl::StatusOr<std::shared_ptr<const rpc::Credentials>>(s);
    if (!credentials.ok()) {
      std::fprintf(stderr, "kvstore_bench: certificates in %s: %s\n", dir.c_str(),
                   credentials.status().ToString().c_str());
      return 1;
    }
    rpc::SetDefaultCredentials(*credentials);
  }
  std::vector<Result> results;
  for (int r : replicas) {
    absl::StatusOr<Result> result = RunOnce(argv0, r);
    if (!result.ok()) {
      std::fprintf(stderr, "kvstore_bench: replicas=%d: %s\n", r,
                   result.status().ToString().c_str());
      return 1;
    }
    results.push_back(*result);
  }
  for (size_t i = 1; i < replicas.size(); ++i) {
    if (replicas[0] != 1) break;
    std::printf("kvstore_replication replicas=%d p50_ratio=%.2f GBps_ratio=%.2f\n", replicas[i],
                results[i].p50 / results[0].p50, results[i].gbps / results[0].gbps);
  }
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
