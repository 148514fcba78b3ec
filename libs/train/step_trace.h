// A step's phases (step_phases.h) as timeline spans (libs/trace): the one
// mapping from what a trainer measures to what `trainctl timeline` shows.
//
//   step track           "step" (the whole step), and inside it "data wait"
//                        and "comm wait" (the communication backward did not
//                        hide)
//   compute track        "forward+backward", "optimizer"
//   communication track  "<sync> bucket <b>" (e.g. "allreduce bucket 0"):
//                        each bucket's reduction across trainers; one that
//                        starts before "forward+backward" ends overlapped
//                        backward
//
// Every span carries `step`. Empty phases (zero length) are not recorded.
#ifndef DTRAIN_LIBS_TRAIN_STEP_TRACE_H_
#define DTRAIN_LIBS_TRAIN_STEP_TRACE_H_

#include <cstdint>
#include <string>

#include "libs/trace/trace.h"
#include "libs/train/step_phases.h"

namespace dtrain {
namespace train {

// Records `phases` of step `step` in `recorder` (null: nothing). `sync` names
// the gradient sync of the bucket spans ("allreduce", "kvstore_sync", ...).
void RecordStepSpans(trace::Recorder* recorder, const StepPhases& phases, int64_t step,
                     const std::string& sync);

}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_STEP_TRACE_H_
