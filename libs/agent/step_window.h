// StepWindow: a rank's recent step times, summarized for the scheduler
// (ProgressReport.step_times): the median of each phase over the last
// `capacity` steps (libs/train/step_phases.h), of the busy time (the step
// minus its comm_wait: the rank's own work) and the rank's samples per
// second. Medians, so that one slow step (a checkpoint, an evaluation on
// rank 0, a page fault) does not make a rank look slow.
//
//   StepWindow w(32);
//   w.Add(times.phases, samples_in_step);
//   v1::StepTimeSummary s = w.Summary();
//
// Not thread-safe (the job's thread owns it).
#ifndef DTRAIN_LIBS_AGENT_STEP_WINDOW_H_
#define DTRAIN_LIBS_AGENT_STEP_WINDOW_H_

#include <cstdint>
#include <deque>

#include "libs/train/step_phases.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace agent {

class StepWindow {
 public:
  // REQUIRES: capacity >= 1.
  explicit StepWindow(int capacity) : capacity_(capacity) {}

  // One completed step and the samples this rank trained in it.
  void Add(const train::StepPhases& phases, int64_t samples);

  // Medians over the window; steps 0 when it is empty.
  scheduler::v1::StepTimeSummary Summary() const;

  int size() const { return static_cast<int>(steps_.size()); }

 private:
  struct Step {
    double phase[train::kNumStepPhases];
    double total;
    int64_t samples;
  };
  const int capacity_;
  std::deque<Step> steps_;
};

}  // namespace agent
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AGENT_STEP_WINDOW_H_
