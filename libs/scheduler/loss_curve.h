// A job's loss curve (JobStatus.step_losses): rank 0's per-step losses as
// its progress reports bring them (ProgressReport.step_losses), kept bounded
// so a long job's status stays small: the first kFirstSteps steps (how
// training started: what two runs of the same model are compared on) and
// the newest kRecentSteps (where it is now).
//
//   MergeStepLosses(report.step_losses(), &status);
//
// Steps are the job's (0-based over all epochs), ascending. A report whose
// first step is at or before a step already kept (a job resumed from a
// checkpoint, or recovered in place, trains those steps again) drops the
// kept steps from there on: the curve shows the steps whose updates count.
#ifndef DTRAIN_LIBS_SCHEDULER_LOSS_CURVE_H_
#define DTRAIN_LIBS_SCHEDULER_LOSS_CURVE_H_

#include <cstdint>

#include "google/protobuf/repeated_field.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace scheduler {

inline constexpr int64_t kFirstSteps = 100;
inline constexpr int kRecentSteps = 100;

// Adds `losses` (ascending by step; anything else is sorted) to
// `status->step_losses`, then trims to the first kFirstSteps steps and the
// newest kRecentSteps others.
void MergeStepLosses(const google::protobuf::RepeatedPtrField<v1::StepLoss>& losses,
                     v1::JobStatus* status);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_LOSS_CURVE_H_
