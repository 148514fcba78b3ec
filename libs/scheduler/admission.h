// RunAdmissionCycle: one scheduling pass over the queues (Kueue's
// scheduler cycle): which pending jobs are admitted now, which preemptions
// start, and why each queue's first blocked job waits. No threads, no
// transport; the caller places the admitted gangs and drains the victims.
//
//   CycleOptions o;
//   o.now = NowSeconds();
//   CycleResult r = RunAdmissionCycle(manager, o);
//   for (const Admission& a : r.admitted) Place(a.id);
//   for (const PreemptionDecision& d : r.preemptions) ... Drain(v.id) / Shrink(v.id)
//   for (const auto& [id, why] : r.pending_reasons) status.set_pending_reason(why);
//
// Admission is all-or-nothing per job (its whole gang) and repeats until
// nothing more fits:
//   1. Each queue offers its first pending job (queue_manager.h's order:
//      priority, user share, age) that fits its quota, or may borrow from its
//      cohort (QuotaState::Fits). A job that does not fit is skipped
//      (best-effort FIFO: smaller jobs behind it may start), at most
//      max_scan_per_queue per queue and offer, until the first blocked job
//      has waited reserve_after_seconds or waits for victims it preempted:
//      then its queue admits nothing behind it (it reserves), so a big gang
//      is not starved by small ones nor robbed of what its preemption frees.
//   2. The offered jobs are sorted once and taken in order: those within
//      their queue's nominal quota first, then those that borrow by their
//      queue's share after admission (fair_sharing.h, lowest first), then
//      priority, then age; each is admitted if it still fits. After each
//      one taken only its queue offers again (step 1), into the sorted
//      offers: a queue's offer and share depend on its own usage alone.
// Then every queue's first blocked job that waits for no victims yet may
// preempt (preemptor.h); its victims are marked evicting in the manager.
//
// Not thread-safe; mutates `m`.
#ifndef DTRAIN_LIBS_SCHEDULER_ADMISSION_H_
#define DTRAIN_LIBS_SCHEDULER_ADMISSION_H_

#include <map>
#include <string>
#include <vector>

#include "libs/scheduler/preemptor.h"
#include "libs/scheduler/queue_manager.h"

namespace dtrain {
namespace scheduler {

struct CycleOptions {
  double now = 0;  // seconds, the clock of Workload::submit_time
  // Jobs looked at per queue and pass: bounds a cycle's cost when a queue
  // holds thousands of jobs that do not fit.
  int max_scan_per_queue = 64;
  // After this long the first blocked job of a queue stops others behind
  // it from starting (see above).
  double reserve_after_seconds = 300;
  bool preempt = true;
};

struct Admission {
  std::string id;
  std::string queue;
  bool borrowing = false;  // admitted above its queue's nominal quota
};

struct CycleResult {
  std::vector<Admission> admitted;
  std::vector<PreemptionDecision> preemptions;
  // For the first blocked job of every queue: why it waits (the quota that
  // blocks it, or the preemption it waits for).
  std::map<std::string, std::string> pending_reasons;
};

CycleResult RunAdmissionCycle(QueueManager& m, const CycleOptions& options);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_ADMISSION_H_
