// Prometheus metrics for dtrain services: an HTTP exposer for /metrics and
// helpers that keep metric names conventional.
//
//   auto registry = std::make_shared<prometheus::Registry>();
//   auto& requests = metrics::AddCounter(*registry, "dtrain_kvstore_requests_total",
//                                        "RPCs handled, by method and status code.");
//   requests.Add({{"method", "Push"}, {"code", "OK"}}).Increment();
//   auto& latency = metrics::AddHistogram(*registry, "dtrain_kvstore_request_duration_seconds",
//                                         "RPC latency.");
//   latency.Add({{"method", "Push"}}, metrics::LatencyBuckets()).Observe(seconds);
//
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<metrics::MetricsServer> server,
//                       metrics::MetricsServer::Start("127.0.0.1:0"));
//   server->Expose(registry);
//   DT_LOG(INFO) << "metrics on port " << server->port();
//
// Conventions (https://prometheus.io/docs/practices/naming/), enforced with
// DT_CHECK because metric names are constants of our own code: names match
// [a-zA-Z_:][a-zA-Z0-9_:]*, start with "dtrain_"; counters end in "_total";
// histograms carry a base unit suffix ("_seconds" or "_bytes"); gauges do not
// end in "_total". Values are in base units: seconds, bytes.
//
// Thread-safety: prometheus-cpp's metrics are thread-safe; the helpers here
// are too. A Registry may be exposed by several servers.
#ifndef DTRAIN_LIBS_METRICS_METRICS_H_
#define DTRAIN_LIBS_METRICS_METRICS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

// prometheus-cpp's CivetServer; kept out of this header.
namespace prometheus {}  // namespace prometheus

namespace dtrain {
namespace metrics {

// Families registered in `registry` (which owns them). Adding a family whose
// name exists with the same type returns the existing one.
prometheus::Family<prometheus::Counter>& AddCounter(prometheus::Registry& registry,
                                                    const std::string& name,
                                                    const std::string& help);
prometheus::Family<prometheus::Gauge>& AddGauge(prometheus::Registry& registry,
                                                const std::string& name, const std::string& help);
prometheus::Family<prometheus::Histogram>& AddHistogram(prometheus::Registry& registry,
                                                        const std::string& name,
                                                        const std::string& help);

// Bucket boundaries in base units. LatencyBuckets: seconds, 10 us to about
// 40 s in steps of about 2.5x (the low end resolves loopback RPCs).
// SizeBuckets: bytes, 64 B to 1 GiB in steps of 4x.
prometheus::Histogram::BucketBoundaries LatencyBuckets();
prometheus::Histogram::BucketBoundaries SizeBuckets();

// One sample of a family built at scrape time.
struct Sample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Builds a gauge or counter family from samples (for CallbackCollectable).
// `type` must be kGauge or kCounter; the name is checked as above.
prometheus::MetricFamily MakeFamily(const std::string& name, const std::string& help,
                                    prometheus::MetricType type,
                                    const std::vector<Sample>& samples);

// A collectable whose families are computed by a function at every scrape:
// for values that live elsewhere (bytes a store holds, queue lengths). The
// function runs on the exposer's HTTP threads and must be thread-safe.
class CallbackCollectable : public prometheus::Collectable {
 public:
  using Fn = std::function<std::vector<prometheus::MetricFamily>()>;
  explicit CallbackCollectable(Fn fn) : fn_(std::move(fn)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return fn_(); }

 private:
  Fn fn_;
};

// Bounds that keep slow or idle clients from holding /metrics.
struct MetricsServerOptions {
  // Connections open at once. A connection past the cap closes the oldest
  // one still sending its request (a slow client's), so a scrape gets in.
  int max_connections = 32;
  // A client must send its whole request head within this time of
  // connecting, and read the whole reply within reply_timeout after it.
  absl::Duration request_timeout = absl::Seconds(1);
  absl::Duration reply_timeout = absl::Seconds(5);
};

// Serves GET /metrics over HTTP for every exposed collectable.
class MetricsServer {
 public:
  // Listens on `address`: "host:port", ":port" (all interfaces) or "port".
  // Port 0 picks a free port; port() tells which. Errors: kInvalidArgument
  // for a malformed address or options, kUnavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      absl::string_view address, const MetricsServerOptions& options = {});

  // Stops serving; connections still open are closed.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Adds `collectable` (a Registry, a CallbackCollectable) to /metrics. The
  // server keeps a reference, so the caller may drop its own.
  void Expose(std::shared_ptr<prometheus::Collectable> collectable);

  // The bound TCP port.
  int port() const { return port_; }

 private:
  MetricsServer(int listen_fd, int port, const MetricsServerOptions& options);
  void Serve();
  // The reply to a request head.
  std::string Respond(absl::string_view head);
  std::string Render();

  // A small HTTP/1.0 server of our own rather than prometheus-cpp's civetweb
  // Exposer: civetweb's mg_start fails in any process that also loads
  // libcublas (found with a probe binary: cudart, cuDNN and NCCL are fine,
  // cuBLAS is not), and every trainer links cuBLAS. One thread serves every
  // connection at once (non-blocking sockets, poll), each with a deadline,
  // so a client that sends or reads slowly delays no other.
  int listen_fd_;
  int port_;
  const MetricsServerOptions options_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<prometheus::Collectable>> exposed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace metrics
}  // namespace dtrain

#endif  // DTRAIN_LIBS_METRICS_METRICS_H_
