#include "libs/doctor/doctor.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {
namespace doctor {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string SizeName(int64_t bytes) {
  if (bytes >= (1 << 20)) return absl::StrCat(bytes >> 20, "MiB");
  return absl::StrCat(bytes >> 10, "KiB");
}

// The chapter's line for a chase through `bytes` (its table's nearest row).
std::string ChapterLatency(int64_t bytes) {
  if (bytes <= (32 << 10)) return "L1 cache reference/hit 1.5 ns";
  if (bytes <= (512 << 10)) return "L2 cache reference/hit 5 ns";
  if (bytes <= (16 << 20)) return "L3 cache hit (unshared cache) 16 ns";
  if (bytes <= (64 << 20)) return "64MB memory ref. (local CPU) 46 ns";
  return "256MB memory ref. (local CPU) 75 ns";
}

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= w;
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= r;
  }
  return true;
}

absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not host:port (e.g. 10.77.0.2:7999)"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, address.substr(colon + 1));
}

absl::StatusOr<addrinfo*> Resolve(const std::string& address, bool passive) {
  auto hp = SplitHostPort(address);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(hp->first.c_str(), hp->second.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", address, "': ", gai_strerror(rc)));
  }
  return res;
}

absl::StatusOr<int> Connect(const std::string& address) {
  auto res = Resolve(address, false);
  if (!res.ok()) return res.status();
  int fd = socket((*res)->ai_family, SOCK_STREAM, 0);
  if (fd < 0) {
    freeaddrinfo(*res);
    return Errno("socket");
  }
  if (connect(fd, (*res)->ai_addr, (*res)->ai_addrlen) != 0) {
    absl::Status s =
        Errno(absl::StrCat("connect to ", address, " (is `trainctl doctor serve` running there?)"));
    freeaddrinfo(*res);
    close(fd);
    return s;
  }
  freeaddrinfo(*res);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Seconds from the first byte of an n-byte bulk stream to its acknowledgment.
absl::StatusOr<double> Bulk(const std::string& address, int64_t n) {
  auto fd = Connect(address);
  if (!fd.ok()) return fd.status();
  std::vector<char> buf(1 << 20, 'x');
  char header[9] = {'B'};
  std::memcpy(header + 1, &n, 8);
  const auto start = Clock::now();
  bool ok = WriteAll(*fd, header, sizeof(header));
  for (int64_t left = n; ok && left > 0;) {
    size_t chunk = std::min<int64_t>(left, buf.size());
    ok = WriteAll(*fd, buf.data(), chunk);
    left -= chunk;
  }
  char ack = 0;
  ok = ok && ReadAll(*fd, &ack, 1);
  const double t = Since(start);
  close(*fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("bulk stream to ", address, " broke"));
  return t;
}

}  // namespace

double ChaseLatencyNs(int64_t bytes) {
  const size_t n = std::max<int64_t>(bytes / sizeof(void*), 16);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(42);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<void*> chain(n);
  for (size_t i = 0; i < n; ++i) chain[order[i]] = &chain[order[(i + 1) % n]];
  // A few million loads: tens of ms in the caches, a few hundred in memory.
  const int64_t loads = 4'000'000;
  void* p = &chain[order[0]];
  for (int64_t i = 0; i < std::min<int64_t>(n, loads); ++i) p = *static_cast<void**>(p);  // warm
  // Best of several runs (a busy machine preempts some); cheap for the
  // cache-sized chains, where one run takes milliseconds.
  const int reps = bytes <= (1 << 20) ? 10 : 3;
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < loads; ++i) p = *static_cast<void**>(p);
    best = std::min(best, Since(start) / loads);
  }
  // Keep the chase from being optimized away.
  if (p == nullptr) std::abort();
  return best * 1e9;
}

double MemcpyBytesPerSecond(int64_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = Clock::now();
    std::memcpy(rep % 2 ? a.data() : b.data(), rep % 2 ? b.data() : a.data(), bytes);
    best = std::min(best, Since(start));
  }
  if (a[bytes / 2] != b[bytes / 2]) std::abort();
  return bytes / best;
}

absl::StatusOr<std::unique_ptr<LinkServer>> LinkServer::Start(const std::string& address) {
  auto res = Resolve(address, true);
  if (!res.ok()) return res.status();
  std::unique_ptr<LinkServer> server(new LinkServer());
  int fd = socket((*res)->ai_family, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, (*res)->ai_addr, (*res)->ai_addrlen) != 0 || listen(fd, 16) != 0) {
    absl::Status s = Errno(absl::StrCat("listen on ", address));
    freeaddrinfo(*res);
    if (fd >= 0) close(fd);
    return s;
  }
  freeaddrinfo(*res);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  server->listen_fd_ = fd;
  server->address_ = absl::StrCat(SplitHostPort(address)->first, ":", port);
  if (pipe(server->wake_fd_) != 0) return Errno("pipe");
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

LinkServer::~LinkServer() {
  if (thread_.joinable()) {
    char c = 0;
    (void)!write(wake_fd_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_fd_[0], wake_fd_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void LinkServer::Serve() {
  std::vector<char> buf(1 << 20);
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval tv{30, 0};  // a client that stalls does not hold the server
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char kind = 0;
    if (ReadAll(fd, &kind, 1)) {
      if (kind == 'P') {
        char c;
        while (ReadAll(fd, &c, 1) && WriteAll(fd, &c, 1)) {
        }
      } else if (kind == 'B') {
        int64_t n = 0;
        bool ok = ReadAll(fd, &n, 8);
        while (ok && n > 0) {
          ssize_t r = recv(fd, buf.data(), std::min<int64_t>(n, buf.size()), 0);
          if (r < 0 && errno == EINTR) continue;
          ok = r > 0;
          n -= std::max<ssize_t>(r, 0);
        }
        char ack = 1;
        if (ok) WriteAll(fd, &ack, 1);
      }
    }
    close(fd);
  }
}

absl::StatusOr<LinkFigures> MeasureLink(const std::string& address, const LinkOptions& options) {
  if (options.pings < 1 || options.bulk_bytes < 4096) {
    return absl::InvalidArgumentError("link measurement needs pings >= 1 and bulk_bytes >= 4096");
  }
  LinkFigures out;
  auto fd = Connect(address);
  if (!fd.ok()) return fd.status();
  std::vector<double> rtt;
  char c = 'P';
  bool ok = WriteAll(*fd, &c, 1);
  for (int i = 0; ok && i < options.pings + 10; ++i) {
    const auto start = Clock::now();
    ok = WriteAll(*fd, &c, 1) && ReadAll(*fd, &c, 1);
    if (i >= 10) rtt.push_back(Since(start));  // the first ones warm up
  }
  close(*fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("ping-pong with ", address, " broke"));
  std::sort(rtt.begin(), rtt.end());
  out.latency_s = rtt[rtt.size() / 2] / 2;
  // Two streams, n/4 and n bytes: their difference is the steady rate
  // (the start, slow start included, cancels).
  auto small = Bulk(address, options.bulk_bytes / 4);
  if (!small.ok()) return small.status();
  auto large = Bulk(address, options.bulk_bytes);
  if (!large.ok()) return large.status();
  double dt = *large - *small;
  if (dt <= 0) dt = *large;
  out.bytes_per_second = (options.bulk_bytes - options.bulk_bytes / 4) / dt;
  return out;
}

std::vector<Figure> MeasureHost(const HostOptions& options) {
  std::vector<Figure> figures;
  for (int64_t bytes : options.latency_bytes) {
    figures.push_back({absl::StrCat("memory_latency_ns_", SizeName(bytes)), ChaseLatencyNs(bytes),
                       "ns", ChapterLatency(bytes)});
  }
  if (options.memcpy_bytes > 0) {
    figures.push_back({absl::StrCat("memcpy_GBps_", SizeName(options.memcpy_bytes)),
                       MemcpyBytesPerSecond(options.memcpy_bytes) / 1e9, "GB/s",
                       "DDR4 channels: 40-100 GB/s peak per CPU"});
  }
  if (options.loopback_bytes > 0) {
    auto server = LinkServer::Start("127.0.0.1:0");
    LinkOptions lo;
    lo.pings = options.pings;
    lo.bulk_bytes = options.loopback_bytes;
    absl::StatusOr<LinkFigures> link =
        server.ok() ? MeasureLink((*server)->address(), lo) : server.status();
    if (link.ok()) {
      figures.push_back({"loopback_latency_us", link->latency_s * 1e6, "us",
                         "One-way ping within same datacenter ~250 us"});
      figures.push_back({"loopback_GBps", link->bytes_per_second / 1e9, "GB/s",
                         "100GbE ~10 GB/s; 1-10GbE 0.1-1 GB/s effective"});
    }
  }
  return figures;
}

}  // namespace doctor
}  // namespace dtrain
