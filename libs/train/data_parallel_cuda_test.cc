// DataParallelTrainer with CUDA replicas (issue #6).
//
// Device-list and option checks run everywhere; the training runs skip with
// the reason on machines without a GPU (or with fewer GPUs than they need).
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/cuda/gpu_test_util.h"
#include "libs/train/data_parallel.h"
#include "libs/train/dp_test_util.h"

namespace dtrain {
namespace train {
namespace {

using testing::MaxRelativeDifference;
using testing::ReferenceRun;
using testing::SyntheticBatch;

constexpr int kSteps = 10;
constexpr int64_t kBatch = 32;
// cuBLAS/cuDNN sum in other orders than oneDNN, and TF32 is off by default
// (libs/cuda/config.h), so 10 steps stay well within this.
constexpr double kTolerance = 1e-4;
// Biases are compared at a looser tolerance: LeNet's conv biases start at
// zero and their gradients are sums that nearly cancel, so any other
// reduction order moves them far more, relative to their size, than the
// weights. Measured without a GPU: two oneDNN convolution layouts on the CPU
// (as different as cuDNN and oneDNN) end these 10 steps 0.00376 apart on
// "0.bias" (the GPU run of 62b5d8a: 0.00376445, the same figure) and within
// 4e-6 on every weight.
constexpr double kBiasTolerance = 1e-2;

DataParallelOptions Options(const std::string& model, std::vector<Device> devices) {
  DataParallelOptions o;
  o.model = model;
  o.devices = std::move(devices);
  o.sgd = {.lr = testing::kLr, .momentum = testing::kMomentum};
  o.init = testing::kInit;
  o.seed = 5;
  o.bucket_bytes = 64 << 10;  // several buckets
  return o;
}

std::vector<std::vector<float>> Parameters(nn::Module* m) {
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : m->NamedParameters()) out.push_back(p.value().ToVector<float>());
  return out;
}

// The positions of `m`'s rank-1 parameters (biases) in Parameters(m).
std::vector<bool> IsBias(nn::Module* m) {
  std::vector<bool> out;
  for (auto& [name, p] : m->NamedParameters()) out.push_back(p.value().shape().size() == 1);
  return out;
}

// `params` split by `bias` into {weights, biases}.
std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> Split(
    const std::vector<std::vector<float>>& params, const std::vector<bool>& bias) {
  std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> out;
  for (size_t i = 0; i < params.size() && i < bias.size(); ++i) {
    (bias[i] ? out.second : out.first).push_back(params[i]);
  }
  return out;
}

// MaxRelativeDifference, made unable to pass by accident: a NaN difference
// compares false with the running maximum (so NaN parameters would read as
// 0), and a missing or short parameter list compares only what is there.
// Returns +inf for either.
double CheckedDifference(const std::vector<std::vector<float>>& got,
                         const std::vector<std::vector<float>>& want) {
  if (got.empty() || got.size() != want.size()) return INFINITY;
  for (size_t p = 0; p < got.size(); ++p) {
    if (got[p].size() != want[p].size()) return INFINITY;
    for (float v : got[p]) {
      if (!std::isfinite(v)) return INFINITY;
    }
  }
  return MaxRelativeDifference(got, want);
}

// Trains `steps` steps of the synthetic stream; the replicas' parameters.
void Train(DataParallelTrainer* trainer, int steps, int64_t batch) {
  for (int s = 0; s < steps; ++s) {
    Tensor x, y;
    SyntheticBatch(batch, s, &x, &y);
    absl::StatusOr<float> loss = trainer->Step(x, y);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(std::isfinite(*loss)) << "step " << s;
  }
}

// ---- runs everywhere ----

TEST(DataParallelCudaTest, MixedDeviceListIsInvalidArgument) {
  for (auto devices : std::vector<std::vector<Device>>{{Device::Cpu(0), Device::Cuda(0)},
                                                       {Device::Cuda(0), Device::Cpu(0)},
                                                       {Device::Cuda(0), Device::Cuda(0)}}) {
    absl::Status s = DataParallelTrainer::Create(Options("mlp", devices)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  absl::Status s =
      DataParallelTrainer::Create(Options("mlp", {Device::Cpu(0), Device::Cuda(1)})).status();
  EXPECT_NE(s.message().find("one kind"), std::string::npos) << s;
}

TEST(DataParallelCudaTest, SyncBatchNormOnCudaIsInvalidArgument) {
  DataParallelOptions o = Options("lenet", {Device::Cuda(0)});
  o.sync_batch_norm = true;
  absl::Status s = DataParallelTrainer::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("sync_batch_norm"), std::string::npos) << s;
}

TEST(DataParallelCudaTest, WithoutGpuCreateIsFailedPrecondition) {
  std::string reason;
  if (cuda::DeviceCount(&reason) > 0) GTEST_SKIP() << "this machine has a GPU";
  absl::Status s = DataParallelTrainer::Create(Options("mlp", {Device::Cuda(0)})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("cuda:0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("no CUDA device"), std::string::npos) << s;
}

// ---- needs a GPU ----

class CudaEquivalenceTest : public ::testing::TestWithParam<std::string> {};

// k = 1 on cuda:0 (host staging path) ends where one CPU device does.
TEST_P(CudaEquivalenceTest, OneGpuMatchesCpuReference) {
  DT_SKIP_WITHOUT_GPU();
  const std::string model = GetParam();
  auto trainer = DataParallelTrainer::Create(Options(model, {Device::Cuda(0)}));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_GT((*trainer)->num_buckets(), 1);
  for (auto& [name, p] : (*trainer)->replica(0)->NamedParameters()) {
    ASSERT_TRUE(p.value().device().is_cuda()) << name;
  }
  Train(trainer->get(), kSteps, kBatch);
  auto want = ReferenceRun(model, kBatch, kSteps, 5);
  const std::vector<bool> bias = IsBias((*trainer)->replica(0));
  auto [got_w, got_b] = Split(Parameters((*trainer)->replica(0)), bias);
  auto [want_w, want_b] = Split(want, bias);
  double diff = CheckedDifference(got_w, want_w);
  double bias_diff = CheckedDifference(got_b, want_b);
  std::printf("cuda k=1 %s max_rel_diff=%g bias_max_rel_diff=%g\n", model.c_str(), diff, bias_diff);
  EXPECT_LT(diff, kTolerance) << model;
  EXPECT_LT(bias_diff, kBiasTolerance) << model;

  Tensor x, y;
  SyntheticBatch(64, 100, &x, &y);
  int64_t correct = (*trainer)->CountCorrect(x, y);
  EXPECT_GE(correct, 0);
  EXPECT_LE(correct, 64);
  // The same count as a CPU trainer that took the same steps (the weights
  // agree to kTolerance, so at most a near-tie may flip).
  auto cpu = DataParallelTrainer::Create(Options(model, {Device::Cpu()}));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  Train(cpu->get(), kSteps, kBatch);
  int64_t cpu_correct = (*cpu)->CountCorrect(x, y);
  EXPECT_LE(std::abs(correct - cpu_correct), 1) << "cuda " << correct << ", cpu " << cpu_correct;
  EXPECT_TRUE((*trainer)->PullLatestWeights().ok());  // no-op without a kvstore
}

// k = 2 GPUs in one trainer: the weighted sum over replicas on the host.
TEST_P(CudaEquivalenceTest, TwoGpusMatchCpuReference) {
  DT_SKIP_WITHOUT_GPUS(2);
  const std::string model = GetParam();
  auto trainer = DataParallelTrainer::Create(Options(model, {Device::Cuda(0), Device::Cuda(1)}));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  Train(trainer->get(), kSteps, kBatch);
  auto want = ReferenceRun(model, kBatch, kSteps, 5);
  const std::vector<bool> bias = IsBias((*trainer)->replica(0));
  auto [want_w, want_b] = Split(want, bias);
  for (int r = 0; r < 2; ++r) {
    auto [got_w, got_b] = Split(Parameters((*trainer)->replica(r)), bias);
    double diff = CheckedDifference(got_w, want_w);
    double bias_diff = CheckedDifference(got_b, want_b);
    std::printf("cuda k=2 %s replica=%d max_rel_diff=%g bias_max_rel_diff=%g\n", model.c_str(), r,
                diff, bias_diff);
    EXPECT_LT(diff, kTolerance) << model << " replica " << r;
    EXPECT_LT(bias_diff, kBiasTolerance) << model << " replica " << r;
  }
  EXPECT_EQ(Parameters((*trainer)->replica(0)), Parameters((*trainer)->replica(1)));
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEquivalenceTest, ::testing::Values("mlp", "lenet"));

// The restore hook sees the replica on its GPU, and what it loads is where
// training starts.
TEST(DataParallelCudaTest, RestoreSeesTheReplicaOnItsDevice) {
  DT_SKIP_WITHOUT_GPU();
  DataParallelOptions o = Options("mlp", {Device::Cuda(0)});
  int calls = 0;
  o.restore = [&calls](nn::Module* m, nn::Sgd*) -> absl::Status {
    ++calls;
    for (auto& [name, p] : m->NamedParameters()) {
      if (!p.value().device().is_cuda()) return absl::InternalError(name + " is not on CUDA");
      DT_RETURN_IF_ERROR(p.mutable_value().CopyFrom(
          Tensor::Full(p.value().shape(), 0.5f, DType::kF32, Device::Cpu())));
    }
    return absl::OkStatus();
  };
  auto trainer = DataParallelTrainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ(calls, 1);
  for (auto& [name, p] : (*trainer)->replica(0)->NamedParameters()) {
    for (float v : p.value().ToVector<float>()) ASSERT_EQ(v, 0.5f) << name;
  }
}

// Two trainers (threads) on cuda:0 each, a TCP (host) communicator between
// them: the initial-weight broadcast and the bucket allreduce go through
// host memory. Same result as one CPU device on the global batch.
TEST(DataParallelCudaTest, TwoTrainersWithHostCommunicatorMatchCpuReference) {
  DT_SKIP_WITHOUT_GPU();
  constexpr int kTrainers = 2;
  const int64_t share = kBatch / kTrainers;
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
      DataParallelOptions o = Options("mlp", {Device::Cuda(0)});
      o.seed = 5 + rank;  // rank 1's own init is overwritten by the broadcast
      o.communicator = comm->get();
      auto trainer = DataParallelTrainer::Create(o);
      if (!trainer.ok()) {
        statuses[rank] = trainer.status();
        return;
      }
      for (int s = 0; s < kSteps; ++s) {
        Tensor x, y;
        SyntheticBatch(kBatch, s, &x, &y);
        absl::StatusOr<float> loss =
            (*trainer)->Step(x.Slice(rank * share, (rank + 1) * share).Clone(),
                             y.Slice(rank * share, (rank + 1) * share).Clone());
        if (!loss.ok()) {
          statuses[rank] = loss.status();
          return;
        }
      }
      results[rank] = Parameters((*trainer)->replica(0));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kTrainers; ++r) ASSERT_TRUE(statuses[r].ok()) << r << ": " << statuses[r];
  auto want = ReferenceRun("mlp", kBatch, kSteps, 5);
  for (int r = 0; r < kTrainers; ++r) {
    EXPECT_LT(CheckedDifference(results[r], want), kTolerance) << "trainer " << r;
  }
  EXPECT_EQ(results[0], results[1]);
}

// The device path: one GPU and an NCCL communicator, so gradient buckets
// are allreduced in device memory (no host staging). One rank runs on the
// single GPU of a GPU check machine; the result must match the CPU
// reference like the staged path does.
TEST(DataParallelCudaTest, NcclDevicePathMatchesCpuReference) {
  DT_SKIP_WITHOUT_GPU();
  collective::InMemoryStore store;
  collective::CommunicatorOptions co;
  co.transport = collective::TransportKind::kNccl;
  co.cuda_device = 0;
  co.timeout = absl::Seconds(60);
  auto comm = collective::Communicator::Create(0, 1, &store, co);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ(std::string((*comm)->transport_name()), "nccl");
  DataParallelOptions o = Options("mlp", {Device::Cuda(0)});
  o.communicator = comm->get();
  auto trainer = DataParallelTrainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int s = 0; s < kSteps; ++s) {
    Tensor x, y;
    SyntheticBatch(kBatch, s, &x, &y);
    absl::StatusOr<float> loss = (*trainer)->Step(x, y);
    ASSERT_TRUE(loss.ok()) << loss.status();
  }
  EXPECT_LT(
      CheckedDifference(Parameters((*trainer)->replica(0)), ReferenceRun("mlp", kBatch, kSteps, 5)),
      kTolerance);
}

// Recovery in place with CUDA replicas (libs/train/job.h): two trainers on
// the GPU train 4 steps over a host communicator, then trainer 1 is gone;
// a replacement (its own seed, no communicator) and trainer 0 regroup over
// a new host communicator: trainer 0's device-resident parameters and
// momentum travel device -> host -> device. Both then train steps 5..10 and
// must end where the undisturbed CPU reference does.
TEST(DataParallelCudaTest, LostTrainerIsReplacedFromASurvivorThroughHostMemory) {
  DT_SKIP_WITHOUT_GPU();
  constexpr int kTrainers = 2;
  constexpr int kBefore = 4;
  const int64_t share = kBatch / kTrainers;
  collective::InMemoryStore store;
  auto step = [&](DataParallelTrainer* t, int rank, int s) -> absl::Status {
    Tensor x, y;
    SyntheticBatch(kBatch, s, &x, &y);
    return t
        ->Step(x.Slice(rank * share, (rank + 1) * share).Clone(),
               y.Slice(rank * share, (rank + 1) * share).Clone())
        .status();
  };
  auto connect = [&](int rank, const std::string& prefix) {
    collective::CommunicatorOptions co;
    co.transport = collective::TransportKind::kTcp;
    co.timeout = absl::Seconds(60);
    co.key_prefix = prefix;
    return collective::Communicator::Create(rank, kTrainers, &store, co);
  };
  std::vector<std::vector<std::vector<float>>> results(kTrainers);
  std::vector<absl::Status> statuses(kTrainers + 1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kTrainers; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = connect(rank, "gen0");
      if (!comm.ok()) {
        statuses[rank] = comm.status();
        return;
      }
      DataParallelOptions o = Options("mlp", {Device::Cuda(0)});
      o.communicator = comm->get();
      auto trainer = DataParallelTrainer::Create(o);
      if (!trainer.ok()) {
        statuses[rank] = trainer.status();
        return;
      }
      for (int s = 0; s < kBefore && statuses[rank].ok(); ++s) {
        statuses[rank] = step(trainer->get(), rank, s);
      }
      if (rank == 1 || !statuses[rank].ok()) return;  // trainer 1 is lost
      auto next = connect(0, "gen1");
      if (!next.ok()) {
        statuses[0] = next.status();
        return;
      }
      statuses[0] = (*trainer)->Regroup(next->get(), /*root=*/0);
      for (int s = kBefore; s < kSteps && statuses[0].ok(); ++s) {
        statuses[0] = step(trainer->get(), 0, s);
      }
      results[0] = Parameters((*trainer)->replica(0));
    });
  }
  threads[1].join();
  ASSERT_TRUE(statuses[1].ok()) << statuses[1];
  std::thread joiner([&] {
    auto comm = connect(1, "gen1");
    if (!comm.ok()) {
      statuses[2] = comm.status();
      return;
    }
    DataParallelOptions o = Options("mlp", {Device::Cuda(0)});
    o.seed = 99;  // its own weights, overwritten by the regroup
    auto trainer = DataParallelTrainer::Create(o);
    if (!trainer.ok()) {
      statuses[2] = trainer.status();
      return;
    }
    statuses[2] = (*trainer)->Regroup(comm->get(), /*root=*/0);
    for (int s = kBefore; s < kSteps && statuses[2].ok(); ++s) {
      statuses[2] = step(trainer->get(), 1, s);
    }
    results[1] = Parameters((*trainer)->replica(0));
  });
  threads[0].join();
  joiner.join();
  for (const absl::Status& st : statuses) ASSERT_TRUE(st.ok()) << st;
  auto want = ReferenceRun("mlp", kBatch, kSteps, 5);
  for (int r = 0; r < kTrainers; ++r) {
    EXPECT_LT(CheckedDifference(results[r], want), kTolerance) << "trainer " << r;
  }
  EXPECT_EQ(results[0], results[1]);
}

// The NCCL device path's regroup on one GPU: the job's NCCL communicator is
// aborted (what libs/agent does when the scheduler offers a new
// membership), so it fails from then on; the trainer regroups with a host
// communicator for the state and a new NCCL communicator (new unique id
// under new keys) for the gradients, and ends where the reference does.
TEST(DataParallelCudaTest, NcclTrainerRegroupsOntoANewNcclCommunicatorAfterAnAbort) {
  DT_SKIP_WITHOUT_GPU();
  collective::InMemoryStore store;
  auto connect = [&](collective::TransportKind kind, const std::string& prefix) {
    collective::CommunicatorOptions co;
    co.transport = kind;
    co.cuda_device = 0;
    co.timeout = absl::Seconds(60);
    co.key_prefix = prefix;
    return collective::Communicator::Create(0, 1, &store, co);
  };
  auto nccl = connect(collective::TransportKind::kNccl, "gen0");
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  DataParallelOptions o = Options("mlp", {Device::Cuda(0)});
  o.communicator = nccl->get();
  auto trainer = DataParallelTrainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ(std::string((*trainer)->sync_name()), "nccl_allreduce");
  for (int s = 0; s < 4; ++s) {
    Tensor x, y;
    SyntheticBatch(kBatch, s, &x, &y);
    ASSERT_TRUE((*trainer)->Step(x, y).ok()) << s;
  }
  (*nccl)->Abort("regrouping in generation 1");
  EXPECT_NE((*nccl)->health().message().find("regrouping in generation 1"), std::string::npos)
      << (*nccl)->health();
  // The state goes over a host communicator, not the NCCL one.
  EXPECT_TRUE(absl::IsInvalidArgument((*trainer)->Regroup(nccl->get(), 0)));
  auto exchange = connect(collective::TransportKind::kTcp, "gen1/regroup");
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  auto next = connect(collective::TransportKind::kNccl, "gen1/allreduce");
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE((*trainer)->Regroup(exchange->get(), 0, nullptr, next->get()).ok());
  EXPECT_EQ(std::string((*trainer)->sync_name()), "nccl_allreduce");
  for (int s = 4; s < kSteps; ++s) {
    Tensor x, y;
    SyntheticBatch(kBatch, s, &x, &y);
    absl::StatusOr<float> loss = (*trainer)->Step(x, y);
    ASSERT_TRUE(loss.ok()) << loss.status();
  }
  EXPECT_LT(
      CheckedDifference(Parameters((*trainer)->replica(0)), ReferenceRun("mlp", kBatch, kSteps, 5)),
      kTolerance);
}

}  // namespace
}  // namespace train
}  // namespace dtrain
