// Pair semantics, the same for every transport: stream order independent of
// message boundaries, combining receives split anywhere, both directions at
// once beyond buffer sizes, zero-byte messages, deadlines and dead peers.
#include "libs/collective/transport.h"

#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/collective/algorithms.h"
#include "libs/collective/inprocess_transport.h"
#include "libs/collective/shm_transport.h"
#include "libs/collective/store.h"
#include "libs/collective/tcp_transport.h"

namespace dtrain {
namespace collective {
namespace {

enum class Kind { kInProcess, kShm, kTcp };

std::string KindName(Kind kind) {
  switch (kind) {
    case Kind::kInProcess:
      return "inprocess";
    case Kind::kShm:
      return "shm";
    case Kind::kTcp:
      return "tcp";
  }
  return "?";
}

class TransportTest : public ::testing::TestWithParam<Kind> {
 protected:
  // Creates both ranks of a 2-rank job (concurrently: creation waits for the
  // peer).
  void CreatePair() {
    static int job = 0;
    const std::string id = absl::StrCat("tt", getpid(), "-", job++);
    std::thread other([&] { t_[1] = Create(1, id); });
    t_[0] = Create(0, id);
    other.join();
    ASSERT_NE(t_[0], nullptr);
    ASSERT_NE(t_[1], nullptr);
  }

  std::unique_ptr<Transport> Create(int rank, const std::string& id) {
    TransportOptions o;
    o.rank = rank;
    o.size = 2;
    o.store = &store_;
    o.job_id = id;
    o.peers = {1 - rank};
    o.channels = 2;
    o.deadline = absl::Now() + absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<Transport>> t;
    switch (GetParam()) {
      case Kind::kInProcess:
        t = CreateInProcessTransport(o);
        break;
      case Kind::kShm: {
        ShmOptions shm;
        shm.ring_bytes = 64 << 10;  // small, so large messages wrap many times
        t = CreateShmTransport(o, shm);
        break;
      }
      case Kind::kTcp: {
        TcpOptions tcp;
        tcp.host = "127.0.0.1";
        tcp.bounce_bytes = 4096 + 3;  // odd, so combining receives split elements
        t = CreateTcpTransport(o, tcp);
        break;
      }
    }
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }

  absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

  InMemoryStore store_;
  std::unique_ptr<Transport> t_[2];
};

TEST_P(TransportTest, StreamIgnoresMessageBoundaries) {
  CreatePair();
  std::vector<char> data(9001);
  std::iota(data.begin(), data.end(), 0);
  std::vector<char> got(data.size(), 0);
  std::thread sender([&] {
    Pair* p = t_[0]->GetPair(1, 0);
    p->PostSend(data.data(), 1000);
    p->PostSend(data.data() + 1000, 0);
    p->PostSend(data.data() + 1000, 1);
    p->PostSend(data.data() + 1001, 8000);
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(p->WaitSend(Soon()).ok());
  });
  Pair* p = t_[1]->GetPair(0, 0);
  p->PostRecv(got.data(), 3001);
  p->PostRecv(got.data() + 3001, 6000);
  EXPECT_TRUE(p->WaitRecv(Soon()).ok());
  EXPECT_TRUE(p->WaitRecv(Soon()).ok());
  sender.join();
  EXPECT_EQ(got, data);
}

TEST_P(TransportTest, CombiningReceiveAcrossOddSplits) {
  CreatePair();
  const size_t n = 50000;  // floats
  std::vector<float> mine(n), theirs(n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = static_cast<float>(i % 100);
    theirs[i] = static_cast<float>(3 * (i % 7));
  }
  std::thread sender([&] {
    Pair* p = t_[0]->GetPair(1, 1);
    const char* bytes = reinterpret_cast<const char*>(theirs.data());
    // Pieces that cut floats apart.
    size_t sizes[] = {3, 5, 1, 4099, 77777};
    size_t off = 0;
    int posted = 0;
    for (size_t s : sizes) {
      p->PostSend(bytes + off, s);
      off += s;
      ++posted;
    }
    p->PostSend(bytes + off, n * 4 - off);
    ++posted;
    for (int i = 0; i < posted; ++i) EXPECT_TRUE(p->WaitSend(Soon()).ok());
  });
  internal::ReduceCombiner sum(DType::kF32, false, 1.0f);
  Pair* p = t_[1]->GetPair(0, 1);
  p->PostRecv(mine.data(), n * 4, &sum);
  EXPECT_TRUE(p->WaitRecv(Soon()).ok());
  sender.join();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(mine[i], static_cast<float>(i % 100 + 3 * (i % 7))) << i;
  }
}

TEST_P(TransportTest, BothDirectionsAtOnceBeyondBufferSizes) {
  CreatePair();
  const size_t bytes = 8 << 20;
  std::vector<std::vector<char>> out(2, std::vector<char>(bytes)), in(2, std::vector<char>(bytes));
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < bytes; ++i) out[r][i] = static_cast<char>(i * (r + 3));
  }
  auto run = [&](int r) {
    Pair* p = t_[r]->GetPair(1 - r, 0);
    // Each side sends first and receives second: only works if waiting on
    // the send also drains the receive.
    p->PostSend(out[r].data(), bytes);
    p->PostRecv(in[r].data(), bytes);
    EXPECT_TRUE(p->WaitSend(Soon()).ok());
    EXPECT_TRUE(p->WaitRecv(Soon()).ok());
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  EXPECT_TRUE(in[0] == out[1]);
  EXPECT_TRUE(in[1] == out[0]);
}

TEST_P(TransportTest, ChannelsAreIndependent) {
  CreatePair();
  int a = 1, b = 2, got_a = 0, got_b = 0;
  Pair* s0 = t_[0]->GetPair(1, 0);
  Pair* s1 = t_[0]->GetPair(1, 1);
  s1->PostSend(&b, sizeof(b));
  s0->PostSend(&a, sizeof(a));
  std::thread receiver([&] {
    Pair* r0 = t_[1]->GetPair(0, 0);
    Pair* r1 = t_[1]->GetPair(0, 1);
    r0->PostRecv(&got_a, sizeof(got_a));
    r1->PostRecv(&got_b, sizeof(got_b));
    EXPECT_TRUE(r0->WaitRecv(Soon()).ok());
    EXPECT_TRUE(r1->WaitRecv(Soon()).ok());
  });
  EXPECT_TRUE(s1->WaitSend(Soon()).ok());
  EXPECT_TRUE(s0->WaitSend(Soon()).ok());
  receiver.join();
  EXPECT_EQ(got_a, 1);
  EXPECT_EQ(got_b, 2);
}

TEST_P(TransportTest, UnconnectedPeersHaveNoPair) {
  CreatePair();
  EXPECT_EQ(t_[0]->GetPair(0, 0), nullptr);  // itself
  EXPECT_EQ(t_[0]->GetPair(2, 0), nullptr);
  EXPECT_EQ(t_[0]->GetPair(1, 2), nullptr);
  EXPECT_EQ(t_[0]->num_channels(), 2);
  EXPECT_EQ(std::string(t_[0]->name()), KindName(GetParam()));
}

TEST_P(TransportTest, DeadlineNamesThePeer) {
  CreatePair();
  char byte;
  Pair* p = t_[0]->GetPair(1, 0);
  p->PostRecv(&byte, 1);
  absl::Time start = absl::Now();
  absl::Status s = p->WaitRecv(absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_P(TransportTest, ClosedPeerFailsPendingReceive) {
  CreatePair();
  char byte;
  Pair* p = t_[0]->GetPair(1, 0);
  p->PostRecv(&byte, 1);
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    t_[1].reset();
  });
  absl::Time start = absl::Now();
  absl::Status s = p->WaitRecv(absl::Now() + absl::Seconds(30));
  closer.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_P(TransportTest, AbortedPeerFailsPendingSend) {
  CreatePair();
  std::vector<char> big(48 << 20);  // more than socket buffers and rings hold
  Pair* p = t_[0]->GetPair(1, 0);
  p->PostSend(big.data(), big.size());
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    t_[1]->Abort(absl::InternalError("test abort"));
  });
  absl::Time start = absl::Now();
  absl::Status s = p->WaitSend(absl::Now() + absl::Seconds(30));
  aborter.join();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsAborted(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The aborted side fails at once.
  char byte;
  Pair* q = t_[1]->GetPair(0, 0);
  q->PostRecv(&byte, 1);
  EXPECT_EQ(q->WaitRecv(absl::Now() + absl::Seconds(5)).code(), absl::StatusCode::kAborted);
}

INSTANTIATE_TEST_SUITE_P(All, TransportTest,
                         ::testing::Values(Kind::kInProcess, Kind::kShm, Kind::kTcp),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return KindName(info.param);
                         });

TEST(InProcessTransportTest, RefusesRanksOfAnotherProcess) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("inproc/j/1", "999999999").ok());  // "another process"
  TransportOptions o;
  o.rank = 0;
  o.size = 2;
  o.store = &store;
  o.job_id = "j";
  o.peers = {1};
  o.deadline = absl::Now() + absl::Seconds(5);
  auto t = CreateInProcessTransport(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
}

TEST(TcpTransportTest, TimesOutWhenThePeerNeverConnects) {
  InMemoryStore store;
  TransportOptions o;
  o.rank = 0;
  o.size = 2;
  o.store = &store;
  o.job_id = "lonely";
  o.peers = {1};
  o.deadline = absl::Now() + absl::Milliseconds(200);
  TcpOptions tcp;
  tcp.host = "127.0.0.1";
  auto t = CreateTcpTransport(o, tcp);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_NE(t.status().message().find("1"), std::string::npos);
}

}  // namespace
}  // namespace collective
}  // namespace dtrain
