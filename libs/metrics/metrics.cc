#include "libs/metrics/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "prometheus/exposer.h"

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

// Opens and closes a TCP connection to host:port, ignoring failures.
void WakeListener(const std::string& host, int port) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &result) != 0) return;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    bool connected = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(result);
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
  // civetweb takes "[ip:]port"; accept ":port" too.
  std::string bind(address);
  if (absl::StartsWith(bind, ":")) bind = "0.0.0.0" + bind;
  size_t colon = bind.rfind(':');
  absl::string_view port_text = colon == std::string::npos
                                    ? absl::string_view(bind)
                                    : absl::string_view(bind).substr(colon + 1);
  int port_number = 0;
  if (!absl::SimpleAtoi(port_text, &port_number) || port_number < 0 || port_number > 65535 ||
      (colon != std::string::npos && colon == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address, "' is not host:port, :port or port (e.g. 127.0.0.1:0)"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on '", address, "': ", e.what()));
  }
  std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics: no listening port for '", address, "'"));
  }
  std::string host = colon == std::string::npos ? "" : bind.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))
    host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), ports[0], host));
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port,
                             std::string wake_host)
    : exposer_(std::move(exposer)), port_(port), wake_host_(std::move(wake_host)) {}

MetricsServer::~MetricsServer() {
  // civetweb's listener polls with a 2 s timeout and only notices the stop
  // request when the poll returns; connecting to it ends the wait at once.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load()) {
      WakeListener(wake_host_, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  exposer_.reset();  // Stops the HTTP threads before the collectables go away.
  stopped = true;
  waker.join();
}

void MetricsServer::Expose(std::shared_ptr<prometheus::Collectable> collectable) {
  absl::MutexLock lock(&mu_);
  exposer_->RegisterCollectable(collectable);
  exposed_.push_back(std::move(collectable));
}

}  // namespace metrics
}  // namespace dtrain
