#include "libs/scheduler/timeline_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace scheduler {

TimelineStore::TimelineStore(size_t max_jobs, int max_spans_per_rank)
    : max_jobs_(std::max<size_t>(max_jobs, 1)), max_spans_per_rank_(max_spans_per_rank) {}

void TimelineStore::Put(const std::string& job_id, v1::RankTimeline t) {
  if (t.spans_size() > max_spans_per_rank_) {
    const int extra = t.spans_size() - max_spans_per_rank_;
    t.mutable_spans()->DeleteSubrange(0, extra);
    t.set_dropped_spans(t.dropped_spans() + extra);
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    it = jobs_.emplace(job_id, Entry{}).first;
    it->second.attempt = t.attempt();
    order_.push_back(job_id);
  } else {
    if (t.attempt() < it->second.attempt) return;
    if (t.attempt() > it->second.attempt) {
      it->second.ranks.clear();
      it->second.attempt = t.attempt();
    }
    order_.erase(it->second.order);
    order_.push_back(job_id);
  }
  it->second.order = std::prev(order_.end());
  const int32_t rank = t.rank();
  it->second.ranks[rank] = std::move(t);
  while (jobs_.size() > max_jobs_) {
    jobs_.erase(order_.front());
    order_.pop_front();
  }
}

absl::StatusOr<v1::Timeline> TimelineStore::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no timeline for job ", job_id,
        ": its ranks upload spans with their final report (rank 0 also after every epoch), and "
        "the scheduler keeps them in memory for its newest ",
        max_jobs_, " jobs"));
  }
  v1::Timeline out;
  out.set_job_id(job_id);
  for (const auto& [rank, t] : it->second.ranks) *out.add_ranks() = t;
  return out;
}

}  // namespace scheduler
}  // namespace dtrain
