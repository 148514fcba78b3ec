// TrainerMetrics: the trainer daemon's Prometheus metrics, fed by the agent
// (an agent::AgentObserver).
//
//   TrainerMetrics metrics;
//   metrics_server->Expose(metrics.registry());
//   agent::Agent agent(&cluster, options, &metrics);
//
// Series (names and labels are what dashboards and alerts query; keep them):
//   dtrain_trainer_busy                  gauge, 1 while a job runs
//   dtrain_trainer_steps_total           counter {job_id, rank}
//   dtrain_trainer_step_seconds          histogram {job_id, rank, phase}, phase
//                                        compute, communication, data_wait
//                                        (train::StepTimes)
//   dtrain_trainer_step_phase_seconds    histogram {job_id, rank, phase}, phase
//                                        data_wait, forward_backward,
//                                        comm_wait, optimizer: contiguous
//                                        parts of each step
//                                        (libs/train/step_phases.h)
//   dtrain_trainer_samples_total         counter {job_id, rank}: this rank's
//                                        training samples
//   dtrain_trainer_samples_per_second    gauge {job_id, rank}: this rank's
//                                        samples per second over its last
//                                        32 steps
//   dtrain_trainer_data_queue_depth      gauge {job_id, rank}: batches the
//                                        data loader had ready ahead of the
//                                        last step (0: the step waited)
//   dtrain_trainer_data_decode_rate      gauge {job_id, rank}: samples the
//                                        loader read, decoded and
//                                        transformed per thread-second
//   dtrain_trainer_data_corrupt_skipped  gauge {job_id, rank}: corrupt
//                                        images the job's data sets left out
//                                        (skip_corrupt; the test set's on
//                                        rank 0 only)
//   dtrain_trainer_device_memory_bytes   gauge {device, state}: the job's
//     devices' allocators, state in_use / peak / cached; updated at most
//     once a second while a job runs
//   dtrain_job_loss, dtrain_job_test_accuracy (-1 until the first epoch
//   ends), dtrain_job_samples_per_second, dtrain_job_epoch
//                                        gauges {job_id, rank}
// A job's series stay until the next job starts (one job's worth at a time).
//
// Thread-safe.
#ifndef DTRAIN_SERVICES_TRAINER_TRAINER_METRICS_H_
#define DTRAIN_SERVICES_TRAINER_TRAINER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/agent/agent.h"

namespace dtrain {
namespace trainer {

class TrainerMetrics : public agent::AgentObserver {
 public:
  TrainerMetrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // agent::AgentObserver. OnJobStart replaces the previous job's series and
  // marks the trainer busy; OnJobEnd marks it idle.
  void OnJobStart(const std::string& job_id, int rank, const std::vector<Device>& devices) override;
  void OnStep(const train::JobProgress& progress, const train::StepTimes& times) override;
  void OnEpoch(const train::JobProgress& progress) override;
  void OnJobEnd(const std::string& job_id, scheduler::v1::JobState final_state) override;

 private:
  // The series of one job.
  struct Job {
    prometheus::Histogram* compute = nullptr;
    prometheus::Histogram* communication = nullptr;
    prometheus::Histogram* data_wait = nullptr;
    prometheus::Histogram* phases[train::kNumStepPhases] = {};
    prometheus::Counter* steps = nullptr;
    prometheus::Counter* samples = nullptr;
    prometheus::Gauge* rank_samples_per_second = nullptr;
    // The last steps' samples and seconds (rank_samples_per_second).
    std::deque<std::pair<int64_t, double>> recent;
    int64_t recent_samples = 0;
    double recent_seconds = 0;
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* test_accuracy = nullptr;
    prometheus::Gauge* samples_per_second = nullptr;
    prometheus::Gauge* achieved_flops = nullptr;
    prometheus::Gauge* mfu = nullptr;
    prometheus::Gauge* epoch = nullptr;
    prometheus::Gauge* data_queue_depth = nullptr;
    prometheus::Gauge* data_decode_rate = nullptr;
    prometheus::Gauge* data_corrupt_skipped = nullptr;
  };

  void RemoveCurrent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Updates the memory gauges of the job's devices from their allocators.
  void DeviceMemory() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Histogram>& step_phase_seconds_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Gauge>& rank_samples_per_second_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& test_accuracy_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Gauge>& achieved_flops_;
  prometheus::Family<prometheus::Gauge>& mfu_;
  prometheus::Family<prometheus::Gauge>& epoch_;
  prometheus::Family<prometheus::Gauge>& data_queue_depth_;
  prometheus::Family<prometheus::Gauge>& data_decode_rate_;
  prometheus::Family<prometheus::Gauge>& data_corrupt_skipped_;
  prometheus::Family<prometheus::Gauge>& device_memory_;
  prometheus::Gauge& busy_;

  absl::Mutex mu_;
  std::unique_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
  std::vector<Device> devices_ ABSL_GUARDED_BY(mu_);
  absl::Time last_memory_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace trainer
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINER_TRAINER_METRICS_H_
