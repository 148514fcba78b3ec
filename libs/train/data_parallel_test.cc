#include "libs/train/data_parallel.h"

#include <string>
#include <tuple>

#include "gtest/gtest.h"
#include "libs/train/dp_test_util.h"

namespace dtrain {
namespace train {
namespace {

using testing::MaxRelativeDifference;
using testing::ReferenceRun;
using testing::SyntheticBatch;

constexpr int kSteps = 20;

class EquivalenceTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// k CPU devices in one trainer end with the same parameters as one device
// on the same global batch (the 1e-5 relative).
TEST_P(EquivalenceTest, SameParametersAsOneDevice) {
  const std::string model = std::get<0>(GetParam());
  const int k = std::get<1>(GetParam());
  const int64_t batch = 32;
  DataParallelOptions o;
  o.model = model;
  o.devices.clear();
  for (int i = 0; i < k; ++i) o.devices.push_back(Device::Cpu(i));
  o.sgd = {.lr = testing::kLr, .momentum = testing::kMomentum};
  o.init = testing::kInit;
  o.seed = 5;
  o.bucket_bytes = 64 << 10;  // several buckets, to exercise overlap
  auto trainer = DataParallelTrainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_GT((*trainer)->num_buckets(), 1);
  for (int s = 0; s < kSteps; ++s) {
    Tensor x, y;
    SyntheticBatch(batch, s, &x, &y);
    absl::StatusOr<float> loss = (*trainer)->Step(x, y);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(std::isfinite(*loss));
  }
  auto want = ReferenceRun(model, batch, kSteps, 5);
  for (int r = 0; r < k; ++r) {
    std::vector<std::vector<float>> got;
    for (auto& [name, p] : (*trainer)->replica(r)->NamedParameters()) {
      got.push_back(p.value().ToVector<float>());
    }
    EXPECT_LT(MaxRelativeDifference(got, want), 1e-5) << model << " k=" << k << " replica " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EquivalenceTest,
                         ::testing::Combine(::testing::Values("mlp", "lenet"),
                                            ::testing::Values(1, 2, 4)));

TEST(DataParallelTest, UnevenSplitStillMatches) {
  DataParallelOptions o;
  o.model = "mlp";
  o.devices = {Device::Cpu(0), Device::Cpu(1), Device::Cpu(2)};
  o.sgd = {.lr = testing::kLr, .momentum = testing::kMomentum};
  o.init = testing::kInit;
  o.seed = 9;
  auto trainer = *DataParallelTrainer::Create(o);
  for (int s = 0; s < 5; ++s) {
    Tensor x, y;
    SyntheticBatch(31, s, &x, &y);  // 11 + 10 + 10
    ASSERT_TRUE(trainer->Step(x, y).ok());
  }
  std::vector<std::vector<float>> got;
  for (auto& [name, p] : trainer->replica(2)->NamedParameters()) {
    got.push_back(p.value().ToVector<float>());
  }
  EXPECT_LT(MaxRelativeDifference(got, ReferenceRun("mlp", 31, 5, 9)), 1e-5);
}

TEST(DataParallelTest, BadInputIsAnErrorNotACrash) {
  DataParallelOptions o;
  o.model = "mlp";
  o.devices = {Device::Cpu(0), Device::Cpu(1)};
  auto trainer = *DataParallelTrainer::Create(o);
  Tensor x, y;
  SyntheticBatch(1, 0, &x, &y);
  EXPECT_EQ(trainer->Step(x, y).status().code(), absl::StatusCode::kInvalidArgument);
  o.devices = {Device::Cuda(0)};
  EXPECT_EQ(DataParallelTrainer::Create(o).status().code(), absl::StatusCode::kUnimplemented);
  o.devices = {};
  EXPECT_FALSE(DataParallelTrainer::Create(o).ok());
  EXPECT_FALSE(DataParallelTrainer::Create({.model = "nope"}).ok());
}

TEST(DataParallelTest, ScalingHelperFollowsTheLinearRule) {
  ScaledHyperparameters s = ScaleForDevices(256, 0.1f, 4);
  EXPECT_EQ(s.batch_size, 1024);
  EXPECT_FLOAT_EQ(s.lr, 0.4f);
}

}  // namespace
}  // namespace train
}  // namespace dtrain
