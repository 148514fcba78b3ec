#include "libs/scheduler/straggler.h"

#include <algorithm>
#include <functional>

namespace dtrain {
namespace scheduler {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

}  // namespace

StragglerDetector::StragglerDetector(int world_size, StragglerOptions options)
    : options_(options), ranks_(std::max(0, world_size)) {}

std::optional<StragglerChange> StragglerDetector::Observe(int rank,
                                                          const v1::StepTimeSummary& summary) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return std::nullopt;
  Rank& me = ranks_[rank];
  me.summary = summary;
  if (summary.steps() < options_.min_steps) return std::nullopt;
  // The other ranks' medians of a quantity.
  auto others = [&](const std::function<double(const v1::StepTimeSummary&)>& f) {
    std::vector<double> v;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (static_cast<int>(r) == rank || ranks_[r].summary.steps() < options_.min_steps) continue;
      v.push_back(f(ranks_[r].summary));
    }
    return v;
  };
  const std::vector<double> busy =
      others([](const v1::StepTimeSummary& s) { return s.busy_seconds(); });
  if (busy.empty()) return std::nullopt;
  const double reference = Median(busy);
  if (reference <= 0) return std::nullopt;
  me.ratio = summary.busy_seconds() / reference;
  const bool slow = me.ratio >= options_.ratio &&
                    summary.busy_seconds() - reference >= options_.min_excess_seconds;
  const bool calm = me.ratio < options_.clear_ratio;
  me.slow_reports = slow ? me.slow_reports + 1 : 0;
  me.calm_reports = calm ? me.calm_reports + 1 : 0;
  if (!me.straggler && me.slow_reports >= options_.reports) {
    me.straggler = true;
    StragglerChange c;
    c.rank = rank;
    c.straggler = true;
    c.ratio = me.ratio;
    struct Phase {
      const char* name;
      double (v1::StepTimeSummary::*get)() const;
    };
    const Phase phases[] = {
        {"data_wait", &v1::StepTimeSummary::data_wait_seconds},
        {"forward_backward", &v1::StepTimeSummary::forward_backward_seconds},
        {"optimizer", &v1::StepTimeSummary::optimizer_seconds},
    };
    double worst = -1e300;
    for (const Phase& p : phases) {
      const double excess =
          (summary.*p.get)() -
          Median(others([&](const v1::StepTimeSummary& s) { return (s.*p.get)(); }));
      if (excess > worst) {
        worst = excess;
        c.phase = p.name;
      }
    }
    return c;
  }
  if (me.straggler && me.calm_reports >= options_.reports) {
    me.straggler = false;
    StragglerChange c;
    c.rank = rank;
    c.straggler = false;
    c.ratio = me.ratio;
    return c;
  }
  return std::nullopt;
}

void StragglerDetector::Reset(int rank) {
  if (rank >= 0 && rank < static_cast<int>(ranks_.size())) ranks_[rank] = Rank();
}

bool StragglerDetector::is_straggler(int rank) const {
  return rank >= 0 && rank < static_cast<int>(ranks_.size()) && ranks_[rank].straggler;
}

double StragglerDetector::ratio(int rank) const {
  return rank >= 0 && rank < static_cast<int>(ranks_.size()) ? ranks_[rank].ratio : 0;
}

}  // namespace scheduler
}  // namespace dtrain
