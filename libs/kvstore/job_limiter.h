// Per-job caps on what a shared server has a fixed amount of (calls in
// flight, connections), so that one job cannot take what the others need:
// a trainer that holds hundreds of pulls for a round that never completes
// gets RESOURCE_EXHAUSTED for its own further calls while other jobs' calls
// still find threads. Thread-safe.
//
//   JobLimiter calls(128, "calls in flight", "--max_calls_per_job");
//   DT_ASSIGN_OR_RETURN(JobLimiter::Hold hold, calls.Acquire(grant.job, grant.workers));
//   ...  // the call; `hold` gives its place back when destroyed
//
// A job of many trainers needs more at once (each holds a pull for its
// round while it pushes): its cap is the larger of `cap` and kPerWorker per
// trainer its token names (security::JobGrant::workers, which the
// scheduler signs), so a job of over cap / kPerWorker trainers is not
// refused by its own size.
#ifndef DTRAIN_LIBS_KVSTORE_JOB_LIMITER_H_
#define DTRAIN_LIBS_KVSTORE_JOB_LIMITER_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {
namespace kvstore {

class JobLimiter {
 public:
  // Places per trainer of a job.
  static constexpr int kPerWorker = 4;

  // At most `cap` at once per job (0: no cap), or kPerWorker per trainer
  // where that is more. `what` names the resource and `knob` the setting
  // that raises the cap, in errors.
  JobLimiter(int cap, std::string what, std::string knob);
  JobLimiter(const JobLimiter&) = delete;
  JobLimiter& operator=(const JobLimiter&) = delete;

  // One job's place, given back when destroyed (a default one holds none).
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& other) noexcept;
    Hold& operator=(Hold&& other) noexcept;
    ~Hold();

   private:
    friend class JobLimiter;
    Hold(JobLimiter* limiter, std::string job) : limiter_(limiter), job_(std::move(job)) {}
    JobLimiter* limiter_ = nullptr;
    std::string job_;
  };

  // A place for `job`, an attempt of `workers` trainers (0: unknown):
  // kResourceExhausted, naming the job, the cap and the knob, when the job
  // holds its cap already.
  absl::StatusOr<Hold> Acquire(const std::string& job, int workers = 0);
  // Places `job` holds now.
  int InUse(const std::string& job) const;

 private:
  void Release(const std::string& job);

  const int cap_;
  const std::string what_, knob_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> in_use_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_JOB_LIMITER_H_
