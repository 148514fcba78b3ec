// StragglerDetector: which ranks of a running job are persistently slower
// than the others, from the step-time summaries every rank reports
// (ProgressReport.step_times, libs/agent/step_window.h).
//
// A rank is compared on its busy time (its median step minus its median
// comm_wait: in a synchronous job every rank's step lasts as long as the
// slowest's, the others wait for it in comm_wait) against the median of the
// other ranks' (with 2 ranks: the other one). It becomes a straggler once
// that ratio is at least `ratio` (and the gap at least min_excess_seconds)
// in `reports` of its reports in a row, and stops being one once it is
// below `clear_ratio` in as many reports in a row (hysteresis: a rank that
// hovers near the threshold does not flap). Only summaries of at least
// min_steps steps count. The phase named is the one (data_wait,
// forward_backward, optimizer) whose median exceeds the other ranks' most.
//
//   StragglerDetector d(2);
//   if (std::optional<StragglerChange> c = d.Observe(rank, report.step_times())) ...
//
// Not thread-safe (the scheduler holds its lock).
#ifndef DTRAIN_LIBS_SCHEDULER_STRAGGLER_H_
#define DTRAIN_LIBS_SCHEDULER_STRAGGLER_H_

#include <optional>
#include <string>
#include <vector>

#include "protos/scheduler.pb.h"

namespace dtrain {
namespace scheduler {

struct StragglerOptions {
  double ratio = 1.3;
  double clear_ratio = 1.15;
  // 5 reports (about 5 s at the agents' report interval): on a shared
  // 2-core machine a calm rank's 32-step median was seen at 1.34x for a
  // report.
  int reports = 5;
  int min_steps = 8;
  // A ratio over a gap smaller than this is noise (tiny steps).
  double min_excess_seconds = 0.002;
};

// A rank became a straggler (straggler true) or stopped being one.
struct StragglerChange {
  int rank = 0;
  bool straggler = false;
  double ratio = 0;   // busy time / the other ranks' median
  std::string phase;  // straggler: the phase that grew most
};

class StragglerDetector {
 public:
  explicit StragglerDetector(int world_size, StragglerOptions options = {});

  // Records rank `rank`'s latest summary and evaluates that rank. Returns
  // the change of its verdict, if any. Ranks outside 0..world_size-1 are
  // ignored.
  std::optional<StragglerChange> Observe(int rank, const v1::StepTimeSummary& summary);

  // Forgets rank `rank` (its trainer was replaced): no verdict, no summary.
  void Reset(int rank);

  bool is_straggler(int rank) const;
  // The latest ratio of `rank` (0 before it was evaluated).
  double ratio(int rank) const;

 private:
  struct Rank {
    v1::StepTimeSummary summary;
    bool straggler = false;
    int slow_reports = 0;  // in a row at or above ratio
    int calm_reports = 0;  // in a row below clear_ratio
    double ratio = 0;
  };
  const StragglerOptions options_;
  std::vector<Rank> ranks_;
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_STRAGGLER_H_
