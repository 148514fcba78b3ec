#include "libs/train/step_trace.h"

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace train {
namespace {

void Add(trace::Recorder* r, std::string name, const char* track, const PhaseSpan& p, int64_t step,
         bool keep_empty = false) {
  if (p.end_ns <= p.start_ns && !keep_empty) return;
  trace::Span s;
  s.name = std::move(name);
  s.track = track;
  s.start_us = p.start_ns / 1000;
  s.duration_us = p.end_ns > p.start_ns ? p.end_ns / 1000 - s.start_us : 0;
  s.step = step;
  r->Add(std::move(s));
}

}  // namespace

void RecordStepSpans(trace::Recorder* recorder, const StepPhases& phases, int64_t step,
                     const std::string& sync) {
  if (recorder == nullptr) return;
  Add(recorder, "step", trace::kTrackStep, phases.step, step, /*keep_empty=*/true);
  Add(recorder, "data wait", trace::kTrackStep, phases.span(StepPhase::kDataWait), step);
  Add(recorder, "forward+backward", trace::kTrackCompute, phases.span(StepPhase::kForwardBackward),
      step);
  Add(recorder, "comm wait", trace::kTrackStep, phases.span(StepPhase::kCommWait), step);
  Add(recorder, "optimizer", trace::kTrackCompute, phases.span(StepPhase::kOptimizer), step);
  for (size_t b = 0; b < phases.bucket_reductions.size(); ++b) {
    Add(recorder, absl::StrCat(sync, " bucket ", b), trace::kTrackCommunication,
        phases.bucket_reductions[b], step, /*keep_empty=*/true);
  }
}

}  // namespace train
}  // namespace dtrain
