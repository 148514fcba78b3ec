#include "libs/metrics/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(absl::string_view address) {
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
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
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
  return std::unique_ptr<MetricsServer>(new MetricsServer(fd, port));
}

MetricsServer::MetricsServer(int listen_fd, int port) : listen_fd_(listen_fd), port_(port) {
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
  while (!stop_.load()) {
    pollfd p = {listen_fd_, POLLIN, 0};
    int n = poll(&p, 1, 200);
    if (n <= 0) continue;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) {
      if (stop_.load()) return;
    }
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    HandleConnection(fd);
    close(fd);
  }
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

void MetricsServer::HandleConnection(int fd) {
  // Read the request head (bounded; a slow or silent client gets 2 s).
  timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string head;
  char buf[2048];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < 16384) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
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
  size_t sent = 0;
  while (sent < response.size()) {
    ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
}

}  // namespace metrics
}  // namespace dtrain
