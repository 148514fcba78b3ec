// Stray connections to a TCP transport's listener with malformed handshakes
// (the inputs tests/fuzz/handshake_fuzzer explores): the rank ignores them,
// stays up, and still pairs with its real peer, whose bytes then arrive.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/collective/socket_util.h"
#include "libs/collective/store.h"
#include "libs/collective/tcp_transport.h"

namespace dtrain {
namespace collective {
namespace {

// The handshake a connecting rank sends (tcp_transport.cc), little endian.
std::string Handshake(uint32_t magic, uint32_t rank, uint32_t channel, uint32_t job_length,
                      const std::string& job) {
  std::string out(16, '\0');
  const uint32_t fields[4] = {magic, rank, channel, job_length};
  std::memcpy(&out[0], fields, sizeof(fields));
  return out + job;
}

constexpr uint32_t kMagic = 0x44544332;

TcpOptions Tcp(const std::string& secret) {
  TcpOptions tcp;
  tcp.host = "127.0.0.1";
  tcp.secret = secret;
  return tcp;
}

TransportOptions Options(Store* store, int rank) {
  TransportOptions o;
  o.rank = rank;
  o.size = 2;
  o.store = store;
  o.job_id = "job";
  o.peers = {1 - rank};
  o.channels = 2;
  o.deadline = absl::Now() + absl::Seconds(10);
  return o;
}

class TcpHandshakeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TcpHandshakeTest, StrayConnectionIsIgnored) {
  InMemoryStore store;
  const TcpOptions tcp = Tcp("attempt secret");
  absl::StatusOr<std::unique_ptr<Transport>> rank0, rank1;
  std::thread t0([&] { rank0 = CreateTcpTransport(Options(&store, 0), tcp); });
  absl::StatusOr<std::string> address = store.Get("tcp/job/0", absl::Seconds(10));
  ASSERT_TRUE(address.ok()) << address.status();
  absl::StatusOr<internal::SocketAddress> remote = internal::ParseAddress(*address);
  ASSERT_TRUE(remote.ok()) << remote.status();
  absl::StatusOr<int> stray =
      internal::ConnectWithDeadline(*remote, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stray.ok()) << stray.status();
  const std::string& bytes = GetParam();
  ASSERT_TRUE(
      internal::WriteFull(*stray, bytes.data(), bytes.size(), absl::Now() + absl::Seconds(10))
          .ok());
  ::shutdown(*stray, SHUT_WR);
  // Rank 0 reads and rejects the stray before rank 1 exists.
  char c;
  internal::SetNonBlocking(*stray, false).IgnoreError();
  // (A reset when the stray's bytes were not all read.)
  const ssize_t r = ::recv(*stray, &c, 1, 0);
  EXPECT_TRUE(r == 0 || (r < 0 && errno == ECONNRESET))
      << "rank 0 closes a connection it does not accept; recv: " << r << " "
      << std::strerror(errno);
  ::close(*stray);

  std::thread t1([&] { rank1 = CreateTcpTransport(Options(&store, 1), tcp); });
  t0.join();
  t1.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  // Both channels connect the real ranks: bytes sent by rank 1 arrive.
  for (int channel = 0; channel < 2; ++channel) {
    const std::string sent = "channel " + std::to_string(channel);
    std::string got(sent.size(), '\0');
    Pair* from = (*rank1)->GetPair(0, channel);
    Pair* to = (*rank0)->GetPair(1, channel);
    ASSERT_NE(from, nullptr);
    ASSERT_NE(to, nullptr);
    from->PostSend(sent.data(), sent.size());
    to->PostRecv(&got[0], got.size());
    std::thread sender([&] { EXPECT_TRUE(from->WaitSend(absl::Now() + absl::Seconds(10)).ok()); });
    EXPECT_TRUE(to->WaitRecv(absl::Now() + absl::Seconds(10)).ok());
    sender.join();
    EXPECT_EQ(got, sent);
  }
}

// Bytes from rank 1 reach rank 0 on every channel.
void ExpectConnected(Transport* rank0, Transport* rank1) {
  for (int channel = 0; channel < 2; ++channel) {
    const std::string sent = "tensor bytes " + std::to_string(channel);
    std::string got(sent.size(), '\0');
    Pair* from = rank1->GetPair(0, channel);
    Pair* to = rank0->GetPair(1, channel);
    ASSERT_NE(from, nullptr);
    ASSERT_NE(to, nullptr);
    from->PostSend(sent.data(), sent.size());
    to->PostRecv(&got[0], got.size());
    std::thread sender([&] { EXPECT_TRUE(from->WaitSend(absl::Now() + absl::Seconds(10)).ok()); });
    EXPECT_TRUE(to->WaitRecv(absl::Now() + absl::Seconds(10)).ok());
    sender.join();
    EXPECT_EQ(got, sent);
  }
}

// A process that knows the job id and speaks the protocol but holds another
// secret (or none) tries to take rank 1's place before rank 1 arrives: it is
// refused with PERMISSION_DENIED on both channels, and the real rank 1 still
// pairs with rank 0.
TEST(TcpAuthTest, PeerWithoutTheSecretIsRefused) {
  for (const std::string& intruder_secret : {std::string("another attempt"), std::string()}) {
    InMemoryStore store;
    absl::StatusOr<std::unique_ptr<Transport>> rank0, intruder, rank1;
    std::thread t0([&] { rank0 = CreateTcpTransport(Options(&store, 0), Tcp("attempt secret")); });
    intruder = CreateTcpTransport(Options(&store, 1), Tcp(intruder_secret));
    ASSERT_FALSE(intruder.ok());
    EXPECT_EQ(intruder.status().code(), absl::StatusCode::kPermissionDenied) << intruder.status();
    EXPECT_NE(intruder.status().message().find("collective secret"), std::string::npos)
        << intruder.status();
    rank1 = CreateTcpTransport(Options(&store, 1), Tcp("attempt secret"));
    t0.join();
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    ASSERT_TRUE(rank1.ok()) << rank1.status();
    ExpectConnected(rank0->get(), rank1->get());
  }
}

// The other direction: an impostor listening as rank 0 (it published its
// address where rank 0's goes) cannot answer the challenge, so the real rank
// 1 sends it nothing and fails with PERMISSION_DENIED.
TEST(TcpAuthTest, ConnectingRankRefusesAnImpostor) {
  InMemoryStore store;
  absl::StatusOr<std::unique_ptr<Transport>> impostor, rank1;
  TransportOptions o0 = Options(&store, 0);
  o0.deadline = absl::Now() + absl::Seconds(3);
  std::thread t0([&] { impostor = CreateTcpTransport(o0, Tcp("guess")); });
  TransportOptions o1 = Options(&store, 1);
  o1.deadline = absl::Now() + absl::Seconds(3);
  rank1 = CreateTcpTransport(o1, Tcp("attempt secret"));
  t0.join();
  ASSERT_FALSE(rank1.ok());
  EXPECT_EQ(rank1.status().code(), absl::StatusCode::kPermissionDenied) << rank1.status();
  EXPECT_NE(rank1.status().message().find("did not prove"), std::string::npos) << rank1.status();
  EXPECT_FALSE(impostor.ok());
}

// TLS: a few MiB each way on both channels arrive intact (over many TLS
// records, with short reads inside records); a rank with TLS off meets one
// with TLS on: refused, never read as tensor bytes.
TEST(TcpAuthTest, TlsCarriesBytesAndBothSidesMustAgree) {
  TcpOptions tls = Tcp("attempt secret");
  tls.tls = true;
  tls.bounce_bytes = 1000;  // not a multiple of a TLS record
  {
    InMemoryStore store;
    absl::StatusOr<std::unique_ptr<Transport>> rank0, rank1;
    std::thread t0([&] { rank0 = CreateTcpTransport(Options(&store, 0), tls); });
    rank1 = CreateTcpTransport(Options(&store, 1), tls);
    t0.join();
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    ASSERT_TRUE(rank1.ok()) << rank1.status();
    ExpectConnected(rank0->get(), rank1->get());
    const size_t n = (3 << 20) + 7;
    std::string a(n, '\0'), b(n, '\0'), got_a(n, '\0'), got_b(n, '\0');
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<char>(i * 7 + 1);
      b[i] = static_cast<char>(i * 13 + 5);
    }
    std::vector<std::thread> threads;
    for (int channel = 0; channel < 2; ++channel) {
      Pair* p0 = (*rank0)->GetPair(1, channel);
      Pair* p1 = (*rank1)->GetPair(0, channel);
      if (channel == 0) {
        p0->PostSend(a.data(), n);
        p1->PostRecv(&got_a[0], n);
      } else {
        p1->PostSend(b.data(), n);
        p0->PostRecv(&got_b[0], n);
      }
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    // One thread drives each transport (transport.h).
    std::thread d1([&] {
      EXPECT_TRUE((*rank1)->GetPair(0, 0)->WaitRecv(deadline).ok());
      EXPECT_TRUE((*rank1)->GetPair(0, 1)->WaitSend(deadline).ok());
    });
    EXPECT_TRUE((*rank0)->GetPair(1, 0)->WaitSend(deadline).ok());
    EXPECT_TRUE((*rank0)->GetPair(1, 1)->WaitRecv(deadline).ok());
    d1.join();
    EXPECT_TRUE(got_a == a);
    EXPECT_TRUE(got_b == b);
  }
  {
    InMemoryStore store;
    absl::StatusOr<std::unique_ptr<Transport>> rank0, plain;
    TransportOptions o0 = Options(&store, 0);
    o0.deadline = absl::Now() + absl::Seconds(3);
    std::thread t0([&] { rank0 = CreateTcpTransport(o0, tls); });
    plain = CreateTcpTransport(Options(&store, 1), Tcp("attempt secret"));
    t0.join();
    ASSERT_FALSE(plain.ok());
    EXPECT_EQ(plain.status().code(), absl::StatusCode::kPermissionDenied) << plain.status();
    EXPECT_NE(plain.status().message().find("TLS"), std::string::npos) << plain.status();
    EXPECT_EQ(rank0.status().code(), absl::StatusCode::kDeadlineExceeded) << rank0.status();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, TcpHandshakeTest,
    ::testing::Values(
        // Found by the fuzzer: channel 2^31 passed the check as a negative
        // int and indexed far outside the pair table (SEGV).
        Handshake(kMagic, 1, 0x80000000u, 3, "job"), Handshake(kMagic, 1, 0xFFFFFFFFu, 3, "job"),
        // A rank of 2^31 + 1 (a negative int) and one past the size.
        Handshake(kMagic, 0x80000001u, 0, 3, "job"), Handshake(kMagic, 2, 0, 3, "job"),
        // Rank 0 itself, a channel past the count, another job, a bad magic.
        Handshake(kMagic, 0, 0, 3, "job"), Handshake(kMagic, 1, 2, 3, "job"),
        Handshake(kMagic, 1, 0, 5, "other"), Handshake(0x12345678, 1, 0, 3, "job"),
        // A job id length past the limit, a cut-off handshake, nothing.
        Handshake(kMagic, 1, 0, 4096, ""), Handshake(kMagic, 1, 0, 3, "").substr(0, 10),
        std::string()));

}  // namespace
}  // namespace collective
}  // namespace dtrain
