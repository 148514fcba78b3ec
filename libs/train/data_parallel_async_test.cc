// Asynchronous and bounded-delay data parallelism through the parameter
// server (DataParallelOptions::kvstore_consistency): the kvstore shards hold
// the weights and apply SGD to every pushed gradient bucket; trainers pull the
// weights back. Two in-process shards, trainers as threads with their own
// ParameterServer.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "gtest/gtest.h"
#include "libs/kvstore/in_process.h"
#include "libs/train/data_parallel.h"
#include "libs/train/dp_test_util.h"
#include "libs/train/kvstore_test_util.h"

namespace dtrain {
namespace train {
namespace {

using kvstore::Consistency;
using testing::InProcessShards;

constexpr int kSteps = 20;
// Two trainers learn slower (stale gradients); give them more steps.
constexpr int kTwoTrainerSteps = 40;

std::vector<std::vector<float>> Parameters(DataParallelTrainer* t, int replica) {
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : t->replica(replica)->NamedParameters()) {
    out.push_back(p.value().ToVector<float>());
  }
  return out;
}

DataParallelOptions AsyncOptions(kvstore::ParameterServer* ps, int workers, Consistency c,
                                 int staleness) {
  DataParallelOptions o;
  o.model = "mlp";
  o.devices = {Device::Cpu(0), Device::Cpu(1)};
  o.sgd = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f};
  o.init = nn::Init::kNormal;
  o.seed = 21;
  o.bucket_bytes = 64 << 10;  // several buckets, sliced over both shards
  o.kvstore = ps;
  o.kvstore_workers = workers;
  o.kvstore_consistency = c;
  o.kvstore_max_staleness = staleness;
  return o;
}

class SingleTrainerTest : public ::testing::TestWithParam<Consistency> {};

// One trainer in a 1-worker job through 2 shards is plain SGD with the
// weights on the server: it must end where local training on one device
// ends (momentum and weight decay included, so the server's formula is
// checked against nn::Sgd's).
TEST_P(SingleTrainerTest, SameParametersAsLocalTraining) {
  const Consistency c = GetParam();
  const std::string name = std::string("single_") + kvstore::ConsistencyName(c);
  std::unique_ptr<kvstore::InProcessKVStore> kv = InProcessShards(2);
  ASSERT_NE(kv, nullptr);
  auto ps = kv->Connect(name, 0);
  ASSERT_TRUE(ps.ok()) << ps.status();
  DataParallelOptions o = AsyncOptions(ps->get(), 1, c, c == Consistency::kBoundedDelay ? 1 : 0);
  auto trainer = DataParallelTrainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_GT((*trainer)->num_buckets(), 1);
  const int64_t batch = 32;
  for (int s = 0; s < kSteps; ++s) {
    Tensor x, y;
    testing::SyntheticBatch(batch, s, &x, &y);
    absl::StatusOr<float> loss = (*trainer)->Step(x, y);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(std::isfinite(*loss));
  }
  auto want = testing::ReferenceRun("mlp", batch, kSteps, o.seed, o.sgd.lr, o.sgd.momentum, o.init,
                                    o.sgd.weight_decay);
  for (int r = 0; r < 2; ++r) {
    double diff = testing::MaxRelativeDifference(Parameters(trainer->get(), r), want);
    std::printf("kvstore_%s_single_trainer replica=%d max_relative_difference=%g\n",
                kvstore::ConsistencyName(c), r, diff);
    EXPECT_LT(diff, 1e-5) << "replica " << r;
  }
  // The final pull changes nothing for a single worker.
  ASSERT_TRUE((*trainer)->PullLatestWeights().ok());
  EXPECT_LT(testing::MaxRelativeDifference(Parameters(trainer->get(), 0), want), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Modes, SingleTrainerTest,
                         ::testing::Values(Consistency::kAsync, Consistency::kBoundedDelay),
                         [](const ::testing::TestParamInfo<Consistency>& info) {
                           return std::string(kvstore::ConsistencyName(info.param));
                         });

struct TrainerResult {
  absl::Status status;
  std::vector<float> losses;
  // Largest (own pushed round - completed round) over the slices of every
  // shard, seen after a step returned.
  int64_t max_lead = 0;
};

// Two trainers (threads), the second slower, each its own ParameterServer and 2
// devices, on disjoint halves of each global batch.
void RunTwoTrainers(Consistency c, int staleness, std::vector<TrainerResult>* results,
                    std::vector<std::vector<std::vector<float>>>* final_params) {
  constexpr int kTrainers = 2;
  const std::string name = std::string("two_") + kvstore::ConsistencyName(c);
  std::unique_ptr<kvstore::InProcessKVStore> kv = InProcessShards(2);
  ASSERT_NE(kv, nullptr);
  results->assign(kTrainers, TrainerResult());
  std::vector<std::unique_ptr<kvstore::InProcessParameterServer>> servers(kTrainers);
  std::vector<std::unique_ptr<DataParallelTrainer>> trainers(kTrainers);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kTrainers; ++rank) {
    threads.emplace_back([&, rank] {
      TrainerResult& res = (*results)[rank];
      auto ps = kv->Connect(name, rank);
      if (!ps.ok()) {
        res.status = ps.status();
        return;
      }
      servers[rank] = std::move(*ps);
      DataParallelOptions o = AsyncOptions(servers[rank].get(), kTrainers, c, staleness);
      // Two workers' pushes both land on the weights (twice the step size
      // of one trainer) and are stale: plain SGD keeps this stable.
      o.sgd = {.lr = 0.1f};
      o.init = nn::Init::kKaiming;
      o.seed = 21 + rank;  // the server's initial weights win
      auto trainer = DataParallelTrainer::Create(o);
      if (!trainer.ok()) {
        res.status = trainer.status();
        return;
      }
      trainers[rank] = std::move(*trainer);
      const int64_t global = 64, share = global / kTrainers;
      for (int s = 0; s < kTwoTrainerSteps; ++s) {
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        Tensor x, y;
        // The same few batches again and again, so the loss must fall.
        testing::SyntheticBatch(global, s % 4, &x, &y);
        absl::StatusOr<float> loss =
            trainers[rank]->Step(x.Slice(rank * share, (rank + 1) * share).Clone(),
                                 y.Slice(rank * share, (rank + 1) * share).Clone());
        if (!loss.ok()) {
          res.status = loss.status();
          return;
        }
        res.losses.push_back(*loss);
        for (int shard = 0; shard < kv->num_shards(); ++shard) {
          auto job = kv->shard(shard).GetJob(name, rank, /*include_slices=*/true);
          if (!job.ok()) {
            res.status = job.status();
            return;
          }
          for (const kvstore::SliceStatus& sl : job->slices) {
            res.max_lead = std::max(res.max_lead, sl.pushed_round - sl.completed_round);
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kTrainers; ++r) {
    ASSERT_TRUE((*results)[r].status.ok()) << "trainer " << r << ": " << (*results)[r].status;
  }
  final_params->clear();
  for (int r = 0; r < kTrainers; ++r) {
    ASSERT_TRUE(trainers[r]->PullLatestWeights().ok());
    final_params->push_back(Parameters(trainers[r].get(), 1));
  }
}

void ExpectTrainedAndAgreeing(const std::vector<TrainerResult>& results,
                              const std::vector<std::vector<std::vector<float>>>& params) {
  for (size_t r = 0; r < results.size(); ++r) {
    const std::vector<float>& l = results[r].losses;
    ASSERT_EQ(l.size(), static_cast<size_t>(kTwoTrainerSteps));
    float first = (l[0] + l[1] + l[2] + l[3]) / 4;
    float last = (l[kTwoTrainerSteps - 4] + l[kTwoTrainerSteps - 3] + l[kTwoTrainerSteps - 2] +
                  l[kTwoTrainerSteps - 1]) /
                 4;
    std::printf("trainer=%zu first_loss=%g last_loss=%g max_lead=%lld\n", r, first, last,
                static_cast<long long>(results[r].max_lead));
    EXPECT_LT(last, 0.9f * first) << "trainer " << r;
  }
  ASSERT_EQ(params.size(), 2u);
  ASSERT_EQ(params[0].size(), params[1].size());
  for (size_t p = 0; p < params[0].size(); ++p) {
    EXPECT_EQ(params[0][p], params[1][p]) << "parameter " << p;
  }
}

TEST(DataParallelAsyncTest, TwoTrainersAsync) {
  std::vector<TrainerResult> results;
  std::vector<std::vector<std::vector<float>>> params;
  RunTwoTrainers(Consistency::kAsync, 0, &results, &params);
  if (HasFatalFailure()) return;
  ExpectTrainedAndAgreeing(results, params);
  // Without a bound, the fast trainer runs well ahead of the slow one.
  EXPECT_GT(results[0].max_lead, 2);
}

TEST(DataParallelAsyncTest, TwoTrainersBoundedDelay) {
  constexpr int kStaleness = 1;
  std::vector<TrainerResult> results;
  std::vector<std::vector<std::vector<float>>> params;
  RunTwoTrainers(Consistency::kBoundedDelay, kStaleness, &results, &params);
  if (HasFatalFailure()) return;
  ExpectTrainedAndAgreeing(results, params);
  // The server held the fast trainer back: after every step it was at most
  // kStaleness rounds ahead of the slowest.
  for (const TrainerResult& r : results) EXPECT_LE(r.max_lead, kStaleness);
  EXPECT_GE(results[0].max_lead, 1);  // and it did use its slack
}

TEST(DataParallelAsyncTest, BadOptionsAreInvalidArgument) {
  DataParallelOptions o;
  o.model = "mlp";
  o.kvstore_max_staleness = 2;  // without bounded delay
  EXPECT_EQ(DataParallelTrainer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.kvstore_consistency = Consistency::kBoundedDelay;
  o.kvstore_max_staleness = -1;
  EXPECT_EQ(DataParallelTrainer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);

  std::unique_ptr<kvstore::InProcessKVStore> kv = InProcessShards(1);
  ASSERT_NE(kv, nullptr);
  auto ps = kv->Connect("bad", 0);
  ASSERT_TRUE(ps.ok()) << ps.status();
  o = AsyncOptions(ps->get(), 1, Consistency::kAsync, 0);
  o.sgd.nesterov = true;
  EXPECT_EQ(DataParallelTrainer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataParallelAsyncTest, JobConfigCarriesTheServerOptimizer) {
  DataParallelOptions o;
  o.sgd = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
  o.kvstore_workers = 3;
  o.kvstore_consistency = Consistency::kBoundedDelay;
  o.kvstore_max_staleness = 2;
  kvstore::JobConfig c = MakeKvstoreJobConfig("j", o);
  EXPECT_TRUE(kvstore::ValidateJobConfig(c).ok()) << kvstore::DescribeJobConfig(c);
  EXPECT_EQ(c.num_workers, 3);
  EXPECT_EQ(c.consistency, Consistency::kBoundedDelay);
  EXPECT_EQ(c.max_staleness, 2);
  EXPECT_EQ(c.optimizer, kvstore::OptimizerKind::kSgd);
  EXPECT_FLOAT_EQ(static_cast<float>(c.learning_rate), 0.05f);
  EXPECT_EQ(c.gradient_scale, 1.0);
  o.kvstore_consistency = Consistency::kSync;
  o.kvstore_max_staleness = 0;
  EXPECT_EQ(MakeKvstoreJobConfig("j", o), MakeKvstoreJobConfig("j", 3));
}

}  // namespace
}  // namespace train
}  // namespace dtrain
