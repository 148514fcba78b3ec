// FindPreemption: which admitted jobs a blocked job may take resources
// from, and by which rule. The output is the decision; carrying it out is
// the scheduler's existing drain (checkpoint at a step, requeue, resume at
// that step) or, for a shrink, its elastic regroup.
//
//   std::optional<PreemptionDecision> d = FindPreemption(manager, w);
//   if (d) for (const Victim& v : d->victims) manager.MarkEvicting(v.id, w.id);
//
// Rules (the blocked job's queue's policies, docs/queues.md):
//   within_queue (lower_priority): admitted jobs of the same queue with a
//     lower priority.
//   reclaim_within_cohort (lower_priority | any): when the job fits within
//     its queue's nominal quota, jobs of the other queues of its cohort
//     that borrow (use more than their quota), with lower priority or any.
//     A queue is never reclaimed below its quota.
// Candidates are taken reclaim first, then lower priority first, then the
// most recently admitted (then submitted) first (it has done the least
// work). An elastic
// candidate above min_trainers is shrunk (gives up trainers) before any job
// is preempted: if shrinking alone frees enough, the decision only shrinks,
// by no more than needed. Otherwise the fewest whole jobs (greedy, then
// each one given back when the job still fits without it) are preempted.
// Jobs already evicting are not candidates.
//
// Explanations never name another user's job: the preemptor's message
// names the victims' queues and the rule; each victim's message names the
// preemptor's queue and the rule.
//
// Pure function of the manager's state, thread-compatible.
#ifndef DTRAIN_LIBS_SCHEDULER_PREEMPTOR_H_
#define DTRAIN_LIBS_SCHEDULER_PREEMPTOR_H_

#include <optional>
#include <string>
#include <vector>

#include "libs/scheduler/queue_manager.h"

namespace dtrain {
namespace scheduler {

enum class PreemptRule { kWithinQueue, kReclaimWithinCohort };
// "within_queue", "reclaim_within_cohort" (the metric's reason label).
const char* RuleName(PreemptRule r);

struct Victim {
  std::string id;
  std::string queue;
  std::string user;
  PreemptRule rule = PreemptRule::kWithinQueue;
  int trainers_before = 0;
  int trainers_after = 0;  // 0: preempted (drained and requeued); else shrunk to this
  // For the victim's events: "preempted to reclaim quota for queue team-b
  // (reclaim_within_cohort: any)" or "shrinking from 4 to 2 trainers for a
  // higher-priority job of queue team-a (within_queue: lower_priority)".
  std::string message;
};

struct PreemptionDecision {
  std::string preemptor_id;
  std::string preemptor_queue;
  std::vector<Victim> victims;
  // For the preemptor's events: "waiting for 1 job of queue team-a to drain
  // (reclaim_within_cohort: team-a borrows above its quota)".
  std::string message;
};

// The decision for pending workload `w` (known to `m`), or nullopt when no
// allowed set of victims makes it fit (or it fits already).
std::optional<PreemptionDecision> FindPreemption(const QueueManager& m, const Workload& w);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_PREEMPTOR_H_
