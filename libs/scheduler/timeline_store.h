// The timelines trainers upload with their progress reports
// (ProgressReport.timeline), kept for JobService.GetTimeline: per job, the
// newest upload of every rank of the job's newest attempt. In memory only
// (not in the job log: a restarted scheduler has none) and bounded: the
// newest `max_jobs` jobs (by upload), at most `max_spans_per_rank` spans per
// rank (the newest).
//
// Thread-safety: thread-safe.
#ifndef DTRAIN_LIBS_SCHEDULER_TIMELINE_STORE_H_
#define DTRAIN_LIBS_SCHEDULER_TIMELINE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace scheduler {

class TimelineStore {
 public:
  explicit TimelineStore(size_t max_jobs = 64, int max_spans_per_rank = 16384);

  // Keeps `t` as rank t.rank()'s timeline of `job_id`. An upload of a newer
  // attempt drops the older attempt's ranks; one of an older attempt than
  // the kept one is ignored. The job becomes the newest.
  void Put(const std::string& job_id, scheduler::v1::RankTimeline t);

  // The kept ranks of `job_id`, by rank. NotFound when none.
  absl::StatusOr<scheduler::v1::Timeline> Get(const std::string& job_id) const;

 private:
  struct Entry {
    int32_t attempt = 0;
    std::map<int32_t, scheduler::v1::RankTimeline> ranks;
    std::list<std::string>::iterator order;
  };
  const size_t max_jobs_;
  const int max_spans_per_rank_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> order_ ABSL_GUARDED_BY(mu_);  // oldest upload first
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_TIMELINE_STORE_H_
