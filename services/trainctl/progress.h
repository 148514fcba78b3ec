// The progress line of `trainctl submit --wait` and `trainctl watch`:
//
//   [##########..........]  50%  epoch 3/6  step 117/235  loss 0.4512  test_acc 0.8123
//   12345 samples/s  ETA 1m23s
//
// The fraction done counts completed epochs plus the current epoch's steps;
// the ETA extrapolates the rate at which that fraction grew since the
// current attempt started (a requeued job starts a new estimate).
#ifndef DTRAIN_SERVICES_TRAINCTL_PROGRESS_H_
#define DTRAIN_SERVICES_TRAINCTL_PROGRESS_H_

#include <string>

#include "absl/time/time.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace trainctl {

// In [0, 1]; 1 for a SUCCEEDED job.
double FractionDone(const scheduler::v1::JobStatus& job);

// "1h02m", "4m05s", "9s"; "-" for a negative or infinite duration.
std::string FormatEta(absl::Duration d);

// A `width`-character bar of '#' and '.'.
std::string Bar(double fraction, int width);

class ProgressTracker {
 public:
  // Feeds a status seen at `now`; returns the progress line.
  std::string Update(const scheduler::v1::JobStatus& job, absl::Time now);
  // The current estimate (InfiniteDuration while unknown).
  absl::Duration eta() const { return eta_; }

 private:
  int attempt_ = -1;
  double start_fraction_ = 0;
  absl::Time start_;
  absl::Duration eta_ = absl::InfiniteDuration();
};

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_PROGRESS_H_
