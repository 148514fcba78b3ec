// TrainerMetrics as Prometheus renders it: the names and labels dashboards
// query, and one job's series at a time.
#include "services/trainer/trainer_metrics.h"

#include <prometheus/text_serializer.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace trainer {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Render(const TrainerMetrics& m) {
  return prometheus::TextSerializer().Serialize(m.registry()->Collect());
}

// The value of the series named `series` (name and labels) in `text`; NaN
// when it is missing.
double Value(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + at + key.size(), nullptr);
}

TEST(TrainerMetricsTest, OneJobsSeriesWithTheirLabels) {
  TrainerMetrics m;
  EXPECT_THAT(Render(m), HasSubstr("\ndtrain_trainer_busy 0\n"));

  m.OnJobStart("job-1", 0, {Device::Cpu(0)});
  std::string text = Render(m);
  EXPECT_THAT(text, HasSubstr("\ndtrain_trainer_busy 1\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_job_test_accuracy{job_id=\"job-1\",rank=\"0\"} -1\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_trainer_steps_total{job_id=\"job-1\",rank=\"0\"} 0\n"));

  train::JobProgress p;
  p.loss = 2.5;
  p.samples_per_second = 640;
  p.achieved_flops = 2.5e9;
  p.mfu = 0.375;
  p.data_corrupt_skipped = 7;
  train::StepTimes t;
  t.compute = 0.25;
  t.communication = 0.125;
  t.data_wait = 0.5;
  // 10 ms data wait, 40 ms forward_backward, 20 ms comm_wait, 5 ms optimizer.
  const int64_t ms = 1000000;
  const int64_t edges[] = {100 * ms, 110 * ms, 150 * ms, 170 * ms, 175 * ms};
  for (int i = 0; i < train::kNumStepPhases; ++i) t.phases.phase[i] = {edges[i], edges[i + 1]};
  t.phases.step = {edges[0], edges[4]};
  t.samples = 128;
  t.data_queue_depth = 3;
  t.data_decode_rate = 1250.5;
  m.OnStep(p, t);
  m.OnStep(p, t);
  text = Render(m);
  EXPECT_THAT(text, HasSubstr("dtrain_trainer_steps_total{job_id=\"job-1\",rank=\"0\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("dtrain_trainer_step_seconds_count{job_id=\"job-1\",phase=\"compute\","
                        "rank=\"0\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_trainer_step_seconds_sum{job_id=\"job-1\",phase=\"compute\","
                              "rank=\"0\"} 0.5\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_trainer_step_seconds_sum{job_id=\"job-1\","
                              "phase=\"communication\",rank=\"0\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_trainer_step_seconds_sum{job_id=\"job-1\","
                              "phase=\"data_wait\",rank=\"0\"} 1\n"));
  for (const auto& [phase, sum] :
       std::vector<std::pair<std::string, double>>{{"data_wait", 0.02},
                                                   {"forward_backward", 0.08},
                                                   {"comm_wait", 0.04},
                                                   {"optimizer", 0.01}}) {
    const std::string labels = "{job_id=\"job-1\",phase=\"" + phase + "\",rank=\"0\"}";
    EXPECT_EQ(Value(text, "dtrain_trainer_step_phase_seconds_count" + labels), 2) << phase;
    EXPECT_NEAR(Value(text, "dtrain_trainer_step_phase_seconds_sum" + labels), sum, 1e-9) << phase;
  }
  EXPECT_EQ(Value(text, "dtrain_trainer_samples_total{job_id=\"job-1\",rank=\"0\"}"), 256);
  // 256 samples in 2 x 75 ms.
  EXPECT_NEAR(Value(text, "dtrain_trainer_samples_per_second{job_id=\"job-1\",rank=\"0\"}"),
              256 / 0.15, 1e-6);
  EXPECT_THAT(text, HasSubstr("dtrain_job_loss{job_id=\"job-1\",rank=\"0\"} 2.5\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_job_samples_per_second{job_id=\"job-1\",rank=\"0\"} 640\n"));
  EXPECT_THAT(text,
              HasSubstr("dtrain_job_achieved_flops{job_id=\"job-1\",rank=\"0\"} 2500000000\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_job_mfu{job_id=\"job-1\",rank=\"0\"} 0.375\n"));
  EXPECT_EQ(Value(text, "dtrain_trainer_data_queue_depth{job_id=\"job-1\",rank=\"0\"}"), 3);
  EXPECT_EQ(Value(text, "dtrain_trainer_data_decode_rate{job_id=\"job-1\",rank=\"0\"}"), 1250.5);
  EXPECT_EQ(Value(text, "dtrain_trainer_data_corrupt_skipped{job_id=\"job-1\",rank=\"0\"}"), 7);
  // The first step samples the job's devices' allocators.
  EXPECT_THAT(text,
              HasSubstr("dtrain_trainer_device_memory_bytes{device=\"cpu\",state=\"in_use\"}"));
  EXPECT_THAT(text, HasSubstr("dtrain_trainer_device_memory_bytes{device=\"cpu\",state=\"peak\"}"));
  EXPECT_THAT(text,
              HasSubstr("dtrain_trainer_device_memory_bytes{device=\"cpu\",state=\"cached\"}"));

  p.epoch = 1;
  p.loss = 1.75;
  p.test_accuracy = 0.625;
  m.OnEpoch(p);
  text = Render(m);
  EXPECT_THAT(text, HasSubstr("dtrain_job_epoch{job_id=\"job-1\",rank=\"0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_job_loss{job_id=\"job-1\",rank=\"0\"} 1.75\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_job_test_accuracy{job_id=\"job-1\",rank=\"0\"} 0.625\n"));

  // The job's series stay after it ends, until the next job starts.
  m.OnJobEnd("job-1", scheduler::v1::SUCCEEDED);
  text = Render(m);
  EXPECT_THAT(text, HasSubstr("\ndtrain_trainer_busy 0\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_job_epoch{job_id=\"job-1\",rank=\"0\"} 1\n"));

  m.OnJobStart("job-2", 1, {Device::Cpu(0)});
  text = Render(m);
  EXPECT_THAT(text, Not(HasSubstr("job-1")));
  EXPECT_THAT(text, HasSubstr("dtrain_job_epoch{job_id=\"job-2\",rank=\"1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("\ndtrain_trainer_busy 1\n"));
}

}  // namespace
}  // namespace trainer
}  // namespace dtrain
