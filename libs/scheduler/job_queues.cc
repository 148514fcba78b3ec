#include "libs/scheduler/job_queues.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/scheduler/fair_sharing.h"

namespace dtrain {
namespace scheduler {
namespace {

constexpr Resources kUnlimitedCapacity{{kUnlimited, kUnlimited, kUnlimited}};

Resources Gang(const v1::JobSpec& spec, int trainers) {
  return GangResources(trainers, spec.devices_per_trainer(), spec.device_kind() == "cuda");
}

bool Running(const JobRef& j) { return j.status->state() == v1::RUNNING; }

}  // namespace

double QueuedSeconds(const v1::JobStatus& status, int64_t now_unix_ms) {
  // The start of the newest run of QUEUED events (a preemptor's event
  // keeps it QUEUED and does not restart its wait).
  int64_t since = status.submit_time_unix_ms();
  bool queued = false;
  for (auto e = status.events().rbegin(); e != status.events().rend(); ++e) {
    if (e->state() != v1::QUEUED) {
      if (queued) break;
      continue;
    }
    queued = true;
    since = e->time_unix_ms();
  }
  return std::max<double>(0, static_cast<double>(now_unix_ms - since) / 1000.0);
}

JobQueues::JobQueues(std::optional<QueueConfig> config, std::string yaml)
    : config_(std::move(config)), yaml_(std::move(yaml)) {}

absl::StatusOr<std::string> JobQueues::ForSubmit(const v1::JobSpec& spec,
                                                 const std::string& owner) const {
  if (!config_) return std::string();
  absl::StatusOr<int> q = config_->Resolve(owner, {}, spec.queue());
  if (!q.ok()) {
    if (q.status().code() == absl::StatusCode::kNotFound) {
      return absl::InvalidArgumentError(absl::StrCat("queue: ", q.status().message()));
    }
    return q.status();
  }
  const QuotaState empty(&*config_, kUnlimitedCapacity);
  std::string why;
  if (!empty.Fits(*q, Gang(spec, spec.num_trainers()), &why)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job can never be admitted: ", why, "; ask for less"));
  }
  return config_->queues[*q].name;
}

int JobQueues::QueueOf(const v1::JobStatus& status) const {
  if (!config_) return -1;
  if (!status.queue().empty()) {
    const int q = config_->Find(status.queue());
    if (q >= 0) return q;
  }
  // Submitted before the scheduler had queues, or its queue left the file
  // (ApplyQueues refuses that while it runs): its owner's default.
  auto cached = default_of_owner_.find(status.owner());
  if (cached != default_of_owner_.end()) return cached->second;
  absl::StatusOr<int> q = config_->Resolve(status.owner(), {}, "");
  // An owner in no queue: not limited.
  return default_of_owner_[status.owner()] = q.ok() ? *q : -1;
}

std::optional<QuotaState> JobQueues::Usage(const std::vector<JobRef>& jobs) const {
  if (!config_) return std::nullopt;
  QuotaState quota(&*config_, kUnlimitedCapacity);
  for (const JobRef& j : jobs) {
    const int q = Running(j) ? QueueOf(*j.status) : -1;
    if (q >= 0) quota.Add(q, Gang(j.status->spec(), j.status->trainers_size()));
  }
  return quota;
}

void JobQueues::SortForPlacement(std::vector<JobRef>* queued, const std::vector<JobRef>& jobs,
                                 const std::optional<QuotaState>& usage) const {
  std::set<int64_t> within;               // by seq
  std::map<int64_t, double> share;        // the owner's share of the queue, by seq
  std::map<int64_t, double> queue_share;  // a borrowing job's queue's share, by seq
  if (config_ && usage) {
    std::map<std::pair<int, std::string>, Resources> user_usage;
    for (const JobRef& j : jobs) {
      const int q = Running(j) ? QueueOf(*j.status) : -1;
      if (q >= 0) {
        user_usage[{q, j.status->owner()}] += Gang(j.status->spec(), j.status->trainers_size());
      }
    }
    for (const JobRef& j : *queued) {
      const int q = QueueOf(*j.status);
      if (q < 0) continue;
      const QueueSpec& spec = config_->queues[q];
      if (usage->WithinNominal(q, Gang(j.status->spec(), j.status->spec().num_trainers()))) {
        within.insert(j.seq);
      } else {
        queue_share[j.seq] =
            QueueShare(spec, usage->usage(q), CohortLendable(*config_, spec.cohort));
      }
      share[j.seq] = UserShare(spec, user_usage[{q, j.status->owner()}]);
    }
  }
  std::sort(queued->begin(), queued->end(), [&](const JobRef& a, const JobRef& b) {
    const bool wa = within.count(a.seq) > 0, wb = within.count(b.seq) > 0;
    if (wa != wb) return wa;
    const double qa = queue_share[a.seq], qb = queue_share[b.seq];
    if (qa != qb) return qa < qb;
    const int pa = a.status->spec().priority(), pb = b.status->spec().priority();
    if (pa != pb) return pa > pb;
    const double sa = share[a.seq], sb = share[b.seq];
    if (sa != sb) return sa < sb;
    return a.seq < b.seq;
  });
}

Workload JobQueues::ToWorkload(const JobRef& job, int q, int trainers) const {
  const v1::JobSpec& spec = job.status->spec();
  Workload w;
  w.id = job.status->id();
  w.queue = config_->queues[q].name;
  w.user = job.status->owner();
  w.priority = spec.priority();
  w.submit_time = static_cast<double>(job.seq);
  w.trainers = trainers;
  w.devices_per_trainer = spec.devices_per_trainer();
  w.cuda = spec.device_kind() == "cuda";
  // A RUNNING elastic job the scheduler may shrink now (preemptor.h shrinks
  // before it preempts).
  if (job.status->state() == v1::RUNNING && job.shrink_to > 0 && job.shrink_to < trainers) {
    w.min_trainers = job.shrink_to;
  }
  return w;
}

QueueManager JobQueues::Manager(const std::vector<JobRef>& jobs) const {
  QueueManager m(*config_, kUnlimitedCapacity);
  for (const JobRef& j : jobs) {
    const v1::JobState state = j.status->state();
    if (state != v1::RUNNING && state != v1::QUEUED) continue;
    const int q = QueueOf(*j.status);
    if (q < 0) continue;
    const int trainers =
        state == v1::RUNNING ? j.status->trainers_size() : j.status->spec().num_trainers();
    // A gang its queue can no longer admit (the file changed): not counted.
    if (!m.AddPending(ToWorkload(j, q, trainers)).ok() || state != v1::RUNNING) continue;
    (void)m.Admit(j.status->id(), static_cast<double>(j.seq));  // newer placements go first
  }
  for (const JobRef& j : jobs) {
    if (j.preempting && j.preempted_for != nullptr && m.IsAdmitted(j.status->id())) {
      m.MarkEvicting(j.status->id(), *j.preempted_for);
    }
  }
  return m;
}

int JobQueues::WaitingFor(const JobRef& job, const std::vector<JobRef>& jobs) {
  int waiting = 0;
  for (const JobRef& j : jobs) {
    if (j.preempting && j.preempted_for != nullptr && *j.preempted_for == job.status->id()) {
      ++waiting;
    }
  }
  return waiting;
}

std::optional<PreemptionDecision> JobQueues::FindVictims(const JobRef& job,
                                                         const std::vector<JobRef>& jobs) const {
  if (!config_) return std::nullopt;
  const int q = QueueOf(*job.status);
  if (q < 0) return std::nullopt;
  QueueManager m = Manager(jobs);
  const Workload* w = m.Find(job.status->id());
  if (w == nullptr || m.IsAdmitted(w->id)) return std::nullopt;
  return FindPreemption(m, *w);
}

std::vector<QueueSummary> JobQueues::Summaries(const std::vector<JobRef>& jobs,
                                               std::map<std::string, int>* positions) const {
  if (!config_) return {};
  QueueManager m = Manager(jobs);
  if (positions != nullptr) {
    for (const JobRef& j : jobs) {
      if (j.status->state() != v1::QUEUED) continue;
      const int p = m.QueuePosition(j.status->id());
      if (p > 0) (*positions)[j.status->id()] = p;
    }
  }
  return m.Summaries();
}

absl::Status JobQueues::CheckApply(const QueueConfig& next, const std::vector<JobRef>& jobs) const {
  std::map<std::string, Resources> usage;
  for (const JobRef& j : jobs) {
    if (!Running(j)) continue;
    std::string name = j.status->queue();
    if (name.empty()) {
      const int q = QueueOf(*j.status);
      if (q >= 0) name = config_->queues[q].name;
    }
    if (name.empty()) {
      // Runs outside any queue (no file before, or an owner in none): it
      // counts in its owner's queue of the new file, if any.
      absl::StatusOr<int> q = next.Resolve(j.status->owner(), {}, "");
      if (!q.ok()) continue;
      name = next.queues[*q].name;
    }
    usage[name] += Gang(j.status->spec(), j.status->trainers_size());
  }
  return CheckQuotaChange(next, usage);
}

void JobQueues::Replace(QueueConfig next, std::string yaml) {
  config_ = std::move(next);
  yaml_ = std::move(yaml);
  default_of_owner_.clear();
}

void JobQueues::RecordAdmission(const std::string& queue, double wait_seconds) {
  if (!config_) return;
  Counters& c = counters_[queue];
  size_t b = 0;
  while (b < std::size(kAdmissionWaitBounds) && wait_seconds > kAdmissionWaitBounds[b]) ++b;
  ++c.wait_counts[b];
  c.wait_sum += wait_seconds;
}

void JobQueues::RecordPreemption(const std::string& queue, const Victim& victim) {
  ++counters_[queue].preemptions[victim.trainers_after > 0 ? kShrinkReason : RuleName(victim.rule)];
}

void JobQueues::RecordDeviceSeconds(const std::string& queue, const std::string& user,
                                    double seconds) {
  if (!config_ || seconds <= 0) return;
  counters_[queue].device_seconds[user] += seconds;
}

std::map<std::string, double> JobQueues::DeviceSeconds(const std::string& queue) const {
  auto c = counters_.find(queue);
  return c == counters_.end() ? std::map<std::string, double>() : c->second.device_seconds;
}

std::vector<QueueMetrics> JobQueues::Metrics(const std::vector<JobRef>& jobs,
                                             int64_t now_unix_ms) const {
  std::vector<QueueMetrics> out;
  if (!config_) return out;
  const std::optional<QuotaState> usage = Usage(jobs);
  for (QueueSummary& s : Summaries(jobs)) {
    QueueMetrics m;
    m.summary = std::move(s);
    auto c = counters_.find(m.summary.name);
    const Counters counters = c == counters_.end() ? Counters() : c->second;
    for (const char* reason :
         {RuleName(PreemptRule::kWithinQueue), RuleName(PreemptRule::kReclaimWithinCohort),
          static_cast<const char*>(kShrinkReason)}) {
      auto n = counters.preemptions.find(reason);
      m.preemptions[reason] = n == counters.preemptions.end() ? 0 : n->second;
    }
    m.wait_counts = counters.wait_counts;
    m.wait_sum = counters.wait_sum;
    out.push_back(std::move(m));
  }
  for (const JobRef& j : jobs) {
    if (j.status->state() != v1::QUEUED) continue;
    const int q = QueueOf(*j.status);
    if (q < 0 || !usage->Fits(q, Gang(j.status->spec(), j.status->spec().num_trainers()))) {
      continue;
    }
    QueueMetrics& m = out[q];
    ++m.pending_within_quota;
    m.oldest_pending_within_quota_seconds =
        std::max(m.oldest_pending_within_quota_seconds, QueuedSeconds(*j.status, now_unix_ms));
  }
  return out;
}

}  // namespace scheduler
}  // namespace dtrain
