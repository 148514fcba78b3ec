#include "libs/scheduler/preemptor.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace scheduler {
namespace {

struct Candidate {
  const Workload* w;
  int q;
  PreemptRule rule;
  double admit_time;
};

std::string VictimMessage(const Victim& v, const Workload& preemptor, const QueueSpec& pq) {
  const std::string why =
      v.rule == PreemptRule::kReclaimWithinCohort
          ? absl::StrCat("to reclaim quota for queue ", pq.name,
                         " (reclaim_within_cohort: ", PolicyName(pq.reclaim_within_cohort),
                         "; queue ", v.queue, " borrows above its quota)")
          : absl::StrCat("for a job of priority ", preemptor.priority, " in queue ", pq.name,
                         " (within_queue: ", PolicyName(pq.within_queue), ")");
  if (v.trainers_after > 0) {
    return absl::StrCat("shrinking from ", v.trainers_before, " to ", v.trainers_after,
                        " trainers ", why);
  }
  return absl::StrCat("preempted (drained at a step, back at the head of its queue) ", why);
}

std::string PreemptorMessage(const std::vector<Victim>& victims) {
  // (queue, rule, shrink?) -> count
  std::map<std::tuple<std::string, PreemptRule, bool>, int> groups;
  for (const Victim& v : victims) ++groups[{v.queue, v.rule, v.trainers_after > 0}];
  std::vector<std::string> parts;
  for (const auto& [key, n] : groups) {
    const auto& [queue, rule, shrink] = key;
    parts.push_back(absl::StrCat(shrink ? "shrinking " : "draining ", n, n == 1 ? " job" : " jobs",
                                 " of queue ", queue, " (", RuleName(rule), ")"));
  }
  return absl::StrCat("waiting for preemption: ", absl::StrJoin(parts, "; "));
}

}  // namespace

const char* RuleName(PreemptRule r) {
  return r == PreemptRule::kWithinQueue ? "within_queue" : "reclaim_within_cohort";
}

std::optional<PreemptionDecision> FindPreemption(const QueueManager& m, const Workload& w) {
  const QueueConfig& config = m.config();
  const int qw = config.Find(w.queue);
  if (qw < 0) return std::nullopt;
  const QueueSpec& spec = config.queues[qw];
  const Resources req = w.Request();
  const QuotaState& now = m.quota();
  if (now.Fits(qw, req)) return std::nullopt;

  std::vector<Candidate> candidates;
  if (spec.within_queue == WithinQueuePolicy::kLowerPriority) {
    for (const Workload* a : m.AdmittedIn(qw)) {
      if (a->priority < w.priority && !m.IsEvicting(a->id)) {
        candidates.push_back({a, qw, PreemptRule::kWithinQueue, m.AdmitTime(a->id)});
      }
    }
  }
  if (!spec.cohort.empty() && spec.reclaim_within_cohort != ReclaimPolicy::kNever &&
      now.WithinNominal(qw, req)) {
    for (int q = 0; q < static_cast<int>(config.queues.size()); ++q) {
      if (q == qw || config.queues[q].cohort != spec.cohort || !now.Borrowing(q)) continue;
      for (const Workload* a : m.AdmittedIn(q)) {
        if (m.IsEvicting(a->id)) continue;
        if (spec.reclaim_within_cohort == ReclaimPolicy::kLowerPriority &&
            a->priority >= w.priority) {
          continue;
        }
        candidates.push_back({a, q, PreemptRule::kReclaimWithinCohort, m.AdmitTime(a->id)});
      }
    }
  }
  if (candidates.empty()) return std::nullopt;
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.rule != b.rule) return a.rule == PreemptRule::kReclaimWithinCohort;
    if (a.w->priority != b.w->priority) return a.w->priority < b.w->priority;
    if (a.admit_time != b.admit_time) return a.admit_time > b.admit_time;
    if (a.w->submit_time != b.w->submit_time) return a.w->submit_time > b.w->submit_time;
    return a.w->id > b.w->id;
  });
  // A reclaim candidate counts only while its queue still borrows.
  auto allowed = [](const QuotaState& s, const Candidate& c) {
    return c.rule != PreemptRule::kReclaimWithinCohort || s.Borrowing(c.q);
  };

  auto decide = [&](std::vector<Victim> victims) {
    PreemptionDecision d;
    d.preemptor_id = w.id;
    d.preemptor_queue = w.queue;
    for (Victim& v : victims) v.message = VictimMessage(v, w, spec);
    d.message = PreemptorMessage(victims);
    d.victims = std::move(victims);
    return d;
  };

  // 1. Shrinks only, one trainer at a time.
  {
    QuotaState s = now;
    std::vector<Victim> shrinks;
    for (const Candidate& c : candidates) {
      if (s.Fits(qw, req)) break;
      if (!c.w->Elastic()) continue;
      int n = c.w->trainers;
      const Resources one = GangResources(1, c.w->devices_per_trainer, c.w->cuda);
      while (n > c.w->min_trainers && !s.Fits(qw, req) && allowed(s, c)) {
        s.Remove(c.q, one);
        --n;
      }
      if (n < c.w->trainers) {
        shrinks.push_back({c.w->id, c.w->queue, c.w->user, c.rule, c.w->trainers, n, ""});
      }
    }
    if (s.Fits(qw, req)) return decide(std::move(shrinks));
  }

  // 2. Whole jobs: greedy, then give back every one not needed.
  QuotaState s = now;
  std::vector<const Candidate*> chosen;
  for (const Candidate& c : candidates) {
    if (s.Fits(qw, req)) break;
    if (!allowed(s, c)) continue;
    s.Remove(c.q, c.w->Request());
    chosen.push_back(&c);
  }
  if (!s.Fits(qw, req)) return std::nullopt;
  for (int i = static_cast<int>(chosen.size()) - 1; i >= 0; --i) {
    QuotaState t = s;
    t.Add(chosen[i]->q, chosen[i]->w->Request());
    if (t.Fits(qw, req)) {
      s = t;
      chosen.erase(chosen.begin() + i);
    }
  }
  std::vector<Victim> victims;
  for (const Candidate* c : chosen) {
    victims.push_back({c->w->id, c->w->queue, c->w->user, c->rule, c->w->trainers, 0, ""});
  }
  return decide(std::move(victims));
}

}  // namespace scheduler
}  // namespace dtrain
