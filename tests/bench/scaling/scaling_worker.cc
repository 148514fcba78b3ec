// One worker of the scaling benchmark (run.sh): synchronizes a gradient of
// --bytes (float32) with --workers peers, --rounds times, and prints its own
// time of each round:
//
//   worker rank=0 method=ring seconds=0.8123,0.8051,...
//
// --method=ring: libs/collective's ring allreduce over TCP (the peers meet
// through a FileStore in --store_dir, a directory every host sees).
// --method=ps: a push-pull of one key through the kvstore shards --servers
// (SYNC: the pull returns once every worker pushed the round); the key is
// sliced over all shards. Each round starts after a barrier of the workers
// (a tiny allreduce communicator in the same store), so the slowest worker's
// time is the round's synchronization time.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/kvstore/client.h"
#include "libs/kvstore/malloc_tuning.h"
#include "libs/rpc/credential_flags.h"
#include "libs/rpc/credentials.h"

ABSL_FLAG(std::string, method, "ring", "ring or ps");
ABSL_FLAG(int, rank, 0, "this worker's rank");
ABSL_FLAG(int, workers, 2, "number of workers");
ABSL_FLAG(std::string, store_dir, "", "rendezvous directory shared by the workers");
ABSL_FLAG(std::string, host, "127.0.0.1", "this worker's address (collective TCP)");
ABSL_FLAG(int64_t, bytes, 4 << 20, "gradient size in bytes");
ABSL_FLAG(int, rounds, 3, "timed rounds (after one warm-up round)");
ABSL_FLAG(std::string, servers, "", "ps: comma-separated kvstore shard addresses");
ABSL_FLAG(std::string, job, "scaling", "ps: kvstore job name");

namespace dtrain {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "scaling_worker rank %d: %s: %s\n", absl::GetFlag(FLAGS_rank), what.c_str(),
               s.ToString().c_str());
  return 1;
}

int Main() {
  const std::string method = absl::GetFlag(FLAGS_method);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int workers = absl::GetFlag(FLAGS_workers);
  const size_t count = absl::GetFlag(FLAGS_bytes) / sizeof(float);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (method != "ring" && method != "ps") {
    std::fprintf(stderr, "scaling_worker: --method must be ring or ps, got '%s'\n", method.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_store_dir).empty() || workers < 1 || rank < 0 || rank >= workers ||
      count == 0 || rounds < 1) {
    std::fprintf(stderr,
                 "scaling_worker: need --store_dir, 0 <= --rank < --workers, --bytes >= 4, "
                 "--rounds >= 1\n");
    return 2;
  }
  collective::FileStore store(absl::GetFlag(FLAGS_store_dir));
  collective::CommunicatorOptions options;
  options.transport = collective::TransportKind::kTcp;
  options.tcp.host = absl::GetFlag(FLAGS_host);
  options.timeout = absl::Seconds(300);
  options.algorithm = collective::Algorithm::kRing;
  options.key_prefix = absl::StrCat(method, "-", workers);
  auto comm = collective::Communicator::Create(rank, workers, &store, options);
  if (!comm.ok()) return Fail("joining the workers", comm.status());

  std::vector<float> grad(count, 1.0f + rank);
  std::vector<float> out(count);
  std::unique_ptr<kvstore::KVClient> kv;
  if (method == "ps") {
    kvstore::TuneMallocForBulkTransfers();
    if (absl::Status s = rpc::UseCredentialsFromFlags("scaling_worker"); !s.ok()) {
      return Fail("credentials", s);
    }
    kvstore::ClientOptions ko;
    ko.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
    if (ko.servers.empty()) {
      std::fprintf(stderr, "scaling_worker: --method=ps needs --servers\n");
      return 2;
    }
    ko.job = absl::GetFlag(FLAGS_job);
    ko.worker = rank;
    auto c = kvstore::KVClient::Connect(ko);
    if (!c.ok()) return Fail("connecting to the kvstore", c.status());
    kv = std::move(*c);
    kvstore::JobConfig config;
    config.job = ko.job;
    config.num_workers = workers;
    config.consistency = kvstore::Consistency::kSync;
    absl::Status s = kv->CreateJob(config);
    if (!s.ok()) return Fail("CreateJob", s);
    std::vector<float> zero(count, 0.0f);
    s = kv->Init({{"grad", {static_cast<int64_t>(count)}, DType::kF32, zero.data()}});
    if (!s.ok()) return Fail("Init", s);
  }

  std::vector<double> seconds;
  for (int r = 0; r <= rounds; ++r) {
    absl::Status s = (*comm)->Barrier();
    if (!s.ok()) return Fail("barrier", s);
    const auto start = Clock::now();
    if (method == "ring") {
      s = (*comm)->Allreduce(grad.data(), count, DType::kF32, collective::ReduceOp::kSum);
    } else {
      s = kv->PushPull({{"grad", grad.data(), out.data()}});
    }
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    if (!s.ok()) return Fail(absl::StrCat("round ", r), s);
    if (r > 0) seconds.push_back(t);
  }
  // The sum is right: ring sums in place (each round adds the workers'
  // values again); ps returns the sum of the round's pushes (no optimizer:
  // the value is the aggregated gradient).
  const float expect_ps = workers * (workers + 1) / 2.0f;
  if (method == "ps" && out[count / 2] != expect_ps) {
    std::fprintf(stderr, "scaling_worker rank %d: pulled %g, want %g\n", rank, out[count / 2],
                 expect_ps);
    return 1;
  }
  if (kv != nullptr) (void)kv->LeaveJob();
  std::vector<std::string> parts;
  for (double t : seconds) parts.push_back(absl::StrCat(t));
  std::printf("worker rank=%d method=%s seconds=%s\n", rank, method.c_str(),
              absl::StrJoin(parts, ",").c_str());
  return 0;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dtrain::Main();
}
