#include "libs/kvstore/store.h"

#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/kvstore/codec.h"

namespace dtrain {
namespace kvstore {
namespace {

std::string F32(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> Floats(const PulledValue& v) {
  std::vector<float> out(v.bytes.size / sizeof(float));
  std::memcpy(out.data(), v.bytes.data, v.bytes.size);
  return out;
}

JobConfig Config(int workers, Consistency c = Consistency::kSync, int max_staleness = 0) {
  JobConfig config;
  config.job = "j";
  config.num_workers = workers;
  config.consistency = c;
  config.max_staleness = max_staleness;
  return config;
}

SliceSpec Spec(const std::string& key, std::vector<int64_t> shape, DType dtype = DType::kF32) {
  SliceSpec s;
  s.key = key;
  s.dtype = dtype;
  s.shape = shape;
  s.count = 1;
  for (int64_t d : shape) s.count *= d;
  return s;
}

class StoreTest : public testing::Test {
 protected:
  // A job with key "w" (4 elements, initial 1 2 3 4).
  void SetUpJob(const JobConfig& config) {
    ASSERT_TRUE(store_.CreateJob(config).ok());
    std::string init = F32({1, 2, 3, 4});
    InitItem item{Spec("w", {4}), {init}};
    ASSERT_TRUE(store_.Init("j", {item}).ok());
  }

  absl::StatusOr<PushResult> Push(int worker, int64_t round, const std::vector<float>& g,
                                  const std::string& key = "w") {
    std::string bytes = F32(g);
    PushItem item;
    item.key = key;
    item.round = round;
    item.shape = {static_cast<int64_t>(g.size())};
    item.data = {bytes};
    return store_.Push("j", worker, Compression::kNone, {item});
  }

  absl::StatusOr<std::vector<float>> Pull(int worker, int64_t round,
                                          absl::Duration wait = absl::Seconds(5)) {
    PullOptions o;
    o.deadline = absl::Now() + wait;
    auto r = store_.Pull("j", worker, {{"w", 0, round}}, o);
    if (!r.ok()) return r.status();
    return Floats((*r)[0]);
  }

  Store store_{StoreOptions()};
};

TEST_F(StoreTest, CreateJobIsIdempotentAndRejectsConflicts) {
  JobConfig c = Config(2);
  EXPECT_EQ(*store_.CreateJob(c), true);
  EXPECT_EQ(*store_.CreateJob(c), false);
  c.num_workers = 3;
  absl::StatusOr<bool> conflict = store_.CreateJob(c);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(absl::StrContains(conflict.status().message(), "workers=2")) << conflict.status();
  c.job = "";
  EXPECT_EQ(store_.CreateJob(c).status().code(), absl::StatusCode::kInvalidArgument);
  JobConfig bad = Config(2);
  bad.job = "k";
  bad.learning_rate = 0.1;  // without an optimizer
  EXPECT_EQ(store_.CreateJob(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.DeleteJob("j").code(), absl::StatusCode::kOk);
  EXPECT_EQ(store_.DeleteJob("j").code(), absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, SyncRoundCompletesWhenAllWorkersPushed) {
  SetUpJob(Config(2));
  EXPECT_EQ(Push(0, 1, {1, 1, 1, 1})->applied, 1);
  // Round 1 is not complete: a pull waits and times out naming worker 1.
  absl::StatusOr<std::vector<float>> early = Pull(0, 1, absl::Milliseconds(20));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(early.status().message(), "[1]")) << early.status();
  // A waiting pull returns as soon as worker 1 pushes.
  std::thread pusher([&] {
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(Push(1, 1, {10, 20, 30, 40}).ok());
  });
  absl::StatusOr<std::vector<float>> v = Pull(0, 1);
  pusher.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<float>{11, 21, 31, 41}));  // no optimizer: the round's sum
  // Round 0 is the current value, without waiting.
  EXPECT_EQ(*Pull(1, 0), (std::vector<float>{11, 21, 31, 41}));
}

// TryPull never waits: a round not complete leaves a continuation that the
// push completing the round calls, once, on the pusher's thread.
TEST_F(StoreTest, TryPullWakesFromThePushThatCompletesTheRound) {
  SetUpJob(Config(2));
  ASSERT_TRUE(Push(0, 1, {1, 1, 1, 1}).ok());
  int wakes = 0;
  std::vector<PulledValue> out;
  absl::StatusOr<bool> ready = store_.TryPull(
      "j", 0, {{"w", 0, 1}}, [&] { ++wakes; }, &out);
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_FALSE(*ready);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(wakes, 0);
  // A pull of a round the worker has not pushed is refused, not parked.
  EXPECT_EQ(store_
                .TryPull(
                    "j", 0, {{"w", 0, 2}}, [&] { ++wakes; }, &out)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(Push(1, 1, {10, 20, 30, 40}).ok());
  EXPECT_EQ(wakes, 1);
  ready = store_.TryPull(
      "j", 0, {{"w", 0, 1}}, [&] { ++wakes; }, &out);
  ASSERT_TRUE(ready.ok() && *ready);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{11, 21, 31, 41}));
  EXPECT_EQ(out[0].round, 1);
  // The next round's push by worker 0 alone wakes nobody twice.
  ASSERT_TRUE(Push(0, 2, {1, 1, 1, 1}).ok());
  EXPECT_EQ(wakes, 1);
}

TEST_F(StoreTest, RoundRulesAndDedup) {
  SetUpJob(Config(2));
  ASSERT_TRUE(Push(0, 1, {1, 1, 1, 1}).ok());
  // A retry of the same round is acknowledged, not applied again.
  absl::StatusOr<PushResult> retry = Push(0, 1, {1, 1, 1, 1});
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->applied, 0);
  EXPECT_EQ(retry->duplicates, 1);
  // Round 2 before round 1 completed: too far ahead.
  absl::StatusOr<PushResult> ahead = Push(0, 2, {1, 1, 1, 1});
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(ahead.status().message(), "too far ahead")) << ahead.status();
  // Worker 1 skipping round 1.
  EXPECT_EQ(Push(1, 2, {1, 1, 1, 1}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Push(1, 0, {1, 1, 1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  // Pulling a round the worker has not pushed would wait for itself.
  EXPECT_EQ(Pull(1, 1).status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(Push(1, 1, {2, 2, 2, 2}).ok());
  EXPECT_EQ(*Pull(1, 1), (std::vector<float>{3, 3, 3, 3}));
  // Duplicates after completion do not change the value either.
  ASSERT_TRUE(Push(1, 1, {100, 100, 100, 100}).ok());
  EXPECT_EQ(*Pull(0, 1), (std::vector<float>{3, 3, 3, 3}));
}

TEST_F(StoreTest, BadWorkerKeyJobDtypeShapeAndSize) {
  SetUpJob(Config(2));
  EXPECT_EQ(Push(2, 1, {1, 1, 1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(Push(-1, 1, {1, 1, 1, 1}).status().message(), "worker -1"));
  EXPECT_EQ(Push(0, 1, {1, 1, 1, 1}, "nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Push(0, 1, {1, 1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  std::string bytes = F32({1, 1, 1, 1});
  PushItem item{"w", 0, 1, DType::kF16, {4}, {bytes}};
  absl::Status dtype = store_.Push("j", 0, Compression::kNone, {item}).status();
  EXPECT_TRUE(absl::StrContains(dtype.message(), "dtype f16")) << dtype;
  item.dtype = DType::kF32;
  item.shape = {2, 2};
  absl::Status shape = store_.Push("j", 0, Compression::kNone, {item}).status();
  EXPECT_TRUE(absl::StrContains(shape.message(), "shape [2, 2]")) << shape;
  item.shape = {4};
  item.slice = 1;
  EXPECT_EQ(store_.Push("j", 0, Compression::kNone, {item}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.Push("other", 0, Compression::kNone, {item}).status().code(),
            absl::StatusCode::kNotFound);
  // Nothing was applied.
  EXPECT_EQ(*Pull(0, 0), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(StoreTest, BatchIsAllOrNothing) {
  SetUpJob(Config(1));
  std::string init = F32({5, 5});
  ASSERT_TRUE(store_.Init("j", {{Spec("b", {2}), {init}}}).ok());
  std::string good = F32({1, 1, 1, 1}), bad = F32({1, 1, 1});
  PushItem w{"w", 0, 1, DType::kF32, {4}, {good}};
  PushItem b{"b", 0, 1, DType::kF32, {2}, {bad}};  // wrong size
  EXPECT_EQ(store_.Push("j", 0, Compression::kNone, {w, b}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Push("j", 0, Compression::kNone, {w, w}).status().code(),
            absl::StatusCode::kInvalidArgument);  // twice in one batch
  auto values = store_.Pull("j", 0, {{"w", 0, 0}, {"b", 0, 0}}, PullOptions());
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(Floats((*values)[0]), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(Floats((*values)[1]), (std::vector<float>{5, 5}));
  absl::StatusOr<JobStatus> job = store_.GetJob("j", 0, true);
  for (const SliceStatus& s : job->slices) EXPECT_EQ(s.pushed_round, 0);
}

TEST_F(StoreTest, InitRulesAndQuota) {
  Store store(StoreOptions{0, /*quota_bytes_per_job=*/100});
  JobConfig c = Config(1);
  ASSERT_TRUE(store.CreateJob(c).ok());
  // SYNC without optimizer: value + accumulator = 8 bytes per element.
  absl::StatusOr<InitResult> r = store.Init("j", {{Spec("a", {10}), {}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->created, 1);
  EXPECT_EQ(store.Init("j", {{Spec("a", {10}), {}}})->existing, 1);
  EXPECT_EQ(store.Init("j", {{Spec("a", {11}), {}}}).status().code(),
            absl::StatusCode::kAlreadyExists);
  // 80 held; 3 more elements (24 bytes) would be 104 > 100.
  absl::Status over = store.Init("j", {{Spec("b", {1}), {}}, {Spec("c", {2}), {}}}).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.message(), "quota of 100")) << over;
  EXPECT_EQ(store.GetJob("j", 0, false)->num_slices, 1);  // neither b nor c
  EXPECT_EQ(store.GetJob("j", 0, false)->held_bytes, 80);
  ASSERT_TRUE(store.Init("j", {{Spec("b", {2}), {}}}).ok());
  // Bad specs.
  SliceSpec bad = Spec("x", {4});
  bad.dtype = DType::kI32;
  EXPECT_EQ(store.Init("j", {{bad, {}}}).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Spec("x", {4});
  bad.count = 5;
  EXPECT_EQ(store.Init("j", {{bad, {}}}).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Spec("x", {-1});
  EXPECT_EQ(store.Init("j", {{bad, {}}}).status().code(), absl::StatusCode::kInvalidArgument);
  std::string wrong = F32({1});
  EXPECT_EQ(store.Init("j", {{Spec("y", {2}), {wrong}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Init("nojob", {{Spec("y", {2}), {}}}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, SgdWithMomentumWeightDecayAndScale) {
  JobConfig c = Config(2);
  c.optimizer = OptimizerKind::kSgd;
  c.learning_rate = 0.5;
  c.momentum = 0.5;
  c.weight_decay = 0.1;
  c.gradient_scale = 0.5;
  SetUpJob(c);
  std::vector<float> w = {1, 2, 3, 4}, v(4, 0);
  for (int round = 1; round <= 3; ++round) {
    std::vector<float> g0 = {1, -1, 0.5f, 2}, g1 = {0.25f, 1, -3, 1};
    ASSERT_TRUE(Push(0, round, g0).ok());
    ASSERT_TRUE(Push(1, round, g1).ok());
    for (int i = 0; i < 4; ++i) {
      float d = 0.5f * (g0[i] + g1[i]) + 0.1f * w[i];
      v[i] = 0.5f * v[i] + d;
      w[i] = w[i] - 0.5f * v[i];
    }
    EXPECT_EQ(*Pull(0, round), w) << "round " << round;
  }
}

TEST_F(StoreTest, AsyncAppliesEachPushOnArrival) {
  JobConfig c = Config(2, Consistency::kAsync);
  SetUpJob(c);
  ASSERT_TRUE(Push(0, 1, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(Push(0, 2, {1, 1, 1, 1}).ok());  // no waiting for worker 1
  EXPECT_EQ(*Pull(0, 2), (std::vector<float>{3, 4, 5, 6}));
  absl::StatusOr<JobStatus> job = store_.GetJob("j", 0, true);
  EXPECT_EQ(job->slices[0].completed_round, 0);
  EXPECT_EQ(job->slices[0].pushed_round, 2);
  ASSERT_TRUE(Push(1, 1, {1, 1, 1, 1}).ok());
  EXPECT_EQ(store_.GetJob("j", 0, true)->slices[0].completed_round, 1);
}

TEST_F(StoreTest, BoundedDelayLimitsHowFarAWorkerRunsAhead) {
  SetUpJob(Config(2, Consistency::kBoundedDelay, /*max_staleness=*/1));
  ASSERT_TRUE(Push(0, 1, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(Push(0, 2, {1, 1, 1, 1}).ok());  // one round ahead of worker 1: allowed
  absl::StatusOr<PushResult> ahead = Push(0, 3, {1, 1, 1, 1});
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(ahead.status().message(), "1 rounds of delay")) << ahead.status();
  // A pull of round 2 needs round 1 complete; it waits for worker 1.
  EXPECT_EQ(Pull(0, 2, absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Pull(0, 1).ok());  // round 0 complete is enough for round 1
  ASSERT_TRUE(Push(1, 1, {10, 10, 10, 10}).ok());
  EXPECT_EQ(*Pull(0, 2), (std::vector<float>{13, 14, 15, 16}));  // applied on arrival
  EXPECT_TRUE(Push(0, 3, {1, 1, 1, 1}).ok());
}

TEST_F(StoreTest, PullCancellationEndsTheWait) {
  SetUpJob(Config(2));
  ASSERT_TRUE(Push(0, 1, {1, 1, 1, 1}).ok());
  PullOptions o;
  std::atomic<bool> cancel{false};
  o.cancelled = [&] { return cancel.load(); };
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(30));
    cancel = true;
  });
  absl::Time start = absl::Now();
  auto r = store_.Pull("j", 0, {{"w", 0, 1}}, o);
  canceller.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(StoreTest, PulledValuesAreImmutableSnapshots) {
  SetUpJob(Config(1, Consistency::kAsync));
  auto before = store_.Pull("j", 0, {{"w", 0, 0}}, PullOptions());
  ASSERT_TRUE(before.ok());
  std::string held((*before)[0].bytes.data, (*before)[0].bytes.size);
  ASSERT_TRUE(Push(0, 1, {1, 1, 1, 1}).ok());
  EXPECT_EQ(std::string((*before)[0].bytes.data, (*before)[0].bytes.size), held);
  EXPECT_EQ(*Pull(0, 1), (std::vector<float>{2, 3, 4, 5}));
}

TEST_F(StoreTest, CompressedPushesAndHalfPrecisionKeys) {
  ASSERT_TRUE(store_.CreateJob(Config(1, Consistency::kAsync)).ok());
  ASSERT_TRUE(store_.Init("j", {{Spec("w", {4}), {}}, {Spec("h", {2}, DType::kF16), {}}}).ok());
  std::vector<float> g = {0.5f, -1.25f, 3.0f, 1.0f / 3};
  std::string half = EncodeToString(g.data(), 4, DType::kBF16);
  PushItem item{"w", 0, 1, DType::kF32, {4}, {half}};
  ASSERT_TRUE(store_.Push("j", 0, Compression::kBF16, {item}).ok());
  auto v = store_.Pull("j", 0, {{"w", 0, 1}}, PullOptions());
  std::vector<float> got = Floats((*v)[0]);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], g[i], 1e-2 * std::abs(g[i]));
  // An f16 key: pushed and pulled as f16.
  std::vector<float> hg = {1.5f, -2};
  std::string h16 = EncodeToString(hg.data(), 2, DType::kF16);
  PushItem hitem{"h", 0, 1, DType::kF16, {2}, {h16}};
  ASSERT_TRUE(store_.Push("j", 0, Compression::kNone, {hitem}).ok());
  auto hv = store_.Pull("j", 0, {{"h", 0, 1}}, PullOptions());
  ASSERT_EQ((*hv)[0].dtype, DType::kF16);
  EXPECT_EQ((*hv)[0].bytes.view(), h16);
}

// Top-k (index, value) pairs (codec.h).
std::string Pairs(const std::vector<std::pair<uint32_t, float>>& pairs) {
  std::string out;
  for (const auto& [index, value] : pairs) {
    out.append(reinterpret_cast<const char*>(&index), 4);
    out.append(reinterpret_cast<const char*>(&value), 4);
  }
  return out;
}

TEST_F(StoreTest, TopKPushesScatterIntoTheRoundsSum) {
  const CompressionSpec topk(Compression::kTopK, 0.5);  // k = 2 of 4
  SetUpJob(Config(2));
  EXPECT_EQ(*store_.ExpectedPushBytes("j", "w", 0, topk), 2 * kTopKPairBytes);
  std::string p0 = Pairs({{0, 1.5f}, {3, -2.0f}});
  std::string p1 = Pairs({{1, 4.0f}, {3, 0.5f}});
  ASSERT_TRUE(store_.Push("j", 0, topk, {{"w", 0, 1, DType::kF32, {4}, {p0}}}).ok());
  // The other worker's pairs add to the same round; index 3 gets both.
  ASSERT_TRUE(store_.Push("j", 1, topk, {{"w", 0, 1, DType::kF32, {4}, {p1}}}).ok());
  EXPECT_EQ(*Pull(0, 1), (std::vector<float>{1.5f, 4.0f, 0.0f, -1.5f}));
  // Round 2 mixes top-k and dense pushes; zeros where top-k sent nothing.
  ASSERT_TRUE(
      store_.Push("j", 0, topk, {{"w", 0, 2, DType::kF32, {4}, {Pairs({{2, 1}, {1, 1}})}}}).ok());
  ASSERT_TRUE(Push(1, 2, {10, 10, 10, 10}).ok());
  EXPECT_EQ(*Pull(0, 2), (std::vector<float>{10, 11, 11, 10}));
}

TEST_F(StoreTest, TopKPushesWithHostileIndicesChangeNothing) {
  const CompressionSpec topk(Compression::kTopK, 0.5);
  JobConfig c = Config(1, Consistency::kAsync);
  c.optimizer = OptimizerKind::kSgd;
  c.learning_rate = 1;
  SetUpJob(c);
  ASSERT_TRUE(store_.Init("j", {{Spec("v", {4}), {}}}).ok());
  std::string good = Pairs({{0, 1.0f}, {1, 1.0f}});
  for (uint32_t bad : {4u, 5u, 1u << 31, 0xffffffffu}) {
    std::string hostile = Pairs({{0, 1.0f}, {bad, 1.0f}});
    absl::Status s =
        store_
            .Push("j", 0, topk,
                  {{"v", 0, 1, DType::kF32, {4}, {good}}, {"w", 0, 1, DType::kF32, {4}, {hostile}}})
            .status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(),
                                  absl::StrCat("key 'w' slice 0: top-k pair 1 names index ", bad)))
        << s;
  }
  // Wrong sizes: one pair short, one pair long, and a ratio of 0.
  for (std::string wrong : {Pairs({{0, 1}}), Pairs({{0, 1}, {1, 1}, {2, 1}})}) {
    EXPECT_EQ(store_.Push("j", 0, topk, {{"w", 0, 1, DType::kF32, {4}, {wrong}}}).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(store_
                .Push("j", 0, CompressionSpec(Compression::kTopK, 0),
                      {{"w", 0, 1, DType::kF32, {4}, {good}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing was applied: both keys are at round 0 with their initial values.
  EXPECT_EQ(*Pull(0, 0), (std::vector<float>{1, 2, 3, 4}));
  auto v = store_.Pull("j", 0, {{"v", 0, 0}}, PullOptions());
  EXPECT_EQ(Floats((*v)[0]), (std::vector<float>{0, 0, 0, 0}));
  // A good push is applied by SGD to the scattered gradient (zeros elsewhere).
  ASSERT_TRUE(
      store_.Push("j", 0, topk, {{"w", 0, 1, DType::kF32, {4}, {Pairs({{1, 0.5f}, {3, 1}})}}})
          .ok());
  EXPECT_EQ(*Pull(0, 1), (std::vector<float>{1, 1.5f, 3, 3}));
}

TEST_F(StoreTest, ExportImportResumesMidRound) {
  JobConfig c = Config(2);
  c.optimizer = OptimizerKind::kSgd;
  c.learning_rate = 0.1;
  c.momentum = 0.9;
  SetUpJob(c);
  ASSERT_TRUE(Push(0, 1, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(Push(1, 1, {1, 2, 3, 4}).ok());
  ASSERT_TRUE(Push(0, 2, {4, 3, 2, 1}).ok());  // round 2 half done
  Store copy{StoreOptions()};
  ASSERT_TRUE(copy.Import(store_.Export()).ok());
  // Both stores finish round 2 the same way.
  for (Store* s : {&store_, &copy}) {
    std::string g = F32({1, 0, 1, 0});
    ASSERT_TRUE(s->Push("j", 1, Compression::kNone, {{"w", 0, 2, DType::kF32, {4}, {g}}}).ok());
  }
  auto a = store_.Pull("j", 0, {{"w", 0, 2}}, PullOptions());
  auto b = copy.Pull("j", 0, {{"w", 0, 2}}, PullOptions());
  EXPECT_EQ((*a)[0].bytes.view(), (*b)[0].bytes.view());
  EXPECT_EQ(copy.GetJob("j", 1, true)->slices[0].completed_round, 2);
  // Importing a job that exists fails.
  EXPECT_EQ(copy.Import(store_.Export()).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(StoreTest, ImportRejectsInconsistentState) {
  SetUpJob(Config(2));
  std::vector<JobState> state = store_.Export();
  state[0].slices[0].pushed = {3, 0};  // SYNC rounds 3 apart
  Store s1{StoreOptions()};
  EXPECT_EQ(s1.Import(state).code(), absl::StatusCode::kInvalidArgument);
  state = store_.Export();
  state[0].slices[0].value = std::make_shared<std::vector<float>>(3);
  EXPECT_EQ(s1.Import(state).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(s1.JobNames().empty());
}

TEST_F(StoreTest, ConcurrentPushesOfManySlices) {
  const int kWorkers = 4, kKeys = 8, kRounds = 20;
  ASSERT_TRUE(store_.CreateJob(Config(kWorkers)).ok());
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_TRUE(store_.Init("j", {{Spec(absl::StrCat("k", k), {64}), {}}}).ok());
  }
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::string g = F32(std::vector<float>(64, 1.0f));
      for (int r = 1; r <= kRounds; ++r) {
        std::vector<PushItem> items;
        for (int k = 0; k < kKeys; ++k) {
          items.push_back({absl::StrCat("k", k), 0, r, DType::kF32, {64}, {g}});
        }
        ASSERT_TRUE(store_.Push("j", w, Compression::kNone, items).ok());
        std::vector<PullRequestItem> pulls;
        for (int k = 0; k < kKeys; ++k) pulls.push_back({absl::StrCat("k", k), 0, r});
        auto v = store_.Pull("j", w, pulls, PullOptions());
        ASSERT_TRUE(v.ok()) << v.status();
        for (const PulledValue& p : *v) ASSERT_EQ(Floats(p)[0], float(kWorkers));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_.GetJob("j", 0, false)->rounds_completed, kKeys * kRounds);
}

TEST_F(StoreTest, LeaveJobDropsTheJobOnceEveryWorkerLeft) {
  SetUpJob(Config(2));
  ASSERT_TRUE(Push(0, 1, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(Push(1, 1, {1, 1, 1, 1}).ok());
  absl::StatusOr<bool> first = store_.LeaveJob("j", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(*first);
  // Worker 1 still reads its last round after worker 0 left.
  absl::StatusOr<std::vector<float>> last = Pull(1, 1);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, (std::vector<float>{2, 2, 2, 2}));
  EXPECT_FALSE(*store_.LeaveJob("j", 0));  // leaving twice changes nothing
  EXPECT_EQ(store_.JobNames(), std::vector<std::string>{"j"});
  EXPECT_EQ(store_.LeaveJob("j", 2).status().code(), absl::StatusCode::kInvalidArgument);
  const uint64_t version = store_.version();
  absl::StatusOr<bool> second = store_.LeaveJob("j", 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(*second);
  EXPECT_TRUE(store_.JobNames().empty());
  EXPECT_GT(store_.version(), version);  // the next snapshot drops it too
  EXPECT_EQ(store_.LeaveJob("j", 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, DropIdleJobsDropsOnlyJobsNoCallNamedSince) {
  JobConfig idle = Config(1);
  idle.job = "idle";
  JobConfig busy = Config(1);
  busy.job = "busy";
  ASSERT_TRUE(store_.CreateJob(idle).ok());
  ASSERT_TRUE(store_.CreateJob(busy).ok());
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Time since = absl::Now();
  absl::SleepFor(absl::Milliseconds(20));
  // A worker's call naming "busy" after `since` keeps it; GetJob (what
  // monitoring calls) does not keep "idle".
  ASSERT_TRUE(store_.CreateJob(busy).ok());
  ASSERT_TRUE(store_.GetJob("idle", 0, false).ok());
  EXPECT_EQ(store_.DropIdleJobs(since), std::vector<std::string>{"idle"});
  EXPECT_EQ(store_.JobNames(), std::vector<std::string>{"busy"});
  EXPECT_TRUE(store_.DropIdleJobs(since).empty());
  EXPECT_EQ(store_.DropIdleJobs(absl::Now() + absl::Seconds(1)), std::vector<std::string>{"busy"});
  EXPECT_TRUE(store_.JobNames().empty());
}

TEST_F(StoreTest, QuotaErrorSaysHowToRaiseIt) {
  Store store(StoreOptions{3, /*quota_bytes_per_job=*/64});
  ASSERT_TRUE(store.CreateJob(Config(1)).ok());
  absl::Status over = store.Init("j", {{Spec("big", {100}), {}}}).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.message(), "quota of 64 bytes")) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "--quota_bytes_per_job")) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "shard 3")) << over;
}

// A shard holds at most max_jobs jobs: one more is RESOURCE_EXHAUSTED naming
// the limit (and nothing held is touched); recreating an existing job is
// not a new one; after a delete there is room again.
TEST_F(StoreTest, JobsPerShardAreCapped) {
  StoreOptions o;
  o.shard_index = 2;
  o.max_jobs = 2;
  Store store(o);
  JobConfig a = Config(1), b = Config(1), c = Config(1);
  a.job = "a";
  b.job = "b";
  c.job = "c";
  ASSERT_TRUE(store.CreateJob(a).ok());
  ASSERT_TRUE(store.CreateJob(b).ok());
  absl::Status over = store.CreateJob(c).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "--max_jobs=2")) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "shard 2")) << over;
  EXPECT_TRUE(store.CreateJob(a).ok());  // exists: not a third job
  EXPECT_EQ(store.JobNames().size(), 2u);
  ASSERT_TRUE(store.DeleteJob("b").ok());
  EXPECT_TRUE(store.CreateJob(c).ok());
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
