// Issue 16, exhaustion, end to end on a mutual-TLS cluster (`trainctl
// cluster up`: scheduler, one unreplicated kvstore shard): while
//   - a trainer certificate with a valid token for its own kvstore job asks
//     for an Init far over the per-job quota (RESOURCE_EXHAUSTED, nothing
//     allocated) and then holds 2000 concurrent pulls for a round that never
//     completes (its job's call cap, kvstore_server --max_calls_per_job,
//     refuses the excess at once with RESOURCE_EXHAUSTED, and a trainer of
//     another job is served meanwhile),
//   - 256 slow clients hold the shard's and the scheduler's /metrics
//     connections (trickling or silent),
//   - bob floods the scheduler with submits (his queued jobs stop at the
//     per-user cap, RESOURCE_EXHAUSTED naming it),
// the gRPC health probe of the shard and of the scheduler, over TLS, answers
// SERVING within 1 s every 100 ms throughout, and nothing stored is lost:
// another job's keys on the shard keep their values, alice's queued job is
// still there, and both servers keep serving.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/health_check.h"
#include "libs/security/job_token.h"
#include "protos/kvstore.grpc.pb.h"
#include "protos/scheduler.grpc.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;
namespace kv = kvstore::v1;

absl::StatusCode Code(const grpc::Status& s) {
  return static_cast<absl::StatusCode>(s.error_code());
}

// Probes each server's health every 100 ms until destroyed; remembers the
// slowest answer and every probe that failed or took 1 s or more.
class Prober {
 public:
  // Connects each channel first (the TLS handshake is not a probe's).
  Prober(std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> targets)
      : targets_(std::move(targets)) {
    for (auto& [name, channel] : targets_) {
      EXPECT_TRUE(rpc::HealthServing(channel.get(), absl::Seconds(10))) << name;
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~Prober() { Stop(); }

  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  int probes() const { return probes_.load(); }
  // Names the attack under way in failure messages.
  void Phase(const std::string& phase) {
    absl::MutexLock lock(&mu_);
    phase_ = phase;
  }
  absl::Duration slowest() {
    absl::MutexLock lock(&mu_);
    return slowest_;
  }
  std::vector<std::string> failures() {
    absl::MutexLock lock(&mu_);
    return failures_;
  }

 private:
  void Run() {
    while (!stop_.load()) {
      for (auto& [name, channel] : targets_) {
        const absl::Time start = absl::Now();
        const bool serving = rpc::HealthServing(channel.get(), absl::Seconds(1));
        const absl::Duration took = absl::Now() - start;
        probes_.fetch_add(1);
        absl::MutexLock lock(&mu_);
        slowest_ = std::max(slowest_, took);
        if (!serving || took >= absl::Seconds(1)) {
          failures_.push_back(absl::StrCat(name, serving ? " slow: " : " not SERVING after ",
                                           absl::FormatDuration(took), " during ", phase_));
        }
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> targets_;
  std::atomic<bool> stop_{false};
  std::atomic<int> probes_{0};
  absl::Mutex mu_;
  absl::Duration slowest_ ABSL_GUARDED_BY(mu_);
  std::string phase_ ABSL_GUARDED_BY(mu_) = "slow /metrics clients";
  std::vector<std::string> failures_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

kv::SliceSpec Slice(const std::string& key, int64_t count) {
  kv::SliceSpec s;
  s.set_key(key);
  s.set_slice(0);
  s.set_num_slices(1);
  s.set_dtype(0);
  s.add_shape(count);
  s.set_offset(0);
  s.set_count(count);
  return s;
}

class ExhaustionE2eTest : public ClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Up({.name = "exhaustion-cluster",
                                .trainers = 0,
                                .kvstore_shards = 1,
                                .users = {"alice", "bob"},
                                .down_grace_s = 10}));
    scheduler_ = cluster_->scheduler();
    shard_ = cluster_->shard(0);
    certs_ = dir() + "/certs";
    // A trainer certificate no running trainer holds.
    ASSERT_TRUE(cluster_->IssueCertificate("rogue", "trainer").ok());
  }

  std::shared_ptr<const rpc::Credentials> As(const std::string& name) {
    return cluster_->Credentials(name);
  }

  // A separate connection (gRPC shares one per target and arguments).
  std::shared_ptr<grpc::Channel> Connection(const std::string& address,
                                            const rpc::Credentials& creds, int n) {
    grpc::ChannelArguments args;
    args.SetInt("dtrain.test.connection", n);
    return grpc::CreateCustomChannel(address, creds.ChannelCredentials(), args);
  }

  std::string certs_;
  ClusterProcess scheduler_, shard_;
};

TEST_F(ExhaustionE2eTest, HealthAnswersWithinOneSecondAndNothingStoredIsLost) {
  auto admin = As("admin"), alice = As("alice"), bob = As("bob"), rogue = As("rogue");
  absl::StatusOr<std::string> secret = security::ReadClusterSecret(certs_ + "/cluster.secret");
  ASSERT_TRUE(secret.ok()) << secret.status();

  // What must survive: another job's keys on the shard, alice's job.
  auto shard_admin = kv::KVStore::NewStub(rpc::NewChannel(shard_.address, admin.get()));
  auto data_admin = kv::KVStoreData::NewStub(rpc::NewChannel(shard_.address, admin.get()));
  const std::string victim = "job-000777-a1";
  constexpr int64_t kVictimCount = 4096;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    kv::CreateJobRequest create;
    create.mutable_config()->set_job(victim);
    create.mutable_config()->set_num_workers(1);
    create.mutable_config()->set_consistency(kv::CONSISTENCY_SYNC);
    kv::CreateJobResponse created;
    ASSERT_TRUE(shard_admin->CreateJob(&ctx, create, &created).ok());
  }
  std::vector<float> victim_values(kVictimCount);
  for (int64_t i = 0; i < kVictimCount; ++i) victim_values[i] = 0.5f * static_cast<float>(i);
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    kv::InitResponse init_reply;
    auto init = shard_admin->Init(&ctx, &init_reply);
    kv::InitRequest req;
    req.set_job(victim);
    *req.add_slices() = Slice("w", kVictimCount);
    kv::Chunk* chunk = req.add_chunks();
    chunk->set_item(0);
    chunk->set_offset(0);
    chunk->set_data(std::string(reinterpret_cast<const char*>(victim_values.data()),
                                victim_values.size() * sizeof(float)));
    ASSERT_TRUE(init->Write(req));
    init->WritesDone();
    grpc::Status s = init->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto victim_values_now = [&]() -> std::string {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    kv::PullRequest pull;
    pull.set_job(victim);
    pull.add_items()->set_key("w");
    kv::PullResponse reply;
    grpc::Status s = data_admin->PullUnary(&ctx, pull, &reply);
    if (!s.ok()) return "pull failed: " + s.error_message();
    std::string bytes;
    for (const kv::Chunk& c : reply.chunks()) bytes += c.data();
    return bytes;
  };
  const std::string victim_bytes(reinterpret_cast<const char*>(victim_values.data()),
                                 victim_values.size() * sizeof(float));
  ASSERT_EQ(victim_values_now(), victim_bytes);
  auto alice_jobs = v1::JobService::NewStub(rpc::NewChannel(scheduler_.address, alice.get()));
  v1::SubmitRequest alice_submit;
  {
    v1::JobSpec* s = alice_submit.mutable_spec();
    s->set_name("alice-job");
    s->set_model("mlp");
    s->set_epochs(1);
    s->set_global_batch_size(256);
    s->set_lr(0.1);
    s->set_num_trainers(1);
  }
  v1::JobStatus alice_job;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ASSERT_TRUE(alice_jobs->Submit(&ctx, alice_submit, &alice_job).ok());
  }

  // The probes, over TLS as the admin, each on its own connection.
  Prober prober({{"kvstore", Connection(shard_.address, *admin, 1000)},
                 {"scheduler", Connection(scheduler_.address, *admin, 1001)}});
  // Slow /metrics clients on both servers for the whole attack.
  metrics::SlowClients slow_shard(PortOfUrl(shard_.metrics_url), 128, absl::Milliseconds(20));
  metrics::SlowClients slow_scheduler(PortOfUrl(scheduler_.metrics_url), 128,
                                      absl::Milliseconds(20));

  absl::SleepFor(absl::Seconds(1));  // the slow clients alone

  // 1. A huge Init: 2 x 700M floats (5.6 GB) against the 4 GiB quota.
  const std::string rogue_job = security::KvstoreJobName("job-999999", 1);
  const std::string token =
      security::MintJobToken(*secret, rogue_job, absl::Now() + absl::Hours(1));
  auto rogue_ctx = [&](grpc::ClientContext* ctx, absl::Duration d) {
    SetDeadline(ctx, d);
    ctx->AddMetadata(security::kJobTokenMetadata, token);
  };
  auto rogue_control = kv::KVStore::NewStub(rpc::NewChannel(shard_.address, rogue.get()));
  {
    grpc::ClientContext ctx;
    rogue_ctx(&ctx, absl::Seconds(10));
    kv::CreateJobRequest create;
    create.mutable_config()->set_job(rogue_job);
    create.mutable_config()->set_num_workers(2);
    create.mutable_config()->set_consistency(kv::CONSISTENCY_SYNC);
    kv::CreateJobResponse created;
    grpc::Status s = rogue_control->CreateJob(&ctx, create, &created);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // One Init of the rogue job's `slices`, as the rogue trainer.
  auto init_rogue = [&](std::vector<kv::SliceSpec> slices, absl::Duration deadline) {
    grpc::ClientContext ctx;
    rogue_ctx(&ctx, deadline);
    kv::InitResponse reply;
    auto init = rogue_control->Init(&ctx, &reply);
    kv::InitRequest req;
    req.set_job(rogue_job);
    for (kv::SliceSpec& slice : slices) *req.add_slices() = std::move(slice);
    init->Write(req);
    init->WritesDone();
    return init->Finish();
  };
  prober.Phase("a huge Init");
  {
    grpc::Status s =
        init_rogue({Slice("huge0", 700'000'000), Slice("huge1", 700'000'000)}, absl::Seconds(30));
    EXPECT_EQ(Code(s), absl::StatusCode::kResourceExhausted) << s.error_message();
    EXPECT_NE(s.error_message().find("quota"), std::string::npos) << s.error_message();
  }

  // 2. Thousands of concurrent pulls that wait for a round the second
  // worker never pushes.
  {
    grpc::Status s = init_rogue({Slice("p", 4)}, absl::Seconds(10));
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto rogue_data = kv::KVStoreData::NewStub(rpc::NewChannel(shard_.address, rogue.get()));
  {
    grpc::ClientContext ctx;
    rogue_ctx(&ctx, absl::Seconds(10));
    kv::PushRequest push;
    push.set_job(rogue_job);
    push.set_worker(0);
    kv::PushItem* item = push.add_items();
    item->set_key("p");
    item->set_round(1);
    item->set_dtype(0);
    item->add_shape(4);
    kv::Chunk* chunk = push.add_chunks();
    chunk->set_item(0);
    chunk->set_offset(0);
    chunk->set_data(std::string(16, '\0'));
    kv::PushResponse reply;
    grpc::Status s = rogue_data->PushUnary(&ctx, push, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  prober.Phase("2000 pulls");
  constexpr int kPulls = 2000;
  constexpr int kConnections = 10;
  std::vector<std::unique_ptr<kv::KVStoreData::Stub>> stubs;
  for (int c = 0; c < kConnections; ++c) {
    stubs.push_back(kv::KVStoreData::NewStub(Connection(shard_.address, *rogue, c)));
  }
  struct Call {
    grpc::ClientContext ctx;
    kv::PullResponse reply;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<kv::PullResponse>> reader;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  kv::PullRequest pull;
  pull.set_job(rogue_job);
  pull.set_worker(0);
  kv::PullItem* pi = pull.add_items();
  pi->set_key("p");
  pi->set_round(1);
  for (int i = 0; i < kPulls; ++i) {
    auto call = std::make_unique<Call>();
    rogue_ctx(&call->ctx, absl::Seconds(5));
    call->reader = stubs[i % kConnections]->AsyncPullUnary(&call->ctx, pull, &cq);
    call->reader->Finish(&call->reply, &call->status, call.get());
    calls.push_back(std::move(call));
  }
  // Meanwhile a trainer of the other job (its own token) reads its key,
  // before the rogue's pulls reach their deadline: they hold at most their
  // job's cap of the shard's threads (without it, all 256 until then). The
  // burst's refusals take threads for a moment too, so the reader tries
  // again while they pass.
  {
    const absl::Time held_until = absl::Now() + absl::Seconds(4);
    const std::string victim_token =
        security::MintJobToken(*secret, victim, absl::Now() + absl::Hours(1));
    auto victim_data = kv::KVStoreData::NewStub(Connection(shard_.address, *rogue, 2000));
    grpc::Status s;
    kv::PullResponse reply;
    int tries = 0;
    do {
      absl::SleepFor(absl::Milliseconds(100));
      grpc::ClientContext ctx;
      SetDeadline(&ctx, absl::Seconds(1));
      ctx.AddMetadata(security::kJobTokenMetadata, victim_token);
      kv::PullRequest read;
      read.set_job(victim);
      read.add_items()->set_key("w");
      reply.Clear();
      s = victim_data->PullUnary(&ctx, read, &reply);
      ++tries;
    } while (!s.ok() && absl::Now() < held_until);
    EXPECT_TRUE(s.ok()) << "another job's trainer was not served in " << tries
                        << " tries while the rogue's pulls were held: " << s.error_message();
    std::string bytes;
    for (const kv::Chunk& c : reply.chunks()) bytes += c.data();
    EXPECT_EQ(bytes, victim_bytes);
  }
  int ok = 0, exhausted = 0, timed_out = 0, other = 0;
  int job_capped = 0;
  std::string other_example;
  for (int i = 0; i < kPulls; ++i) {
    void* tag;
    bool fine;
    ASSERT_TRUE(cq.Next(&tag, &fine));
    const grpc::Status& s = static_cast<Call*>(tag)->status;
    switch (Code(s)) {
      case absl::StatusCode::kOk:
        ++ok;
        break;
      case absl::StatusCode::kResourceExhausted:
        ++exhausted;
        // The burst also meets the thread cap ("Server Threadpool
        // Exhausted") while the refusals themselves take threads.
        job_capped += s.error_message().find("--max_calls_per_job") != std::string::npos;
        break;
      case absl::StatusCode::kDeadlineExceeded:
        ++timed_out;
        break;
      default:
        ++other;
        other_example = absl::StrCat(s.error_code(), " ", s.error_message());
    }
  }
  cq.Shutdown();
  EXPECT_EQ(ok, 0);  // the round never completes
  EXPECT_EQ(other, 0) << other_example;
  EXPECT_GT(exhausted, 0) << "none of " << kPulls << " pulls was refused";
  EXPECT_GT(job_capped, 0) << "the job's call cap refused none of " << kPulls << " pulls";
  EXPECT_GT(timed_out, 0) << "no pull was served up to its deadline";

  // 3. A flood of submits from bob.
  prober.Phase("a flood of submits");
  std::atomic<int> accepted{0}, refused{0}, wrong{0};
  std::string refusal, wrong_example;
  absl::Mutex refusal_mu;
  {
    std::vector<std::thread> flood;
    for (int t = 0; t < 8; ++t) {
      flood.emplace_back([&] {
        auto jobs = v1::JobService::NewStub(rpc::NewChannel(scheduler_.address, bob.get()));
        v1::SubmitRequest req = alice_submit;
        req.mutable_spec()->set_name("bob-flood");
        for (int i = 0; i < 40; ++i) {
          grpc::ClientContext ctx;
          SetDeadline(&ctx, absl::Seconds(10));
          v1::JobStatus job;
          grpc::Status s = jobs->Submit(&ctx, req, &job);
          if (s.ok()) {
            ++accepted;
          } else if (Code(s) == absl::StatusCode::kResourceExhausted) {
            ++refused;
            absl::MutexLock lock(&refusal_mu);
            refusal = s.error_message();
          } else {
            ++wrong;
            absl::MutexLock lock(&refusal_mu);
            wrong_example = absl::StrCat(s.error_code(), " ", s.error_message());
          }
        }
      });
    }
    for (auto& t : flood) t.join();
  }
  EXPECT_EQ(accepted.load(), 100);  // the scheduler's default cap
  EXPECT_EQ(refused.load(), 320 - 100);
  EXPECT_EQ(wrong.load(), 0) << wrong_example;
  EXPECT_NE(refusal.find("max_queued_jobs_per_user"), std::string::npos) << refusal;

  prober.Stop();
  EXPECT_GT(prober.probes(), 20);
  for (const std::string& f : prober.failures()) ADD_FAILURE() << "health probe: " << f;
  EXPECT_LT(prober.slowest(), absl::Seconds(1));
  EXPECT_GT(slow_shard.opened(), 0);
  EXPECT_GT(slow_scheduler.opened(), 0);

  // Nothing stored was lost.
  EXPECT_EQ(victim_values_now(), victim_bytes);
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    kv::GetJobRequest get;
    get.set_job(victim);
    kv::GetJobResponse job;
    ASSERT_TRUE(shard_admin->GetJob(&ctx, get, &job).ok());
    EXPECT_EQ(job.num_keys(), 1);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    v1::GetRequest get;
    get.set_id(alice_job.id());
    v1::JobStatus now;
    ASSERT_TRUE(alice_jobs->Get(&ctx, get, &now).ok());
    EXPECT_EQ(now.state(), v1::QUEUED);
    EXPECT_EQ(now.spec().name(), "alice-job");
    EXPECT_EQ(now.owner(), "alice");
  }
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
