// The bucket reducer (buckets, readiness, weighted sum, flat copies) and the
// choice of GradientSync strategy. The strategies' effect on training is
// checked end to end by the data_parallel_*_test targets.
#include "libs/train/gradient_sync.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/train/data_parallel.h"
#include "libs/train/reducer.h"

namespace dtrain {
namespace train {
namespace {

using autograd::Variable;

TEST(AssignBucketsTest, ReverseRegistrationOrderWithinTheByteLimit) {
  // f32: 10, 20, 30, 40 elements; 60 elements per bucket.
  std::vector<Bucket> b = AssignBuckets({10, 20, 30, 40}, 60 * sizeof(float));
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].params, (std::vector<int>{3}));
  EXPECT_EQ(b[0].numel, 40);
  EXPECT_EQ(b[1].params, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(b[1].numel, 60);
  // A parameter larger than the limit is a bucket of its own.
  b = AssignBuckets({5, 100, 5}, 10 * sizeof(float));
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].params, (std::vector<int>{2}));
  EXPECT_EQ(b[1].params, (std::vector<int>{1}));
  EXPECT_EQ(b[1].numel, 100);
  EXPECT_EQ(b[2].params, (std::vector<int>{0}));
}

TEST(FlattenTest, RoundTripKeepsOrderAndValues) {
  Tensor a = Tensor::FromVector<float>({1, 2, 3}, {3});
  Tensor b = Tensor::FromVector<float>({4, 5, 6, 7}, {2, 2});
  std::vector<float> flat(7, -1);
  ASSERT_TRUE(Flatten({&b, &a}, Device::Cpu(), flat.data(), nullptr).ok());
  EXPECT_EQ(flat, (std::vector<float>{4, 5, 6, 7, 1, 2, 3}));
  for (float& v : flat) v *= 10;
  ASSERT_TRUE(Unflatten(flat.data(), Device::Cpu(), {&b, &a}, nullptr).ok());
  EXPECT_EQ(a.ToVector<float>(), (std::vector<float>{10, 20, 30}));
  EXPECT_EQ(b.ToVector<float>(), (std::vector<float>{40, 50, 60, 70}));
}

// Two CPU replicas of parameters {a [3], b [2]} in one bucket.
struct TwoReplicas {
  std::vector<std::vector<Variable>> params;
  std::unique_ptr<Reducer> reducer;

  explicit TwoReplicas(Reducer::BufferPlace place = Reducer::BufferPlace::kHost) {
    for (int r = 0; r < 2; ++r) {
      params.push_back({Variable(Tensor::FromVector<float>({1, 1, 1}, {3}), true),
                        Variable(Tensor::FromVector<float>({1, 1}, {2}), true)});
    }
  }
  absl::Status Create() {
    Reducer::Options o;
    o.params = params;
    o.devices = {Device::Cpu(0), Device::Cpu(1)};
    o.streams = {nullptr, nullptr};
    o.bucket_bytes = 1 << 10;
    absl::StatusOr<std::unique_ptr<Reducer>> made = Reducer::Create(o);
    if (!made.ok()) return made.status();
    reducer = *std::move(made);
    reducer->InstallHooks();
    return absl::OkStatus();
  }
};

TEST(ReducerTest, BucketIsReadyOnlyWhenEveryReplicaIsDoneAndSumsByWeight) {
  TwoReplicas t;
  ASSERT_TRUE(t.Create().ok());
  ASSERT_EQ(t.reducer->buckets().size(), 1u);
  EXPECT_EQ(t.reducer->buckets()[0].params, (std::vector<int>{1, 0}));  // b, then a
  t.reducer->StartStep({0.25, 0.75});

  std::atomic<bool> returned{false};
  absl::Status waited;
  std::thread comm([&] {
    waited = t.reducer->WaitForBucket(0);
    returned = true;
  });
  // Replica 0 uses only a (gradient 2), replica 1 only b (gradient 1).
  autograd::Sum(autograd::Add(t.params[0][0], t.params[0][0])).Backward();
  t.reducer->FinishBackward(0);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(returned) << "bucket ready before replica 1's gradients";
  autograd::Sum(t.params[1][1]).Backward();
  t.reducer->FinishBackward(1);  // a: no gradient on replica 1, counts as zero
  comm.join();
  ASSERT_TRUE(waited.ok()) << waited;

  absl::StatusOr<float*> flat = t.reducer->SumBucket(0);
  ASSERT_TRUE(flat.ok()) << flat.status();
  // b: 0.25 * 0 + 0.75 * 1; a: 0.25 * 2 + 0.75 * 0.
  EXPECT_EQ(std::vector<float>(*flat, *flat + 5),
            (std::vector<float>{0.75f, 0.75f, 0.5f, 0.5f, 0.5f}));
  (*flat)[0] = 9;  // what a strategy leaves is what the replicas get
  ASSERT_TRUE(t.reducer->WriteBackGradients(0).ok());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(t.params[r][0].grad().ToVector<float>(), (std::vector<float>{0.5f, 0.5f, 0.5f}));
    EXPECT_EQ(t.params[r][1].grad().ToVector<float>(), (std::vector<float>{9, 0.75f}));
  }
}

TEST(ReducerTest, AbortReleasesTheWaiter) {
  TwoReplicas t;
  ASSERT_TRUE(t.Create().ok());
  t.reducer->StartStep({0.5, 0.5});
  std::thread comm(
      [&] { EXPECT_EQ(t.reducer->WaitForBucket(0).code(), absl::StatusCode::kAborted); });
  t.reducer->Abort();
  comm.join();
  // A new step starts clean: FinishBackward on both replicas makes it ready.
  t.reducer->StartStep({0.5, 0.5});
  t.reducer->FinishBackward(0);
  t.reducer->FinishBackward(1);
  EXPECT_TRUE(t.reducer->WaitForBucket(0).ok());
}

TEST(ReducerTest, DeviceBuffersNeedOneCudaReplica) {
  TwoReplicas t;
  Reducer::Options o;
  o.params = t.params;
  o.devices = {Device::Cpu(0), Device::Cpu(1)};
  o.streams = {nullptr, nullptr};
  o.place = Reducer::BufferPlace::kDevice;
  absl::Status s = Reducer::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("one CUDA replica"), std::string::npos) << s;
}

// Selection never calls the parameter server (Start does); this one only
// stands for "a kvstore is configured".
class UnusedParameterServer : public kvstore::ParameterServer {
 public:
  const std::string& job() const override { return job_; }
  int worker() const override { return 0; }
  absl::Status CreateJob(const kvstore::JobConfig&) override { return Unused(); }
  absl::Status DeleteJob() override { return Unused(); }
  absl::Status LeaveJob() override { return Unused(); }
  void Cancel(const std::string&) override {}
  absl::Status Init(const std::vector<kvstore::KeySpec>&) override { return Unused(); }
  kvstore::Work PushAsync(std::vector<kvstore::PushSource>) override {
    return kvstore::Work::Done(Unused());
  }
  kvstore::Work PullAsync(std::vector<kvstore::PullTarget>) override {
    return kvstore::Work::Done(Unused());
  }
  kvstore::Work PushPullAsync(std::vector<kvstore::PushPullItem>) override {
    return kvstore::Work::Done(Unused());
  }

 private:
  static absl::Status Unused() { return absl::InternalError("selection used the kvstore"); }
  std::string job_ = "unused";
};

std::string Chosen(const DataParallelOptions& o) {
  absl::StatusOr<std::unique_ptr<GradientSync>> sync = CreateGradientSync(o);
  if (!sync.ok()) return sync.status().ToString();
  return (*sync)->name();
}

TEST(GradientSyncRegistryTest, OneStrategyPerMode) {
  const std::vector<std::string> names = GradientSyncNames();
  for (const char* mode :
       {"local", "allreduce", "nccl_allreduce", "kvstore_sync", "kvstore_weights"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), mode), names.end()) << mode;
  }
  DataParallelOptions o;
  EXPECT_EQ(Chosen(o), "local");

  UnusedParameterServer ps;
  o.kvstore = &ps;
  o.kvstore_workers = 2;
  EXPECT_EQ(Chosen(o), "kvstore_sync");
  o.kvstore_consistency = kvstore::Consistency::kAsync;
  EXPECT_EQ(Chosen(o), "kvstore_weights");
  o.kvstore_consistency = kvstore::Consistency::kBoundedDelay;
  EXPECT_EQ(Chosen(o), "kvstore_weights");
  // The strategy's own checks.
  o.sgd.nesterov = true;
  absl::Status s = CreateGradientSync(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("nesterov"), std::string::npos) << s;

  // A one-rank TCP communicator: allreduce (on CPU replicas). With a kvstore
  // as well no strategy applies.
  collective::InMemoryStore store;
  collective::CommunicatorOptions co;
  co.transport = collective::TransportKind::kTcp;
  absl::StatusOr<std::unique_ptr<collective::Communicator>> comm =
      collective::Communicator::Create(0, 1, &store, co);
  ASSERT_TRUE(comm.ok()) << comm.status();
  o.communicator = comm->get();
  s = CreateGradientSync(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("no gradient-sync strategy"), std::string::npos) << s;
  o.kvstore = nullptr;
  EXPECT_EQ(Chosen(o), "allreduce");
}

TEST(GradientSyncRegistryTest, TrainerReportsItsStrategyAndAveragesStatistics) {
  DataParallelOptions o;
  o.model = "mlp";
  absl::StatusOr<std::unique_ptr<DataParallelTrainer>> t = DataParallelTrainer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_STREQ((*t)->sync_name(), "local");
  // One trainer: its statistics are the job's.
  float sums[3] = {6, 3, 2};
  ASSERT_TRUE((*t)->AverageStatistics(sums, 3).ok());
  EXPECT_EQ(std::vector<float>(sums, sums + 3), (std::vector<float>{6, 3, 2}));
}

// How each strategy lives through a lost trainer (what job.cc and libs/agent
// ask instead of branching): one row per registered strategy.
TEST(GradientSyncRegistryTest, EachStrategySaysHowItRecovers) {
  struct Row {
    const char* name;
    bool communicator, device_communicator, kvstore;
    bool regroups_two, regroups_one;  // RegroupsInPlace(2), (1)
    bool silent;
    bool cancelled, unavailable, internal;  // MayBePeerLoss of these
    bool continues_rounds;
    bool stalls_sync, stalls_bounded;  // StepMayStall(kSync), (kBoundedDelay)
  };
  const Row rows[] = {
      {"local", false, false, false, false, false, false, false, true, false, false, false, false},
      {"allreduce", true, false, false, true, true, false, false, true, false, false, false, false},
      {"nccl_allreduce", true, true, false, true, true, true, true, true, true, false, true, true},
      {"kvstore_sync", false, false, true, true, false, true, true, false, false, false, true,
       true},
      {"kvstore_weights", false, false, true, false, false, false, false, true, false, true, false,
       true},
  };
  EXPECT_EQ(GradientSyncNames().size(), sizeof(rows) / sizeof(rows[0]));
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const SyncStrategy* s = FindSyncStrategy(row.name);
    ASSERT_NE(s, nullptr);
    EXPECT_STREQ(s->name(), row.name);
    EXPECT_EQ(s->uses_communicator(), row.communicator);
    EXPECT_EQ(s->uses_device_communicator(), row.device_communicator);
    EXPECT_EQ(s->uses_kvstore(), row.kvstore);
    EXPECT_EQ(s->RegroupsInPlace(2), row.regroups_two);
    EXPECT_EQ(s->RegroupsInPlace(1), row.regroups_one);
    EXPECT_EQ(s->loss_is_silent(), row.silent);
    EXPECT_EQ(s->MayBePeerLoss(absl::CancelledError("c")), row.cancelled);
    EXPECT_EQ(s->MayBePeerLoss(absl::UnavailableError("u")), row.unavailable);
    EXPECT_EQ(s->MayBePeerLoss(absl::InternalError("i")), row.internal);
    EXPECT_EQ(s->replacement_continues_rounds(), row.continues_rounds);
    EXPECT_EQ(s->StepMayStall(kvstore::Consistency::kSync), row.stalls_sync);
    EXPECT_EQ(s->StepMayStall(kvstore::Consistency::kBoundedDelay), row.stalls_bounded);
  }
  EXPECT_EQ(FindSyncStrategy("tcp"), nullptr);
}

// A strategy chosen from the options is the registered one of that name.
TEST(GradientSyncRegistryTest, ChoosingAndFindingAgree) {
  DataParallelOptions o;
  absl::StatusOr<const SyncStrategy*> chosen = ChooseSyncStrategy(o);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(*chosen, FindSyncStrategy("local"));
}

}  // namespace
}  // namespace train
}  // namespace dtrain
