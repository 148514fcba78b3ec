#include "services/trainer/trainer_metrics.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/metrics/metrics.h"
#include "libs/tensor/allocator.h"

namespace dtrain {
namespace trainer {

TrainerMetrics::TrainerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      step_seconds_(metrics::AddHistogram(
          *registry_, "dtrain_trainer_step_seconds",
          "Time of each training step by phase: compute, communication (allreduce work), "
          "data_wait (waiting for the data loader).")),
      step_phase_seconds_(metrics::AddHistogram(
          *registry_, "dtrain_trainer_step_phase_seconds",
          "Each training step cut into contiguous phases: data_wait (the data loader), "
          "forward_backward (this rank's compute), comm_wait (communication backward did not "
          "hide, or waiting for slower ranks), optimizer (the update).")),
      steps_(metrics::AddCounter(*registry_, "dtrain_trainer_steps_total",
                                 "Training steps this trainer finished.")),
      samples_(metrics::AddCounter(*registry_, "dtrain_trainer_samples_total",
                                   "Training samples this rank processed.")),
      rank_samples_per_second_(
          metrics::AddGauge(*registry_, "dtrain_trainer_samples_per_second",
                            "This rank's training samples per second over its last 32 steps.")),
      loss_(metrics::AddGauge(*registry_, "dtrain_job_loss",
                              "Mean training loss of the current epoch so far.")),
      test_accuracy_(
          metrics::AddGauge(*registry_, "dtrain_job_test_accuracy",
                            "Test accuracy after the last epoch (0..1; -1 before the first).")),
      samples_per_second_(metrics::AddGauge(*registry_, "dtrain_job_samples_per_second",
                                            "Training throughput of the whole job.")),
      achieved_flops_(metrics::AddGauge(
          *registry_, "dtrain_job_achieved_flops",
          "Model FLOPs per second of the whole job (a training step's matrix-product FLOPs per "
          "sample, counted from the model's graph, times samples per second).")),
      mfu_(metrics::AddGauge(*registry_, "dtrain_job_mfu",
                             "Model FLOPs utilization: dtrain_job_achieved_flops over the ranks' "
                             "measured GEMM peak (0..1; 0 when unknown).")),
      epoch_(metrics::AddGauge(*registry_, "dtrain_job_epoch", "Epochs done.")),
      data_queue_depth_(metrics::AddGauge(
          *registry_, "dtrain_trainer_data_queue_depth",
          "Batches the data loader had ready ahead of the last step (0: the step waited).")),
      data_decode_rate_(metrics::AddGauge(
          *registry_, "dtrain_trainer_data_decode_rate",
          "Samples the data loader read, decoded and transformed per thread-second.")),
      data_corrupt_skipped_(
          metrics::AddGauge(*registry_, "dtrain_trainer_data_corrupt_skipped",
                            "Corrupt images the job's data sets left out (skip_corrupt: true).")),
      device_memory_(metrics::AddGauge(
          *registry_, "dtrain_trainer_device_memory_bytes",
          "Tensor memory of each device's allocator: state in_use, peak (since the job "
          "started) or cached (freed blocks kept for reuse).")),
      busy_(metrics::AddGauge(*registry_, "dtrain_trainer_busy",
                              "1 while the trainer runs a job, else 0.")
                .Add({})) {}

void TrainerMetrics::OnJobStart(const std::string& job_id, int rank,
                                const std::vector<Device>& devices) {
  absl::MutexLock lock(&mu_);
  RemoveCurrent();
  const std::map<std::string, std::string> l = {{"job_id", job_id}, {"rank", absl::StrCat(rank)}};
  auto phase = [&](const char* p) {
    std::map<std::string, std::string> m = l;
    m["phase"] = p;
    return &step_seconds_.Add(m, metrics::LatencyBuckets());
  };
  job_ = std::make_unique<Job>();
  job_->compute = phase("compute");
  job_->communication = phase("communication");
  job_->data_wait = phase("data_wait");
  for (int i = 0; i < train::kNumStepPhases; ++i) {
    std::map<std::string, std::string> m = l;
    m["phase"] = train::StepPhaseName(static_cast<train::StepPhase>(i));
    job_->phases[i] = &step_phase_seconds_.Add(m, metrics::LatencyBuckets());
  }
  job_->samples = &samples_.Add(l);
  job_->rank_samples_per_second = &rank_samples_per_second_.Add(l);
  job_->steps = &steps_.Add(l);
  job_->loss = &loss_.Add(l);
  job_->test_accuracy = &test_accuracy_.Add(l);
  job_->test_accuracy->Set(-1);
  job_->samples_per_second = &samples_per_second_.Add(l);
  job_->achieved_flops = &achieved_flops_.Add(l);
  job_->mfu = &mfu_.Add(l);
  job_->epoch = &epoch_.Add(l);
  job_->data_queue_depth = &data_queue_depth_.Add(l);
  job_->data_decode_rate = &data_decode_rate_.Add(l);
  job_->data_corrupt_skipped = &data_corrupt_skipped_.Add(l);
  devices_ = devices;
  last_memory_ = absl::InfinitePast();
  busy_.Set(1);
}

void TrainerMetrics::OnStep(const train::JobProgress& p, const train::StepTimes& t) {
  absl::MutexLock lock(&mu_);
  if (job_ == nullptr) return;
  job_->compute->Observe(t.compute);
  job_->communication->Observe(t.communication);
  job_->data_wait->Observe(t.data_wait);
  for (int i = 0; i < train::kNumStepPhases; ++i)
    job_->phases[i]->Observe(t.phases.phase[i].seconds());
  job_->steps->Increment();
  job_->samples->Increment(static_cast<double>(t.samples));
  const double step_seconds = t.phases.step.seconds();
  job_->recent.emplace_back(t.samples, step_seconds);
  job_->recent_samples += t.samples;
  job_->recent_seconds += step_seconds;
  if (job_->recent.size() > 32) {
    job_->recent_samples -= job_->recent.front().first;
    job_->recent_seconds -= job_->recent.front().second;
    job_->recent.pop_front();
  }
  if (job_->recent_seconds > 0) {
    job_->rank_samples_per_second->Set(job_->recent_samples / job_->recent_seconds);
  }
  job_->loss->Set(p.loss);
  job_->samples_per_second->Set(p.samples_per_second);
  job_->achieved_flops->Set(p.achieved_flops);
  job_->mfu->Set(p.mfu);
  job_->data_queue_depth->Set(static_cast<double>(t.data_queue_depth));
  job_->data_decode_rate->Set(t.data_decode_rate);
  job_->data_corrupt_skipped->Set(static_cast<double>(p.data_corrupt_skipped));
  const absl::Time now = absl::Now();
  if (now - last_memory_ >= absl::Seconds(1)) {
    last_memory_ = now;
    DeviceMemory();
  }
}

void TrainerMetrics::OnEpoch(const train::JobProgress& p) {
  absl::MutexLock lock(&mu_);
  if (job_ == nullptr) return;
  job_->epoch->Set(p.epoch);
  job_->loss->Set(p.loss);
  if (p.test_accuracy >= 0) job_->test_accuracy->Set(p.test_accuracy);
}

void TrainerMetrics::OnJobEnd(const std::string& job_id, scheduler::v1::JobState final_state) {
  busy_.Set(0);
}

void TrainerMetrics::DeviceMemory() {
  for (const Device& d : devices_) {
    absl::StatusOr<Allocator*> a = GetAllocator(d);
    if (!a.ok()) continue;
    const AllocatorStats st = (*a)->stats();
    const std::string name = d.ToString();
    device_memory_.Add({{"device", name}, {"state", "in_use"}}).Set(st.bytes_in_use);
    device_memory_.Add({{"device", name}, {"state", "peak"}}).Set(st.peak_bytes_in_use);
    device_memory_.Add({{"device", name}, {"state", "cached"}}).Set(st.bytes_cached);
  }
}

void TrainerMetrics::RemoveCurrent() {
  if (job_ == nullptr) return;
  step_seconds_.Remove(job_->compute);
  step_seconds_.Remove(job_->communication);
  step_seconds_.Remove(job_->data_wait);
  for (prometheus::Histogram* h : job_->phases) step_phase_seconds_.Remove(h);
  samples_.Remove(job_->samples);
  rank_samples_per_second_.Remove(job_->rank_samples_per_second);
  steps_.Remove(job_->steps);
  loss_.Remove(job_->loss);
  test_accuracy_.Remove(job_->test_accuracy);
  samples_per_second_.Remove(job_->samples_per_second);
  achieved_flops_.Remove(job_->achieved_flops);
  mfu_.Remove(job_->mfu);
  epoch_.Remove(job_->epoch);
  data_queue_depth_.Remove(job_->data_queue_depth);
  data_decode_rate_.Remove(job_->data_decode_rate);
  data_corrupt_skipped_.Remove(job_->data_corrupt_skipped);
  job_.reset();
}

}  // namespace trainer
}  // namespace dtrain
