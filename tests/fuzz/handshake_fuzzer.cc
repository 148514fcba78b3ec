// Fuzz target: the TCP collective transport's connection handshake
// (libs/collective/tcp_transport.cc), over real sockets on loopback.
//
// Each input is up to four stray connections' bytes ({u8 length, bytes}
// repeated). Rank 0 of a 2-rank, 2-channel transport (job id "fuzz")
// starts listening; the harness opens the stray connections to it, sends
// their bytes and half-closes them; then the real rank 1 connects. The
// checks: no crash, and both real ranks' creation succeeds -- a stray
// connection must not break or hang the rendezvous of the real ranks, nor
// take rank 1's place: the ranks hold a secret the strays do not, and the
// handshake's challenge-response refuses them.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "libs/base/logging.h"
#include "libs/collective/socket_util.h"
#include "libs/collective/store.h"
#include "libs/collective/tcp_transport.h"

namespace {

namespace co = dtrain::collective;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "handshake_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

co::TransportOptions Options(co::Store* store, int rank) {
  co::TransportOptions o;
  o.rank = rank;
  o.size = 2;
  o.store = store;
  o.job_id = "fuzz";
  o.peers = {1 - rank};
  o.channels = 2;
  o.deadline = absl::Now() + absl::Seconds(5);
  return o;
}

co::TcpOptions Tcp() {
  co::TcpOptions t;
  t.host = "127.0.0.1";
  t.socket_buffer_bytes = 0;
  t.bounce_bytes = 4096;
  t.secret = "fuzz attempt secret";
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  signal(SIGPIPE, SIG_IGN);
  dtrain::SetMinLogLevel(dtrain::LogLevel::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> strays;
  for (size_t p = 0; p < size && strays.size() < 4;) {
    const size_t n = std::min<size_t>(data[p], size - p - 1);
    strays.emplace_back(reinterpret_cast<const char*>(data + p + 1), n);
    p += 1 + n;
  }
  co::InMemoryStore store;
  absl::StatusOr<std::unique_ptr<co::Transport>> rank0, rank1;
  std::thread t0([&] { rank0 = co::CreateTcpTransport(Options(&store, 0), Tcp()); });
  absl::StatusOr<std::string> address = store.Get("tcp/fuzz/0", absl::Seconds(5));
  Check(address.ok(), "rank 0 publishes its address");
  absl::StatusOr<co::internal::SocketAddress> remote = co::internal::ParseAddress(*address);
  Check(remote.ok(), "rank 0's address parses");
  std::vector<int> fds;
  for (const std::string& bytes : strays) {
    absl::StatusOr<int> fd =
        co::internal::ConnectWithDeadline(*remote, absl::Now() + absl::Seconds(5));
    Check(fd.ok(), "a stray connection connects");
    fds.push_back(*fd);
    if (!bytes.empty()) {
      // The peer may close first (it read enough to reject): errors are fine.
      (void)co::internal::WriteFull(*fd, bytes.data(), bytes.size(),
                                    absl::Now() + absl::Seconds(5));
    }
    ::shutdown(*fd, SHUT_WR);
  }
  std::thread t1([&] { rank1 = co::CreateTcpTransport(Options(&store, 1), Tcp()); });
  t0.join();
  t1.join();
  if (!rank0.ok()) std::fprintf(stderr, "rank 0: %s\n", rank0.status().ToString().c_str());
  Check(rank0.ok(), "rank 0 connects despite stray connections");
  if (!rank1.ok()) std::fprintf(stderr, "rank 1: %s\n", rank1.status().ToString().c_str());
  Check(rank1.ok(), "rank 1 connects despite stray connections");
  rank0->reset();
  rank1 = absl::UnknownError("done");
  for (int fd : fds) ::close(fd);
  return 0;
}
