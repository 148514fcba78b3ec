// QueueManager: the queues' pending and admitted workloads (jobs) and the
// quota they use, and the quota arithmetic that says whether one more fits.
//
//   QueueManager m(config);
//   DT_RETURN_IF_ERROR(m.AddPending(w));          // a submitted job
//   RunAdmissionCycle(m, options);                // admission.h: admits some
//   m.Finish("job-1");                            // it ended: usage goes down
//   m.Requeue("job-2");                           // drained after a preemption
//
// Quota (per resource the queue's quota names; docs/queues.md): a queue
// keeps quota - lending_limit for itself (its guaranteed part); the rest of
// every member's quota forms its cohort's shared pool. A queue may use
//   usage + request <= quota + borrowing_limit                 (its limit)
// and what it uses above its guaranteed part comes from the pool:
//   sum over members of max(0, usage - guaranteed) <= pool.
// A queue without a cohort just has usage + request <= quota. Admitted
// workloads count until Finish/Requeue, evicting ones too (their drain is in
// progress). Resources the cluster has (capacity) bound everything.
//
// Order inside a queue: priority (higher first), then the user's share
// (fair_sharing.h, lower first), then submit time (older first), then
// arrival.
//
// Not thread-safe (the caller holds its lock).
#ifndef DTRAIN_LIBS_SCHEDULER_QUEUE_MANAGER_H_
#define DTRAIN_LIBS_SCHEDULER_QUEUE_MANAGER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "libs/scheduler/queue_config.h"

namespace dtrain {
namespace scheduler {

// One job as the queues see it.
struct Workload {
  std::string id;     // the job id
  std::string queue;  // resolved (QueueConfig::Resolve)
  std::string user;
  int priority = 0;
  double submit_time = 0;  // seconds; older goes first at equal priority and share
  int trainers = 1;        // the gang (while admitted: its current size)
  int devices_per_trainer = 1;
  bool cuda = false;
  // Elastic jobs may shrink to min_trainers instead of being preempted;
  // 0 (or >= trainers): not elastic.
  int min_trainers = 0;

  Resources Request() const { return GangResources(trainers, devices_per_trainer, cuda); }
  bool Elastic() const { return min_trainers > 0 && min_trainers < trainers; }
};

// Per-queue usage and the quota arithmetic, as a value: the preemptor
// copies one and removes victims from it to see whether a job would fit.
class QuotaState {
 public:
  QuotaState(const QueueConfig* config, Resources capacity);

  // The largest amount of resource r queue q could add now (kUnlimited
  // when nothing limits it).
  int64_t Available(int q, int r) const;
  // Whether `request` fits in queue q; otherwise, when `reason` is set, a
  // sentence naming the queue, resource and numbers, e.g.
  //   "queue team-a: trainers 2 in use + 2 requested > quota 2 + borrowable 1".
  bool Fits(int q, const Resources& request, std::string* reason = nullptr) const;
  // Whether `request` in queue q stays within its nominal quota (no
  // borrowing) for every resource the quota names.
  bool WithinNominal(int q, const Resources& request) const;
  // Whether queue q uses more than its quota of some resource.
  bool Borrowing(int q) const;

  void Add(int q, const Resources& r);
  void Remove(int q, const Resources& r);
  const Resources& usage(int q) const { return usage_[q]; }
  const Resources& total() const { return total_; }
  const Resources& capacity() const { return capacity_; }
  // What queue q's cohort shares in all, and what of it is in use.
  Resources PoolCapacity(int q) const;
  Resources PoolUsed(int q) const;

 private:
  const QueueConfig* config_;
  Resources capacity_;
  std::vector<Resources> usage_;
  Resources total_;
};

// One queue at a glance (what `trainctl queues` shows).
struct QueueSummary {
  std::string name;
  std::string cohort;
  std::array<bool, kNumResources> managed{};  // which resources quota limits
  Resources quota;
  Resources usage;     // by its admitted jobs (evicting ones too)
  Resources borrowed;  // usage above quota, per resource
  // Of its unused quota (up to its lending limit), what other queues of its
  // cohort borrow: the cohort's borrowing is counted against its lenders in
  // file order.
  Resources lent;
  Resources available;  // what it could add now (QuotaState::Available)
  int pending = 0;
  int admitted = 0;
};

class QueueManager {
 public:
  // `capacity`: the cluster's resources (kUnlimited where unknown).
  QueueManager(QueueConfig config, Resources capacity);

  const QueueConfig& config() const { return config_; }
  const QuotaState& quota() const { return quota_; }

  // A new pending workload. InvalidArgument for an unknown queue, an id
  // already known, or a job bigger than its queue could ever admit (naming
  // the queue's quota and limits).
  absl::Status AddPending(const Workload& w);
  // Pending -> gone (cancelled). NotFound if not pending.
  absl::Status RemovePending(const std::string& id);
  // Pending -> admitted at `now`: its usage counts. NotFound if not pending.
  absl::Status Admit(const std::string& id, double now);
  // Admitted -> gone (it ended). NotFound if not admitted.
  absl::Status Finish(const std::string& id);
  // Admitted -> pending again, keeping its submit time (so it goes back to
  // the head of its queue): a preempted job once drained.
  absl::Status Requeue(const std::string& id);
  // An admitted elastic job now runs on `trainers` (>= min_trainers).
  absl::Status Resize(const std::string& id, int trainers);
  // An admitted workload chosen as a victim: it is never chosen again while
  // its drain (or shrink) runs; `preemptor` waits for it. Cleared by
  // Requeue, Finish or Resize.
  void MarkEvicting(const std::string& id, const std::string& preemptor);

  const Workload* Find(const std::string& id) const;
  bool IsAdmitted(const std::string& id) const;
  bool IsEvicting(const std::string& id) const;
  // Victims `id` (a pending preemptor) still waits for.
  int WaitingForVictims(const std::string& id) const;
  double AdmitTime(const std::string& id) const;

  int num_pending() const { return num_pending_; }
  int num_admitted() const { return num_admitted_; }
  int PendingIn(int q) const { return pending_count_[q]; }
  // Admitted workloads of queue q, in no particular order.
  std::vector<const Workload*> AdmittedIn(int q) const;
  std::map<std::string, Resources> UsageByQueue() const;
  // Every queue, in file order.
  std::vector<QueueSummary> Summaries() const;
  const Resources& UserUsage(int q, const std::string& user) const;

  // Visits queue q's pending workloads in admission order until `visit`
  // returns false.
  void ForEachPending(int q, const std::function<bool(const Workload&)>& visit) const;
  // 1-based position of pending `id` in its queue; 0 if not pending.
  int QueuePosition(const std::string& id) const;

 private:
  struct Key {
    double submit_time;
    uint64_t seq;
    bool operator<(const Key& o) const {
      return submit_time != o.submit_time ? submit_time < o.submit_time : seq < o.seq;
    }
  };
  struct Entry {
    Workload w;
    int q = 0;
    uint64_t seq = 0;
    bool admitted = false;
    double admit_time = 0;
    std::string evicting_for;  // the preemptor, while evicting
    int waiting_for = 0;       // victims this pending workload waits for
  };
  // Per queue: priority (high first) -> user -> keys in age order.
  using UserQueues = std::map<std::string, std::map<Key, std::string>>;
  using Levels = std::map<int, UserQueues, std::greater<int>>;

  void InsertPending(Entry& e);
  void ErasePending(const Entry& e);
  void ReleaseVictim(Entry& e);
  // Takes admitted `e` out of its queue's usage (quota, its user's share,
  // the admitted set), releasing what it was evicting for.
  void Unadmit(Entry& e);

  QueueConfig config_;
  QuotaState quota_;
  std::unordered_map<std::string, Entry> entries_;
  std::vector<std::set<std::string>> admitted_;  // per queue
  int num_admitted_ = 0;
  std::vector<Levels> pending_;
  std::vector<int> pending_count_;
  std::vector<std::map<std::string, Resources>> user_usage_;
  int num_pending_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_QUEUE_MANAGER_H_
