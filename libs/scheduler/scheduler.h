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
// Recovery in place (CPU ALLREDUCE and KVSTORE jobs of several trainers,
// recover_in_place):
// when a trainer of a running attempt that has reported progress (or
// regrouped already) is lost and a free trainer that fits the job exists,
// the attempt is not requeued. The job's generation goes up,
// the spare takes the lost rank (an Assignment with the generation and
// join set: it receives the state from the survivors), and every other
// trainer of the attempt is told to regroup (HeartbeatReply.regroups, in
// every reply while the generation is > 0): the survivors keep their model
// and optimizer state in memory and meet the spare under the generation's
// rendezvous keys. The event says "rank R lost on trainer X (...);
// recovering in place on trainer Y (generation G)". The rank that sent the
// state reports the recovery time and the steps lost once the first step
// after it completed (ProgressReport.recovery_seconds): JobStatus.recoveries,
// last_recovery_seconds and steps_lost grow and an event says "recovered in
// place on trainer Y in 2.1 s". With no spare the attempt is requeued as
// before; a survivor that cannot regroup reports a retryable failure, which
// requeues it too. Survivors see a lost peer at once (their collectives
// fail) and say so in their heartbeats (peer_lost_job_ids): the job's
// trainers silent for more than 2 heartbeat intervals are then lost at
// once (in that heartbeat or the next CheckLiveness) instead of after
// heartbeat_timeout.
//
// KVSTORE jobs whose weights live on the kvstore (ASYNCHRONOUS,
// BOUNDED_DELAY) recover in place too, differently: the survivors never
// stop (nothing they hold is lost; a bounded-delay survivor waits in a pull
// for the lost worker, which its heartbeats report as a lost peer), and the
// spare joins the attempt's own kvstore job (the token of generation 0's
// "<job>-a<A>", in every generation) as the lost rank's kvstore worker: it
// pulls the weights and continues that worker's rounds. Its recovery
// report's seconds are replaced by the time from the lost trainer's last
// heartbeat (the survivors saw no failure to count from) to the report.
//
// Elastic jobs (spec.min_trainers < num_trainers or max_trainers >
// num_trainers; ALLREDUCE on CPU). A lost trainer with no spare free: while
// at least min_trainers would remain, the job shrinks instead of being
// requeued: the lost rank leaves the placement, the others are renumbered
// in order (Trainer.rank follows at once; a progress report a survivor sent
// under its old rank before regrouping is dropped, a final one counted for
// its new rank), the generation goes up and the survivors regroup
// (HeartbeatReply.regroups names the new membership). Event "rank R lost on
// trainer X (...); no spare trainer: continuing on N trainers (min_trainers
// M, generation G)"; the recovery report counts it like a replacement
// ("continued on N trainers in 1.9 s"). Growing: Schedule(), after placing
// the queue, gives a RUNNING elastic job below max_trainers the free
// trainers no queued job reserved, once its membership is settled (its
// current generation's recovery was reported, no peer lost, every rank has
// its assignment, none draining): they are appended as new ranks with
// join set, in a new generation ("growing to N trainers (max_trainers M):
// T joins at a step boundary (generation G)"); the running ranks meet them
// at a step they agree on, and the root's report gives "grew to N trainers
// (T joined) in 0.8 s" (not counted in recoveries or the histogram).
//
// Drain: a trainer is DRAINING once DrainTrainer names it or it heartbeats
// with draining set (it got SIGTERM); no work is placed on it again (until
// it registers anew). An assignment it has not received yet is taken back
// (the job is requeued, not counted). Its running job is told to drain
// (HeartbeatReply.drain_job_ids): the ranks stop at one step, rank 0
// checkpoints it and every rank reports FAILED with retryable and drained.
// Rank 0's drained report requeues the job from that checkpoint (resuming
// at its epoch and step: Assignment.resume_step) and adds one to
// JobStatus.drains; attempts still counts the placement, but max_attempts
// limits attempts - drains, so drains never fail a job. The other ranks'
// drained reports only free their trainers (the job waits for rank 0's
// checkpoint). ListTrainers shows IDLE, BUSY, DRAINING and the last
// kMaxLostTrainersListed trainers declared lost (LOST).
//
// Stragglers: every rank reports its recent step times
// (ProgressReport.step_times; JobStatus.rank_step_times keeps the latest of
// each rank). A rank whose busy time stays at least 1.3x the median of the
// other ranks' for 5 reports in a row (StragglerDetector, straggler.h) is
// added to JobStatus.stragglers with an event "straggler: rank 1 on trainer
// T is 1.8x slower than the median of the other ranks, in
// forward_backward"; once it is below 1.15x for 5 reports it is removed
// ("straggler no more: ..."). Both events are logged. A new placement
// starts over; a rank replaced in place is forgotten.
//
// Why a job waits: every Schedule() sets a QUEUED job's
// JobStatus.pending_reason ("needs 2 trainers with 1 free cpu device; 1 is
// free, trainer-3 runs job-000007"; a job of another owner is "another
// user's job"), not logged (it is recomputed).
//
// Durability: every job change that matters after a restart (submission,
// state changes, completed epochs, checkpoints) is appended to a
// write-ahead log (wal.h) as the job's full JobStatus before the call
// returns. Trainers are not logged.
//
// A restart restarts nothing. Open replays the log; a job that was RUNNING
// stays RUNNING, awaiting adoption, for heartbeat_timeout: its trainers
// keep training while the scheduler is away, find it forgot them (NOT_FOUND
// from Heartbeat) and register again with what they run
// (RegisterTrainerRequest.previous_trainer_id and .running). A claim whose
// job, attempt, rank and trainer id match the logged placement (generation
// at most the logged one: a newer one is offered again as a regroup) gives
// that trainer its old id back and its rank; rank 0's claim brings the
// job's epoch and step up to date. Once every rank is claimed the attempt
// is adopted: event "scheduler restarted; adopted the running attempt 1
// from its 2 trainers", attempts unchanged. Until then the attempt's
// unclaimed trainers get kUnavailable (not NOT_FOUND, which would stop
// their job) from ReportProgress and the rendezvous store, and the
// store starts empty (a drain claimed before the restart is claimed again).
// An attempt not fully claimed within heartbeat_timeout of Open is
// requeued from its newest checkpoint ("scheduler restarted while the job
// was running; ... not claimed ...; requeued") and its claimed trainers are
// told to stop; such a requeue (kRestartRequeued events) never counts
// against max_attempts.
//
// The scheduler never runs ahead of its log: each change is made on a copy
// of the job's status, which is written first and becomes the job's status
// (and trainers are assigned or freed) only once the write succeeded. A
// change whose record cannot be written (a full disk, an I/O error) is
// refused with kUnavailable, "the scheduler cannot write its job log
// (appending to <path>: <OS error>); ...", and nothing changes: a
// Submit/Cancel/ReportProgress fails (the client retries; Submit is
// idempotent with a request id), reads (Get, List, Watch) go on working.
// kUnavailable rather than kResourceExhausted: the change was not made and
// the same call succeeds once the operator frees space, which is what
// clients retry on. Changes the scheduler makes on its own are retried
// rather than forced: a placement is not made (every heartbeat schedules
// again), a lost trainer stays in the table until its job's requeue is
// logged (the next CheckLiveness), a job its trainer silently dropped is
// failed at a later heartbeat; each is logged as an error at most every 10
// s. The scheduler does not stop: restarting would not make the disk any
// less full, and it keeps serving reads and liveness meanwhile. Open
// itself writes nothing (a RUNNING job awaits adoption), so a full disk
// does not keep the scheduler from starting; an adoption whose event cannot
// be logged adopts the job all the same (the event is only said in the log
// of the scheduler).
//
// Compaction: when the log holds more than 2 * (jobs + 1) + 64 records
// (2 * (jobs + 1) right after retention dropped jobs), it is rewritten
// atomically to one record per job (at Open and while running, after any
// append); a failed compaction leaves the log as it was and is tried again
// 64 records later.
//
// Retention: a finished job (SUCCEEDED, FAILED, CANCELLED) is dropped from
// memory, and from the log (a tombstone record, a JobStatus with only id,
// submit_request_id and state JOB_STATE_UNSPECIFIED, until compaction
// removes both), finished_job_retention after its last event, by
// CheckLiveness. Its Submit request id is forgotten with it: a Submit retry
// is recognized for as long as the job is kept. Job ids are never reused
// (compaction keeps a tombstone for the newest id).
//
// Thread-safe.
#ifndef DTRAIN_LIBS_SCHEDULER_SCHEDULER_H_
#define DTRAIN_LIBS_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/scheduler/job_queues.h"
#include "libs/scheduler/queue_config.h"
#include "libs/scheduler/straggler.h"
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
// The start of the event of a job requeued because the scheduler restarted
// while it ran and no trainer claimed it (not counted against max_attempts).
inline constexpr char kRestartRequeued[] = "scheduler restarted while the job was running";
// The id of the job log's record of an applied queues file (v1::QueuesRecord).
inline constexpr char kQueuesRecordId[] = "#queues";
// Lost trainers ListTrainers keeps showing (the newest).
inline constexpr size_t kMaxLostTrainersListed = 32;

struct SchedulerOptions {
  // The write-ahead log; empty: nothing survives a restart (tests).
  std::string wal_path;
  // A trainer silent this long is lost.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Told to trainers at registration (a third of the timeout by default).
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // On trainer loss: true puts the job back in the queue, false fails it.
  bool requeue_on_trainer_loss = true;
  // On trainer loss: a job (ALLREDUCE or KVSTORE, CPU or CUDA, not
  // sync_batch_norm) continues on a spare trainer within the same attempt
  // (see "Recovery in place") when one is free.
  bool recover_in_place = true;
  // A job is placed at most this many times (the first run included); when a
  // trainer of its last attempt is lost, it FAILS with the reason.
  int max_attempts = 5;
  // A user (JobStatus.owner; "" on a scheduler without TLS) may have at most
  // this many QUEUED jobs; Submit beyond it is RESOURCE_EXHAUSTED naming the
  // limit. <= 0: no limit.
  int max_queued_jobs_per_user = 100;
  // Finished jobs are dropped this long after they finished
  // (absl::InfiniteDuration(): kept forever).
  absl::Duration finished_job_retention = absl::Hours(7 * 24);
  // The cluster secret (libs/security/job_token.h); non-empty: every
  // assignment of a KVSTORE job carries a kvstore token for its attempt,
  // valid for job_token_lifetime, and every other job's its attempt's
  // collective secret (security::CollectiveSecret).
  std::string job_token_secret;
  absl::Duration job_token_lifetime = absl::Hours(30 * 24);
  // Straggler detection (see "Stragglers").
  StragglerOptions stragglers;
  // Queues with quotas (docs/queues.md, job_queues.h); nullopt: one queue,
  // no quota. A job goes to JobSpec.queue if its owner may use it, else its
  // owner's default (Submit refuses an unknown queue, another team's, an
  // owner in no queue, or a gang its queue can never admit; the queue is
  // JobStatus.queue); it is placed only within its queue's quota or what
  // its cohort lends (from the RUNNING jobs' current sizes), else its
  // pending_reason names the queue, resource and numbers, and it reserves
  // no trainers. QUEUED jobs carry their queue_position. Elastic growth
  // stays within the quota too. The first such job of each queue may
  // preempt (preemptor.h, whole jobs): each victim gets an event naming the
  // preemptor's queue and rule and is drained like a draining trainer's job
  // (checkpoint at a step, requeued, resumed there; counted in drains, not
  // against max_attempts); the preemptor's event names the victims' queues.
  // Jobs within their queue's quota are placed before jobs that would
  // borrow, those by their queue's borrowed share by weight, then by
  // priority, then the owner's share of the queue (fair_sharing.h; smaller
  // first), then arrival (JobQueues::SortForPlacement). ApplyQueues
  // replaces them at run time; the applied file is logged and, after a
  // restart, kept over `queues` while `queues_yaml` is the file it was
  // applied over (a changed --queues file wins).
  std::optional<QueueConfig> queues;
  std::string queues_yaml;  // the text `queues` was parsed from
  // The clock; tests inject a fake one.
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

// Counts for metrics.
struct SchedulerStats {
  std::map<JobState, int64_t> jobs_by_state;  // every state, zeros included
  int64_t queue_length = 0;
  int64_t trainers_alive = 0;
  int64_t trainers_busy = 0;
  // Completed recoveries in place since the scheduler started, and their
  // times (failed step -> next completed step) as a histogram: counts per
  // upper bound of kRecoverySecondsBounds, then above the last.
  int64_t recoveries = 0;
  std::vector<int64_t> recovery_seconds_counts;
  double recovery_seconds_sum = 0;
  // Ranks of RUNNING jobs that are stragglers now, and ranks named
  // stragglers since the scheduler started.
  int64_t stragglers = 0;
  int64_t stragglers_detected = 0;
  // Per queue (empty without queues).
  std::vector<QueueMetrics> queues;
};

// Upper bounds (seconds) of the recovery time histogram.
inline constexpr double kRecoverySecondsBounds[] = {0.5, 1, 2, 3, 5, 10, 30, 60, 120};

bool IsFinal(JobState state);

// List pages: page_size 0 means kDefaultListPageSize; larger than
// kMaxListPageSize means kMaxListPageSize.
inline constexpr int kDefaultListPageSize = 100;
inline constexpr int kMaxListPageSize = 1000;

struct JobPage {
  std::vector<JobStatus> jobs;
  // Empty on the last page.
  std::string next_page_token;
};

class Scheduler {
 public:
  // Replays options.wal_path if set. Errors: those of Wal::Open, kDataLoss
  // for a record that does not parse.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Open(SchedulerOptions options);

  // Validates (InvalidArgument naming the field), applies defaults, logs and
  // queues the job. Returns its status (QUEUED, or RUNNING if it was
  // placed at once).
  // `request_id` (optional, at most 128 bytes): a Submit with the id of an
  // earlier one returns that job instead (a client's retry). `owner`: who
  // submits it (JobStatus.owner).
  absl::StatusOr<JobStatus> Submit(JobSpec spec, const std::string& request_id = "",
                                   const std::string& owner = "");

  // kNotFound for an unknown id.
  absl::StatusOr<JobStatus> Get(const std::string& id) const;

  // Every job in submission order; `state` JOB_STATE_UNSPECIFIED: all.
  std::vector<JobStatus> List(JobState state = v1::JOB_STATE_UNSPECIFIED) const;

  // One page of List: up to page_size jobs in submission order after those
  // of the page that returned `page_token` ("" for the first page). Jobs
  // submitted or dropped in between neither shift nor repeat the others.
  // kInvalidArgument for a negative page_size or a token no reply gave.
  // `owner` non-null: only that owner's jobs.
  absl::StatusOr<JobPage> ListPage(JobState state, int page_size, const std::string& page_token,
                                   const std::string* owner = nullptr) const;

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

  // Declares trainers lost whose last heartbeat is older than the timeout,
  // and drops finished jobs past their retention. Returns how many trainers
  // were declared lost.
  int CheckLiveness();

  SchedulerStats Stats() const;

  // Marks a trainer DRAINING (see "Drain" above). `trainer` is an id, or a
  // name when no id matches. kNotFound for an unknown trainer,
  // kInvalidArgument for a name several trainers have; kUnavailable when
  // taking back an undelivered assignment cannot be logged (nothing
  // changed).
  absl::StatusOr<v1::TrainerStatus> DrainTrainer(const std::string& trainer);

  // Registered trainers by id, then recently lost ones.
  std::vector<v1::TrainerStatus> ListTrainers() const;

  // The queues at a glance (trainctl queues); `with_yaml`: also the file
  // and each queue's users (for admins).
  v1::ListQueuesReply ListQueues(bool with_yaml) const;
  // Replaces the queues with the file `yaml` (applied by `who`), logged
  // first, and returns ListQueues(true). InvalidArgument naming the line
  // for a malformed file, FailedPrecondition naming the queue, resource
  // and numbers when it would strand running jobs (or the scheduler has no
  // queues file: start it with --queues), kUnavailable when the log refuses;
  // nothing changes then. Jobs keep their queue by name; a waiting job
  // whose queue is gone goes by its owner's default.
  absl::StatusOr<v1::ListQueuesReply> ApplyQueues(const std::string& yaml, const std::string& who);

 private:
  struct Job {
    JobStatus status;
    int64_t seq = 0;  // arrival order
    std::vector<bool> rank_done;
    // A survivor said a peer is gone (HeartbeatRequest.peer_lost_job_ids):
    // its silent trainers are lost after 2 heartbeat intervals.
    bool peer_lost = false;
    // The last generation whose recovery was reported, and what the event
    // of the current one says ("rank 1 lost on trainer-2").
    int recovered_generation = 0;
    std::string recovery_note;
    std::string recovery_trainer;
    // The current attempt's ranks compared (see "Stragglers"); null until
    // the job is placed.
    std::unique_ptr<StragglerDetector> stragglers;
    // What the current generation changed: a spare replaced a lost rank, the
    // job shrank onto its survivors (elastic, no spare), or it grew.
    // kYield: it gave up trainers to a preemptor (queues).
    enum class Change { kReplace, kShrink, kGrow, kYield };
    Change change = Change::kReplace;
    // A KVSTORE job with kvstore-held weights: the lost trainer's last
    // heartbeat, where its recovery's seconds count from.
    absl::Time lost_at = absl::InfinitePast();
    // Chosen as a preemption victim (queues): its trainers are told to
    // drain it; cleared once it leaves RUNNING. `preempted_for`: the job
    // that waits for it.
    bool preempting = false;
    std::string preempted_for;
    // commits_ when this job last found no victims (Preempt tries again
    // only after some job changed).
    int64_t no_victims_at = -1;
    // RUNNING in the log when the scheduler started and not adopted yet
    // (see "A restart restarts nothing"): requeued at adopt_by.
    bool awaiting_adoption = false;
    absl::Time adopt_by = absl::InfiniteFuture();
    // While RUNNING: since when its device-seconds are not yet recorded
    // (queues; InfinitePast: not counted, e.g. replayed RUNNING).
    absl::Time accrued_at = absl::InfinitePast();
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
    bool draining = false;  // no new work (DrainTrainer, or SIGTERM)
    bool join = false;      // replaces a lost rank (Assignment.join)
    int generation = 0;     // of its assignment (regroups are for later ones)
    // Dropped from its elastic job's membership in this generation (the
    // job yielded trainers to a preemptor): it gets that generation's
    // regroup too, so it stops at the step the others regroup at.
    int leaving_generation = -1;
  };

  explicit Scheduler(SchedulerOptions options)
      : options_(std::move(options)), queues_(options_.queues, options_.queues_yaml) {}

  absl::Status Replay(const std::vector<std::string>& records) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A logged queues file (record `index`): the newest is kept.
  absl::Status ReplayQueues(const std::string& record, size_t index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After replay: the logged queues file replaces options_.queues while the
  // --queues file is the one it was applied over.
  absl::Status UseAppliedQueues() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `status` to the log. On failure kUnavailable naming the log's
  // error, followed by `refused` (what did not happen).
  absl::Status Persist(const JobStatus& status, absl::string_view refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs `next`, then makes it the job's status (dropping the rendezvous
  // store when it leaves RUNNING). On error nothing changed.
  absl::Status Commit(Job* job, JobStatus next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs the refusal of a change the scheduler makes itself (rate-limited).
  void LogRefusal(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The records of a compacted log.
  std::vector<std::string> Snapshot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compacts when the log holds more than 2 * (jobs + 1) + 64 records, or,
  // right after jobs were dropped, more than 2 * (jobs + 1).
  void MaybeCompact(bool dropped = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops finished jobs past the retention period; returns how many.
  int DropExpiredJobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetState(JobStatus* status, JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(JobStatus* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    status->set_version(NextVersion());
  }
  static std::vector<std::string> Placement(const Job& job);
  // Frees the trainers `placed` on job_id; those still working on it are
  // told to stop unless `except` is their id.
  void ReleaseTrainers(const std::string& job_id, const std::vector<std::string>& placed,
                       const std::string& except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Fits(const Trainer& t, const JobSpec& spec) const;
  // Checks that `trainer_id` may use the store of `job_id` attempt
  // `attempt` and the key is valid; returns its table.
  absl::StatusOr<Kv*> StoreFor(const std::string& trainer_id, const std::string& job_id,
                               int attempt, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns false (and changes nothing) when its job's change cannot be
  // logged.
  bool LoseTrainer(const std::string& trainer_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recovery in place of `job` after its trainer `lost` is gone: a spare
  // takes the rank in a new generation. False (nothing changed) when the
  // job does not recover in place, no spare is free or the log refuses.
  bool RecoverInPlace(Job* job, const Trainer& lost, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic jobs without a spare: the survivors continue as a smaller
  // membership (ranks renumbered). False (nothing changed) when the job
  // would fall below min_trainers or the log refuses.
  bool Shrink(Job* job, const Trainer& lost, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic jobs below max_trainers whose membership is settled take free
  // trainers not `reserved` by queued jobs (a new generation; they join at a
  // step boundary).
  // Every job, for the queues (job_queues.h).
  std::vector<JobRef> JobRefs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For `job`, the first job of its queue that the quota blocks (`why`):
  // starts the drains the queues decide (events on both jobs) or says it
  // waits for earlier ones; returns its pending reason.
  std::string Preempt(Job* job, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fewest trainers RUNNING `job` may shrink to now for a preemptor:
  // an elastic job above min_trainers whose membership is settled (as for
  // Grow); 0 otherwise.
  int ShrinkTo(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Carries out victim `v` (trainers_after > 0) of a preemption: the job
  // keeps its first v.trainers_after ranks in a new generation, the others
  // get the regroup too and leave at its step. False (nothing changed) when
  // the log refuses.
  bool YieldTrainers(Job* job, const Victim& v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The device-seconds RUNNING `job` used since they were last recorded
  // (0 when not RUNNING or not counted).
  double UnrecordedDeviceSeconds(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before `job`'s status changes (Commit): records what it used so far in
  // its queue, by its owner; `running_next`: it is RUNNING after the change.
  void AccrueDeviceSeconds(Job* job, bool running_next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the QUEUED jobs' queue_position (after some job changed).
  void UpdateQueuePositions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Grow(const std::map<const Trainer*, std::string>& reserved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `job` may change its membership in place at all.
  bool RecoversInPlace(const Job& job) const;
  // Whether RUNNING `job` may change its membership in place now (Grow,
  // ShrinkTo): it recovers in place, no recovery or adoption is pending, and
  // every rank runs the current membership (none draining, every assignment
  // delivered).
  bool MembershipSettled(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The silence after which a trainer of a job with a lost peer is lost.
  absl::Duration PeerLostTimeout() const;
  // Whether `t` holds rank t.rank of job's current placement (not a stale
  // one that was told to stop).
  static bool InPlacement(const Job& job, const Trainer& t);
  // After a failure of the running job's attempt that was not the job's
  // fault: back to the queue (resuming from its newest checkpoint), or
  // FAILED once it has been placed max_attempts times (on the status; the
  // caller commits it and releases the trainers).
  // `counted` false: a requeue no failure caused (the scheduler restarted),
  // which never fails the job.
  void Requeue(JobStatus* status, const std::string& why, bool counted = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `t` draining; takes back an assignment it has not received
  // (requeueing the job as a drain); kUnavailable, changing nothing, when
  // that cannot be logged.
  absl::Status StartDrain(Trainer* t, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static v1::TrainerStatus ToStatus(const Trainer& t, v1::TrainerState state);
  // A re-registering trainer's claim on a job awaiting adoption: the job it
  // matches (t gets its rank), or null (t registers as a new trainer).
  Job* Claim(const RegisterTrainerRequest& request, Trainer* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adopts `job` once every rank of its placement is claimed.
  void MaybeAdopt(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Requeues jobs awaiting adoption past their deadline (not counted);
  // whether it requeued any.
  bool RequeueUnclaimed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kUnavailable when `trainer_id` is unknown but holds a rank of a job
  // awaiting adoption (it has not registered again yet), else kNotFound.
  absl::Status UnknownTrainer(const std::string& trainer_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records rank r.rank()'s step times in *next and compares the ranks
  // (see "Stragglers"); t is its trainer.
  void StepTimes(Job* job, const Trainer& t, const ProgressReport& r, JobStatus* next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `job` is not placed: `free_fit` free trainers fit it; `reserved`
  // holds free trainers kept for higher jobs, with their ids.
  std::string PendingReason(const Job& job, int free_fit,
                            const std::map<const Trainer*, std::string>& reserved) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  mutable absl::Mutex mu_;
  // The queues (options_.queues, or the file an admin applied since).
  JobQueues queues_ ABSL_GUARDED_BY(mu_);
  int64_t positions_at_ ABSL_GUARDED_BY(mu_) = -1;
  // The applied queues file in force (kept by compaction).
  std::optional<v1::QueuesRecord> queues_record_
      ABSL_GUARDED_BY(mu_);                   // commits_ at the last UpdateQueuePositions
  int64_t commits_ ABSL_GUARDED_BY(mu_) = 0;  // job changes made (Commit, Submit)
  std::unique_ptr<Wal> wal_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> by_request_id_ ABSL_GUARDED_BY(mu_);  // -> job id
  std::map<std::string, Trainer> trainers_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::TrainerStatus> lost_ ABSL_GUARDED_BY(mu_);  // newest last
  std::map<std::string, Kv> kv_ ABSL_GUARDED_BY(mu_);        // by job id, RUNNING jobs only
  int64_t next_job_ = 1 ABSL_GUARDED_BY(mu_);
  int64_t next_trainer_ = 1 ABSL_GUARDED_BY(mu_);
  // Versions are hybrid logical clock readings: the larger of the last one
  // plus one and the time in microseconds since the epoch, so they keep
  // increasing across a restart (which replays only logged changes, not the
  // progress reports in between) without logging every version.
  int64_t NextVersion() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    version_ = std::max(version_ + 1, absl::ToUnixMicros(absl::Now()));
    return version_;
  }
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t recoveries_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> recovery_counts_ ABSL_GUARDED_BY(mu_);
  double recovery_sum_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stragglers_detected_ ABSL_GUARDED_BY(mu_) = 0;
  // A failed compaction is retried once the log holds this many records.
  int64_t next_compaction_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_refusal_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_SCHEDULER_H_
