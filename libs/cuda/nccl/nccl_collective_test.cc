// The NCCL communicator behind collective::Communicator: ranks as threads, one
// per GPU (NCCL refuses two ranks of one communicator on one GPU, see
// TwoRanksOnOneGpuFailOrWork), results checked against the values the host
// computes for the same integer-valued data (exact sums even in bf16). On a
// machine with one GPU the single-rank and argument tests run and the
// multi-rank sweep skips; without a GPU only the argument and registration
// checks run and the rest skip with the reason.
#include "libs/cuda/nccl/nccl_collective.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/collective/test_util.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/gpu_test_util.h"
#include "libs/cuda/stream.h"

namespace dtrain {
namespace cuda {
namespace {

using collective::Communicator;
using collective::CommunicatorOptions;
using collective::InMemoryStore;
using collective::ReduceOp;
using collective::TransportKind;
using collective::Work;
using collective::testing::Base;
using collective::testing::CheckBuffer;
using collective::testing::Contribution;
using collective::testing::FillContribution;
using collective::testing::GetElement;
using collective::testing::RunThreads;

const size_t kSizes[] = {0, 1, 7, 1000, 4099, (1 << 20) + 3};
const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

bool Contains(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

CommunicatorOptions Options(const std::string& prefix, int device = -1) {
  CommunicatorOptions o;
  o.transport = TransportKind::kNccl;
  o.timeout = absl::Seconds(30);
  o.key_prefix = prefix;
  o.cuda_device = device;
  return o;
}

// `bytes` of device memory on cuda:`device`, filled and read through the
// thread's current stream of the device (the stream the communicator orders
// itself after).
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    DeviceGuard guard(device_);
    if (cudaMalloc(&ptr_, bytes_ == 0 ? 1 : bytes_) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    DeviceGuard guard(device_);
    cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  char* bytes() const { return static_cast<char*>(ptr_); }

  absl::Status Upload(const std::vector<char>& host, size_t offset = 0) {
    if (host.empty()) return absl::OkStatus();
    DeviceGuard guard(device_);
    cudaStream_t s = CurrentCudaStream(device_);
    DT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(bytes() + offset, host.data(), host.size(), cudaMemcpyHostToDevice, s));
    DT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<char>> Download(size_t offset, size_t bytes) const {
    std::vector<char> host(bytes);
    if (bytes == 0) return host;
    DeviceGuard guard(device_);
    cudaStream_t s = CurrentCudaStream(device_);
    DT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host.data(), bytes_ptr(offset), bytes, cudaMemcpyDeviceToHost, s));
    DT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return host;
  }

 private:
  const char* bytes_ptr(size_t offset) const { return static_cast<const char*>(ptr_) + offset; }
  int device_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

std::vector<char> Contributions(DType dtype, size_t count, int rank, int size, size_t offset = 0) {
  std::vector<char> host(count * DTypeSize(dtype));
  FillContribution(dtype, host.data(), count, rank, size, offset);
  return host;
}

// NCCL's average may round differently from a correctly rounded mean (it may
// scale before summing), so averages are compared with the dtype's tolerance.
absl::Status CheckClose(DType dtype, const void* buf, size_t count,
                        const std::function<float(size_t)>& expected) {
  const double tol = testing::Tolerance(dtype);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = expected(i);
    if (std::fabs(GetElement(dtype, buf, i) - want) > tol * (1 + std::fabs(want))) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(bad, " of ", count, " elements differ; first at ", first,
                                          ": ", GetElement(dtype, buf, first), " vs ",
                                          expected(first)));
}

// Every collective of the interface, sync and async, on `comm` (rank r of n,
// on cuda:`device`), for every size and dtype; results against the host.
absl::Status SweepCollectives(Communicator& comm, int device) {
  const int r = comm.rank(), n = comm.size();
  for (DType dtype : kDTypes) {
    for (size_t count : kSizes) {
      const std::string where = absl::StrCat(DTypeName(dtype), " count ", count, " rank ", r);
      const size_t esize = DTypeSize(dtype);
      // Allreduce, sum (synchronous) and average (asynchronous).
      DeviceBuffer a(device, count * esize), b(device, count * esize);
      DT_RETURN_IF_ERROR(a.Upload(Contributions(dtype, count, r, n)));
      DT_RETURN_IF_ERROR(b.Upload(Contributions(dtype, count, r, n)));
      DT_RETURN_IF_ERROR(Annotate(comm.Allreduce(a.get(), count, dtype), where));
      std::shared_ptr<Work> avg = comm.AllreduceAsync(b.get(), count, dtype, ReduceOp::kAverage);
      DT_RETURN_IF_ERROR(Annotate(avg->Wait(), where));
      if (!avg->IsCompleted()) return absl::InternalError("Wait returned before completion");
      DT_ASSIGN_OR_RETURN(std::vector<char> sum, a.Download(0, count * esize));
      DT_RETURN_IF_ERROR(
          Annotate(CheckBuffer(dtype, sum.data(), count, [&](size_t i) { return n * Base(i); }),
                   absl::StrCat("allreduce sum, ", where)));
      DT_ASSIGN_OR_RETURN(std::vector<char> mean, b.Download(0, count * esize));
      DT_RETURN_IF_ERROR(
          Annotate(CheckClose(dtype, mean.data(), count, [&](size_t i) { return Base(i); }),
                   absl::StrCat("allreduce average, ", where)));

      // Reduce-scatter in place: output aliases block r of the input.
      DeviceBuffer rs(device, n * count * esize);
      DT_RETURN_IF_ERROR(rs.Upload(Contributions(dtype, n * count, r, n)));
      DT_RETURN_IF_ERROR(Annotate(
          comm.ReduceScatter(rs.get(), rs.bytes() + r * count * esize, count, dtype), where));
      DT_ASSIGN_OR_RETURN(std::vector<char> block, rs.Download(r * count * esize, count * esize));
      DT_RETURN_IF_ERROR(Annotate(CheckBuffer(dtype, block.data(), count,
                                              [&](size_t i) { return n * Base(r * count + i); }),
                                  absl::StrCat("reduce-scatter, ", where)));

      // Allgather (asynchronous) from a separate input, and broadcast from
      // the last rank.
      DeviceBuffer in(device, count * esize), out(device, n * count * esize);
      DeviceBuffer bc(device, count * esize);
      DT_RETURN_IF_ERROR(in.Upload(Contributions(dtype, count, r, n)));
      DT_RETURN_IF_ERROR(bc.Upload(Contributions(dtype, count, r, n)));
      std::shared_ptr<Work> gather = comm.AllgatherAsync(in.get(), out.get(), count, dtype);
      std::shared_ptr<Work> bcast = comm.BroadcastAsync(bc.get(), count, dtype, n - 1);
      DT_RETURN_IF_ERROR(Annotate(gather->Wait(), where));
      DT_RETURN_IF_ERROR(Annotate(bcast->Wait(), where));
      DT_ASSIGN_OR_RETURN(std::vector<char> all, out.Download(0, n * count * esize));
      for (int q = 0; q < n; ++q) {
        DT_RETURN_IF_ERROR(Annotate(CheckBuffer(dtype, all.data() + q * count * esize, count,
                                                [&](size_t i) { return Contribution(q, n, i); }),
                                    absl::StrCat("allgather block ", q, ", ", where)));
      }
      DT_ASSIGN_OR_RETURN(std::vector<char> from_root, bc.Download(0, count * esize));
      DT_RETURN_IF_ERROR(Annotate(CheckBuffer(dtype, from_root.data(), count,
                                              [&](size_t i) { return Contribution(n - 1, n, i); }),
                                  absl::StrCat("broadcast, ", where)));
    }
  }
  DT_RETURN_IF_ERROR(comm.Barrier());
  return comm.BarrierAsync()->Wait();
}

// ---- everywhere

TEST(NcclCollectiveTest, RejectsBadArguments) {
  InMemoryStore store;
  EXPECT_EQ(CreateNcclCommunicator(2, 2, &store, Options("bad")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNcclCommunicator(0, 1, nullptr, Options("bad")).status().code(),
            absl::StatusCode::kInvalidArgument);
  CommunicatorOptions o = Options("bad");
  o.timeout = absl::ZeroDuration();
  EXPECT_EQ(CreateNcclCommunicator(0, 1, &store, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Linking this library makes Communicator::Create build NCCL communicators
// for kNccl (without it, Create says what to link: communicator_test).
TEST(NcclCollectiveTest, CreateDispatchesKNcclHere) {
  InMemoryStore store;
  absl::StatusOr<std::unique_ptr<Communicator>> c =
      Communicator::Create(0, 1, &store, Options("registered"));
  std::string reason;
  if (DeviceCount(&reason) == 0) {
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
    EXPECT_TRUE(Contains(c.status(), "no CUDA device")) << c.status();
    return;
  }
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_STREQ((*c)->transport_name(), "nccl");
  EXPECT_EQ((*c)->size(), 1);
  EXPECT_EQ((*c)->options().cuda_device, 0);
  EXPECT_EQ((*c)->AllreduceAlgorithmFor(1 << 20), collective::Algorithm::kAuto);
}

// ---- one GPU

class GpuNcclCollectiveTest : public ::testing::Test {
 protected:
  void SetUp() override { DT_SKIP_WITHOUT_GPU(); }
};

TEST_F(GpuNcclCollectiveTest, SingleRankMatchesTheHost) {
  InMemoryStore store;
  auto comm = CreateNcclCommunicator(0, 1, &store, Options("single", 0));
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::Status s = SweepCollectives(**comm, 0);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE((*comm)->health().ok()) << (*comm)->health();
}

TEST_F(GpuNcclCollectiveTest, ArgumentErrorsDoNotBreakIt) {
  InMemoryStore store;
  auto comm = CreateNcclCommunicator(0, 1, &store, Options("args", 0));
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  std::vector<float> host(16, 1.0f);
  absl::Status s = c.Allreduce(host.data(), host.size(), DType::kF32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s, "host memory")) << s;
  EXPECT_TRUE(Contains(s, "rank 0 of 1 (cuda:0)")) << s;
  DeviceBuffer buf(0, 64);
  EXPECT_EQ(c.AllreduceAsync(buf.get(), 4, DType::kI32)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Broadcast(buf.get(), 4, DType::kF32, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Allgather(nullptr, buf.get(), 4, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.health().ok()) << c.health();
  ASSERT_TRUE(buf.Upload(std::vector<char>(64, 0)).ok());
  EXPECT_TRUE(c.Allreduce(buf.get(), 16, DType::kF32).ok());
  // Allgather and broadcast take any dtype.
  DeviceBuffer out(0, 64);
  EXPECT_TRUE(c.Allgather(buf.get(), out.get(), 16, DType::kI32).ok());
}

// NCCL allows one rank per GPU in a communicator ("Duplicate GPU detected");
// this pins what happens when two ranks share one: an error on both ranks,
// not a hang (or, should a future NCCL allow it, correct results).
TEST_F(GpuNcclCollectiveTest, TwoRanksOnOneGpuFailOrWork) {
  InMemoryStore store;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> outcome(2);
  std::vector<absl::Status> results = RunThreads(2, [&](int r) -> absl::Status {
    CommunicatorOptions o = Options("shared-gpu", 0);
    o.timeout = absl::Seconds(15);
    auto comm = CreateNcclCommunicator(r, 2, &store, o);
    if (!comm.ok()) {
      outcome[r] = "init failed";
      if (!Contains(comm.status(), absl::StrCat("rank ", r, " of 2"))) {
        return absl::InternalError(
            absl::StrCat("error does not name the rank: ", comm.status().ToString()));
      }
      return absl::OkStatus();
    }
    outcome[r] = "works";
    DeviceBuffer a(0, 1000 * 4);
    DT_RETURN_IF_ERROR(a.Upload(Contributions(DType::kF32, 1000, r, 2)));
    absl::Status s = (*comm)->Allreduce(a.get(), 1000, DType::kF32);
    if (!s.ok()) {
      outcome[r] = "allreduce failed";
      return absl::OkStatus();  // an error is acceptable; a hang is not
    }
    DT_ASSIGN_OR_RETURN(std::vector<char> sum, a.Download(0, 1000 * 4));
    return CheckBuffer(DType::kF32, sum.data(), 1000, [](size_t i) { return 2 * Base(i); });
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  EXPECT_LT(secs, 60.0) << "must end in an error, not a hang";
  RecordProperty("outcome", outcome[0] + " / " + outcome[1]);
  std::cout << "two ranks on one GPU: rank 0 " << outcome[0] << ", rank 1 " << outcome[1] << " ("
            << secs << " s)\n";
}

// ---- several GPUs: one rank (thread) per GPU

TEST(MultiGpuNcclCollectiveTest, CollectivesMatchTheHost) {
  DT_SKIP_WITHOUT_GPUS(2);
  const int n = DeviceCount();
  InMemoryStore store;
  std::vector<absl::Status> results = RunThreads(n, [&](int r) -> absl::Status {
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                        Communicator::Create(r, n, &store, Options("multi")));
    if (comm->options().cuda_device != r) return absl::InternalError("rank r not on cuda:r");
    return SweepCollectives(*comm, r);
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

// A rank that stops issuing collectives: the other one times out naming
// itself and what the stopped rank published, and its later calls fail at
// once with FAILED_PRECONDITION.
TEST(MultiGpuNcclCollectiveTest, APeerThatStopsIsAnErrorNotAHang) {
  DT_SKIP_WITHOUT_GPUS(2);
  InMemoryStore store;
  std::vector<absl::Status> first(2), later(2);
  std::vector<absl::Status> results = RunThreads(2, [&](int r) -> absl::Status {
    CommunicatorOptions o = Options("stop", r);
    o.timeout = absl::Seconds(20);
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, Communicator::Create(r, 2, &store, o));
    DeviceBuffer a(r, 4 << 20);
    if (r == 1) return absl::OkStatus();  // leaves; its destructor finalizes
    first[0] = comm->Allreduce(a.get(), 1 << 20, DType::kF32, ReduceOp::kSum, absl::Seconds(3));
    later[0] = comm->Allreduce(a.get(), 1 << 20, DType::kF32);
    return absl::OkStatus();
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
  ASSERT_FALSE(first[0].ok());
  EXPECT_TRUE(Contains(first[0], "rank 0 of 2 (cuda:0)")) << first[0];
  EXPECT_TRUE(Contains(first[0], "allreduce #1")) << first[0];
  EXPECT_EQ(later[0].code(), absl::StatusCode::kFailedPrecondition) << later[0];
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
