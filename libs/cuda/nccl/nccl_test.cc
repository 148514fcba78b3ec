// NCCL communicators: collectives against values computed on the host, and
// the failure paths, which must end in an error naming the rank rather than
// a hang. One-GPU tests use a single-rank communicator; the multi-rank ones
// need as many GPUs as ranks (NCCL allows one rank per GPU) and skip with the
// reason otherwise. The argument and no-GPU checks run everywhere.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/collective/store.h"
#include "libs/cuda/gpu_test_util.h"
#include "libs/cuda/nccl/communicator.h"
#include "libs/cuda/nccl/nccl_status.h"

namespace dtrain {
namespace cuda {
namespace {

using Clock = std::chrono::steady_clock;

bool Contains(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

NcclOptions Quick(const std::string& prefix) {
  NcclOptions o;
  o.init_timeout = absl::Seconds(20);
  o.op_timeout = absl::Seconds(20);
  o.key_prefix = prefix;
  return o;
}

TEST(NcclTest, TypesAndOps) {
  EXPECT_EQ(NcclType(DType::kF32), ncclFloat32);
  EXPECT_EQ(NcclType(DType::kBF16), ncclBfloat16);
  EXPECT_EQ(NcclType(DType::kF16), ncclFloat16);
  EXPECT_EQ(NcclType(DType::kI64), ncclInt64);
  EXPECT_EQ(NcclOp(ReduceOp::kAvg), ncclAvg);
  EXPECT_EQ(NcclOp(ReduceOp::kMax), ncclMax);
}

TEST(NcclTest, BadArguments) {
  collective::InMemoryStore store;
  EXPECT_EQ(NcclCommunicator::Create(2, 2, 0, &store).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Create(0, 1, 0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclTest, NoGpuIsAFailedPrecondition) {
  std::string reason;
  if (DeviceCount(&reason) > 0) GTEST_SKIP() << "this machine has a GPU";
  collective::InMemoryStore store;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> c = NcclCommunicator::Create(0, 1, 0, &store);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(c.status(), "no CUDA device")) << c.status();
}

class GpuNcclTest : public ::testing::Test {
 protected:
  void SetUp() override { DT_SKIP_WITHOUT_GPU(); }
};

TEST_F(GpuNcclTest, SingleRankCollectives) {
  collective::InMemoryStore store;
  auto comm = NcclCommunicator::Create(0, 1, 0, &store, Quick("single"));
  ASSERT_TRUE(comm.ok()) << comm.status();
  NcclCommunicator& c = **comm;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.world_size(), 1);
  Tensor t = Tensor::FromVector<float>({1, 2, 3, 4}, {4}, Device::Cuda(0));
  ASSERT_TRUE(c.Allreduce(t, &t, ReduceOp::kSum).ok());
  Tensor g = Tensor::Empty({4}, DType::kF32, Device::Cuda(0));
  ASSERT_TRUE(c.Allgather(t, &g).ok());
  Tensor rs = Tensor::Empty({4}, DType::kF32, Device::Cuda(0));
  ASSERT_TRUE(c.ReduceScatter(t, &rs, ReduceOp::kMax).ok());
  ASSERT_TRUE(c.Broadcast(&rs, 0).ok());
  ASSERT_TRUE(c.Synchronize().ok());
  EXPECT_EQ(g.ToVector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(rs.ToVector<float>(), (std::vector<float>{1, 2, 3, 4}));
  // Size mismatches are argument errors, not NCCL failures.
  Tensor small = Tensor::Empty({3}, DType::kF32, Device::Cuda(0));
  EXPECT_EQ(c.Allreduce(t, &small, ReduceOp::kSum).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(c.aborted());
  // An aborted communicator fails every later call, naming the rank.
  c.Abort("test");
  absl::Status s = c.Allreduce(t, &t, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "rank 0 of 1 (cuda:0)")) << s;
}

TEST_F(GpuNcclTest, InitTimesOutNamingTheMissingRank) {
  collective::InMemoryStore store;
  NcclOptions o = Quick("missing");
  o.init_timeout = absl::Seconds(3);
  const auto t0 = Clock::now();
  // Rank 1 never comes.
  auto comm = NcclCommunicator::Create(0, 2, 0, &store, o);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_TRUE(Contains(comm.status(), "rank 0 of 2 (cuda:0)")) << comm.status();
  EXPECT_TRUE(Contains(comm.status(), "Rank 1 never joined")) << comm.status();
  EXPECT_LT(secs, 30.0) << "the abort must not hang";
}

TEST_F(GpuNcclTest, MissingRootTimesOut) {
  collective::InMemoryStore store;
  NcclOptions o = Quick("noroot");
  o.init_timeout = absl::Seconds(1);
  auto comm = NcclCommunicator::Create(1, 2, 0, &store, o);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_TRUE(Contains(comm.status(), "no unique id from rank 0")) << comm.status();
}

// ---- several GPUs: one thread per rank ----

template <typename F>
void OnRanks(int n, F f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&f, r] { f(r); });
  for (auto& t : threads) t.join();
}

TEST(MultiGpuNcclTest, CollectivesMatchTheHost) {
  std::string reason;
  const int n = DeviceCount(&reason);
  DT_SKIP_WITHOUT_GPUS(2);
  collective::InMemoryStore store;
  std::vector<std::string> errors(n);
  OnRanks(n, [&](int r) {
    auto comm = NcclCommunicator::Create(r, n, r, &store, Quick("multi"));
    if (!comm.ok()) {
      errors[r] = comm.status().ToString();
      return;
    }
    NcclCommunicator& c = **comm;
    const Device dev = Device::Cuda(r);
    const int64_t len = 1000 * n;
    std::vector<float> mine(len);
    for (int64_t i = 0; i < len; ++i) mine[i] = static_cast<float>(r + 1) * (i % 13);
    Tensor t = Tensor::FromVector(mine, {len}, dev);
    Tensor sum = Tensor::Empty({len}, DType::kF32, dev);
    Tensor gathered = Tensor::Empty({len * n}, DType::kF32, dev);
    Tensor scattered = Tensor::Empty({len / n}, DType::kF32, dev);
    Tensor b = Tensor::Full({5}, static_cast<float>(r), DType::kF32, dev);
    absl::Status s = c.Allreduce(t, &sum, ReduceOp::kSum);
    if (s.ok()) s = c.Allgather(t, &gathered);
    if (s.ok()) s = c.ReduceScatter(t, &scattered, ReduceOp::kMax);
    if (s.ok()) s = c.Broadcast(&b, n - 1);
    if (s.ok()) s = c.Synchronize();
    if (!s.ok()) {
      errors[r] = s.ToString();
      return;
    }
    const float total = n * (n + 1) / 2.0f;
    std::vector<float> sv = sum.ToVector<float>();
    for (int64_t i = 0; i < len; ++i) {
      if (sv[i] != total * (i % 13)) errors[r] = absl::StrCat("allreduce at ", i);
    }
    std::vector<float> gv = gathered.ToVector<float>();
    for (int q = 0; q < n; ++q) {
      for (int64_t i = 0; i < len; i += 97) {
        if (gv[q * len + i] != (q + 1) * (i % 13)) errors[r] = absl::StrCat("allgather ", q, i);
      }
    }
    std::vector<float> rv = scattered.ToVector<float>();
    for (int64_t i = 0; i < len / n; ++i) {
      if (rv[i] != n * ((r * (len / n) + i) % 13)) errors[r] = absl::StrCat("reduce_scatter ", i);
    }
    if (b.ToVector<float>() != std::vector<float>(5, static_cast<float>(n - 1))) {
      errors[r] = "broadcast";
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(MultiGpuNcclTest, APeerThatStopsIsAnErrorNotAHang) {
  DT_SKIP_WITHOUT_GPUS(2);
  collective::InMemoryStore store;
  std::vector<absl::Status> result(2);
  OnRanks(2, [&](int r) {
    NcclOptions o = Quick("stop");
    o.op_timeout = absl::Seconds(3);
    auto comm = NcclCommunicator::Create(r, 2, r, &store, o);
    if (!comm.ok()) {
      result[r] = comm.status();
      return;
    }
    if (r == 1) {
      (*comm)->Abort("rank 1 stops before the allreduce");
      return;
    }
    Tensor t = Tensor::Full({1 << 20}, 1.0f, DType::kF32, Device::Cuda(0));
    result[0] = (*comm)->Allreduce(t, &t, ReduceOp::kSum);
    if (result[0].ok()) result[0] = (*comm)->Synchronize();
  });
  ASSERT_FALSE(result[0].ok());
  EXPECT_TRUE(Contains(result[0], "rank 0 of 2 (cuda:0)")) << result[0];
  EXPECT_TRUE(Contains(result[0], "rank 1 reported: rank 1 stops")) << result[0];
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
