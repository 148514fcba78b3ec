#include "libs/kvstore/worker_keys.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

// A key of `elements` f32 values: sliced over the servers at 1 MiB and up.
KeySpec F32(const std::string& name, int64_t elements) {
  return {name, {elements}, DType::kF32, nullptr};
}

class WorkerKeysTest : public ::testing::Test {
 protected:
  static constexpr int kServers = 2;

  void InitKeys(const std::vector<KeySpec>& specs) {
    auto placed = keys_.Place("job", specs, kServers, PlacementOptions());
    ASSERT_TRUE(placed.ok()) << placed.status();
    keys_.Add(*std::move(placed));
  }

  WorkerKeys keys_{"worker 3"};
};

TEST_F(WorkerKeysTest, PushesNumberEachSliceAndPullsAskForTheLastPushedRound) {
  ASSERT_NO_FATAL_FAILURE(InitKeys({F32("small", 4), F32("big", 1 << 18)}));
  std::vector<float> small(4), big(1 << 18);
  std::vector<CallItem> push = {{"small", small.data(), nullptr}, {"big", big.data(), nullptr}};
  for (int64_t round = 1; round <= 3; ++round) {
    auto plan = keys_.PlanCall(CallKind::kPush, push, std::make_shared<Work::State>());
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->ops.size(), 1u + kServers);  // "big" is one slice per server
    for (const WorkerKeys::SliceOp& op : plan->ops) {
      EXPECT_EQ(op.round, round) << op.slice->spec.key << " slice " << op.slice->spec.slice;
      EXPECT_EQ(op.dst, nullptr);
    }
    // A slice's source is its first element in the caller's buffer.
    const WorkerKeys::SliceOp& second = plan->ops[2];
    EXPECT_EQ(second.slice->spec.key, "big");
    EXPECT_EQ(second.src, reinterpret_cast<const char*>(big.data() + second.slice->spec.offset));
    EXPECT_GT(second.slice->spec.offset, 0);
  }
  auto pull = keys_.PlanCall(CallKind::kPull, {{"big", nullptr, big.data()}},
                             std::make_shared<Work::State>());
  ASSERT_TRUE(pull.ok());
  for (const WorkerKeys::SliceOp& op : pull->ops) {
    EXPECT_EQ(op.round, 3);
    EXPECT_EQ(op.src, nullptr);
    EXPECT_EQ(op.dst, reinterpret_cast<char*>(big.data() + op.slice->spec.offset));
  }
  CallItem older{"big", nullptr, big.data(), /*round=*/2};
  pull = keys_.PlanCall(CallKind::kPull, {older}, std::make_shared<Work::State>());
  ASSERT_TRUE(pull.ok());
  EXPECT_EQ(pull->ops[0].round, 2);
  EXPECT_EQ(*keys_.PushedRound("big"), 3);
}

TEST_F(WorkerKeysTest, ACallWaitsForTheLatestEarlierCallOnEachOfItsKeysOnce) {
  ASSERT_NO_FATAL_FAILURE(InitKeys({F32("a", 4), F32("b", 4), F32("c", 4)}));
  std::vector<float> v(4);
  auto first = std::make_shared<Work::State>();
  ASSERT_TRUE(keys_.PlanCall(CallKind::kPush, {{"a", v.data()}, {"b", v.data()}}, first).ok());
  auto second = std::make_shared<Work::State>();
  auto plan = keys_.PlanCall(
      CallKind::kPushPull,
      {{"a", v.data(), v.data()}, {"b", v.data(), v.data()}, {"c", v.data(), v.data()}}, second);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->after.size(), 1u);  // "a" and "b" share one earlier call; "c" had none
  EXPECT_EQ(plan->after[0], first);
  auto third = std::make_shared<Work::State>();
  plan = keys_.PlanCall(CallKind::kPull, {{"c", nullptr, v.data()}}, third);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->after.size(), 1u);
  EXPECT_EQ(plan->after[0], second);
}

TEST_F(WorkerKeysTest, KeysNotInitedHereAreNotFoundNamingTheWorker) {
  ASSERT_NO_FATAL_FAILURE(InitKeys({F32("a", 4)}));
  std::vector<float> v(4);
  auto plan = keys_.PlanCall(CallKind::kPush, {{"a", v.data()}, {"zz", v.data()}},
                             std::make_shared<Work::State>());
  ASSERT_TRUE(absl::IsNotFound(plan.status())) << plan.status();
  EXPECT_EQ(plan.status().message(), "push of key 'zz' not Init'ed by worker 3");
  // Nothing was numbered: the failed call's known key keeps its round.
  EXPECT_EQ(*keys_.PushedRound("a"), 0);
  EXPECT_TRUE(absl::IsNotFound(keys_.PushedRound("zz").status()));
  EXPECT_TRUE(absl::IsNotFound(keys_.Placement("zz").status()));
}

TEST_F(WorkerKeysTest, PlacingAKeyAgainWithAnotherShapeIsRefusedAndAddKeepsTheFirst) {
  ASSERT_NO_FATAL_FAILURE(InitKeys({F32("a", 4)}));
  std::vector<float> v(4);
  ASSERT_TRUE(
      keys_.PlanCall(CallKind::kPush, {{"a", v.data()}}, std::make_shared<Work::State>()).ok());
  EXPECT_EQ(keys_.Place("job", {F32("a", 8)}, kServers, PlacementOptions()).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Init'ing the same key again (another worker process, a retry) keeps its rounds.
  ASSERT_NO_FATAL_FAILURE(InitKeys({F32("a", 4)}));
  EXPECT_EQ(*keys_.PushedRound("a"), 1);
  auto placement = keys_.Placement("a");
  ASSERT_TRUE(placement.ok());
  ASSERT_EQ(placement->size(), 1u);
  EXPECT_EQ((*placement)[0].spec.count, 4);
}

TEST_F(WorkerKeysTest, SetPushedRoundsTakesTheServersRoundsAndReturnsTheLowest) {
  ASSERT_NO_FATAL_FAILURE(InitKeys({F32("small", 4), F32("big", 1 << 18)}));
  std::vector<JobStatus> per_server(kServers);
  auto big = keys_.Placement("big");
  auto small = keys_.Placement("small");
  ASSERT_TRUE(big.ok() && small.ok());
  for (const PlacedSlice& p : *big) {
    per_server[static_cast<size_t>(p.server)].slices.push_back({p.spec, 0, 7 + p.spec.slice});
  }
  // "small" is not reported (its server lost it): it keeps its round, 0.
  EXPECT_EQ(keys_.SetPushedRounds(per_server), 0);
  EXPECT_EQ(*keys_.PushedRound("big"), 7);
  EXPECT_EQ(*keys_.PushedRound("small"), 0);
  const PlacedSlice& s = (*small)[0];
  per_server[static_cast<size_t>(s.server)].slices.push_back({s.spec, 0, 9});
  EXPECT_EQ(keys_.SetPushedRounds(per_server), 7);
  EXPECT_EQ(*keys_.PushedRound("small"), 9);
  // The next push of each slice follows what the servers hold.
  std::vector<float> v(1 << 18);
  auto plan = keys_.PlanCall(CallKind::kPush, {{"big", v.data()}}, std::make_shared<Work::State>());
  ASSERT_TRUE(plan.ok());
  for (const WorkerKeys::SliceOp& op : plan->ops) EXPECT_EQ(op.round, 8 + op.slice->spec.slice);
}

TEST(WorkerKeysInitTest, SlicesByServerPointsEachSliceAtItsPartOfTheInitialValue) {
  WorkerKeys keys("worker 0");
  std::vector<float> big(1 << 18);
  std::vector<KeySpec> specs = {F32("small", 4), F32("big", 1 << 18)};
  specs[1].initial = big.data();
  auto placed = keys.Place("job", specs, 2, PlacementOptions());
  ASSERT_TRUE(placed.ok());
  auto by_server = WorkerKeys::SlicesByServer(specs, *placed, 2);
  ASSERT_EQ(by_server.size(), 2u);
  int slices = 0;
  for (size_t server = 0; server < by_server.size(); ++server) {
    for (const WorkerKeys::InitSlice& s : by_server[server]) {
      ++slices;
      EXPECT_EQ(s.slice->server, static_cast<int>(server));
      if (s.slice->spec.key == "small") {
        EXPECT_EQ(s.initial, nullptr);
      } else {
        EXPECT_EQ(s.initial, reinterpret_cast<const char*>(big.data() + s.slice->spec.offset));
      }
    }
  }
  EXPECT_EQ(slices, 3);
}

TEST(WorkerKeysEmptyTest, NoKeysResumeAtRoundZero) {
  WorkerKeys keys("this client");
  EXPECT_EQ(keys.SetPushedRounds({}), 0);
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
