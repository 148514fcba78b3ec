#include "libs/scheduler/queue_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "libs/scheduler/fair_sharing.h"

namespace dtrain {
namespace scheduler {
namespace {

std::string Amount(int64_t v) { return v >= kUnlimited ? "unlimited" : absl::StrCat(v); }

int64_t CappedSum(int64_t a, int64_t b) { return std::min(kUnlimited, a + b); }

}  // namespace

QuotaState::QuotaState(const QueueConfig* config, Resources capacity)
    : config_(config), capacity_(capacity), usage_(config->queues.size()) {}

Resources QuotaState::PoolCapacity(int q) const {
  const std::string& cohort = config_->queues[q].cohort;
  Resources out;
  if (cohort.empty()) return out;
  for (const QueueSpec& m : config_->queues) {
    if (m.cohort == cohort) out += m.lending_limit;
  }
  return out;
}

Resources QuotaState::PoolUsed(int q) const {
  const std::string& cohort = config_->queues[q].cohort;
  Resources out;
  if (cohort.empty()) return out;
  for (size_t i = 0; i < config_->queues.size(); ++i) {
    const QueueSpec& m = config_->queues[i];
    if (m.cohort != cohort) continue;
    for (int r = 0; r < kNumResources; ++r) {
      out[r] += std::max<int64_t>(0, usage_[i][r] - (m.quota[r] - m.lending_limit[r]));
    }
  }
  return out;
}

int64_t QuotaState::Available(int q, int r) const {
  const QueueSpec& s = config_->queues[q];
  int64_t avail = capacity_[r] >= kUnlimited ? kUnlimited : capacity_[r] - total_[r];
  if (!s.managed[r]) return avail;
  const int64_t used = usage_[q][r];
  if (s.cohort.empty()) return std::min(avail, s.quota[r] - used);
  avail = std::min(avail, CappedSum(s.quota[r], s.borrowing_limit[r]) - used);
  const int64_t guaranteed = s.quota[r] - s.lending_limit[r];
  int64_t pool_free = PoolCapacity(q)[r] - PoolUsed(q)[r];
  return std::min(avail, std::max<int64_t>(0, guaranteed - used) + pool_free);
}

bool QuotaState::Fits(int q, const Resources& request, std::string* reason) const {
  const QueueSpec& s = config_->queues[q];
  for (int r = 0; r < kNumResources; ++r) {
    if (request[r] <= 0 || request[r] <= Available(q, r)) continue;
    if (reason == nullptr) return false;
    const int64_t used = usage_[q][r];
    const char* name = ResourceName(r);
    if (capacity_[r] < kUnlimited && total_[r] + request[r] > capacity_[r] &&
        (!s.managed[r] || used + request[r] <= s.quota[r])) {
      *reason = absl::StrCat("cluster: ", name, " ", total_[r], " in use + ", request[r],
                             " requested > capacity ", capacity_[r]);
    } else if (s.cohort.empty()) {
      *reason = absl::StrCat("queue ", s.name, ": ", name, " ", used, " in use + ", request[r],
                             " requested > quota ", s.quota[r]);
    } else if (used + request[r] > CappedSum(s.quota[r], s.borrowing_limit[r])) {
      *reason = absl::StrCat("queue ", s.name, ": ", name, " ", used, " in use + ", request[r],
                             " requested > quota ", s.quota[r], " + borrowing limit ",
                             Amount(s.borrowing_limit[r]));
    } else if (used + request[r] <= s.quota[r]) {
      int64_t borrowed = 0;  // by the other queues of the cohort
      for (size_t i = 0; i < config_->queues.size(); ++i) {
        const QueueSpec& o = config_->queues[i];
        if (static_cast<int>(i) != q && o.cohort == s.cohort && o.managed[r]) {
          borrowed += std::max<int64_t>(0, usage_[i][r] - o.quota[r]);
        }
      }
      *reason = absl::StrCat("queue ", s.name, ": ", name, " ", used, " in use + ", request[r],
                             " requested is within quota ", s.quota[r],
                             ", but other queues of cohort ", s.cohort, " borrow ", borrowed,
                             " of it; reclaim is ", PolicyName(s.reclaim_within_cohort));
    } else {
      const int64_t borrowable = std::max<int64_t>(0, used + Available(q, r) - s.quota[r]);
      *reason = absl::StrCat("queue ", s.name, ": ", name, " ", used, " in use + ", request[r],
                             " requested > quota ", s.quota[r], " + borrowable ", borrowable,
                             " (cohort ", s.cohort, ": ", PoolUsed(q)[r], " of ",
                             PoolCapacity(q)[r], " shared in use)");
    }
    return false;
  }
  return true;
}

bool QuotaState::WithinNominal(int q, const Resources& request) const {
  const QueueSpec& s = config_->queues[q];
  for (int r = 0; r < kNumResources; ++r) {
    if (s.managed[r] && usage_[q][r] + request[r] > s.quota[r]) return false;
  }
  return true;
}

bool QuotaState::Borrowing(int q) const {
  const QueueSpec& s = config_->queues[q];
  for (int r = 0; r < kNumResources; ++r) {
    if (s.managed[r] && usage_[q][r] > s.quota[r]) return true;
  }
  return false;
}

void QuotaState::Add(int q, const Resources& r) {
  usage_[q] += r;
  total_ += r;
}

void QuotaState::Remove(int q, const Resources& r) {
  usage_[q] -= r;
  total_ -= r;
}

QueueManager::QueueManager(QueueConfig config, Resources capacity)
    : config_(std::move(config)),
      quota_(&config_, capacity),
      admitted_(config_.queues.size()),
      pending_(config_.queues.size()),
      pending_count_(config_.queues.size(), 0),
      user_usage_(config_.queues.size()) {}

absl::Status QueueManager::AddPending(const Workload& w) {
  const int q = config_.Find(w.queue);
  if (q < 0) return absl::InvalidArgumentError(absl::StrCat("unknown queue '", w.queue, "'"));
  if (entries_.count(w.id)) {
    return absl::InvalidArgumentError(absl::StrCat("workload ", w.id, " is already queued"));
  }
  if (w.trainers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("workload ", w.id, " asks for no trainers"));
  }
  const QueueSpec& s = config_.queues[q];
  const Resources req = w.Request();
  for (int r = 0; r < kNumResources; ++r) {
    if (!s.managed[r]) continue;
    const int64_t limit = CappedSum(s.quota[r], s.cohort.empty() ? 0 : s.borrowing_limit[r]);
    const int64_t pool_limit =
        s.cohort.empty() ? s.quota[r] : s.quota[r] - s.lending_limit[r] + quota_.PoolCapacity(q)[r];
    if (req[r] > std::min(limit, pool_limit)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job needs ", ResourceName(r), " ", req[r], " but queue ", s.name,
          " can never have more than ", std::min(limit, pool_limit), " (quota ", s.quota[r],
          s.cohort.empty() ? "" : absl::StrCat(" + borrowing limit ", Amount(s.borrowing_limit[r])),
          "); ask for less or use another queue"));
    }
  }
  Entry& e = entries_[w.id];
  e.w = w;
  e.q = q;
  e.seq = next_seq_++;
  InsertPending(e);
  return absl::OkStatus();
}

void QueueManager::InsertPending(Entry& e) {
  pending_[e.q][e.w.priority][e.w.user].emplace(Key{e.w.submit_time, e.seq}, e.w.id);
  ++pending_count_[e.q];
  ++num_pending_;
}

void QueueManager::ErasePending(const Entry& e) {
  Levels& levels = pending_[e.q];
  auto level = levels.find(e.w.priority);
  auto user = level->second.find(e.w.user);
  user->second.erase(Key{e.w.submit_time, e.seq});
  if (user->second.empty()) level->second.erase(user);
  if (level->second.empty()) levels.erase(level);
  --pending_count_[e.q];
  --num_pending_;
}

absl::Status QueueManager::RemovePending(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.admitted) {
    return absl::NotFoundError(absl::StrCat("workload ", id, " is not pending"));
  }
  ErasePending(it->second);
  entries_.erase(it);
  return absl::OkStatus();
}

absl::Status QueueManager::Admit(const std::string& id, double now) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.admitted) {
    return absl::NotFoundError(absl::StrCat("workload ", id, " is not pending"));
  }
  Entry& e = it->second;
  ErasePending(e);
  e.admitted = true;
  e.admit_time = now;
  e.waiting_for = 0;
  admitted_[e.q].insert(id);
  ++num_admitted_;
  const Resources req = e.w.Request();
  quota_.Add(e.q, req);
  user_usage_[e.q][e.w.user] += req;
  return absl::OkStatus();
}

void QueueManager::ReleaseVictim(Entry& e) {
  if (e.evicting_for.empty()) return;
  auto p = entries_.find(e.evicting_for);
  if (p != entries_.end() && p->second.waiting_for > 0) --p->second.waiting_for;
  e.evicting_for.clear();
}

void QueueManager::Unadmit(Entry& e) {
  ReleaseVictim(e);
  const Resources req = e.w.Request();
  quota_.Remove(e.q, req);
  Resources& u = user_usage_[e.q][e.w.user];
  u -= req;
  if (u.IsZero()) user_usage_[e.q].erase(e.w.user);
  admitted_[e.q].erase(e.w.id);
  --num_admitted_;
}

absl::Status QueueManager::Finish(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.admitted) {
    return absl::NotFoundError(absl::StrCat("workload ", id, " is not admitted"));
  }
  Entry& e = it->second;
  Unadmit(e);
  entries_.erase(it);
  return absl::OkStatus();
}

absl::Status QueueManager::Requeue(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.admitted) {
    return absl::NotFoundError(absl::StrCat("workload ", id, " is not admitted"));
  }
  Entry& e = it->second;
  Unadmit(e);
  e.admitted = false;
  InsertPending(e);
  return absl::OkStatus();
}

absl::Status QueueManager::Resize(const std::string& id, int trainers) {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.admitted) {
    return absl::NotFoundError(absl::StrCat("workload ", id, " is not admitted"));
  }
  Entry& e = it->second;
  if (trainers < std::max(1, e.w.min_trainers)) {
    return absl::InvalidArgumentError(absl::StrCat("workload ", id, " cannot run on ", trainers,
                                                   " trainers (min_trainers ", e.w.min_trainers,
                                                   ")"));
  }
  ReleaseVictim(e);
  const Resources before = e.w.Request();
  quota_.Remove(e.q, before);
  user_usage_[e.q][e.w.user] -= before;
  e.w.trainers = trainers;
  const Resources after = e.w.Request();
  quota_.Add(e.q, after);
  user_usage_[e.q][e.w.user] += after;
  return absl::OkStatus();
}

void QueueManager::MarkEvicting(const std::string& id, const std::string& preemptor) {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.admitted || !it->second.evicting_for.empty()) return;
  it->second.evicting_for = preemptor;
  auto p = entries_.find(preemptor);
  if (p != entries_.end()) ++p->second.waiting_for;
}

const Workload* QueueManager::Find(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.w;
}

bool QueueManager::IsAdmitted(const std::string& id) const {
  auto it = entries_.find(id);
  return it != entries_.end() && it->second.admitted;
}

bool QueueManager::IsEvicting(const std::string& id) const {
  auto it = entries_.find(id);
  return it != entries_.end() && !it->second.evicting_for.empty();
}

int QueueManager::WaitingForVictims(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second.waiting_for;
}

double QueueManager::AdmitTime(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second.admit_time;
}

std::vector<const Workload*> QueueManager::AdmittedIn(int q) const {
  std::vector<const Workload*> out;
  out.reserve(admitted_[q].size());
  for (const std::string& id : admitted_[q]) out.push_back(&entries_.at(id).w);
  return out;
}

std::map<std::string, Resources> QueueManager::UsageByQueue() const {
  std::map<std::string, Resources> out;
  for (size_t q = 0; q < config_.queues.size(); ++q) {
    out[config_.queues[q].name] = quota_.usage(static_cast<int>(q));
  }
  return out;
}

std::vector<QueueSummary> QueueManager::Summaries() const {
  std::vector<QueueSummary> out;
  for (int q = 0; q < static_cast<int>(config_.queues.size()); ++q) {
    const QueueSpec& spec = config_.queues[q];
    QueueSummary s;
    s.name = spec.name;
    s.cohort = spec.cohort;
    s.managed = spec.managed;
    s.quota = spec.quota;
    s.usage = quota_.usage(q);
    for (int r = 0; r < kNumResources; ++r) {
      if (spec.managed[r]) s.borrowed[r] = std::max<int64_t>(0, s.usage[r] - spec.quota[r]);
      s.available[r] = std::max<int64_t>(0, quota_.Available(q, r));
    }
    s.pending = pending_count_[q];
    s.admitted = static_cast<int>(admitted_[q].size());
    out.push_back(std::move(s));
  }
  // Each cohort's borrowing, counted against its lenders in file order.
  std::map<std::string, Resources> to_lend;
  for (const QueueSummary& s : out) {
    if (!s.cohort.empty()) to_lend[s.cohort] += s.borrowed;
  }
  for (int q = 0; q < static_cast<int>(out.size()); ++q) {
    QueueSummary& s = out[q];
    if (s.cohort.empty()) continue;
    Resources& left = to_lend[s.cohort];
    for (int r = 0; r < kNumResources; ++r) {
      const int64_t unused = std::max<int64_t>(0, s.quota[r] - s.usage[r]);
      s.lent[r] = std::min({left[r], unused, config_.queues[q].lending_limit[r]});
      left[r] -= s.lent[r];
    }
  }
  return out;
}

const Resources& QueueManager::UserUsage(int q, const std::string& user) const {
  static const Resources kNone;
  auto it = user_usage_[q].find(user);
  return it == user_usage_[q].end() ? kNone : it->second;
}

void QueueManager::ForEachPending(int q, const std::function<bool(const Workload&)>& visit) const {
  const QueueSpec& spec = config_.queues[q];
  for (const auto& [priority, users] : pending_[q]) {
    // Users by share, then by their oldest job.
    std::vector<std::pair<std::pair<double, Key>, const std::map<Key, std::string>*>> order;
    order.reserve(users.size());
    for (const auto& [user, jobs] : users) {
      order.push_back({{UserShare(spec, UserUsage(q, user)), jobs.begin()->first}, &jobs});
    }
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first.first != b.first.first ? a.first.first < b.first.first
                                            : a.first.second < b.first.second;
    });
    for (const auto& [rank, jobs] : order) {
      for (const auto& [key, id] : *jobs) {
        if (!visit(entries_.at(id).w)) return;
      }
    }
  }
}

int QueueManager::QueuePosition(const std::string& id) const {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.admitted) return 0;
  int position = 0, found = 0;
  ForEachPending(it->second.q, [&](const Workload& w) {
    ++position;
    if (w.id == id) found = position;
    return found == 0;
  });
  return found;
}

}  // namespace scheduler
}  // namespace dtrain
