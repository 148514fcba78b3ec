// SchedulerStore: a collective::Store kept by the scheduler, so the trainers
// of a multi-trainer job can find each other wherever they run
// (ClusterService.StoreSet / StoreGet / StoreAdd).
//
//   SchedulerStore store(stub, trainer_id, assignment.job_id(), assignment.attempt());
//   DT_ASSIGN_OR_RETURN(auto comm, collective::Communicator::Create(rank, size, &store, o));
//
// The scheduler keeps one table per job attempt and drops it when the job
// leaves RUNNING, so keys never leak into the next attempt or job.
//
// Failures: each call has a deadline (rpc_timeout); calls that fail with a
// transient error (IsTransient in libs/base/retry.h: the scheduler
// restarting, a lost reply) are retried with backoff for up to retry_for. Set is idempotent; Add
// carries a request id the scheduler deduplicates, so a retried Add counts
// once. Other errors (the job ended, a bad key, a full table) return at
// once, prefixed with the RPC name. Get waits in slices of at most
// kMaxStoreWait inside the scheduler and returns DEADLINE_EXCEEDED naming
// the key once `timeout` has passed; Get with no timeout (a poll) is
// retried for 250 ms only (its caller polls again).
//
// Thread-safe (the gRPC stub is).
#ifndef DTRAIN_SERVICES_TRAINER_SCHEDULER_STORE_H_
#define DTRAIN_SERVICES_TRAINER_SCHEDULER_STORE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/collective/store.h"
#include "protos/scheduler.grpc.pb.h"

namespace dtrain {
namespace trainer {

struct SchedulerStoreOptions {
  // Deadline of each call (Get: on top of its wait).
  absl::Duration rpc_timeout = absl::Seconds(5);
  // How long transient failures are retried.
  absl::Duration retry_for = absl::Seconds(30);
};

class SchedulerStore : public collective::Store {
 public:
  // `stub` is not owned and must outlive the store.
  SchedulerStore(scheduler::v1::ClusterService::StubInterface* stub, std::string trainer_id,
                 std::string job_id, int attempt, SchedulerStoreOptions options = {});

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  // Runs `call` until it succeeds, fails for good, or retry_for (bounded by
  // `until`) has passed.
  absl::Status WithRetries(absl::string_view what, absl::Time until,
                           absl::FunctionRef<absl::Status()> call);

  scheduler::v1::ClusterService::StubInterface* const stub_;
  const std::string trainer_id_;
  const std::string job_id_;
  const int attempt_;
  const SchedulerStoreOptions options_;
  const uint64_t id_base_;
  std::atomic<uint64_t> next_request_{1};
};

}  // namespace trainer
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINER_SCHEDULER_STORE_H_
