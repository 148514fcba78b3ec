#include "libs/scheduler/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "libs/scheduler/fair_sharing.h"

namespace dtrain {
namespace scheduler {
namespace {

struct Head {
  const Workload* w;
  int q;
  bool within_nominal;
  double share;  // its queue's share after admitting it
};

}  // namespace

CycleResult RunAdmissionCycle(QueueManager& m, const CycleOptions& options) {
  CycleResult result;
  const QueueConfig& config = m.config();
  const int nq = static_cast<int>(config.queues.size());
  std::vector<Resources> lendable(nq);
  for (int q = 0; q < nq; ++q) lendable[q] = CohortLendable(config, config.queues[q].cohort);

  std::vector<const Workload*> blocked(nq, nullptr);
  while (true) {
    std::vector<Head> heads;
    std::fill(blocked.begin(), blocked.end(), nullptr);
    for (int q = 0; q < nq; ++q) {
      if (m.PendingIn(q) == 0) continue;
      int scanned = 0;
      m.ForEachPending(q, [&](const Workload& w) {
        const Resources req = w.Request();
        if (m.quota().Fits(q, req)) {
          Resources after = m.quota().usage(q);
          after += req;
          heads.push_back({&w, q, m.quota().WithinNominal(q, req),
                           QueueShare(config.queues[q], after, lendable[q])});
          return false;
        }
        if (blocked[q] == nullptr) {
          blocked[q] = &w;
          // It reserves: waited long enough, or preempted for what is freed.
          if (options.now - w.submit_time >= options.reserve_after_seconds ||
              m.WaitingForVictims(w.id) > 0) {
            return false;
          }
        }
        return ++scanned < options.max_scan_per_queue;
      });
    }
    if (heads.empty()) break;
    std::sort(heads.begin(), heads.end(), [](const Head& a, const Head& b) {
      if (a.within_nominal != b.within_nominal) return a.within_nominal;
      if (!a.within_nominal && a.share != b.share) return a.share < b.share;
      if (a.w->priority != b.w->priority) return a.w->priority > b.w->priority;
      if (a.w->submit_time != b.w->submit_time) return a.w->submit_time < b.w->submit_time;
      return a.w->id < b.w->id;
    });
    int admitted = 0;
    for (const Head& h : heads) {
      const Resources req = h.w->Request();
      if (!m.quota().Fits(h.q, req)) continue;
      const bool borrowing = !m.quota().WithinNominal(h.q, req);
      const std::string id = h.w->id;
      result.admitted.push_back({id, config.queues[h.q].name, borrowing});
      m.Admit(id, options.now).IgnoreError();  // pending: it was just offered
      ++admitted;
      // One borrowing admission per pass: the next pass offers heads again,
      // ordered by the shares this one changed.
      if (borrowing) break;
    }
    if (admitted == 0) break;
  }

  for (int q = 0; q < nq; ++q) {
    const Workload* w = blocked[q];
    if (w == nullptr) continue;
    std::string reason;
    m.quota().Fits(q, w->Request(), &reason);
    const int waiting = m.WaitingForVictims(w->id);
    if (waiting > 0) {
      reason = absl::StrCat(reason, "; waiting for ", waiting, " preempted ",
                            waiting == 1 ? "job" : "jobs", " to drain");
    } else if (options.preempt) {
      if (std::optional<PreemptionDecision> d = FindPreemption(m, *w)) {
        for (const Victim& v : d->victims) m.MarkEvicting(v.id, w->id);
        reason = absl::StrCat(reason, "; ", d->message);
        result.preemptions.push_back(*std::move(d));
      }
    }
    result.pending_reasons[w->id] = std::move(reason);
  }
  return result;
}

}  // namespace scheduler
}  // namespace dtrain
