// JobQueues: the scheduler's queues (docs/queues.md) over its job table.
// Which queue a submitted job goes to, each queue's usage by the RUNNING
// jobs, the order QUEUED jobs are placed in, the victims a blocked job may
// preempt (preemptor.h), what `trainctl queues` shows, run-time changes of
// the queues file, and the per-queue counters behind the metrics. The
// scheduler (scheduler.h) carries the decisions out (placements, drains,
// events) under its lock; nothing here knows of trainers, the log or gRPC.
//
//   JobQueues queues(config);                       // nullopt: no queues file
//   DT_ASSIGN_OR_RETURN(std::string q, queues.ForSubmit(spec, owner));
//   std::vector<JobRef> jobs = ...;                 // every job, by reference
//   QuotaState usage = queues.Usage(jobs);
//   queues.SortForPlacement(&queued, jobs, usage);
//   std::optional<PreemptionDecision> d = queues.FindVictims(blocked, jobs);
//   DT_RETURN_IF_ERROR(queues.CheckApply(next, jobs)); queues.Replace(next, yaml);
//
// A job's queue is JobStatus.queue (set at Submit) while the file has it,
// else its owner's default (jobs submitted before the scheduler had queues,
// or waiting in a queue an admin removed); an owner in no queue is not
// limited (-1). Without a queues file every method is
// a no-op: one queue, no quota (Usage is unlimited, FindVictims finds none).
//
// Not thread-safe (the scheduler holds its lock).
#ifndef DTRAIN_LIBS_SCHEDULER_JOB_QUEUES_H_
#define DTRAIN_LIBS_SCHEDULER_JOB_QUEUES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/scheduler/preemptor.h"
#include "libs/scheduler/queue_config.h"
#include "libs/scheduler/queue_manager.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace scheduler {

// One job of the scheduler's table as the queues see it.
struct JobRef {
  const v1::JobStatus* status = nullptr;
  int64_t seq = 0;  // arrival order
  // Chosen as a victim and draining; `preempted_for` waits for it.
  bool preempting = false;
  const std::string* preempted_for = nullptr;
  // A RUNNING elastic job that may give up trainers now (its membership is
  // settled): the fewest it may shrink to; 0: it may not (preempted whole).
  int shrink_to = 0;
};

// The preemption metric's reason for a victim shrunk instead of drained.
inline constexpr char kShrinkReason[] = "shrink";

// Upper bounds (seconds) of the admission wait histogram: from a job's
// (re)queueing to its placement.
inline constexpr double kAdmissionWaitBounds[] = {1, 5, 10, 30, 60, 300, 900, 3600, 14400};

// Per queue, for metrics (a snapshot; counters since the scheduler started).
struct QueueMetrics {
  QueueSummary summary;
  // By reason: RuleName (drained whole) or kShrinkReason (shrunk).
  std::map<std::string, int64_t> preemptions;
  std::vector<int64_t> wait_counts;  // per kAdmissionWaitBounds, then above
  double wait_sum = 0;
  // QUEUED jobs of this queue whose gang fits its quota now (so only
  // trainers or a reservation hold them back), and the longest such wait in
  // seconds: long while the queue has free quota suggests a scheduler bug.
  int64_t pending_within_quota = 0;
  double oldest_pending_within_quota_seconds = 0;
};

class JobQueues {
 public:
  // `yaml`: the file `config` was parsed from (shown to admins).
  explicit JobQueues(std::optional<QueueConfig> config, std::string yaml = "");

  bool enabled() const { return config_.has_value(); }
  const QueueConfig& config() const { return *config_; }
  const std::string& yaml() const { return yaml_; }

  // The queue (its name) a job of `owner` with `spec` goes to: spec.queue()
  // if the owner may use it, else the owner's default; "" without queues.
  // InvalidArgument for an unknown queue or a gang its queue could never
  // admit, PermissionDenied for a queue the owner may not use,
  // FailedPrecondition for an owner in no queue; each names the owner's
  // queues or the quota.
  absl::StatusOr<std::string> ForSubmit(const v1::JobSpec& spec, const std::string& owner) const;

  // The index of the queue of `status`, or -1 (none, or no queues).
  int QueueOf(const v1::JobStatus& status) const;

  // What the RUNNING jobs of `jobs` use per queue (their current sizes);
  // nullopt without queues.
  std::optional<QuotaState> Usage(const std::vector<JobRef>& jobs) const;

  // Sorts QUEUED jobs in placement order: jobs within their queue's
  // nominal quota before jobs that would borrow (a queue's quota is its own
  // before it is lent); jobs that would borrow by their queue's borrowed
  // share of the cohort by weight (fair_sharing.h's QueueShare, smaller
  // first: spare quota is split by weight); then priority, then the owner's
  // share of the queue (from the RUNNING jobs of `jobs`; smaller first),
  // then arrival. Without queues: priority, then arrival.
  void SortForPlacement(std::vector<JobRef>* queued, const std::vector<JobRef>& jobs,
                        const std::optional<QuotaState>& usage) const;

  // For QUEUED `job`, the first job of its queue that the quota blocks: the
  // victims preemptor.h chooses among the RUNNING jobs (elastic ones with
  // shrink_to set shrink first; those already preempting are not chosen
  // again), or nullopt.
  std::optional<PreemptionDecision> FindVictims(const JobRef& job,
                                                const std::vector<JobRef>& jobs) const;
  // Victims `job` still waits for (preempting jobs preempted for it).
  static int WaitingFor(const JobRef& job, const std::vector<JobRef>& jobs);

  // Every queue (file order) with its usage, borrowed, lent and counts, and
  // each QUEUED job's 1-based position in its queue (by job id).
  std::vector<QueueSummary> Summaries(const std::vector<JobRef>& jobs,
                                      std::map<std::string, int>* positions = nullptr) const;

  // Whether `next` may replace the queues: FailedPrecondition naming the
  // queue, resource and numbers when it would strand RUNNING jobs of `jobs`
  // (CheckQuotaChange; a job's queue by the current file, then by name in
  // the new one).
  absl::Status CheckApply(const QueueConfig& next, const std::vector<JobRef>& jobs) const;
  // Replaces the queues (after CheckApply).
  void Replace(QueueConfig next, std::string yaml);

  // Counters: a job of queue `queue` admitted after waiting `wait_seconds`;
  // a job of queue `queue` preempted by `rule`, or shrunk (reason "shrink").
  void RecordAdmission(const std::string& queue, double wait_seconds);
  void RecordPreemption(const std::string& queue, const Victim& victim);

  // Device-seconds used by `user`'s jobs in queue `queue` (fair sharing's
  // measure, trainctl queues); `seconds` may be fractional.
  void RecordDeviceSeconds(const std::string& queue, const std::string& user, double seconds);
  // Device-seconds recorded per user of queue `queue` (by user).
  std::map<std::string, double> DeviceSeconds(const std::string& queue) const;

  // Per queue (file order); empty without queues. `now_unix_ms` ages the
  // pending jobs.
  std::vector<QueueMetrics> Metrics(const std::vector<JobRef>& jobs, int64_t now_unix_ms) const;

 private:
  // The queues' view of `jobs`: RUNNING jobs admitted (newer placements
  // later), QUEUED ones pending.
  QueueManager Manager(const std::vector<JobRef>& jobs) const;
  Workload ToWorkload(const JobRef& job, int q, int trainers) const;

  std::optional<QueueConfig> config_;
  std::string yaml_;
  // QueueOf's answers for jobs without JobStatus.queue, by owner.
  mutable std::map<std::string, int> default_of_owner_;
  struct Counters {
    std::map<std::string, int64_t> preemptions;
    std::vector<int64_t> wait_counts = std::vector<int64_t>(std::size(kAdmissionWaitBounds) + 1);
    double wait_sum = 0;
    std::map<std::string, double> device_seconds;  // by user
  };
  std::map<std::string, Counters> counters_;  // by queue name
};

// The seconds since the job was last queued (the first of its newest run of
// QUEUED events; its submission if none), at `now_unix_ms`.
double QueuedSeconds(const v1::JobStatus& status, int64_t now_unix_ms);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_JOB_QUEUES_H_
