// Scheduler: the job table, gang scheduling and trainer liveness, without
// any transport (services/scheduler wraps it in gRPC).
//
//   SchedulerOptions o;
//   o.wal_path = "/var/lib/dtrain-scheduler/jobs.wal";
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> s, Scheduler::Open(o));
//   DT_ASSIGN_OR_RETURN(JobStatus job, s->Submit(spec));          // QUEUED
//   DT_ASSIGN_OR_RETURN(RegisterTrainerReply t, s->RegisterTrainer(req));
//   DT_ASSIGN_OR_RETURN(HeartbeatReply hb, s->Heartbeat(beat));   // assignments
//   s->ReportProgress(report);                                    // RUNNING -> SUCCEEDED
//
// Queue: jobs run in order of priority (higher first), then arrival. A job
// starts only when spec.num_trainers free, live trainers that each have
// spec.devices_per_trainer devices of spec.device_kind exist together (gang
// scheduling); ranks follow registration order. A job that cannot start
// reserves the free trainers it could use, so lower-priority jobs only
// backfill trainers it cannot use and never starve it.
//
// Liveness: a trainer that has not heartbeated for heartbeat_timeout is
// lost (CheckLiveness, which the server calls periodically). Its job goes
// back to the queue (or FAILS, with requeue_on_trainer_loss false, or once
// it has been placed max_attempts times) with an event naming the trainer;
// the job's other trainers are told to stop. A rank whose attempt failed
// because of a peer or the network (ProgressReport.retryable) requeues the
// job the same way, and the attempt's other trainers are placed again only
// after they heartbeat. Rank 0 reports each checkpoint
// it writes (ProgressReport.checkpoint_path); the job's next placement
// resumes from the newest one (Assignment.resume_checkpoint), so a requeued
// job loses at most checkpoint_interval_epochs of work.
//
// Durability: every job change that matters after a restart (submission,
// state changes, completed epochs) is appended to a write-ahead log (wal.h)
// as the job's full JobStatus before the call returns. Open replays it; jobs
// that were RUNNING go back to QUEUED (their trainers re-register with the
// new process). Trainers are not logged. Open compacts the log to one
// record per job when it holds many more.
//
// Thread-safe.
#ifndef DTRAIN_LIBS_SCHEDULER_SCHEDULER_H_
#define DTRAIN_LIBS_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/scheduler/wal.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace scheduler {

using v1::Assignment;
using v1::HeartbeatReply;
using v1::HeartbeatRequest;
using v1::JobSpec;
using v1::JobState;
using v1::JobStatus;
using v1::ProgressReport;
using v1::RegisterTrainerReply;
using v1::RegisterTrainerRequest;
using v1::StoreAddRequest;
using v1::StoreGetReply;
using v1::StoreGetRequest;
using v1::StoreSetRequest;

// Limits of a job attempt's rendezvous store.
inline constexpr size_t kMaxStoreKeyBytes = 1024;
inline constexpr size_t kMaxStoreValueBytes = 64 << 10;
inline constexpr size_t kMaxStoreKeys = 4096;
inline constexpr size_t kMaxStoreBytes = 8 << 20;
// The longest a StoreGet waits inside the scheduler.
inline constexpr absl::Duration kMaxStoreWait = absl::Seconds(5);

struct SchedulerOptions {
  // The write-ahead log; empty: nothing survives a restart (tests).
  std::string wal_path;
  // A trainer silent this long is lost.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Told to trainers at registration (a third of the timeout by default).
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // On trainer loss: true puts the job back in the queue, false fails it.
  bool requeue_on_trainer_loss = true;
  // A job is placed at most this many times (the first run included); when a
  // trainer of its last attempt is lost, it FAILS with the reason.
  int max_attempts = 5;
  // The clock; tests inject a fake one.
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

// Counts for metrics.
struct SchedulerStats {
  std::map<JobState, int64_t> jobs_by_state;  // every state, zeros included
  int64_t queue_length = 0;
  int64_t trainers_alive = 0;
  int64_t trainers_busy = 0;
};

bool IsFinal(JobState state);

class Scheduler {
 public:
  // Replays options.wal_path if set. Errors: those of Wal::Open, kDataLoss
  // for a record that does not parse.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Open(SchedulerOptions options);

  // Validates (InvalidArgument naming the field), applies defaults, logs and
  // queues the job. Returns its status (QUEUED, or RUNNING if it was
  // placed at once).
  // `request_id` (optional, at most 128 bytes): a Submit with the id of an
  // earlier one returns that job instead (a client's retry).
  absl::StatusOr<JobStatus> Submit(JobSpec spec, const std::string& request_id = "");

  // kNotFound for an unknown id.
  absl::StatusOr<JobStatus> Get(const std::string& id) const;

  // Every job in submission order; `state` JOB_STATE_UNSPECIFIED: all.
  std::vector<JobStatus> List(JobState state = v1::JOB_STATE_UNSPECIFIED) const;

  // QUEUED or RUNNING -> CANCELLED (the trainers are told to stop on their
  // next heartbeat). kFailedPrecondition for a finished job, kNotFound.
  absl::StatusOr<JobStatus> Cancel(const std::string& id, const std::string& reason);

  // Blocks until job `id` has a version above `after_version`, or until
  // `deadline`; returns the current status either way (compare versions).
  absl::StatusOr<JobStatus> WaitForChange(const std::string& id, int64_t after_version,
                                          absl::Time deadline) const;

  // Registers a trainer (kInvalidArgument for bad device names).
  absl::StatusOr<RegisterTrainerReply> RegisterTrainer(const RegisterTrainerRequest& request);

  // Records liveness; returns new assignments and jobs to stop. kNotFound
  // for an unknown (or lost) trainer: it must register again. A trainer
  // that no longer lists a job it was given, without having reported its
  // end, fails that job.
  absl::StatusOr<HeartbeatReply> Heartbeat(const HeartbeatRequest& request);

  // Updates a running job. Returns true when the trainer should stop the
  // job (cancelled, or no longer its job). kNotFound for an unknown trainer
  // or job; kFailedPrecondition when the job is not this trainer's.
  absl::StatusOr<bool> ReportProgress(const ProgressReport& report);

  // The rendezvous store of a running job attempt (see StoreSetRequest in
  // protos/scheduler.proto for the errors). Each attempt's table starts
  // empty and is dropped when the job leaves RUNNING.
  absl::Status StoreSet(const StoreSetRequest& request);
  // Waits up to min(wait_ms, kMaxStoreWait) for the key; found=false if it
  // is still missing then.
  absl::StatusOr<StoreGetReply> StoreGet(const StoreGetRequest& request);
  absl::StatusOr<int64_t> StoreAdd(const StoreAddRequest& request);

  // Declares trainers lost whose last heartbeat is older than the timeout.
  // Returns how many.
  int CheckLiveness();

  SchedulerStats Stats() const;

 private:
  struct Job {
    JobStatus status;
    int64_t seq = 0;  // arrival order
    std::vector<bool> rank_done;
  };
  // One job attempt's rendezvous table.
  struct Kv {
    int attempt = 0;
    std::map<std::string, std::string> values;
    std::map<uint64_t, int64_t> add_results;  // StoreAdd request_id -> result
    size_t bytes = 0;
  };
  struct Trainer {
    std::string id;
    std::string name;
    std::map<std::string, int> devices;  // kind -> count
    absl::Time last_heartbeat;
    std::string job_id;  // empty: free
    int rank = -1;
    bool delivered = false;  // the assignment went out in a heartbeat reply
    // Not placed until it heartbeats after this time (a peer of an attempt
    // that failed retryably may be dead without being declared lost yet).
    absl::Time placeable_after = absl::InfinitePast();
    std::vector<std::string> cancels;
    int64_t order = 0;
  };

  explicit Scheduler(SchedulerOptions options) : options_(std::move(options)) {}

  absl::Status Replay(const std::vector<std::string>& records) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Persist(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetState(Job* job, JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { job->status.set_version(++version_); }
  // Frees the job's trainers; those still working on it are told to stop
  // unless `except` is their id.
  void ReleaseTrainers(Job* job, const std::string& except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Fits(const Trainer& t, const JobSpec& spec) const;
  // Checks that `trainer_id` may use the store of `job_id` attempt
  // `attempt` and the key is valid; returns its table.
  absl::StatusOr<Kv*> StoreFor(const std::string& trainer_id, const std::string& job_id,
                               int attempt, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoseTrainer(const std::string& trainer_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `t` holds rank t.rank of job's current placement (not a stale
  // one that was told to stop).
  static bool InPlacement(const Job& job, const Trainer& t);
  // After a failure of the running job's attempt that was not the job's
  // fault: back to the queue (resuming from its newest checkpoint), or
  // FAILED once it has been placed max_attempts times. The caller has
  // released the trainers.
  void Requeue(Job* job, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Wal> wal_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> by_request_id_ ABSL_GUARDED_BY(mu_);  // -> job id
  std::map<std::string, Trainer> trainers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Kv> kv_ ABSL_GUARDED_BY(mu_);  // by job id, RUNNING jobs only
  int64_t next_job_ = 1 ABSL_GUARDED_BY(mu_);
  int64_t next_trainer_ = 1 ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_SCHEDULER_H_
