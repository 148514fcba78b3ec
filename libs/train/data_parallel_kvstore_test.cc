// Two trainers (threads here, each with its own ParameterServer and two CPU
// devices) synchronize gradients through a kvstore of two in-process shards,
// in the parameter server's synchronous mode, and end with the same
// parameters as one device on the same global batch after 20 steps.
#include <thread>

#include "gtest/gtest.h"
#include "libs/kvstore/in_process.h"
#include "libs/train/data_parallel.h"
#include "libs/train/dp_test_util.h"
#include "libs/train/kvstore_test_util.h"

namespace dtrain {
namespace train {
namespace {

constexpr int kTrainers = 2;
constexpr int64_t kGlobalBatch = 32;
constexpr int kSteps = 20;

void CheckThroughKvstore(const std::string& model) {
  std::unique_ptr<kvstore::InProcessKVStore> kv = testing::InProcessShards(2);
  ASSERT_NE(kv, nullptr);
  std::vector<std::vector<std::vector<float>>> results(kTrainers);
  std::vector<absl::Status> statuses(kTrainers);
  std::vector<std::thread> trainers;
  for (int rank = 0; rank < kTrainers; ++rank) {
    trainers.emplace_back([&, rank] {
      auto ps = kv->Connect("dp-" + model, rank);
      if (!ps.ok()) {
        statuses[rank] = ps.status();
        return;
      }
      DataParallelOptions o;
      o.model = model;
      o.devices = {Device::Cpu(0), Device::Cpu(1)};
      o.sgd = {.lr = testing::kLr, .momentum = testing::kMomentum};
      o.init = testing::kInit;
      o.seed = 11;  // same initial weights on both trainers
      o.bucket_bytes = 64 << 10;
      o.kvstore = ps->get();
      o.kvstore_workers = kTrainers;
      auto trainer = DataParallelTrainer::Create(o);
      if (!trainer.ok()) {
        statuses[rank] = trainer.status();
        return;
      }
      int64_t share = kGlobalBatch / kTrainers;
      for (int s = 0; s < kSteps; ++s) {
        Tensor x, y;
        testing::SyntheticBatch(kGlobalBatch, s, &x, &y);
        absl::StatusOr<float> loss =
            (*trainer)->Step(x.Slice(rank * share, (rank + 1) * share).Clone(),
                             y.Slice(rank * share, (rank + 1) * share).Clone());
        if (!loss.ok()) {
          statuses[rank] = loss.status();
          return;
        }
      }
      for (auto& [name, p] : (*trainer)->replica(1)->NamedParameters()) {
        results[rank].push_back(p.value().ToVector<float>());
      }
    });
  }
  for (auto& t : trainers) t.join();
  for (int r = 0; r < kTrainers; ++r)
    ASSERT_TRUE(statuses[r].ok()) << "trainer " << r << ": " << statuses[r];
  auto want = testing::ReferenceRun(model, kGlobalBatch, kSteps, 11);
  for (int r = 0; r < kTrainers; ++r) {
    double diff = testing::MaxRelativeDifference(results[r], want);
    std::printf("kvstore_equivalence model=%s trainer=%d max_relative_difference=%g\n",
                model.c_str(), r, diff);
    EXPECT_LT(diff, 1e-5) << model << " trainer " << r;
  }
}

TEST(DataParallelKvstoreTest, TwoTrainersThroughTwoShardsMlp) { CheckThroughKvstore("mlp"); }
TEST(DataParallelKvstoreTest, TwoTrainersThroughTwoShardsLeNet) { CheckThroughKvstore("lenet"); }

}  // namespace
}  // namespace train
}  // namespace dtrain
