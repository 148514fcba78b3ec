#include "libs/agent/step_window.h"

#include <algorithm>
#include <functional>
#include <vector>

namespace dtrain {
namespace agent {

void StepWindow::Add(const train::StepPhases& phases, int64_t samples) {
  Step s;
  for (int i = 0; i < train::kNumStepPhases; ++i) s.phase[i] = phases.phase[i].seconds();
  s.total = phases.step.seconds();
  s.samples = samples;
  steps_.push_back(s);
  while (static_cast<int>(steps_.size()) > capacity_) steps_.pop_front();
}

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return (lower + upper) / 2;
}

}  // namespace

scheduler::v1::StepTimeSummary StepWindow::Summary() const {
  scheduler::v1::StepTimeSummary out;
  out.set_steps(static_cast<int32_t>(steps_.size()));
  if (steps_.empty()) return out;
  auto median = [this](const std::function<double(const Step&)>& f) {
    std::vector<double> v;
    v.reserve(steps_.size());
    for (const Step& s : steps_) v.push_back(f(s));
    return Median(std::move(v));
  };
  auto phase = [&](train::StepPhase p) {
    return median([p](const Step& s) { return s.phase[static_cast<int>(p)]; });
  };
  out.set_step_seconds(median([](const Step& s) { return s.total; }));
  out.set_data_wait_seconds(phase(train::StepPhase::kDataWait));
  out.set_forward_backward_seconds(phase(train::StepPhase::kForwardBackward));
  out.set_comm_wait_seconds(phase(train::StepPhase::kCommWait));
  out.set_optimizer_seconds(phase(train::StepPhase::kOptimizer));
  out.set_busy_seconds(median([](const Step& s) {
    return std::max(0.0, s.total - s.phase[static_cast<int>(train::StepPhase::kCommWait)]);
  }));
  double seconds = 0;
  int64_t samples = 0;
  for (const Step& s : steps_) {
    seconds += s.total;
    samples += s.samples;
  }
  out.set_samples_per_second(seconds > 0 ? samples / seconds : 0);
  return out;
}

}  // namespace agent
}  // namespace dtrain
