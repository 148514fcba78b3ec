// The phases of one training step, as a trainer measures them: the one
// definition metrics (dtrain_trainer_step_phase_seconds), straggler reports
// (ProgressReport.step_times) and timelines share.
//
// A step of RunJob (libs/train/job.h) is cut into four contiguous spans on
// the wall clock, each starting where the previous one ended:
//
//   data_wait         waiting for the data loader's next batch
//   forward_backward  from the batch in hand until the last replica's
//                     backward pass finished (the rank's own compute;
//                     bucket reductions run meanwhile on the
//                     communication queue)
//   comm_wait         from the end of backward until the last gradient
//                     bucket was reduced across trainers: the communication
//                     backward did not hide (0 when it all overlapped). In
//                     a synchronous job a fast rank waits here for a slow
//                     one, so a rank's busy time is its step minus comm_wait.
//   optimizer         from then until the step returned (every replica's
//                     SGD update, or the copy of the kvstore's weights)
//
// so step.seconds() == the sum of the four. A hybridized step (one compiled
// plan) counts entirely as forward_backward. Every bucket's reduction (the
// strategy's work after the bucket's gradients were ready on every replica)
// is also recorded, for timelines: a reduction that starts before
// phase[kForwardBackward] ends overlapped backward.
//
//   void OnStep(const JobProgress& p, const StepTimes& t) override {
//     const StepPhases& ph = t.phases;
//     histogram(StepPhaseName(StepPhase::kCommWait)).Observe(ph.seconds(StepPhase::kCommWait));
//   }
//
// Times are absl::GetCurrentTimeNanos() readings (Unix nanoseconds of this
// machine's clock), so spans of ranks on several machines can be put on one
// axis once their clock offsets are known.
#ifndef DTRAIN_LIBS_TRAIN_STEP_PHASES_H_
#define DTRAIN_LIBS_TRAIN_STEP_PHASES_H_

#include <cstdint>
#include <vector>

namespace dtrain {
namespace train {

enum class StepPhase : int {
  kDataWait = 0,
  kForwardBackward = 1,
  kCommWait = 2,
  kOptimizer = 3,
};
inline constexpr int kNumStepPhases = 4;

// The phase's label in metrics and reports: "data_wait", "forward_backward",
// "comm_wait", "optimizer".
inline const char* StepPhaseName(StepPhase p) {
  switch (p) {
    case StepPhase::kDataWait:
      return "data_wait";
    case StepPhase::kForwardBackward:
      return "forward_backward";
    case StepPhase::kCommWait:
      return "comm_wait";
    case StepPhase::kOptimizer:
      return "optimizer";
  }
  return "unknown";
}

// [start_ns, end_ns) on the wall clock (absl::GetCurrentTimeNanos()).
struct PhaseSpan {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  double seconds() const { return end_ns > start_ns ? (end_ns - start_ns) * 1e-9 : 0.0; }
};

struct StepPhases {
  // The whole step, data wait included: phase[0].start_ns .. phase[3].end_ns.
  PhaseSpan step;
  // Indexed by StepPhase; contiguous (see the file comment).
  PhaseSpan phase[kNumStepPhases];
  // Bucket b's reduction across trainers (summing over the replicas, the
  // strategy's exchange, writing back), once its gradients were ready;
  // empty for a hybridized step. Buckets are numbered as the reducer's
  // (reverse registration order: bucket 0 is ready first).
  std::vector<PhaseSpan> bucket_reductions;

  double seconds(StepPhase p) const { return phase[static_cast<int>(p)].seconds(); }
  const PhaseSpan& span(StepPhase p) const { return phase[static_cast<int>(p)]; }
};

}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_STEP_PHASES_H_
