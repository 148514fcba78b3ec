#include "libs/train/data_parallel.h"

#include <cstdlib>
#include <string>
#include <tuple>

#include "gtest/gtest.h"
#include "libs/train/dp_test_util.h"
#include "libs/train/state_io.h"

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
  // This binary does not link the CUDA backend: cuda:0 is unavailable here
  // whether or not the machine has a GPU (data_parallel_cuda_test covers it).
  o.devices = {Device::Cuda(0)};
  EXPECT_EQ(DataParallelTrainer::Create(o).status().code(), absl::StatusCode::kFailedPrecondition);
  o.devices = {};
  EXPECT_FALSE(DataParallelTrainer::Create(o).ok());
  DataParallelOptions unknown;
  unknown.model = "nope";
  EXPECT_FALSE(DataParallelTrainer::Create(unknown).ok());
}

// Resuming: 10 steps, a checkpoint (parameters and momentum), and a new
// trainer restored from it through DataParallelOptions::restore continues
// exactly as the original does for 10 more steps. Restoring only the
// parameters (momentum lost) would not.
TEST(DataParallelTest, RestoreContinuesFromACheckpoint) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/dp_restore.ckpt";
  DataParallelOptions o;
  o.model = "mlp";
  o.devices = {Device::Cpu(0), Device::Cpu(1)};
  o.sgd = {.lr = 0.05f, .momentum = 0.9f};
  o.seed = 4;
  auto step = [](DataParallelTrainer* t, int s) {
    Tensor x, y;
    SyntheticBatch(32, s, &x, &y);
    ASSERT_TRUE(t->Step(x, y).ok());
  };
  auto params = [](DataParallelTrainer* t, int r) {
    std::vector<std::vector<float>> out;
    for (auto& [name, p] : t->replica(r)->NamedParameters()) {
      out.push_back(p.value().ToVector<float>());
    }
    return out;
  };
  auto original = *DataParallelTrainer::Create(o);
  for (int s = 0; s < 10; ++s) step(original.get(), s);
  ASSERT_TRUE(
      SaveTrainingState(path, "mlp", original->replica(0), original->optimizer(0), {}).ok());

  for (bool with_momentum : {true, false}) {
    DataParallelOptions ro = o;
    ro.seed = 77;  // different initial weights: the restore must replace them
    int calls = 0;
    ro.restore = [&](nn::Module* m, nn::Sgd* opt) -> absl::Status {
      ++calls;
      return LoadTrainingState(path, "mlp", m, with_momentum ? opt : nullptr).status();
    };
    auto resumed = *DataParallelTrainer::Create(ro);
    EXPECT_EQ(calls, 2);  // every replica
    if (with_momentum) {
      for (int s = 10; s < 20; ++s) step(original.get(), s);
    }
    for (int s = 10; s < 20; ++s) step(resumed.get(), s);
    for (int r = 0; r < 2; ++r) {
      const double diff =
          MaxRelativeDifference(params(resumed.get(), r), params(original.get(), 0));
      if (with_momentum) {
        EXPECT_LT(diff, 1e-6) << "replica " << r;
      } else {
        EXPECT_GT(diff, 1e-4) << "replica " << r << ": momentum should matter";
      }
    }
  }
  // A failing restore fails Create with its status.
  DataParallelOptions bad = o;
  bad.restore = [](nn::Module*, nn::Sgd*) { return absl::DataLossError("corrupt"); };
  EXPECT_EQ(DataParallelTrainer::Create(bad).status().code(), absl::StatusCode::kDataLoss);
}

// last_correct counts the step's correct predictions, made before the update.
TEST(DataParallelTest, LastCorrectCountsTheStepsPredictions) {
  for (int k : {1, 2}) {
    DataParallelOptions o;
    o.model = "mlp";
    o.devices.clear();
    for (int i = 0; i < k; ++i) o.devices.push_back(Device::Cpu(i));
    o.sgd = {.lr = 0.1f};
    o.init = nn::Init::kKaiming;
    o.seed = 3;
    auto trainer = *DataParallelTrainer::Create(o);
    for (int s = 0; s < 5; ++s) {
      Tensor x, y;
      SyntheticBatch(64, s, &x, &y);
      int64_t want = 0;
      {
        autograd::NoGradGuard no_grad;
        want = ops::CountCorrect(trainer->replica(0)->Forward(autograd::Variable(x)).value(), y);
      }
      ASSERT_TRUE(trainer->Step(x, y).ok());
      if (k == 1) {
        EXPECT_EQ(trainer->last_correct(), want) << "step " << s;
      } else {
        EXPECT_NEAR(trainer->last_correct(), want, 2) << "step " << s;  // slices round apart
      }
      EXPECT_GT(want, 0);
    }
  }
}

TEST(DataParallelTest, ScalingHelperFollowsTheLinearRule) {
  ScaledHyperparameters s = ScaleForDevices(256, 0.1f, 4);
  EXPECT_EQ(s.batch_size, 1024);
  EXPECT_FLOAT_EQ(s.lr, 0.4f);
}

}  // namespace
}  // namespace train
}  // namespace dtrain
