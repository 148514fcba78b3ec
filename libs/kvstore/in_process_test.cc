// The in-process ParameterServer: the shared contract
// (parameter_server_contract.h) and what only it has (options, shard access,
// lifetime, pull timeout).
#include "libs/kvstore/in_process.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/kvstore/parameter_server_contract.h"

namespace dtrain {
namespace kvstore {
namespace {

class InProcessContractKVStore : public ContractKVStore {
 public:
  explicit InProcessContractKVStore(int num_shards) {
    InProcessOptions options;
    options.num_shards = num_shards;
    auto kvstore = InProcessKVStore::Create(options);
    EXPECT_TRUE(kvstore.ok()) << kvstore.status();
    if (kvstore.ok()) kvstore_ = std::move(*kvstore);
  }

  absl::StatusOr<std::unique_ptr<ParameterServer>> Connect(const std::string& job,
                                                           int worker) override {
    if (kvstore_ == nullptr) return absl::InternalError("no kvstore");
    DT_ASSIGN_OR_RETURN(std::unique_ptr<InProcessParameterServer> ps,
                        kvstore_->Connect(job, worker));
    return std::unique_ptr<ParameterServer>(std::move(ps));
  }

 private:
  std::unique_ptr<InProcessKVStore> kvstore_;
};

INSTANTIATE_TEST_SUITE_P(
    InProcess, ParameterServerContractTest,
    ::testing::Values(ContractParam{"two_shards",
                                    [] { return std::make_unique<InProcessContractKVStore>(2); }},
                      ContractParam{"three_shards",
                                    [] { return std::make_unique<InProcessContractKVStore>(3); }}),
    ContractParamName);

std::unique_ptr<InProcessKVStore> MakeKVStore(int num_shards,
                                              absl::Duration pull_timeout = absl::Minutes(5)) {
  InProcessOptions options;
  options.num_shards = num_shards;
  options.pull_timeout = pull_timeout;
  auto kvstore = InProcessKVStore::Create(options);
  EXPECT_TRUE(kvstore.ok()) << kvstore.status();
  return kvstore.ok() ? std::move(*kvstore) : nullptr;
}

JobConfig SyncJob(const std::string& job, int workers) {
  JobConfig c;
  c.job = job;
  c.num_workers = workers;
  return c;
}

TEST(InProcessKVStoreTest, BadOptionsAreInvalidArgument) {
  InProcessOptions options;
  options.num_shards = 0;
  absl::StatusOr<std::unique_ptr<InProcessKVStore>> kvstore = InProcessKVStore::Create(options);
  EXPECT_EQ(kvstore.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(kvstore.status().message(), "num_shards=0")) << kvstore.status();
  options.num_shards = 1;
  options.pull_timeout = absl::ZeroDuration();
  kvstore = InProcessKVStore::Create(options);
  EXPECT_EQ(kvstore.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(kvstore.status().message(), "pull_timeout")) << kvstore.status();

  std::unique_ptr<InProcessKVStore> good = MakeKVStore(1);
  ASSERT_NE(good, nullptr);
  EXPECT_EQ(good->Connect("", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(good->Connect(std::string(kMaxJobNameLength + 1, 'j'), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(good->Connect("job", -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(good->Connect("job", kMaxWorkers).status().code(), absl::StatusCode::kInvalidArgument);
}

// Keys are placed as a RemoteParameterServer places them: a large key has one slice on
// every shard; each shard's Store counts the worker's rounds.
TEST(InProcessKVStoreTest, KeysArePlacedOnTheShards) {
  std::unique_ptr<InProcessKVStore> kvstore = MakeKVStore(2);
  ASSERT_NE(kvstore, nullptr);
  ASSERT_EQ(kvstore->num_shards(), 2);
  auto ps = kvstore->Connect("placed", 0);
  ASSERT_TRUE(ps.ok()) << ps.status();
  InProcessParameterServer& w = **ps;
  ASSERT_TRUE(w.CreateJob(SyncJob("placed", 1)).ok());
  const int64_t n = 1 << 17;  // 512 KiB of f32
  ASSERT_TRUE(w.Init({{"big", {n}}}).ok());
  std::vector<float> g(static_cast<size_t>(n), 2.0f), out(static_cast<size_t>(n), 0.0f);
  ASSERT_TRUE(w.PushPull({{"big", g.data(), out.data()}}).ok());
  ASSERT_TRUE(w.PushPull({{"big", g.data(), out.data()}}).ok());
  EXPECT_EQ(out, g);
  int64_t elements = 0;
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<JobStatus> job = kvstore->shard(s).GetJob("placed", 0, true);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->shard_index, s);
    ASSERT_EQ(job->slices.size(), 1u) << "shard " << s;
    EXPECT_EQ(job->slices[0].spec.num_slices, 2);
    EXPECT_EQ(job->slices[0].pushed_round, 2);
    EXPECT_EQ(job->slices[0].completed_round, 2);
    elements += job->slices[0].spec.count;
  }
  EXPECT_EQ(elements, n);
  absl::StatusOr<int64_t> round = w.PushedRound("big");
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(*round, 2);
  EXPECT_EQ(w.PushedRound("other").status().code(), absl::StatusCode::kNotFound);
}

// A SYNC pull whose round never completes ends at pull_timeout with the
// Store's kDeadlineExceeded, naming the missing worker.
TEST(InProcessKVStoreTest, PullWaitsAtMostPullTimeout) {
  std::unique_ptr<InProcessKVStore> kvstore = MakeKVStore(1, absl::Milliseconds(200));
  ASSERT_NE(kvstore, nullptr);
  auto w0 = kvstore->Connect("timeout", 0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  ASSERT_TRUE((*w0)->CreateJob(SyncJob("timeout", 2)).ok());
  ASSERT_TRUE((*w0)->Init({{"w", {4}}}).ok());
  std::vector<float> g(4, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s = (*w0)->PushPull({{"w", g.data(), g.data()}});
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "waiting for workers [1]")) << s;
  EXPECT_GE(waited, absl::Milliseconds(200));
  EXPECT_LT(waited, absl::Seconds(20));
}

// The Stores live as long as a ParameterServer uses them.
TEST(InProcessKVStoreTest, ParameterServerOutlivesTheKVStore) {
  std::unique_ptr<InProcessKVStore> kvstore = MakeKVStore(2);
  ASSERT_NE(kvstore, nullptr);
  auto ps = kvstore->Connect("outlive", 0);
  ASSERT_TRUE(ps.ok()) << ps.status();
  kvstore.reset();
  InProcessParameterServer& w = **ps;
  ASSERT_TRUE(w.CreateJob(SyncJob("outlive", 1)).ok());
  ASSERT_TRUE(w.Init({{"w", {3}}}).ok());
  std::vector<float> g = {1, 2, 3}, out(3, 0.0f);
  ASSERT_TRUE(w.PushPull({{"w", g.data(), out.data()}}).ok());
  EXPECT_EQ(out, g);
}

// Destroying a ParameterServer waits for its operations: the pull below
// completes (into a buffer that outlives it) once the other worker pushes.
TEST(InProcessKVStoreTest, DestructionWaitsForOperationsInFlight) {
  std::unique_ptr<InProcessKVStore> kvstore = MakeKVStore(1);
  ASSERT_NE(kvstore, nullptr);
  auto w0 = kvstore->Connect("inflight", 0);
  auto w1 = kvstore->Connect("inflight", 1);
  ASSERT_TRUE(w0.ok() && w1.ok());
  ASSERT_TRUE((*w0)->CreateJob(SyncJob("inflight", 2)).ok());
  ASSERT_TRUE((*w0)->Init({{"w", {2}}}).ok());
  ASSERT_TRUE((*w1)->Init({{"w", {2}}}).ok());
  std::vector<float> g0 = {1, 2}, g1 = {3, 4}, out(2, 0.0f);
  std::thread pusher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE((*w1)->Push({{"w", g1.data()}}).ok());
  });
  {
    Work p = (*w0)->PushPullAsync({{"w", g0.data(), out.data()}});
    // Worker 0's ParameterServer goes away while its round waits for worker 1.
    w0->reset();
    EXPECT_TRUE(p.IsCompleted());
  }
  pusher.join();
  EXPECT_EQ(out, std::vector<float>({4, 6}));
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
