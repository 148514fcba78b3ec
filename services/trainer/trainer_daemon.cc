// trainer: the trainer daemon. Registers with the scheduler, heartbeats,
// and trains the jobs the scheduler assigns to it.
//
//   trainer --scheduler=scheduler:7000 --checkpoint_dir=/shared/checkpoints
//
// One job at a time, on a worker thread. Progress goes to the scheduler with
// ReportProgress (every step, at most once a second, and after every epoch
// with its accuracies).
//
// The training itself is libs/train's RunJob (job.h): this rank's shard of
// the training set (global_batch_size / world_size samples per step), the
// data-parallel step over devices_per_trainer devices (cpu:0..cpu:k-1 with
// threads/k kernel threads each, or the trainer's CUDA devices), or a
// hybridized step; rank 0 evaluates test accuracy after every epoch and
// every checkpoint_interval_epochs saves replica 0's parameters, buffers and
// momentum to <checkpoint_dir>/<job>.ckpt (atomically replaced; kept after
// the job). The epoch loss and training accuracy are averaged over the
// ranks (rank 0's share in ASYNCHRONOUS / BOUNDED_DELAY kvstore jobs; the
// running loss between epochs is rank 0's). This file adds what needs the
// network: the trainers of a multi-trainer job meet through the scheduler's
// rendezvous store (SchedulerStore, keyed by job and attempt) and allreduce
// gradients over TCP (--collective_host is the address peers connect to),
// or, in KVSTORE mode, push and pull every gradient bucket through the
// kvstore shards given by --kvstore; rank 0 reports progress and each
// checkpoint to the scheduler. Cancellation takes effect at the next step;
// a rank that stops closes its communicator, which makes its peers' next
// allreduce fail at once, so all ranks stop within about a step; a rank
// whose peer failed reports a retryable failure and the scheduler requeues
// the job.
//
// Resume. When the scheduler places a job again after a lost trainer, the
// assignment names the newest checkpoint: every rank loads it (so
// --checkpoint_dir must be a directory all trainers share: a shared volume
// on Kubernetes, <cluster>/checkpoints for `trainctl cluster up`) and
// training continues with the epoch after the one it holds, with the same
// data order as an undisturbed run. A checkpoint that cannot be read fails
// the job with the reason. What restarts: in ASYNCHRONOUS / BOUNDED_DELAY
// kvstore jobs the shards' momentum (the weights come from the checkpoint);
// in hybridized jobs the compiled plan's momentum buffers.
//
// sync_batch_norm: batch norm normalizes over the global batch of every
// device and trainer (DataParallelOptions::sync_batch_norm).
//
// CUDA jobs use the first devices_per_trainer CUDA devices the trainer
// offers (--devices; by default every CUDA device found). Between trainers
// with one GPU each the gradients are allreduced by NCCL in device memory
// (the NCCL unique id travels through the scheduler's rendezvous store);
// otherwise CUDA gradients are staged through host memory and allreduced
// over TCP (--cuda_collective=tcp forces that). NOT YET RUN ON A GPU: the
// CUDA paths are built and their tests (tools/gpu-check) skip without one.
//
// Each epoch reports the training accuracy (predictions made during the
// epoch's steps, before each update) and the epoch's wall time.
//
// When the scheduler forgets the trainer (restart, or it was declared lost)
// the daemon registers again. SIGTERM or SIGINT: stops the job at the next
// step, reports it FAILED ("trainer shutting down") and exits 0. Exit status
// 2 for bad flags.
//
// Observability. --metrics_listen (e.g. :9402) serves Prometheus /metrics:
//   dtrain_trainer_busy                  gauge, 1 while a job runs
//   dtrain_trainer_steps_total           counter {job_id, rank}
//   dtrain_trainer_step_seconds          histogram {job_id, rank, phase}, phase:
//     data_wait      time Next() waited for the loader's batch
//     communication  the comm queue's reduction work in the step
//                    (DataParallelTrainer::last_comm_work_seconds(); its wait
//                    for buckets is idle time and not counted). Reductions
//                    overlap backward, so this is an upper bound of the time
//                    communication cost the step.
//     compute        the rest of the step's wall time (never negative).
//     (train::StepTimes; a single-device job's communication is 0.)
//   dtrain_trainer_device_memory_bytes   gauge {device, state}: the job's devices'
//     allocators, state in_use / peak (since the job started) / cached;
//     updated about once a second while a job runs
//   dtrain_job_loss, dtrain_job_test_accuracy (-1 until the first epoch
//   ends; only rank 0 evaluates), dtrain_job_samples_per_second (the whole
//   job's), dtrain_job_epoch (epochs done)   gauges {job_id, rank}
// The series of a job stay until the next job starts (one job's worth of
// series at a time). --health_listen (e.g. :9403) serves grpc.health.v1
// (and reflection) only, SERVING while the daemon runs; --metrics_port_file
// and --health_port_file receive the bound ports (for tests with port 0).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/signals.h"
#include "libs/base/status.h"
#include "libs/collective/communicator.h"
#include "libs/cuda/devices.h"
#include "libs/kvstore/client.h"
#include "libs/metrics/metrics.h"
#include "libs/tensor/allocator.h"
#include "libs/train/job.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/trainer/scheduler_store.h"

ABSL_FLAG(std::string, scheduler, "",
          "scheduler address host:port (default: $DTRAIN_SCHEDULER, else 127.0.0.1:7000)");
ABSL_FLAG(std::string, name, "", "this trainer's name for people (default: the host name)");
ABSL_FLAG(std::string, devices, "auto",
          "devices to offer: auto (every CUDA device found, else cpu, with a log line saying "
          "which), cuda (every CUDA device; an error without one), or a list: cpu, cpu:0,cpu:1, "
          "cuda:0,cuda:1, ...");
ABSL_FLAG(std::string, work_dir, "", "scratch directory (default: /tmp/dtrain-trainer-<pid>)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where jobs' checkpoints go; share it between trainers so a job can resume on another "
          "trainer (default: --work_dir)");
ABSL_FLAG(double, rpc_timeout_s, 5, "deadline of each call to the scheduler");
ABSL_FLAG(std::string, collective_host, "",
          "address other trainers reach this one at for allreduce (default: the host name)");
ABSL_FLAG(std::string, kvstore, "",
          "kvstore shard addresses host:port,... in shard order (for KVSTORE-mode jobs)");
ABSL_FLAG(std::string, cuda_collective, "auto",
          "between trainers of CUDA jobs: auto (NCCL when each trainer has one GPU, else TCP with "
          "gradients staged through host memory), nccl (the same), or tcp");
ABSL_FLAG(double, collective_timeout_s, 60,
          "time limit of the rendezvous and of each allreduce of multi-trainer jobs");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus /metrics address, e.g. :9402 or 127.0.0.1:0 (empty: no endpoint)");
ABSL_FLAG(std::string, health_listen, "",
          "gRPC health-checking (grpc.health.v1) address, e.g. :9403 (empty: none)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the bound metrics port is written to this file");
ABSL_FLAG(std::string, health_port_file, "",
          "if set, the bound health port is written to this file");

namespace dtrain {
namespace {

namespace v1 = scheduler::v1;
using trainer::SchedulerStore;
using trainer::SchedulerStoreOptions;

// The trainer's Prometheus metrics (see the file comment). Thread-safe.
class TrainerMetrics {
 public:
  // The series of one job on this trainer.
  struct Job {
    prometheus::Histogram* compute = nullptr;
    prometheus::Histogram* communication = nullptr;
    prometheus::Histogram* data_wait = nullptr;
    prometheus::Counter* steps = nullptr;
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* test_accuracy = nullptr;
    prometheus::Gauge* samples_per_second = nullptr;
    prometheus::Gauge* epoch = nullptr;

    void Step(const train::StepTimes& t) const {
      compute->Observe(t.compute);
      communication->Observe(t.communication);
      data_wait->Observe(t.data_wait);
      steps->Increment();
    }
  };

  TrainerMetrics()
      : registry_(std::make_shared<prometheus::Registry>()),
        step_seconds_(metrics::AddHistogram(
            *registry_, "dtrain_trainer_step_seconds",
            "Time of each training step by phase: compute, communication (allreduce work), "
            "data_wait (waiting for the data loader).")),
        steps_(metrics::AddCounter(*registry_, "dtrain_trainer_steps_total",
                                   "Training steps this trainer finished.")),
        loss_(metrics::AddGauge(*registry_, "dtrain_job_loss",
                                "Mean training loss of the current epoch so far.")),
        test_accuracy_(
            metrics::AddGauge(*registry_, "dtrain_job_test_accuracy",
                              "Test accuracy after the last epoch (0..1; -1 before the first).")),
        samples_per_second_(metrics::AddGauge(*registry_, "dtrain_job_samples_per_second",
                                              "Training throughput of the whole job.")),
        epoch_(metrics::AddGauge(*registry_, "dtrain_job_epoch", "Epochs done.")),
        device_memory_(metrics::AddGauge(
            *registry_, "dtrain_trainer_device_memory_bytes",
            "Tensor memory of each device's allocator: state in_use, peak (since the job "
            "started) or cached (freed blocks kept for reuse).")),
        busy_(metrics::AddGauge(*registry_, "dtrain_trainer_busy",
                                "1 while the trainer runs a job, else 0.")
                  .Add({})) {}

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Creates the series of a job (removing the previous job's) and marks the
  // trainer busy. The pointer stays valid until the next StartJob.
  const Job* StartJob(const std::string& job_id, int rank) {
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
    job_->steps = &steps_.Add(l);
    job_->loss = &loss_.Add(l);
    job_->test_accuracy = &test_accuracy_.Add(l);
    job_->test_accuracy->Set(-1);
    job_->samples_per_second = &samples_per_second_.Add(l);
    job_->epoch = &epoch_.Add(l);
    busy_.Set(1);
    return job_.get();
  }

  void EndJob() { busy_.Set(0); }

  // Updates the memory gauges of `devices` from their allocators.
  void DeviceMemory(const std::vector<Device>& devices) {
    absl::MutexLock lock(&mu_);
    for (const Device& d : devices) {
      absl::StatusOr<Allocator*> a = GetAllocator(d);
      if (!a.ok()) continue;
      const AllocatorStats st = (*a)->stats();
      const std::string name = d.ToString();
      device_memory_.Add({{"device", name}, {"state", "in_use"}}).Set(st.bytes_in_use);
      device_memory_.Add({{"device", name}, {"state", "peak"}}).Set(st.peak_bytes_in_use);
      device_memory_.Add({{"device", name}, {"state", "cached"}}).Set(st.bytes_cached);
    }
  }

 private:
  void RemoveCurrent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job_ == nullptr) return;
    step_seconds_.Remove(job_->compute);
    step_seconds_.Remove(job_->communication);
    step_seconds_.Remove(job_->data_wait);
    steps_.Remove(job_->steps);
    loss_.Remove(job_->loss);
    test_accuracy_.Remove(job_->test_accuracy);
    samples_per_second_.Remove(job_->samples_per_second);
    epoch_.Remove(job_->epoch);
    job_.reset();
  }

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& test_accuracy_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Gauge>& epoch_;
  prometheus::Family<prometheus::Gauge>& device_memory_;
  prometheus::Gauge& busy_;
  absl::Mutex mu_;
  std::unique_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
};

class Daemon {
 public:
  Daemon(std::shared_ptr<grpc::Channel> channel, std::string name, std::vector<std::string> devices,
         std::string work_dir, absl::Duration rpc_timeout, std::string collective_host,
         absl::Duration collective_timeout, TrainerMetrics* metrics)
      : metrics_(metrics),
        stub_(v1::ClusterService::NewStub(channel)),
        name_(std::move(name)),
        devices_(std::move(devices)),
        work_dir_(std::move(work_dir)),
        rpc_timeout_(rpc_timeout),
        collective_host_(std::move(collective_host)),
        collective_timeout_(collective_timeout) {}

  // Runs until `shutdown` is requested.
  // kvstore shard addresses (in shard order) for KVSTORE-mode jobs.
  // REQUIRES: called before Run().
  void set_kvstore_servers(std::vector<std::string> servers) {
    kvstore_servers_ = std::move(servers);
  }
  // auto, nccl or tcp (see --cuda_collective). REQUIRES: before Run().
  void set_cuda_collective(std::string c) { cuda_collective_ = std::move(c); }
  // Where checkpoints go (see the file comment). REQUIRES: before Run().
  void set_checkpoint_dir(std::string dir) { checkpoint_dir_ = std::move(dir); }

  void Run(ShutdownSignal& shutdown) {
    absl::Duration interval = absl::Seconds(1);
    absl::Duration backoff = absl::Milliseconds(200);
    while (!shutdown.requested()) {
      if (TrainerId().empty()) {
        v1::RegisterTrainerRequest req;
        req.set_name(name_);
        for (const auto& d : devices_) req.add_devices(d);
        v1::RegisterTrainerReply reply;
        auto ctx = Ctx();
        absl::Status s = FromGrpcStatus(stub_->RegisterTrainer(ctx.get(), req, &reply),
                                        "ClusterService.RegisterTrainer");
        if (!s.ok()) {
          DT_LOG(WARNING) << s << "; retrying in " << backoff;
          shutdown.WaitFor(backoff);
          backoff = std::min(backoff * 2, absl::Seconds(5));
          continue;
        }
        backoff = absl::Milliseconds(200);
        SetTrainerId(reply.trainer_id());
        interval = absl::Milliseconds(std::max<int64_t>(50, reply.heartbeat_interval_ms()));
        DT_LOG(INFO) << "registered as " << reply.trainer_id() << "; heartbeat every " << interval;
      }
      ReapFinished();
      Heartbeat();
      shutdown.WaitFor(interval);
    }
    DT_LOG(INFO) << "shutting down";
    StopWorker("trainer shutting down");
  }

 private:
  struct Job {
    v1::Assignment assignment;
    std::atomic<bool> stop{false};
    // The worker is sending its final report and about to end.
    std::atomic<bool> finishing{false};
    std::string stop_reason;  // guarded by Daemon::mu_
    std::thread thread;
  };

  std::unique_ptr<grpc::ClientContext> Ctx() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
    return ctx;
  }

  void Heartbeat() {
    v1::HeartbeatRequest req;
    req.set_trainer_id(TrainerId());
    {
      absl::MutexLock lock(&mu_);
      if (running_ != nullptr && !running_id_.empty()) req.add_running_job_ids(running_id_);
    }
    v1::HeartbeatReply reply;
    auto ctx = Ctx();
    absl::Status s =
        FromGrpcStatus(stub_->Heartbeat(ctx.get(), req, &reply), "ClusterService.Heartbeat");
    if (absl::IsNotFound(s)) {
      DT_LOG(WARNING) << s << "; registering again";
      SetTrainerId("");
      return;
    }
    if (!s.ok()) {
      DT_LOG(WARNING) << s;
      return;
    }
    for (const std::string& id : reply.cancel_job_ids()) {
      absl::MutexLock lock(&mu_);
      if (running_ != nullptr && running_id_ == id) {
        DT_LOG(INFO) << "job " << id << " cancelled; stopping";
        running_->stop_reason = "cancelled";
        running_->stop = true;
      }
    }
    for (const v1::Assignment& a : reply.assignments()) Start(a);
  }

  void Start(const v1::Assignment& a) {
    // The previous job may be ending: sending its final report (a peer's
    // failure can requeue it and place it here again within that time), or
    // an earlier attempt of this very job (the scheduler restarted and
    // placed it again), which the new attempt supersedes. Let it end.
    for (absl::Time deadline = absl::Now() + absl::Seconds(30);;) {
      ReapFinished();
      absl::MutexLock lock(&mu_);
      if (running_ == nullptr || absl::Now() > deadline) break;
      if (running_id_ == a.job_id() && !running_->stop &&
          running_->assignment.attempt() != a.attempt()) {
        DT_LOG(INFO) << "job " << a.job_id() << ": attempt " << a.attempt()
                     << " supersedes attempt " << running_->assignment.attempt();
        running_->stop_reason = absl::StrCat("superseded by attempt ", a.attempt());
        running_->stop = true;
      }
      if (!running_->finishing && !running_->stop) break;
      mu_.Unlock();
      absl::SleepFor(absl::Milliseconds(10));
      mu_.Lock();
    }
    absl::MutexLock lock(&mu_);
    if (running_ != nullptr) {
      // The scheduler gives a trainer one job at a time; refuse rather than
      // oversubscribe.
      mu_.Unlock();
      Report(a, v1::FAILED, "trainer is already running job " + running_id_);
      mu_.Lock();
      return;
    }
    running_ = std::make_unique<Job>();
    running_->assignment = a;
    running_id_ = a.job_id();
    Job* job = running_.get();
    DT_LOG(INFO) << "starting job " << a.job_id() << " (" << a.spec().name() << ", "
                 << a.spec().model() << ", " << a.spec().epochs() << " epochs) as rank " << a.rank()
                 << " of " << a.world_size() << ", attempt " << a.attempt();
    job->thread = std::thread([this, job] { Work(job); });
  }

  // Joins a worker that has finished (its job cleared running_id_).
  void ReapFinished() {
    std::unique_ptr<Job> done;
    {
      absl::MutexLock lock(&mu_);
      if (running_ != nullptr && running_id_.empty()) done = std::move(running_);
    }
    if (done && done->thread.joinable()) done->thread.join();
  }

  void StopWorker(const std::string& reason) {
    std::unique_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      if (running_ != nullptr) {
        if (!running_id_.empty() && !running_->stop) {
          running_->stop_reason = reason;
          running_->stop = true;
        }
        job = std::move(running_);
      }
    }
    if (job && job->thread.joinable()) job->thread.join();
  }

  // Sends a report; returns true when the scheduler wants the job stopped.
  bool Report(const v1::Assignment& a, v1::JobState final_state, const std::string& reason,
              const v1::ProgressReport* stats = nullptr) {
    v1::ProgressReport r;
    if (stats != nullptr) r = *stats;
    r.set_trainer_id(TrainerId());
    r.set_job_id(a.job_id());
    r.set_rank(a.rank());
    r.set_attempt(a.attempt());
    r.set_final_state(final_state);
    r.set_reason(reason);
    const int attempts = final_state == v1::JOB_STATE_UNSPECIFIED ? 1 : 5;
    for (int i = 0; i < attempts; ++i) {
      v1::ReportProgressReply reply;
      auto ctx = Ctx();
      absl::Status s = FromGrpcStatus(stub_->ReportProgress(ctx.get(), r, &reply),
                                      "ClusterService.ReportProgress");
      if (s.ok()) return reply.stop();
      DT_LOG(WARNING) << s;
      // The job is no longer ours (the scheduler restarted or requeued it).
      if (absl::IsNotFound(s) || absl::IsFailedPrecondition(s)) return true;
      absl::SleepFor(absl::Milliseconds(200) * (i + 1));
    }
    return false;
  }

  // Runs an assigned job to its end and sends the final report.
  void Work(Job* job) {
    const v1::Assignment& a = job->assignment;
    const TrainerMetrics::Job* m = metrics_->StartJob(a.job_id(), a.rank());
    train::JobProgress progress;
    absl::Status s = RunJob(job, m, &progress);
    v1::ProgressReport last = ToReport(progress);
    v1::JobState final_state = v1::SUCCEEDED;
    std::string reason = "training finished";
    if (job->stop) {
      absl::MutexLock lock(&mu_);
      final_state = job->stop_reason == "cancelled" ? v1::CANCELLED : v1::FAILED;
      reason =
          absl::StrCat(job->stop_reason, " at epoch ", last.epoch() + 1, " step ", last.step());
    } else if (!s.ok()) {
      final_state = v1::FAILED;
      reason = std::string(s.message());
      // A peer, the network or a kvstore shard failed, not this job's
      // definition: the scheduler may run the job again.
      last.set_retryable(absl::IsUnavailable(s) || absl::IsAborted(s) ||
                         absl::IsDeadlineExceeded(s));
    }
    DT_LOG(INFO) << "job " << a.job_id() << " rank " << a.rank() << " "
                 << v1::JobState_Name(final_state) << ": " << reason;
    job->finishing = true;
    Report(a, final_state, reason, &last);
    metrics_->EndJob();
    absl::MutexLock lock(&mu_);
    running_id_.clear();
  }

  static v1::ProgressReport ToReport(const train::JobProgress& p) {
    v1::ProgressReport r;
    r.set_epoch(p.epoch);
    r.set_step(p.step);
    r.set_steps_per_epoch(p.steps_per_epoch);
    r.set_loss(p.loss);
    r.set_train_accuracy(p.train_accuracy);
    r.set_test_accuracy(p.test_accuracy);
    r.set_samples_per_second(p.samples_per_second);
    r.set_epoch_seconds(p.epoch_seconds);
    r.set_checkpoint_path(p.checkpoint_path);
    r.set_checkpoint_epoch(p.checkpoint_epoch);
    return r;
  }

  // Progress of a running job: metrics, and (rank 0) reports to the
  // scheduler, at most once a second between epochs.
  class Observer : public train::JobObserver {
   public:
    Observer(Daemon* daemon, Job* job, const TrainerMetrics::Job* m, std::vector<Device> devices)
        : daemon_(daemon), job_(job), m_(m), devices_(std::move(devices)) {}

    void OnStep(const train::JobProgress& p, const train::StepTimes& t) override {
      m_->Step(t);
      m_->loss->Set(p.loss);
      m_->samples_per_second->Set(p.samples_per_second);
      const absl::Time now = absl::Now();
      if (now - last_memory_ >= absl::Seconds(1)) {
        last_memory_ = now;
        daemon_->metrics_->DeviceMemory(devices_);
      }
      if (job_->assignment.rank() == 0 && now - last_report_ >= absl::Seconds(1)) {
        last_report_ = now;
        Send(p);
      }
    }

    void OnEpoch(const train::JobProgress& p) override {
      m_->epoch->Set(p.epoch);
      m_->loss->Set(p.loss);
      if (p.test_accuracy >= 0) m_->test_accuracy->Set(p.test_accuracy);
      if (job_->assignment.rank() == 0) {
        last_report_ = absl::Now();
        Send(p);
      }
    }

    bool StopRequested() override { return job_->stop; }

   private:
    void Send(const train::JobProgress& p) {
      const v1::ProgressReport r = ToReport(p);
      if (daemon_->Report(job_->assignment, v1::JOB_STATE_UNSPECIFIED, "", &r)) {
        daemon_->Stop(job_, "cancelled");
      }
    }

    Daemon* const daemon_;
    Job* const job_;
    const TrainerMetrics::Job* const m_;
    const std::vector<Device> devices_;
    absl::Time last_report_ = absl::InfinitePast();
    absl::Time last_memory_ = absl::InfinitePast();
  };

  // Connects what the job needs across trainers (the rendezvous through the
  // scheduler and a communicator, or a kvstore client) and runs it with
  // libs/train's RunJob.
  absl::Status RunJob(Job* job, const TrainerMetrics::Job* m, train::JobProgress* progress) {
    const v1::Assignment& a = job->assignment;
    const v1::JobSpec& spec = a.spec();
    const int world = std::max(1, a.world_size());
    const int rank = a.rank();
    const bool use_kvstore = spec.sync().mode() == v1::KVSTORE;
    if (use_kvstore && kvstore_servers_.empty()) {
      return absl::FailedPreconditionError(
          "sync mode KVSTORE, but this trainer was started without --kvstore servers");
    }
    const int k = std::max(1, spec.devices_per_trainer());

    train::JobConfig c;
    c.name = a.job_id();
    c.model = spec.model();
    c.data_dir = spec.data_dir();
    c.epochs = spec.epochs();
    c.global_batch_size = spec.global_batch_size();
    c.sgd = {.lr = static_cast<float>(spec.lr()),
             .momentum = static_cast<float>(spec.momentum()),
             .weight_decay = static_cast<float>(spec.weight_decay())};
    c.init = spec.init().empty() ? "normal" : spec.init();
    c.seed = spec.seed();
    c.threads = spec.threads();
    c.train_limit = spec.train_limit();
    c.test_limit = spec.test_limit();
    c.hybridize = spec.hybridize();
    c.sync_batch_norm = spec.sync_batch_norm();
    c.checkpoint_interval_epochs = spec.checkpoint_interval_epochs();
    c.rank = rank;
    c.world_size = world;
    c.checkpoint_path = absl::StrCat(checkpoint_dir_, "/", a.job_id(), ".ckpt");
    c.checkpoint_metadata = {{"job_id", a.job_id()}, {"attempt", absl::StrCat(a.attempt())}};
    c.resume_from = a.resume_checkpoint();

    // The job's devices: cpu:0..k-1, or the first k CUDA devices this
    // trainer offers.
    const bool cuda = spec.device_kind() == "cuda";
    c.devices.clear();
    for (int i = 0; !cuda && i < k; ++i) c.devices.push_back(Device::Cpu(i));
    for (const std::string& d : devices_) {
      if (!cuda || static_cast<int>(c.devices.size()) == k || !absl::StartsWith(d, "cuda")) {
        continue;
      }
      DT_ASSIGN_OR_RETURN(Device parsed, Device::Parse(d == "cuda" ? "cuda:0" : d));
      c.devices.push_back(parsed);
    }
    if (static_cast<int>(c.devices.size()) < k) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job needs ", k, " ", spec.device_kind(), " devices; this trainer has ",
                       absl::StrJoin(devices_, ",")));
    }

    std::unique_ptr<SchedulerStore> store;
    std::unique_ptr<collective::Communicator> comm;
    std::unique_ptr<kvstore::KVClient> kv;
    if (use_kvstore) {
      // Gradients go through the parameter server: one kvstore job per
      // attempt, every trainer a worker.
      kvstore::ClientOptions ko;
      ko.servers = kvstore_servers_;
      ko.job = absl::StrCat(a.job_id(), "-a", a.attempt());
      ko.worker = rank;
      DT_ASSIGN_OR_RETURN(kv, kvstore::KVClient::Connect(ko));
      DT_LOG(INFO) << "job " << a.job_id() << " rank " << rank << ": synchronizing through "
                   << kvstore_servers_.size() << " kvstore shards";
      c.kvstore = kv.get();
      switch (spec.sync().consistency()) {
        case v1::ASYNCHRONOUS:
          c.kvstore_consistency = kvstore::Consistency::kAsync;
          break;
        case v1::BOUNDED_DELAY:
          c.kvstore_consistency = kvstore::Consistency::kBoundedDelay;
          c.kvstore_max_staleness = spec.sync().max_staleness();
          break;
        default:
          c.kvstore_consistency = kvstore::Consistency::kSync;
      }
    } else if (world > 1) {
      // Between trainers with one GPU each, NCCL (device memory); otherwise
      // TCP (CUDA gradients staged through host memory). The ranks meet
      // through the scheduler's rendezvous store.
      const bool nccl = cuda && k == 1 && cuda_collective_ != "tcp";
      SchedulerStoreOptions so;
      so.rpc_timeout = rpc_timeout_;
      store =
          std::make_unique<SchedulerStore>(stub_.get(), TrainerId(), a.job_id(), a.attempt(), so);
      collective::CommunicatorOptions co;
      co.transport = nccl ? collective::TransportKind::kNccl : collective::TransportKind::kTcp;
      if (nccl) co.cuda_device = c.devices[0].index;
      co.timeout = collective_timeout_;
      co.key_prefix = "allreduce";
      co.tcp.host = collective_host_;
      const absl::Time start = absl::Now();
      absl::StatusOr<std::unique_ptr<collective::Communicator>> made =
          collective::Communicator::Create(rank, world, store.get(), co);
      if (!made.ok()) {
        return Annotate(made.status(), absl::StrCat("rendezvous of rank ", rank, " of ", world));
      }
      comm = *std::move(made);
      DT_LOG(INFO) << "job " << a.job_id() << " rank " << rank << ": connected to " << world - 1
                   << " peers in " << absl::Now() - start << " ("
                   << collective::TransportKindName(co.transport) << ")";
      c.communicator = comm.get();
      c.communicator_device = nccl ? c.devices[0] : Device::Cpu(0);
    }
    for (const Device& d : c.devices) {
      if (absl::StatusOr<Allocator*> alloc = GetAllocator(d); alloc.ok()) (*alloc)->ResetPeak();
    }
    Observer observer(this, job, m, c.devices);
    return train::RunJob(c, &observer, progress);
  }

  void Stop(Job* job, const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (!job->stop) {
      job->stop_reason = reason;
      job->stop = true;
    }
  }

  TrainerMetrics* const metrics_;
  std::unique_ptr<v1::ClusterService::Stub> stub_;
  const std::string name_;
  const std::vector<std::string> devices_;
  const std::string work_dir_;
  std::string checkpoint_dir_;  // set once before Run()
  std::string cuda_collective_ = "auto";
  const absl::Duration rpc_timeout_;
  const std::string collective_host_;
  std::vector<std::string> kvstore_servers_;  // set once before Run()
  const absl::Duration collective_timeout_;
  std::string TrainerId() const {
    absl::MutexLock lock(&id_mu_);
    return trainer_id_;
  }
  void SetTrainerId(const std::string& id) {
    absl::MutexLock lock(&id_mu_);
    trainer_id_ = id;
  }

  mutable absl::Mutex id_mu_;
  // Set by the main thread (registration), read by the worker's reports.
  std::string trainer_id_ ABSL_GUARDED_BY(id_mu_);

  absl::Mutex mu_;
  std::unique_ptr<Job> running_ ABSL_GUARDED_BY(mu_);
  std::string running_id_ ABSL_GUARDED_BY(mu_);  // empty once the worker is done
};

bool WriteFileAtomically(const std::string& path, const std::string& text) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("The dtrain trainer daemon: trains the jobs the scheduler assigns.");
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::string address = absl::GetFlag(FLAGS_scheduler);
  if (address.empty()) {
    const char* env = std::getenv("DTRAIN_SCHEDULER");
    address = env != nullptr && *env ? env : "127.0.0.1:7000";
  }
  std::vector<std::string> devices;
  const std::string requested = absl::GetFlag(FLAGS_devices);
  if (requested == "auto" || requested == "cuda") {
    // One log line says which devices and why (no CUDA device: cpu).
    absl::StatusOr<std::vector<dtrain::Device>> chosen = dtrain::cuda::ChooseDevices(requested);
    if (!chosen.ok()) {
      std::fprintf(stderr, "trainer: --devices=%s: %s\n", requested.c_str(),
                   std::string(chosen.status().message()).c_str());
      return 2;
    }
    for (const dtrain::Device& d : *chosen) devices.push_back(d.ToString());
  } else {
    devices = absl::StrSplit(requested, ',', absl::SkipWhitespace());
  }
  if (devices.empty()) {
    std::fprintf(stderr, "trainer: --devices must name at least one device\n");
    return 2;
  }
  const double timeout_s = absl::GetFlag(FLAGS_rpc_timeout_s);
  if (!(timeout_s > 0)) {
    std::fprintf(stderr, "trainer: --rpc_timeout_s must be > 0\n");
    return 2;
  }
  std::string name = absl::GetFlag(FLAGS_name);
  if (name.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    name = host;
  }
  std::string work_dir = absl::GetFlag(FLAGS_work_dir);
  if (work_dir.empty()) work_dir = absl::StrCat("/tmp/dtrain-trainer-", getpid());
  if (access(work_dir.c_str(), W_OK) != 0 && mkdir(work_dir.c_str(), 0755) != 0) {
    std::fprintf(stderr, "trainer: cannot use --work_dir=%s\n", work_dir.c_str());
    return 2;
  }
  dtrain::ShutdownSignal& shutdown = dtrain::ShutdownSignal::Install();
  DT_LOG(INFO) << "trainer " << name << " with devices " << absl::StrJoin(devices, ",")
               << "; scheduler at " << address;
  const double collective_timeout_s = absl::GetFlag(FLAGS_collective_timeout_s);
  if (!(collective_timeout_s > 0)) {
    std::fprintf(stderr, "trainer: --collective_timeout_s must be > 0\n");
    return 2;
  }
  dtrain::TrainerMetrics metrics;
  std::unique_ptr<dtrain::metrics::MetricsServer> metrics_server;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen); !listen.empty()) {
    absl::StatusOr<std::unique_ptr<dtrain::metrics::MetricsServer>> m =
        dtrain::metrics::MetricsServer::Start(listen);
    if (!m.ok()) {
      std::fprintf(stderr, "trainer: --metrics_listen=%s: %s\n", listen.c_str(),
                   std::string(m.status().message()).c_str());
      return 2;
    }
    metrics_server = *std::move(m);
    metrics_server->Expose(metrics.registry());
    DT_LOG(INFO) << "metrics on port " << metrics_server->port();
    const std::string port_file = absl::GetFlag(FLAGS_metrics_port_file);
    if (!port_file.empty() &&
        !dtrain::WriteFileAtomically(port_file, absl::StrCat(metrics_server->port()))) {
      std::fprintf(stderr, "trainer: cannot write --metrics_port_file=%s\n", port_file.c_str());
      return 2;
    }
  }
  // A gRPC server with only the health-checking service (and reflection):
  // the kubelet's grpc probes.
  std::unique_ptr<grpc::Server> health_server;
  if (const std::string listen = absl::GetFlag(FLAGS_health_listen); !listen.empty()) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
    health_server = builder.BuildAndStart();
    if (health_server == nullptr || port == 0) {
      std::fprintf(stderr, "trainer: cannot listen on --health_listen=%s\n", listen.c_str());
      return 2;
    }
    if (auto* health = health_server->GetHealthCheckService()) health->SetServingStatus(true);
    DT_LOG(INFO) << "gRPC health on port " << port;
    const std::string port_file = absl::GetFlag(FLAGS_health_port_file);
    if (!port_file.empty() && !dtrain::WriteFileAtomically(port_file, absl::StrCat(port))) {
      std::fprintf(stderr, "trainer: cannot write --health_port_file=%s\n", port_file.c_str());
      return 2;
    }
  }
  dtrain::Daemon daemon(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), name,
                        devices, work_dir, absl::Seconds(timeout_s),
                        absl::GetFlag(FLAGS_collective_host), absl::Seconds(collective_timeout_s),
                        &metrics);
  {
    std::vector<std::string> kv;
    for (absl::string_view a :
         absl::StrSplit(absl::GetFlag(FLAGS_kvstore), ',', absl::SkipEmpty())) {
      kv.emplace_back(a);
    }
    daemon.set_kvstore_servers(std::move(kv));
  }
  std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (checkpoint_dir.empty()) checkpoint_dir = work_dir;
  if (access(checkpoint_dir.c_str(), W_OK) != 0 && mkdir(checkpoint_dir.c_str(), 0755) != 0) {
    std::fprintf(stderr, "trainer: cannot use --checkpoint_dir=%s\n", checkpoint_dir.c_str());
    return 2;
  }
  daemon.set_checkpoint_dir(checkpoint_dir);
  const std::string cuda_collective = absl::GetFlag(FLAGS_cuda_collective);
  if (cuda_collective != "auto" && cuda_collective != "nccl" && cuda_collective != "tcp") {
    std::fprintf(stderr, "trainer: --cuda_collective must be auto, nccl or tcp, got %s\n",
                 cuda_collective.c_str());
    return 2;
  }
  daemon.set_cuda_collective(cuda_collective);
  daemon.Run(shutdown);
  if (health_server != nullptr) {
    if (auto* health = health_server->GetHealthCheckService()) health->SetServingStatus(false);
    health_server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  metrics_server.reset();
  return 0;
}
