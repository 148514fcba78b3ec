// Test helpers: fetch /metrics over plain HTTP and lint it with promtool.
//
//   DT_ASSIGN_OR_RETURN(std::string text, metrics::Scrape(server->port()));
//   absl::StatusOr<bool> linted = metrics::PromtoolCheck(text);  // false: no promtool
//
// For tests and tools only (testonly target). Thread-compatible.
#ifndef DTRAIN_LIBS_METRICS_SCRAPE_H_
#define DTRAIN_LIBS_METRICS_SCRAPE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace dtrain {
namespace metrics {

// GET http://127.0.0.1:<port><path> with HTTP/1.0 and returns the body.
// Errors: kUnavailable (connect/read), kInternal for a non-200 status line.
absl::StatusOr<std::string> Scrape(int port, absl::string_view path = "/metrics");

// Runs `promtool check metrics` on `text`. Returns true when promtool
// accepted it, false when promtool is not installed (the check is skipped),
// and kFailedPrecondition with promtool's complaints when it rejected it.
absl::StatusOr<bool> PromtoolCheck(const std::string& text);

// The value of the sample whose line starts with `series` (a name with its
// labels exactly as exposed, e.g. `dtrain_x_total{code="OK"}`), or kNotFound.
absl::StatusOr<double> SampleValue(absl::string_view text, absl::string_view series);

// Slow clients for exhaustion tests: keeps `n` connections to
// 127.0.0.1:<port> open until destroyed. Every `interval`, odd-numbered
// clients send one more byte of a request head that never ends ("GET
// /metrics HTTP/1.0\r\nX-Slow: xxxx..."); even-numbered ones send nothing.
// A connection the server closes is opened again.
class SlowClients {
 public:
  SlowClients(int port, int n, absl::Duration interval);
  ~SlowClients();
  SlowClients(const SlowClients&) = delete;
  SlowClients& operator=(const SlowClients&) = delete;

  // Connections opened so far, and those the server closed.
  int64_t opened() const { return opened_.load(); }
  int64_t closed_by_server() const { return closed_by_server_.load(); }

 private:
  int Connect();
  void Run(absl::Duration interval);

  const int port_;
  std::vector<int> fds_;  // owned by the thread until it ends
  std::atomic<int64_t> opened_{0};
  std::atomic<int64_t> closed_by_server_{0};
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace metrics
}  // namespace dtrain

#endif  // DTRAIN_LIBS_METRICS_SCRAPE_H_
