#include "libs/train/step_trace.h"

#include <gtest/gtest.h>

#include <vector>

namespace dtrain {
namespace train {
namespace {

TEST(StepTraceTest, PhasesOnTheirTracksEmptyOnesSkipped) {
  StepPhases ph;
  ph.step = {1000000, 9000000};
  ph.phase[0] = {1000000, 2000000};  // data wait
  ph.phase[1] = {2000000, 6000000};  // forward+backward
  ph.phase[2] = {6000000, 6000000};  // no comm wait: skipped
  ph.phase[3] = {6000000, 9000000};  // optimizer
  ph.bucket_reductions = {{3000000, 4000000}, {5500000, 5900000}};
  trace::Recorder r;
  RecordStepSpans(&r, ph, 42, "allreduce");
  RecordStepSpans(nullptr, ph, 42, "allreduce");
  std::vector<trace::Span> got = r.Snapshot();
  ASSERT_EQ(got.size(), 6u);
  struct Want {
    const char* name;
    const char* track;
    int64_t start_us, dur_us;
  };
  const Want want[] = {{"step", "step", 1000, 8000},
                       {"data wait", "step", 1000, 1000},
                       {"forward+backward", "compute", 2000, 4000},
                       {"optimizer", "compute", 6000, 3000},
                       {"allreduce bucket 0", "communication", 3000, 1000},
                       {"allreduce bucket 1", "communication", 5500, 400}};
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].track, want[i].track);
    EXPECT_EQ(got[i].start_us, want[i].start_us);
    EXPECT_EQ(got[i].duration_us, want[i].dur_us);
    EXPECT_EQ(got[i].step, 42);
  }
}

}  // namespace
}  // namespace train
}  // namespace dtrain
