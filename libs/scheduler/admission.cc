#include "libs/scheduler/admission.h"

#include <algorithm>
#include <set>

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
  // Queue q's offer: its first pending job that fits now (false: none),
  // noting its first blocked job.
  auto offer = [&](int q, Head* out) {
    blocked[q] = nullptr;
    if (m.PendingIn(q) == 0) return false;
    bool found = false;
    int scanned = 0;
    m.ForEachPending(q, [&](const Workload& w) {
      const Resources req = w.Request();
      if (m.quota().Fits(q, req)) {
        Resources after = m.quota().usage(q);
        after += req;
        *out = {&w, q, m.quota().WithinNominal(q, req),
                QueueShare(config.queues[q], after, lendable[q])};
        found = true;
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
    return found;
  };
  auto before = [](const Head& a, const Head& b) {
    if (a.within_nominal != b.within_nominal) return a.within_nominal;
    if (!a.within_nominal && a.share != b.share) return a.share < b.share;
    if (a.w->priority != b.w->priority) return a.w->priority > b.w->priority;
    if (a.w->submit_time != b.w->submit_time) return a.w->submit_time < b.w->submit_time;
    return a.w->id < b.w->id;
  };
  // The offers, sorted once; after each admission only the admitting
  // queue offers again (its usage, share and users' order changed; the
  // others' offers and shares depend on their own usage only, and one that
  // no longer fits the cohort's pool is replaced when it comes up).
  std::set<Head, decltype(before)> heads(before);
  for (int q = 0; q < nq; ++q) {
    Head h;
    if (offer(q, &h)) heads.insert(h);
  }
  while (!heads.empty()) {
    const Head h = *heads.begin();
    heads.erase(heads.begin());
    const Resources req = h.w->Request();
    if (m.quota().Fits(h.q, req)) {
      const bool borrowing = !m.quota().WithinNominal(h.q, req);
      const std::string id = h.w->id;
      result.admitted.push_back({id, config.queues[h.q].name, borrowing});
      m.Admit(id, options.now).IgnoreError();  // pending: it was just offered
    }
    Head next;
    if (offer(h.q, &next)) heads.insert(next);
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
