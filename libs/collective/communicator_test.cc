// Ranks as threads, in the style of gloo's tests: every collective swept over
// transport x world size x algorithm x message size x dtype, checked exactly
// (integer-valued data makes sums exact even in bf16). Plus asynchronous
// handles, timeouts and ranks that leave.
#include "libs/collective/communicator.h"

#include <atomic>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/collective/test_util.h"

namespace dtrain {
namespace collective {
namespace {

using testing::Base;
using testing::CheckBuffer;
using testing::Contribution;
using testing::FillContribution;
using testing::RunThreads;

const size_t kSizes[] = {0, 1, 7, 1000, 4099, (1 << 20) + 3};
const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

CommunicatorOptions Options(TransportKind transport, Algorithm algorithm = Algorithm::kAuto) {
  CommunicatorOptions o;
  o.transport = transport;
  o.algorithm = algorithm;
  o.timeout = absl::Seconds(60);
  o.tcp.host = "127.0.0.1";
  o.chunk_bytes = 64 << 10;  // several chunks per block even for mid sizes
  o.shm.ring_bytes = 256 << 10;
  return o;
}

// Creates `n` communicators concurrently (Create waits for all ranks).
std::vector<std::unique_ptr<Communicator>> CreateAll(int n, Store* store,
                                                     const CommunicatorOptions& options) {
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<absl::Status> results = RunThreads(n, [&](int rank) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Communicator>> c = Communicator::Create(rank, n, store, options);
    if (!c.ok()) return c.status();
    comms[rank] = *std::move(c);
    return absl::OkStatus();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  return comms;
}

using SweepParam = std::tuple<TransportKind, int, Algorithm>;

class SweepTest : public ::testing::TestWithParam<SweepParam> {
 protected:
  TransportKind transport() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }
  Algorithm algorithm() const { return std::get<2>(GetParam()); }
};

TEST_P(SweepTest, Allreduce) {
  const int n = world();
  InMemoryStore store;
  auto comms = CreateAll(n, &store, Options(transport(), algorithm()));
  ASSERT_EQ(comms.size(), static_cast<size_t>(n));
  for (auto& c : comms) ASSERT_NE(c, nullptr);
  std::vector<absl::Status> results = RunThreads(n, [&](int rank) -> absl::Status {
    Communicator& comm = *comms[rank];
    for (DType dtype : kDTypes) {
      for (size_t count : kSizes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
          std::vector<char> buf(count * DTypeSize(dtype) + 1);
          FillContribution(dtype, buf.data(), count, rank, n);
          buf.back() = 0x5a;  // guard byte
          absl::Status s = comm.Allreduce(buf.data(), count, dtype, op);
          std::string what = absl::StrCat(DTypeName(dtype), " count=", count, " ", ReduceOpName(op),
                                          " rank=", rank);
          if (!s.ok()) return Annotate(s, what);
          s = CheckBuffer(dtype, buf.data(), count,
                          [&](size_t i) { return op == ReduceOp::kSum ? n * Base(i) : Base(i); });
          if (!s.ok()) return Annotate(s, what);
          if (buf.back() != 0x5a)
            return absl::InternalError(absl::StrCat(what, ": wrote past the end"));
        }
      }
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
}

// The other collectives do not depend on the allreduce algorithm; run them
// once per transport and world size.
TEST_P(SweepTest, ReduceScatterAllgatherBroadcastBarrier) {
  if (algorithm() != Algorithm::kRing) GTEST_SKIP() << "independent of the allreduce algorithm";
  const int n = world();
  InMemoryStore store;
  CommunicatorOptions options = Options(transport(), algorithm());
  options.tree_broadcast_max_bytes = 8 << 10;  // both broadcast algorithms below
  auto comms = CreateAll(n, &store, options);
  for (auto& c : comms) ASSERT_NE(c, nullptr);
  const size_t sizes[] = {0, 1, 7, 1000, 4099, (1 << 18) + 3};
  std::vector<absl::Status> results = RunThreads(n, [&](int rank) -> absl::Status {
    Communicator& comm = *comms[rank];
    for (DType dtype : kDTypes) {
      const size_t es = DTypeSize(dtype);
      for (size_t count : sizes) {
        const std::string what = absl::StrCat(DTypeName(dtype), " count=", count, " rank=", rank);
        // Reduce-scatter: input holds n blocks; block b of rank r carries
        // Contribution(r, n, b * count + i).
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
          std::vector<char> input(n * count * es), output(count * es);
          FillContribution(dtype, input.data(), n * count, rank, n);
          std::vector<char> before = input;
          absl::Status s = comm.ReduceScatter(input.data(), output.data(), count, dtype, op);
          if (!s.ok()) return Annotate(s, absl::StrCat("reduce_scatter ", what));
          s = CheckBuffer(dtype, output.data(), count, [&](size_t i) {
            float base = Base(rank * count + i);
            return op == ReduceOp::kSum ? n * base : base;
          });
          if (!s.ok()) return Annotate(s, absl::StrCat("reduce_scatter ", what));
          if (input != before) return absl::InternalError("reduce_scatter modified its input");
        }
        // Allgather: rank r contributes Contribution(r, n, i).
        {
          std::vector<char> input(count * es), output(n * count * es);
          FillContribution(dtype, input.data(), count, rank, n);
          absl::Status s = comm.Allgather(input.data(), output.data(), count, dtype);
          if (!s.ok()) return Annotate(s, absl::StrCat("allgather ", what));
          for (int r = 0; r < n; ++r) {
            s = CheckBuffer(dtype, output.data() + r * count * es, count,
                            [&](size_t i) { return Contribution(r, n, i); });
            if (!s.ok()) return Annotate(s, absl::StrCat("allgather block ", r, " ", what));
          }
        }
        // Broadcast from every root.
        for (int root = 0; root < n; ++root) {
          std::vector<char> buf(count * es);
          FillContribution(dtype, buf.data(), count, rank, n);
          absl::Status s = comm.Broadcast(buf.data(), count, dtype, root);
          if (!s.ok()) return Annotate(s, absl::StrCat("broadcast root ", root, " ", what));
          s = CheckBuffer(dtype, buf.data(), count,
                          [&](size_t i) { return Contribution(root, n, i); });
          if (!s.ok()) return Annotate(s, absl::StrCat("broadcast root ", root, " ", what));
        }
      }
    }
    for (int i = 0; i < 5; ++i) {
      absl::Status s = comm.Barrier();
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
}

std::string SweepName(const ::testing::TestParamInfo<SweepParam>& info) {
  return absl::StrCat(TransportKindName(std::get<0>(info.param)), "_n", std::get<1>(info.param),
                      "_", AlgorithmName(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    Threads, SweepTest,
    ::testing::Combine(
        ::testing::Values(TransportKind::kInProcess, TransportKind::kTcp, TransportKind::kShm),
        ::testing::Values(1, 2, 3, 4, 5),
        ::testing::Values(Algorithm::kRing, Algorithm::kBidirectionalRing,
                          Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling)),
    SweepName);

// --- Asynchronous handles

TEST(AsyncTest, QueuedOperationsRunInOrder) {
  constexpr int n = 3;
  constexpr int kOps = 6;
  InMemoryStore store;
  auto comms = CreateAll(n, &store, Options(TransportKind::kTcp));
  for (auto& c : comms) ASSERT_NE(c, nullptr);
  std::vector<absl::Status> results = RunThreads(n, [&](int rank) -> absl::Status {
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(10000));
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      // Different sizes pick different algorithms.
      const size_t count = k % 2 == 0 ? 10000 : 100;
      FillContribution(DType::kF32, bufs[k].data(), count, rank, n, k);
      works.push_back(comms[rank]->AllreduceAsync(bufs[k].data(), count, DType::kF32));
    }
    for (int k = kOps - 1; k >= 0; --k) {  // waiting order does not matter
      absl::Status s = works[k]->Wait(absl::Seconds(30));
      if (!s.ok()) return s;
      if (!works[k]->IsCompleted()) return absl::InternalError("not completed after Wait");
      const size_t count = k % 2 == 0 ? 10000 : 100;
      s = CheckBuffer(DType::kF32, bufs[k].data(), count,
                      [&](size_t i) { return n * Base(i + k); });
      if (!s.ok()) return Annotate(s, absl::StrCat("op ", k));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
}

TEST(AsyncTest, AllKindsAndWaitTimeout) {
  constexpr int n = 2;
  InMemoryStore store;
  auto comms = CreateAll(n, &store, Options(TransportKind::kInProcess));
  for (auto& c : comms) ASSERT_NE(c, nullptr);
  absl::Notification rank1_may_start;
  std::vector<absl::Status> results = RunThreads(n, [&](int rank) -> absl::Status {
    Communicator& comm = *comms[rank];
    std::vector<float> a(1000), rs_in(2 * 50), rs_out(50), ag_out(2 * 50), bc(300);
    FillContribution(DType::kF32, a.data(), a.size(), rank, n);
    FillContribution(DType::kF32, rs_in.data(), rs_in.size(), rank, n);
    FillContribution(DType::kF32, bc.data(), bc.size(), rank, n);
    if (rank == 1) rank1_may_start.WaitForNotification();
    auto w1 = comm.AllreduceAsync(a.data(), a.size(), DType::kF32, ReduceOp::kAverage);
    if (rank == 0) {
      // Rank 1 has not started: the operation cannot finish yet.
      absl::Status early = w1->Wait(absl::Milliseconds(50));
      if (!absl::IsDeadlineExceeded(early)) {
        return absl::InternalError(absl::StrCat("expected a wait timeout, got ", early.ToString()));
      }
      rank1_may_start.Notify();
    }
    auto w2 = comm.ReduceScatterAsync(rs_in.data(), rs_out.data(), 50, DType::kF32);
    auto w3 = comm.AllgatherAsync(rs_out.data(), ag_out.data(), 50, DType::kF32);
    auto w4 = comm.BroadcastAsync(bc.data(), bc.size(), DType::kF32, 1);
    auto w5 = comm.BarrierAsync();
    for (auto& w : {w1, w2, w3, w4, w5}) {
      absl::Status s = w->Wait(absl::Seconds(30));
      if (!s.ok()) return s;
    }
    absl::Status s = CheckBuffer(DType::kF32, a.data(), a.size(), Base);
    if (s.ok()) {
      s = CheckBuffer(DType::kF32, ag_out.data(), 100, [&](size_t i) { return n * Base(i); });
    }
    if (s.ok()) {
      s = CheckBuffer(DType::kF32, bc.data(), bc.size(),
                      [&](size_t i) { return Contribution(1, n, i); });
    }
    return s;
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
}

TEST(AsyncTest, ArgumentErrorsShowInTheWorkAndDoNotBreak) {
  InMemoryStore store;
  auto comms = CreateAll(1, &store, Options(TransportKind::kInProcess));
  ASSERT_NE(comms[0], nullptr);
  std::vector<int32_t> ints(4);
  auto w = comms[0]->AllreduceAsync(ints.data(), ints.size(), DType::kI32);
  EXPECT_EQ(w->Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Allreduce(nullptr, 3, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Broadcast(ints.data(), 4, DType::kI32, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(comms[0]->health().ok());
  float x = 2;
  EXPECT_TRUE(comms[0]->Allreduce(&x, 1, DType::kF32).ok());
  EXPECT_EQ(x, 2);
  // Allgather and broadcast take any dtype.
  std::vector<int32_t> out(4);
  EXPECT_TRUE(comms[0]->Allgather(ints.data(), out.data(), 4, DType::kI32).ok());
}

// --- Failures

class FailureTest : public ::testing::TestWithParam<TransportKind> {};

// One rank never calls the collective: the others fail within the timeout
// instead of hanging, the one that waited on it with DEADLINE_EXCEEDED naming
// the operation; afterwards the communicators refuse further work.
TEST_P(FailureTest, MissingRankTimesOut) {
  constexpr int n = 4;
  InMemoryStore store;
  auto comms = CreateAll(n, &store, Options(GetParam()));
  for (auto& c : comms) ASSERT_NE(c, nullptr);
  absl::Notification others_done;
  std::atomic<int> deadline_errors{0};
  std::atomic<int> finished{0};
  const absl::Duration timeout = absl::Milliseconds(500);
  std::vector<absl::Status> results = RunThreads(n, [&](int rank) -> absl::Status {
    if (rank == 2) {
      others_done.WaitForNotification();
      return absl::OkStatus();
    }
    std::vector<float> buf(1 << 16, 1.0f);
    absl::Time start = absl::Now();
    absl::Status s =
        comms[rank]->Allreduce(buf.data(), buf.size(), DType::kF32, ReduceOp::kSum, timeout);
    absl::Duration took = absl::Now() - start;
    if (++finished == n - 1) others_done.Notify();
    if (s.ok()) return absl::InternalError("allreduce succeeded without rank 2");
    if (took > timeout + absl::Seconds(5)) {
      return absl::InternalError(absl::StrCat("error came after ", absl::FormatDuration(took)));
    }
    if (absl::IsDeadlineExceeded(s)) {
      ++deadline_errors;
      if (s.message().find("allreduce") == std::string::npos) {
        return absl::InternalError(
            absl::StrCat("message does not name the operation: ", s.ToString()));
      }
    }
    absl::Status again = comms[rank]->Barrier();
    if (!absl::IsFailedPrecondition(again)) {
      return absl::InternalError(absl::StrCat("broken communicator answered ", again.ToString()));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  EXPECT_GE(deadline_errors.load(), 1);
}

// A rank closes its communicator while the others run a collective with a
// long timeout: they fail fast with an error naming a rank.
TEST_P(FailureTest, RankThatLeavesFailsTheOthersFast) {
  constexpr int n = 3;
  InMemoryStore store;
  auto comms = CreateAll(n, &store, Options(GetParam()));
  for (auto& c : comms) ASSERT_NE(c, nullptr);
  std::vector<absl::Status> results = RunThreads(n, [&](int rank) -> absl::Status {
    if (rank == 1) {
      comms[1].reset();
      return absl::OkStatus();
    }
    std::vector<float> buf(1 << 18, 1.0f);
    absl::Time start = absl::Now();
    absl::Status s = comms[rank]->Allreduce(buf.data(), buf.size(), DType::kF32, ReduceOp::kSum,
                                            absl::Seconds(60));
    absl::Duration took = absl::Now() - start;
    if (s.ok()) return absl::InternalError("allreduce succeeded without rank 1");
    if (took > absl::Seconds(10)) {
      return absl::InternalError(absl::StrCat("error came after ", absl::FormatDuration(took)));
    }
    if (!absl::IsUnavailable(s) && !absl::IsAborted(s)) {
      return absl::InternalError(absl::StrCat("unexpected code: ", s.ToString()));
    }
    if (s.message().find("rank ") == std::string::npos) {
      return absl::InternalError(absl::StrCat("message names no rank: ", s.ToString()));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST_P(FailureTest, CreateTimesOutWhenARankNeverArrives) {
  InMemoryStore store;
  CommunicatorOptions options = Options(GetParam());
  options.timeout = absl::Milliseconds(300);
  std::vector<absl::Status> results = RunThreads(2, [&](int rank) -> absl::Status {
    absl::Time start = absl::Now();
    auto c = Communicator::Create(rank, 3, &store, options);  // rank 2 never comes
    if (c.ok()) return absl::InternalError("Create succeeded without rank 2");
    if (absl::Now() - start > absl::Seconds(5)) return absl::InternalError("Create took too long");
    return c.status();
  });
  // Rank 0 and 1 wait for rank 2 (both are its ring neighbours).
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded) << results[r];
  }
}

INSTANTIATE_TEST_SUITE_P(All, FailureTest,
                         ::testing::Values(TransportKind::kInProcess, TransportKind::kTcp,
                                           TransportKind::kShm),
                         [](const ::testing::TestParamInfo<TransportKind>& info) {
                           return std::string(TransportKindName(info.param));
                         });

TEST(CommunicatorTest, AutoAlgorithmBySize) {
  InMemoryStore store;
  auto comms = CreateAll(1, &store, Options(TransportKind::kInProcess));
  ASSERT_NE(comms[0], nullptr);
  const CommunicatorOptions& o = comms[0]->options();
  EXPECT_EQ(comms[0]->AllreduceAlgorithmFor(64), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(comms[0]->AllreduceAlgorithmFor(o.recursive_doubling_max_bytes + 1),
            Algorithm::kHalvingDoubling);
  EXPECT_EQ(comms[0]->AllreduceAlgorithmFor(o.halving_doubling_max_bytes + 1), o.large_algorithm);
}

TEST(CommunicatorTest, RejectsBadArguments) {
  InMemoryStore store;
  EXPECT_EQ(Communicator::Create(2, 2, &store).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Communicator::Create(0, 0, &store).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Communicator::Create(0, 1, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CommunicatorTest, ParsesNames) {
  EXPECT_EQ(*ParseTransportKind("shm"), TransportKind::kShm);
  EXPECT_EQ(*ParseTransportKind("nccl"), TransportKind::kNccl);
  EXPECT_FALSE(ParseTransportKind("gloo").ok());
  EXPECT_EQ(*ParseAlgorithm("bidir_ring"), Algorithm::kBidirectionalRing);
  EXPECT_FALSE(ParseAlgorithm("tree").ok());
}

// This binary does not link //libs/cuda/nccl:nccl_collective: asking for NCCL
// says what to link instead of failing obscurely.
TEST(CommunicatorTest, NcclWithoutItsLibraryIsAFailedPrecondition) {
  InMemoryStore store;
  CommunicatorOptions o;
  o.transport = TransportKind::kNccl;
  absl::StatusOr<std::unique_ptr<Communicator>> c = Communicator::Create(0, 1, &store, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_NE(c.status().message().find("//libs/cuda/nccl:nccl_collective"), std::string::npos)
      << c.status();
}

TEST(CommunicatorTest, FactoriesRegisterOnlyForOtherTransports) {
  auto factory = [](int, int, Store*,
                    const CommunicatorOptions&) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    return absl::UnimplementedError("test factory");
  };
  EXPECT_EQ(RegisterCommunicatorFactory(TransportKind::kTcp, factory).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegisterCommunicatorFactory(TransportKind::kNccl, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace collective
}  // namespace dtrain
