#include "services/trainctl/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace dtrain {
namespace trainctl {

namespace v1 = scheduler::v1;

double FractionDone(const v1::JobStatus& job) {
  if (job.state() == v1::SUCCEEDED) return 1;
  const int epochs = job.spec().epochs();
  if (epochs <= 0) return 0;
  double f = job.epoch();
  if (job.steps_per_epoch() > 0 && job.epoch() < epochs) {
    f += std::min(1.0, static_cast<double>(job.step()) / job.steps_per_epoch());
  }
  return std::clamp(f / epochs, 0.0, 1.0);
}

std::string FormatEta(absl::Duration d) {
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) return "-";
  const int64_t s = absl::ToInt64Seconds(d + absl::Milliseconds(500));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string Bar(double fraction, int width) {
  const int done = static_cast<int>(std::lround(std::clamp(fraction, 0.0, 1.0) * width));
  return std::string(done, '#') + std::string(width - done, '.');
}

std::string ProgressTracker::Update(const v1::JobStatus& job, absl::Time now) {
  const double f = FractionDone(job);
  if (job.state() != v1::RUNNING) {
    eta_ = job.state() == v1::SUCCEEDED ? absl::ZeroDuration() : absl::InfiniteDuration();
  } else if (job.attempts() != attempt_) {
    attempt_ = job.attempts();
    start_fraction_ = f;
    start_ = now;
    eta_ = absl::InfiniteDuration();
  } else if (f > start_fraction_ && now > start_) {
    const double rate = (f - start_fraction_) / absl::ToDoubleSeconds(now - start_);
    eta_ = absl::Seconds((1 - f) / rate);
  }
  const std::string acc =
      job.test_accuracy() >= 0 ? absl::StrFormat("%.4f", job.test_accuracy()) : std::string("-");
  std::string step;
  if (job.steps_per_epoch() > 0 && job.state() == v1::RUNNING) {
    step = absl::StrFormat("  step %d/%d", job.step(), job.steps_per_epoch());
  }
  return absl::StrFormat(
      "[%s] %3.0f%%  epoch %d/%d%s  loss %.4f  test_acc %s  %.0f samples/s  ETA %s", Bar(f, 20),
      100 * f, job.epoch(), job.spec().epochs(), step, job.loss(), acc, job.samples_per_second(),
      FormatEta(eta_));
}

}  // namespace trainctl
}  // namespace dtrain
