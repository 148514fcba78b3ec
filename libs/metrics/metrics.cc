#include "libs/metrics/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/base/logging.h"
#include "prometheus/text_serializer.h"

namespace dtrain {
namespace metrics {
namespace {

bool ValidName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = absl::ascii_isalpha(c) || c == '_' || c == ':' || (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

void CheckName(absl::string_view name, prometheus::MetricType type) {
  DT_CHECK(ValidName(name)) << "metric name '" << name << "' is not [a-zA-Z_:][a-zA-Z0-9_:]*";
  DT_CHECK(absl::StartsWith(name, "dtrain_")) << "metric '" << name << "' must start with dtrain_";
  bool total = absl::EndsWith(name, "_total");
  switch (type) {
    case prometheus::MetricType::Counter:
      DT_CHECK(total) << "counter '" << name << "' must end in _total";
      break;
    case prometheus::MetricType::Histogram:
      DT_CHECK(absl::EndsWith(name, "_seconds") || absl::EndsWith(name, "_bytes"))
          << "histogram '" << name << "' must end in a base unit (_seconds, _bytes)";
      break;
    default:
      DT_CHECK(!total) << "only counters end in _total: '" << name << "'";
      break;
  }
}

}  // namespace

prometheus::Family<prometheus::Counter>& AddCounter(prometheus::Registry& registry,
                                                    const std::string& name,
                                                    const std::string& help) {
  CheckName(name, prometheus::MetricType::Counter);
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Gauge>& AddGauge(prometheus::Registry& registry,
                                                const std::string& name, const std::string& help) {
  CheckName(name, prometheus::MetricType::Gauge);
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Histogram>& AddHistogram(prometheus::Registry& registry,
                                                        const std::string& name,
                                                        const std::string& help) {
  CheckName(name, prometheus::MetricType::Histogram);
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  // 1-2.5-5 steps per decade from 10 us to 50 s.
  prometheus::Histogram::BucketBoundaries b;
  for (double decade = 1e-5; decade < 11; decade *= 10) {
    for (double m : {1.0, 2.5, 5.0}) b.push_back(decade * m);
  }
  return b;
}

prometheus::Histogram::BucketBoundaries SizeBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 64; v <= double(1 << 30); v *= 4) b.push_back(v);
  return b;
}

prometheus::MetricFamily MakeFamily(const std::string& name, const std::string& help,
                                    prometheus::MetricType type,
                                    const std::vector<Sample>& samples) {
  DT_CHECK(type == prometheus::MetricType::Gauge || type == prometheus::MetricType::Counter)
      << "MakeFamily builds gauges and counters";
  CheckName(name, type);
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  for (const Sample& s : samples) {
    prometheus::ClientMetric m;
    for (const auto& [k, v] : s.labels) m.label.push_back({k, v});
    if (type == prometheus::MetricType::Gauge) {
      m.gauge.value = s.value;
    } else {
      m.counter.value = s.value;
    }
    family.metric.push_back(std::move(m));
  }
  return family;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    absl::string_view address, const MetricsServerOptions& options) {
  if (options.max_connections < 1 || options.request_timeout <= absl::ZeroDuration() ||
      options.reply_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("metrics: max_connections must be >= 1 and the timeouts > 0");
  }
  // Accepts "host:port", ":port" (all interfaces) and "port".
  std::string bind_addr(address);
  if (absl::StartsWith(bind_addr, ":")) bind_addr = "0.0.0.0" + bind_addr;
  size_t colon = bind_addr.rfind(':');
  absl::string_view port_text = colon == std::string::npos
                                    ? absl::string_view(bind_addr)
                                    : absl::string_view(bind_addr).substr(colon + 1);
  int port_number = 0;
  if (!absl::SimpleAtoi(port_text, &port_number) || port_number < 0 || port_number > 65535 ||
      (colon != std::string::npos && colon == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address, "' is not host:port, :port or port (e.g. 127.0.0.1:0)"));
  }
  std::string host = colon == std::string::npos ? "0.0.0.0" : bind_addr.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))
    host = host.substr(1, host.size() - 2);
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port_number);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: cannot resolve '", address, "': ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* ai = result; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last_error = strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      last_error = strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(result);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on '", address, "': ", last_error));
  }
  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<MetricsServer>(new MetricsServer(fd, port, options));
}

MetricsServer::MetricsServer(int listen_fd, int port, const MetricsServerOptions& options)
    : listen_fd_(listen_fd), port_(port), options_(options) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  shutdown(listen_fd_, SHUT_RDWR);  // wakes the poll below
  thread_.join();
  close(listen_fd_);
}

void MetricsServer::Expose(std::shared_ptr<prometheus::Collectable> collectable) {
  absl::MutexLock lock(&mu_);
  exposed_.push_back(std::move(collectable));
}

void MetricsServer::Serve() {
  struct Conn {
    int fd;
    absl::Time deadline;
    bool replying = false;  // the request head is in; sending `out`
    std::string in, out;
    size_t sent = 0;
  };
  std::vector<Conn> conns;  // oldest first
  auto close_at = [&](size_t i) {
    close(conns[i].fd);
    conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
  };
  // Reads what has arrived and sends what the socket takes; false when the
  // connection is done (answered, or closed by the client).
  auto progress = [&](Conn& c) {
    if (!c.replying) {
      char buf[4096];
      const ssize_t n = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
      if (n > 0) c.in.append(buf, static_cast<size_t>(n));
      const bool done = n <= 0 || c.in.find("\r\n\r\n") != std::string::npos ||
                        c.in.find("\n\n") != std::string::npos || c.in.size() >= 16384;
      if (!done) return true;
      c.out = Respond(c.in);
      c.in.clear();
      c.replying = true;
      c.deadline = absl::Now() + options_.reply_timeout;
    }
    const ssize_t n =
        send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (n > 0) c.sent += static_cast<size_t>(n);
    return n > 0 && c.sent < c.out.size();
  };
  while (!stop_.load()) {
    const absl::Time now = absl::Now();
    for (size_t i = conns.size(); i-- > 0;) {
      if (conns[i].deadline <= now) close_at(i);  // too slow: sending or reading
    }
    absl::Time wake = now + absl::Milliseconds(200);
    std::vector<pollfd> fds;
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const Conn& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.replying ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c.deadline);
    }
    const int timeout_ms =
        static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - now) + 1));
    if (poll(fds.data(), fds.size(), timeout_ms) <= 0) continue;
    if (stop_.load()) break;
    // Existing connections first (indices match fds[1..]).
    for (size_t i = conns.size(); i-- > 0;) {
      if (fds[i + 1].revents != 0 && !progress(conns[i])) close_at(i);
    }
    if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
      if (stop_.load()) break;
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    // A full accept queue drops connection attempts (the client retries
    // after a second): drain it, up to a bound that keeps reads going.
    for (int accepted = 0; accepted < 4 * options_.max_connections + 64; ++accepted) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      // A scrape's request is usually there already: answer it at once,
      // before newer connections can push this one out.
      Conn c{fd, absl::Now() + options_.request_timeout};
      if (!progress(c)) {
        close(fd);
        continue;
      }
      if (static_cast<int>(conns.size()) >= options_.max_connections) {
        // At the cap: drop the oldest connection still sending its request
        // (or, when all are being answered, the oldest of all).
        size_t victim = 0;
        for (size_t i = 0; i < conns.size(); ++i) {
          if (!conns[i].replying) {
            victim = i;
            break;
          }
        }
        close_at(victim);
      }
      conns.push_back(std::move(c));
    }
  }
  for (const Conn& c : conns) close(c.fd);
}

std::string MetricsServer::Render() {
  std::vector<prometheus::MetricFamily> families;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& c : exposed_) {
      std::vector<prometheus::MetricFamily> f = c->Collect();
      families.insert(families.end(), std::make_move_iterator(f.begin()),
                      std::make_move_iterator(f.end()));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

std::string MetricsServer::Respond(absl::string_view head) {
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (absl::StartsWith(head, "GET /metrics ") || absl::StartsWith(head, "GET /metrics?") ||
      absl::StartsWith(head, "HEAD /metrics ")) {
    body = Render();
  } else if (absl::StartsWith(head, "GET ") || absl::StartsWith(head, "HEAD ")) {
    status = "404 Not Found";
    type = "text/plain";
    body = "only /metrics is served here\n";
  } else {
    status = "400 Bad Request";
    type = "text/plain";
    body = "expected an HTTP GET\n";
  }
  std::string response =
      absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (!absl::StartsWith(head, "HEAD ")) response += body;
  return response;
}

}  // namespace metrics
}  // namespace dtrain
