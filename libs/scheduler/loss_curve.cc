#include "libs/scheduler/loss_curve.h"

#include <algorithm>
#include <vector>

namespace dtrain {
namespace scheduler {

void MergeStepLosses(const google::protobuf::RepeatedPtrField<v1::StepLoss>& losses,
                     v1::JobStatus* status) {
  if (losses.empty()) return;
  std::vector<v1::StepLoss> incoming(losses.begin(), losses.end());
  std::stable_sort(
      incoming.begin(), incoming.end(),
      [](const v1::StepLoss& a, const v1::StepLoss& b) { return a.step() < b.step(); });
  const int64_t from = incoming.front().step();
  std::vector<v1::StepLoss> kept;
  kept.reserve(status->step_losses_size() + incoming.size());
  // Steps trained again replace the kept ones from the first of them on.
  for (const v1::StepLoss& s : status->step_losses()) {
    if (s.step() < from) kept.push_back(s);
  }
  for (v1::StepLoss& s : incoming) {
    if (s.step() < 0) continue;
    if (!kept.empty() && kept.back().step() == s.step()) {
      kept.back() = std::move(s);  // a duplicate in one report: the later wins
    } else {
      kept.push_back(std::move(s));
    }
  }
  // The first kFirstSteps steps, and the newest kRecentSteps of the others.
  const auto first_end = std::find_if(
      kept.begin(), kept.end(), [](const v1::StepLoss& s) { return s.step() >= kFirstSteps; });
  const int64_t later = kept.end() - first_end;
  if (later > kRecentSteps) kept.erase(first_end, first_end + (later - kRecentSteps));
  status->clear_step_losses();
  for (v1::StepLoss& s : kept) *status->add_step_losses() = std::move(s);
}

}  // namespace scheduler
}  // namespace dtrain
