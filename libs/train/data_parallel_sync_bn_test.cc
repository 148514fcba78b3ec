// Synchronized batch norm (DataParallelOptions::sync_batch_norm): K devices
// in one trainer, and 2 trainers x 2 devices over a TCP communicator, end
// with the same parameters and running statistics as one device on the same
// global batch; without sync batch norm they do not.
#include <cstdio>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/kvstore/in_process.h"
#include "libs/nn/layers.h"
#include "libs/train/data_parallel.h"
#include "libs/train/dp_test_util.h"

namespace dtrain {
namespace train {
namespace {

using testing::MaxRelativeDifference;
using testing::SyntheticBatch;

constexpr int kSteps = 20;
constexpr float kLr = 0.05f, kMomentum = 0.5f;
constexpr uint64_t kSeed = 17;

// conv + BN + relu + pool twice, then linear + BN1d + relu + linear, kept
// small on purpose. The comparison with one device measures how far float
// summation order moves the trajectory, and BN + ReLU puts half of the
// activations near zero, where a rounding-level change flips a ReLU and
// moves the gradient discretely: with 8 and 16 channels at 28x28 (250k
// activations a step) some flip happened within 20 steps in every setting
// tried (even for one device: sync BN vs the oneDNN kernel), sending the
// runs 1e-3..1 apart; at this size all settings tried stay within 1.2e-6.
// Also: layers followed by batch norm have no bias (the gradient of such a
// bias is zero up to rounding, so its value is rounding noise and its
// relative difference means nothing), and pooling is average pooling (an
// argmax flip is discrete too).
absl::StatusOr<std::shared_ptr<nn::Module>> SmallBnNet() {
  auto net = std::make_shared<nn::Sequential>();
  net->Add(std::make_shared<nn::Conv2d>(1, 4, 3, 2, 1, /*bias=*/false));  // 14x14
  net->Add(std::make_shared<nn::BatchNorm2d>(4));
  net->Add(std::make_shared<nn::ReLU>());
  net->Add(std::make_shared<nn::AvgPool2d>(2));                           // 7x7
  net->Add(std::make_shared<nn::Conv2d>(4, 8, 3, 2, 1, /*bias=*/false));  // 4x4
  net->Add(std::make_shared<nn::BatchNorm2d>(8));
  net->Add(std::make_shared<nn::ReLU>());
  net->Add(std::make_shared<nn::AvgPool2d>(2));  // 2x2
  net->Add(std::make_shared<nn::Flatten>());
  net->Add(std::make_shared<nn::Linear>(8 * 2 * 2, 16, /*bias=*/false));
  net->Add(std::make_shared<nn::BatchNorm2d>(16));
  net->Add(std::make_shared<nn::ReLU>());
  net->Add(std::make_shared<nn::Linear>(16, 10));
  return std::shared_ptr<nn::Module>(net);
}

// Parameters, then buffers (running statistics).
std::vector<std::vector<float>> State(nn::Module* m) {
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : m->NamedParameters()) out.push_back(p.value().ToVector<float>());
  for (auto& [name, t] : m->NamedBuffers()) out.push_back(t->ToVector<float>());
  return out;
}

// Separate differences for parameters and running statistics.
struct Diff {
  double params = 0, stats = 0;
};
Diff Compare(const std::vector<std::vector<float>>& got,
             const std::vector<std::vector<float>>& want, size_t num_params) {
  Diff d;
  std::vector<std::vector<float>> gp(got.begin(), got.begin() + num_params),
      wp(want.begin(), want.begin() + num_params), gs(got.begin() + num_params, got.end()),
      ws(want.begin() + num_params, want.end());
  d.params = MaxRelativeDifference(gp, wp);
  d.stats = MaxRelativeDifference(gs, ws);
  return d;
}

// One device, the whole global batch.
std::vector<std::vector<float>> Reference(int64_t batch, size_t* num_params) {
  int threads = ops::CpuThreads();
  ops::SetCpuThreads(1);
  auto m = *SmallBnNet();
  nn::InitParameters(m.get(), nn::Init::kKaiming, kSeed);
  nn::Sgd opt(m->NamedParameters(), {.lr = kLr, .momentum = kMomentum});
  for (int s = 0; s < kSteps; ++s) {
    Tensor x, y;
    SyntheticBatch(batch, s, &x, &y);
    opt.ZeroGrad();
    autograd::SoftmaxCrossEntropy(m->Forward(autograd::Variable(x)), y).Backward();
    opt.Step();
  }
  ops::SetCpuThreads(threads);
  *num_params = m->NamedParameters().size();
  return State(m.get());
}

DataParallelOptions Options(int k, bool sync) {
  DataParallelOptions o;
  o.model_factory = SmallBnNet;
  o.devices.clear();
  for (int i = 0; i < k; ++i) o.devices.push_back(Device::Cpu(i));
  o.sgd = {.lr = kLr, .momentum = kMomentum};
  o.init = nn::Init::kKaiming;
  o.seed = kSeed;
  o.bucket_bytes = 16 << 10;  // several buckets
  o.sync_batch_norm = sync;
  o.sync_batch_norm_timeout = absl::Seconds(60);
  return o;
}

// Runs one trainer for kSteps on `batch` rows per step; returns replica
// states.
std::vector<std::vector<std::vector<float>>> RunOneTrainer(int k, bool sync, int64_t batch) {
  auto trainer = DataParallelTrainer::Create(Options(k, sync));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  for (int s = 0; s < kSteps; ++s) {
    Tensor x, y;
    SyntheticBatch(batch, s, &x, &y);
    absl::StatusOr<float> loss = (*trainer)->Step(x, y);
    EXPECT_TRUE(loss.ok()) << loss.status();
    if (!loss.ok()) return {};
  }
  std::vector<std::vector<std::vector<float>>> out;
  for (int r = 0; r < k; ++r) out.push_back(State((*trainer)->replica(r)));
  return out;
}

class SyncBnEquivalenceTest : public ::testing::TestWithParam<int> {};

TEST_P(SyncBnEquivalenceTest, SameParametersAndStatisticsAsOneDevice) {
  const int k = GetParam();
  const int64_t batch = 32;
  size_t np = 0;
  auto want = Reference(batch, &np);
  auto got = RunOneTrainer(k, true, batch);
  ASSERT_EQ(got.size(), static_cast<size_t>(k));
  for (int r = 0; r < k; ++r) {
    Diff d = Compare(got[r], want, np);
    std::printf("sync_bn k=%d replica=%d params_max_rel_diff=%g running_stats_max_rel_diff=%g\n", k,
                r, d.params, d.stats);
    EXPECT_LT(d.params, 1e-5) << "replica " << r;
    EXPECT_LT(d.stats, 1e-5) << "replica " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, SyncBnEquivalenceTest, ::testing::Values(1, 2, 4));

// Slices of 11, 10 and 10 rows: the loss weights in the backward matter.
TEST(SyncBnTest, UnevenSplitStillMatches) {
  size_t np = 0;
  auto want = Reference(31, &np);
  auto got = RunOneTrainer(3, true, 31);
  ASSERT_EQ(got.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    Diff d = Compare(got[r], want, np);
    std::printf(
        "sync_bn uneven k=3 replica=%d params_max_rel_diff=%g running_stats_max_rel_diff=%g\n", r,
        d.params, d.stats);
    EXPECT_LT(d.params, 1e-5);
    EXPECT_LT(d.stats, 1e-5);
  }
}

// The control: per-device statistics give a different result, so the
// equivalence above is not a no-op.
TEST(SyncBnTest, WithoutSyncBatchNormTheResultDiffers) {
  size_t np = 0;
  auto want = Reference(32, &np);
  auto got = RunOneTrainer(2, false, 32);
  ASSERT_EQ(got.size(), 2u);
  Diff d = Compare(got[0], want, np);
  std::printf("per_device_bn k=2 params_max_rel_diff=%g running_stats_max_rel_diff=%g\n", d.params,
              d.stats);
  EXPECT_GT(d.params, 1e-3);
  EXPECT_GT(d.stats, 1e-3);
}

// 2 trainers (threads) x 2 devices, a TCP communicator between them.
TEST(SyncBnTest, TwoTrainersTimesTwoDevices) {
  constexpr int kTrainers = 2;
  const int64_t global = 32, share = global / kTrainers;
  collective::InMemoryStore store;
  std::vector<std::vector<std::vector<float>>> results(kTrainers);
  std::vector<absl::Status> statuses(kTrainers);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kTrainers; ++rank) {
    threads.emplace_back([&, rank] {
      collective::CommunicatorOptions co;
      co.transport = collective::TransportKind::kTcp;
      co.timeout = absl::Seconds(60);
      auto comm = collective::Communicator::Create(rank, kTrainers, &store, co);
      if (!comm.ok()) {
        statuses[rank] = comm.status();
        return;
      }
      DataParallelOptions o = Options(2, true);
      o.communicator = comm->get();
      auto trainer = DataParallelTrainer::Create(o);
      if (!trainer.ok()) {
        statuses[rank] = trainer.status();
        return;
      }
      for (int s = 0; s < kSteps; ++s) {
        Tensor x, y;
        SyntheticBatch(global, s, &x, &y);
        absl::StatusOr<float> loss =
            (*trainer)->Step(x.Slice(rank * share, (rank + 1) * share).Clone(),
                             y.Slice(rank * share, (rank + 1) * share).Clone());
        if (!loss.ok()) {
          statuses[rank] = loss.status();
          return;
        }
      }
      results[rank] = State((*trainer)->replica(1));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kTrainers; ++r) ASSERT_TRUE(statuses[r].ok()) << r << ": " << statuses[r];
  size_t np = 0;
  auto want = Reference(global, &np);
  for (int r = 0; r < kTrainers; ++r) {
    Diff d = Compare(results[r], want, np);
    std::printf(
        "sync_bn trainers=2 k=2 trainer=%d params_max_rel_diff=%g "
        "running_stats_max_rel_diff=%g\n",
        r, d.params, d.stats);
    EXPECT_LT(d.params, 1e-5);
    EXPECT_LT(d.stats, 1e-5);
  }
  EXPECT_EQ(results[0], results[1]);  // bitwise: same statistics everywhere
}

// A trainer whose peer never steps fails its step within the timeout
// instead of hanging.
TEST(SyncBnTest, AMissingTrainerIsATimeoutNotAHang) {
  collective::InMemoryStore store;
  std::vector<std::unique_ptr<collective::Communicator>> comms(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      collective::CommunicatorOptions co;
      co.transport = collective::TransportKind::kTcp;
      co.timeout = absl::Seconds(2);
      auto comm = collective::Communicator::Create(rank, 2, &store, co);
      if (comm.ok()) comms[rank] = std::move(*comm);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(comms[0] && comms[1]);
  DataParallelOptions o = Options(2, true);
  o.communicator = comms[0].get();
  o.sync_batch_norm_timeout = absl::Seconds(2);
  // Rank 1 takes part in the initial broadcast only.
  std::thread peer([&] {
    DataParallelOptions p = Options(2, true);
    p.communicator = comms[1].get();
    auto t = DataParallelTrainer::Create(p);
    EXPECT_TRUE(t.ok()) << t.status();
  });
  auto trainer = DataParallelTrainer::Create(o);
  peer.join();
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  Tensor x, y;
  SyntheticBatch(16, 0, &x, &y);
  auto start = absl::Now();
  absl::StatusOr<float> loss = (*trainer)->Step(x, y);
  EXPECT_FALSE(loss.ok());
  std::printf("missing trainer: %s after %s\n", loss.status().ToString().c_str(),
              absl::FormatDuration(absl::Now() - start).c_str());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(SyncBnTest, KvstoreAcrossTrainersIsRejected) {
  auto kv = kvstore::InProcessKVStore::Create(kvstore::InProcessOptions());
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto ps = (*kv)->Connect("sync-bn", 0);
  ASSERT_TRUE(ps.ok()) << ps.status();
  DataParallelOptions o = Options(2, true);
  o.kvstore = ps->get();  // never used: Create rejects the options first
  o.kvstore_workers = 2;
  absl::StatusOr<std::unique_ptr<DataParallelTrainer>> t = DataParallelTrainer::Create(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
}

}  // namespace
}  // namespace train
}  // namespace dtrain
