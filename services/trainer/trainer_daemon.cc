// trainer: the trainer daemon. Registers with the scheduler, heartbeats,
// and trains the jobs the scheduler assigns to it.
//
//   trainer --scheduler=scheduler:7000 --devices=cpu --work_dir=/var/lib/dtrain-trainer
//
// One job at a time, on a worker thread, with libs/train's Train(). Progress
// goes to the scheduler with ReportProgress (every step, at most once a
// second, and after every epoch with its accuracies).
//
// Cancellation (from a heartbeat reply or a ReportProgress reply) takes
// effect at the next epoch boundary, not at the next step: Train() has no
// way to stop mid-epoch, so the daemon runs it one epoch at a time, resuming
// from a checkpoint in --work_dir between epochs, and checks for
// cancellation in between. The checkpoint also gives
// checkpoint_interval_epochs for free (it is written after every epoch).
//
// Multi-trainer jobs (world size > 1) need the data-parallel runner, which
// is not wired into the daemon yet: such assignments are reported FAILED
// with the reason "multi-trainer jobs need the data-parallel runner (not yet
// wired)".
//
// When the scheduler forgets the trainer (restart, or it was declared lost)
// the daemon registers again. SIGTERM or SIGINT: stops the job at the next
// epoch boundary, reports it FAILED ("trainer shutting down") and exits 0.
// Exit status 2 for bad flags.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/signals.h"
#include "libs/train/train.h"
#include "protos/scheduler.grpc.pb.h"

ABSL_FLAG(std::string, scheduler, "",
          "scheduler address host:port (default: $DTRAIN_SCHEDULER, else 127.0.0.1:7000)");
ABSL_FLAG(std::string, name, "", "this trainer's name for people (default: the host name)");
ABSL_FLAG(std::string, devices, "cpu", "comma-separated devices to offer: cpu, cuda:0, ...");
ABSL_FLAG(std::string, work_dir, "", "checkpoint directory (default: /tmp/dtrain-trainer-<pid>)");
ABSL_FLAG(double, rpc_timeout_s, 5, "deadline of each call to the scheduler");

namespace dtrain {
namespace {

namespace v1 = scheduler::v1;

constexpr char kMultiTrainerReason[] =
    "multi-trainer jobs need the data-parallel runner (not yet wired)";

class Daemon {
 public:
  Daemon(std::shared_ptr<grpc::Channel> channel, std::string name, std::vector<std::string> devices,
         std::string work_dir, absl::Duration rpc_timeout)
      : stub_(v1::ClusterService::NewStub(channel)),
        name_(std::move(name)),
        devices_(std::move(devices)),
        work_dir_(std::move(work_dir)),
        rpc_timeout_(rpc_timeout) {}

  // Runs until `shutdown` is requested.
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
        DT_LOG(INFO) << "job " << id << " cancelled; stopping after this epoch";
        running_->stop_reason = "cancelled";
        running_->stop = true;
      }
    }
    for (const v1::Assignment& a : reply.assignments()) Start(a);
  }

  void Start(const v1::Assignment& a) {
    if (a.world_size() > 1 || a.rank() > 0) {
      DT_LOG(WARNING) << "job " << a.job_id() << " rank " << a.rank() << " of " << a.world_size()
                      << ": " << kMultiTrainerReason;
      Report(a, v1::FAILED, kMultiTrainerReason);
      return;
    }
    ReapFinished();
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
                 << a.spec().model() << ", " << a.spec().epochs() << " epochs)";
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

  void Work(Job* job) {
    const v1::Assignment& a = job->assignment;
    const v1::JobSpec& spec = a.spec();
    train::TrainOptions o;
    o.model = spec.model();
    o.batch_size = spec.global_batch_size();
    o.lr = static_cast<float>(spec.lr());
    o.momentum = static_cast<float>(spec.momentum());
    o.weight_decay = static_cast<float>(spec.weight_decay());
    o.seed = spec.seed();
    o.init = spec.init().empty() ? "normal" : spec.init();
    o.threads = spec.threads();
    o.data_dir = spec.data_dir();
    o.train_limit = spec.train_limit();
    o.test_limit = spec.test_limit();
    o.device = spec.device_kind() == "cuda" ? "cuda:0" : "cpu";
    for (const std::string& d : devices_) {
      if (absl::StartsWith(d, spec.device_kind())) {
        o.device = d.find(':') == std::string::npos && d == "cuda" ? "cuda:0" : d;
        break;
      }
    }
    o.checkpoint_path = absl::StrCat(work_dir_, "/", a.job_id(), ".ckpt");
    std::remove(o.checkpoint_path.c_str());
    o.resume = true;

    v1::ProgressReport last;
    last.set_test_accuracy(-1);
    absl::Time last_report = absl::InfinitePast();
    v1::JobState final_state = v1::SUCCEEDED;
    std::string reason = "training finished";
    for (int epoch = 1; epoch <= spec.epochs(); ++epoch) {
      if (job->stop) break;
      o.epochs = epoch;  // one more epoch, resuming from the checkpoint
      absl::StatusOr<train::TrainResult> r = train::Train(
          o,
          [&](const train::Progress& p) {
            last.set_epoch(p.epoch - 1);
            last.set_step(p.step);
            last.set_loss(p.loss);
            last.set_samples_per_second(p.samples_per_second);
            if (absl::Now() - last_report >= absl::Seconds(1)) {
              last_report = absl::Now();
              if (Report(a, v1::JOB_STATE_UNSPECIFIED, "", &last)) Stop(job, "cancelled");
            }
          },
          [&](const train::EpochStats& e) {
            last.set_epoch(e.epoch);
            last.set_step(0);
            last.set_loss(e.loss);
            last.set_train_accuracy(e.train_accuracy);
            last.set_test_accuracy(e.test_accuracy);
            last.set_samples_per_second(e.samples_per_second);
            last_report = absl::Now();
            if (Report(a, v1::JOB_STATE_UNSPECIFIED, "", &last)) Stop(job, "cancelled");
          });
      if (!r.ok()) {
        final_state = v1::FAILED;
        reason = std::string(r.status().message());
        break;
      }
    }
    if (final_state == v1::SUCCEEDED && job->stop) {
      absl::MutexLock lock(&mu_);
      final_state = job->stop_reason == "cancelled" ? v1::CANCELLED : v1::FAILED;
      reason = absl::StrCat(job->stop_reason, " after epoch ", last.epoch());
    }
    std::remove(o.checkpoint_path.c_str());
    DT_LOG(INFO) << "job " << a.job_id() << " " << v1::JobState_Name(final_state) << ": " << reason;
    Report(a, final_state, reason, &last);
    absl::MutexLock lock(&mu_);
    running_id_.clear();
  }

  void Stop(Job* job, const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (!job->stop) {
      job->stop_reason = reason;
      job->stop = true;
    }
  }

  std::unique_ptr<v1::ClusterService::Stub> stub_;
  const std::string name_;
  const std::vector<std::string> devices_;
  const std::string work_dir_;
  const absl::Duration rpc_timeout_;
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
  std::vector<std::string> devices =
      absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipWhitespace());
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
  DT_LOG(INFO) << "trainer " << name << " with devices " << absl::GetFlag(FLAGS_devices)
               << "; scheduler at " << address;
  dtrain::Daemon daemon(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), name,
                        devices, work_dir, absl::Seconds(timeout_s));
  daemon.Run(shutdown);
  return 0;
}
