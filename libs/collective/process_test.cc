// Ranks as real processes (fork), meeting through a FileStore in TEST_TMPDIR,
// over TCP on loopback and over shared memory. A rank killed with SIGKILL in
// the middle of collectives turns into an error on the others well within
// their timeout; a rank that never arrives makes Create time out; no shared
// memory segment outlives the job.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/collective/communicator.h"
#include "libs/collective/test_util.h"

namespace dtrain {
namespace collective {
namespace {

using testing::Base;
using testing::CheckBuffer;
using testing::Contribution;
using testing::FillContribution;
using testing::ProcessResult;
using testing::RunProcesses;

// Exit codes of the children.
constexpr int kOk = 0;
constexpr int kWrong = 1;          // a wrong result or an unexpected status
constexpr int kExpectedError = 3;  // failed the way the test wanted

CommunicatorOptions Options(TransportKind transport, absl::Duration timeout) {
  CommunicatorOptions o;
  o.transport = transport;
  o.timeout = timeout;
  o.tcp.host = "127.0.0.1";
  return o;
}

int Fail(int rank, const absl::Status& status) {
  std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
  return kWrong;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The /dev/shm segments the job whose ranks met in `dir` left behind: those
// named after the job id rank 0 put in the store (tests beside this one
// make and remove segments of their own at any time).
std::vector<std::string> SegmentsLeft(const std::string& dir) {
  FileStore store(dir);
  PrefixStore prefixed("collective/", &store);
  absl::StatusOr<std::string> job = prefixed.Get("job_id", absl::ZeroDuration());
  if (!job.ok()) return {absl::StrCat("(no job id in ", dir, ": ", job.status().ToString(), ")")};
  return testing::ShmEntries(absl::StrCat("dtrain-", *job, "-"));
}

using Param = std::tuple<TransportKind, int>;

class ProcessTest : public ::testing::TestWithParam<Param> {};

TEST_P(ProcessTest, CollectivesAcrossProcesses) {
  const TransportKind transport = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  const std::string dir = testing::NewTempDir("rendezvous");
  std::vector<ProcessResult> results = RunProcesses(
      n,
      [&](int rank) -> int {
        FileStore store(dir);
        auto comm = Communicator::Create(rank, n, &store, Options(transport, absl::Seconds(60)));
        if (!comm.ok()) return Fail(rank, comm.status());
        // Sizes that pick each allreduce algorithm, not divisible by n, and 0.
        for (size_t count :
             {size_t{0}, size_t{7}, size_t{4099}, size_t{65537}, size_t{(1 << 20) + 3}}) {
          for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
              std::vector<char> buf(count * DTypeSize(dtype));
              FillContribution(dtype, buf.data(), count, rank, n);
              absl::Status s = (*comm)->Allreduce(buf.data(), count, dtype, op);
              if (s.ok()) {
                s = CheckBuffer(dtype, buf.data(), count, [&](size_t i) {
                  return op == ReduceOp::kSum ? n * Base(i) : Base(i);
                });
              }
              if (!s.ok()) {
                return Fail(rank,
                            Annotate(s, absl::StrCat("allreduce ", count, " ", DTypeName(dtype))));
              }
            }
          }
        }
        const size_t count = 10007;
        std::vector<float> in(n * count), out(count), gathered(n * count), bc(count);
        FillContribution(DType::kF32, in.data(), n * count, rank, n);
        absl::Status s = (*comm)->ReduceScatter(in.data(), out.data(), count, DType::kF32);
        if (s.ok()) {
          s = CheckBuffer(DType::kF32, out.data(), count,
                          [&](size_t i) { return n * Base(rank * count + i); });
        }
        if (s.ok()) s = (*comm)->Allgather(out.data(), gathered.data(), count, DType::kF32);
        if (s.ok()) {
          s = CheckBuffer(DType::kF32, gathered.data(), n * count,
                          [&](size_t i) { return n * Base(i); });
        }
        FillContribution(DType::kF32, bc.data(), count, rank, n);
        if (s.ok()) s = (*comm)->Broadcast(bc.data(), count, DType::kF32, n - 1);
        if (s.ok()) {
          s = CheckBuffer(DType::kF32, bc.data(), count,
                          [&](size_t i) { return Contribution(n - 1, n, i); });
        }
        if (s.ok()) s = (*comm)->Barrier();
        return s.ok() ? kOk : Fail(rank, s);
      },
      absl::Seconds(100));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(results[r].exit_code, kOk) << "rank " << r << " signal " << results[r].signal;
  }
  EXPECT_EQ(SegmentsLeft(dir), std::vector<std::string>()) << "shared-memory segments left behind";
}

INSTANTIATE_TEST_SUITE_P(Processes, ProcessTest,
                         ::testing::Combine(::testing::Values(TransportKind::kTcp,
                                                              TransportKind::kShm),
                                            ::testing::Values(2, 3, 4)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return absl::StrCat(TransportKindName(std::get<0>(info.param)), "_n",
                                               std::get<1>(info.param));
                         });

// A process that knows the job id (it reads the rendezvous store) but not
// the attempt's collective secret tries to join the job's allreduce as rank
// 1 while rank 0 waits for its peer: once with a wrong secret, once with
// none. It is refused (PERMISSION_DENIED naming the secret) before any
// tensor moves; then the real rank 1 arrives and the job's allreduces give
// the right sums on both ranks.
TEST(ProcessAuthTest, ProcessWithoutTheAttemptSecretCannotJoin) {
  const std::string dir = testing::NewTempDir("intruder");
  const std::string refused = absl::StrCat(dir, "/intruder.done");
  auto options = [](const std::string& secret) {
    CommunicatorOptions o = Options(TransportKind::kTcp, absl::Seconds(30));
    o.tcp.secret = secret;
    return o;
  };
  const std::string secret = "0123456789abcdef0123456789abcdef-attempt-1";
  std::vector<ProcessResult> results = RunProcesses(
      3,
      [&](int child) -> int {
        FileStore store(dir);
        if (child == 1) {  // the intruder
          PrefixStore prefixed("collective/", &store);
          absl::StatusOr<std::string> job = prefixed.Get("job_id", absl::Seconds(30));
          if (!job.ok()) return Fail(child, job.status());
          // Rank 0 is listening once its address is in the store.
          if (!prefixed.Get(absl::StrCat("tcp/", *job, "/0"), absl::Seconds(30)).ok()) {
            return Fail(child, absl::InternalError("rank 0 never listened"));
          }
          std::string errors;
          for (const std::string& guess : {std::string("wrong secret"), std::string()}) {
            auto comm = Communicator::Create(1, 2, &store, options(guess));
            if (comm.ok()) return Fail(child, absl::InternalError("the intruder joined"));
            if (!absl::IsPermissionDenied(comm.status()) ||
                comm.status().message().find("collective secret") == std::string::npos) {
              return Fail(child, comm.status());
            }
            absl::StrAppend(&errors, comm.status().ToString(), "\n");
          }
          WriteFile(refused, errors);
          return kExpectedError;
        }
        const int rank = child == 0 ? 0 : 1;
        if (rank == 1) {  // the real rank 1 comes after the intruder
          for (int i = 0; i < 3000 && ReadFile(refused).empty(); ++i) {
            absl::SleepFor(absl::Milliseconds(10));
          }
        }
        auto comm = Communicator::Create(rank, 2, &store, options(secret));
        if (!comm.ok()) return Fail(rank, comm.status());
        for (size_t count : {size_t{7}, size_t{65537}, size_t{(1 << 20) + 3}}) {
          std::vector<float> buf(count);
          FillContribution(DType::kF32, buf.data(), count, rank, 2);
          absl::Status s = (*comm)->Allreduce(buf.data(), count, DType::kF32);
          if (s.ok()) {
            s = CheckBuffer(DType::kF32, buf.data(), count, [&](size_t i) { return 2 * Base(i); });
          }
          if (!s.ok()) return Fail(rank, s);
        }
        return kOk;
      },
      absl::Seconds(90));
  EXPECT_EQ(results[1].exit_code, kExpectedError) << "the intruder: " << ReadFile(refused);
  EXPECT_EQ(results[0].exit_code, kOk) << "rank 0 signal " << results[0].signal;
  EXPECT_EQ(results[2].exit_code, kOk) << "rank 1 signal " << results[2].signal;
}

// Collective TLS (TcpOptions::tls) between 3 processes: allreduces of every
// algorithm's sizes (the combining receives decrypt into the bounce buffer)
// and a broadcast give exact results.
TEST(ProcessAuthTest, TlsCollectivesAcrossProcesses) {
  const std::string dir = testing::NewTempDir("tls");
  const int n = 3;
  std::vector<ProcessResult> results = RunProcesses(
      n,
      [&](int rank) -> int {
        FileStore store(dir);
        CommunicatorOptions o = Options(TransportKind::kTcp, absl::Seconds(60));
        o.tcp.secret = "tls attempt secret";
        o.tcp.tls = true;
        auto comm = Communicator::Create(rank, n, &store, o);
        if (!comm.ok()) return Fail(rank, comm.status());
        for (size_t count : {size_t{7}, size_t{4099}, size_t{65537}, size_t{(1 << 20) + 3}}) {
          for (DType dtype : {DType::kF32, DType::kBF16}) {
            std::vector<char> buf(count * DTypeSize(dtype));
            FillContribution(dtype, buf.data(), count, rank, n);
            absl::Status s = (*comm)->Allreduce(buf.data(), count, dtype);
            if (s.ok()) {
              s = CheckBuffer(dtype, buf.data(), count, [&](size_t i) { return n * Base(i); });
            }
            if (!s.ok()) return Fail(rank, Annotate(s, absl::StrCat("allreduce ", count)));
          }
        }
        std::vector<float> bc(100003);
        FillContribution(DType::kF32, bc.data(), bc.size(), rank, n);
        absl::Status s = (*comm)->Broadcast(bc.data(), bc.size(), DType::kF32, 1);
        if (s.ok()) {
          s = CheckBuffer(DType::kF32, bc.data(), bc.size(),
                          [&](size_t i) { return Contribution(1, n, i); });
        }
        return s.ok() ? kOk : Fail(rank, s);
      },
      absl::Seconds(90));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(results[r].exit_code, kOk) << "rank " << r << " signal " << results[r].signal;
  }
}

class KillTest : public ::testing::TestWithParam<TransportKind> {
 protected:
  // Runs `n` ranks doing allreduces of `count` floats with a 30 s timeout.
  // Rank 1 writes a byte to a pipe after `signal_after` collectives (and, if
  // `then_hang`, stops calling collectives); the parent then SIGKILLs it.
  // Expects every other rank to fail with UNAVAILABLE or ABORTED naming a
  // rank, within 10 s of the kill.
  void RunAndKill(int n, size_t count, int signal_after, bool then_hang) {
    const TransportKind transport = GetParam();
    const std::string dir = testing::NewTempDir("kill");
    const absl::Duration timeout = absl::Seconds(30);
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    absl::Time killed_at = absl::InfiniteFuture();
    std::vector<ProcessResult> results = RunProcesses(
        n,
        [&](int rank) -> int {
          close(fds[0]);
          FileStore store(dir);
          auto comm = Communicator::Create(rank, n, &store, Options(transport, timeout));
          if (!comm.ok()) return Fail(rank, comm.status());
          std::vector<float> buf(count);
          for (int iter = 0; iter < 100000; ++iter) {
            if (rank == 1 && iter == signal_after) {
              char byte = 1;
              if (write(fds[1], &byte, 1) != 1) return kWrong;
              if (then_hang) pause();  // killed while the others wait for it
            }
            FillContribution(DType::kF32, buf.data(), count, rank, n);
            absl::Status s = (*comm)->Allreduce(buf.data(), count, DType::kF32);
            if (s.ok()) continue;
            WriteFile(absl::StrCat(dir, "/error.", rank), s.ToString());
            const bool expected = (absl::IsUnavailable(s) || absl::IsAborted(s)) &&
                                  s.message().find("rank ") != std::string::npos;
            return expected ? kExpectedError : Fail(rank, s);
          }
          return Fail(rank, absl::InternalError("no error although rank 1 was killed"));
        },
        absl::Seconds(120),
        [&](const std::vector<int>& pids) {
          close(fds[1]);
          pollfd pfd{fds[0], POLLIN, 0};
          ASSERT_EQ(poll(&pfd, 1, 60000), 1) << "rank 1 never got going";
          absl::SleepFor(absl::Milliseconds(then_hang ? 200 : 3));
          kill(pids[1], SIGKILL);
          killed_at = absl::Now();
        });
    close(fds[0]);
    EXPECT_EQ(results[1].signal, SIGKILL);
    for (int r = 0; r < n; ++r) {
      if (r == 1) continue;
      EXPECT_EQ(results[r].exit_code, kExpectedError)
          << "rank " << r << ": " << ReadFile(absl::StrCat(dir, "/error.", r));
      std::printf("rank %d saw: %s\n", r, ReadFile(absl::StrCat(dir, "/error.", r)).c_str());
    }
    EXPECT_EQ(SegmentsLeft(dir), std::vector<std::string>())
        << "shared-memory segments left behind";
  }
};

TEST_P(KillTest, RankKilledMidTransfer) { RunAndKill(3, 1 << 20, 3, /*then_hang=*/false); }

TEST_P(KillTest, RankKilledWhileOthersWaitForIt) { RunAndKill(4, 1 << 16, 2, /*then_hang=*/true); }

TEST_P(KillTest, NeverArrivingRankTimesOutCreate) {
  const TransportKind transport = GetParam();
  const std::string dir = testing::NewTempDir("absent");
  // Ranks 0 and 1 of 3 start; rank 2 never does.
  std::vector<ProcessResult> results = RunProcesses(
      2,
      [&](int rank) -> int {
        FileStore store(dir);
        auto comm =
            Communicator::Create(rank, 3, &store, Options(transport, absl::Milliseconds(500)));
        if (absl::IsDeadlineExceeded(comm.status())) return kExpectedError;
        return Fail(rank, comm.status());
      },
      absl::Seconds(30));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, kExpectedError) << "rank " << r;
    EXPECT_LT(results[r].elapsed, absl::Seconds(10));
  }
}

INSTANTIATE_TEST_SUITE_P(Processes, KillTest,
                         ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const ::testing::TestParamInfo<TransportKind>& info) {
                           return std::string(TransportKindName(info.param));
                         });

}  // namespace
}  // namespace collective
}  // namespace dtrain
