// Test helpers: fetch /metrics over plain HTTP and lint it with promtool.
//
//   DT_ASSIGN_OR_RETURN(std::string text, metrics::Scrape(server->port()));
//   absl::StatusOr<bool> linted = metrics::PromtoolCheck(text);  // false: no promtool
//
// For tests and tools only (testonly target). Thread-compatible.
#ifndef DTRAIN_LIBS_METRICS_SCRAPE_H_
#define DTRAIN_LIBS_METRICS_SCRAPE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

}  // namespace metrics
}  // namespace dtrain

#endif  // DTRAIN_LIBS_METRICS_SCRAPE_H_
