#include "services/trainer/scheduler_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/retry.h"

namespace dtrain {
namespace trainer {
namespace {

namespace v1 = scheduler::v1;

// The scheduler's cap on one StoreGet wait (scheduler::kMaxStoreWait).
constexpr absl::Duration kWaitSlice = absl::Seconds(5);

// How long a poll (Get with no timeout) is retried: a lost reply or two,
// not a scheduler restart.
constexpr absl::Duration kPollRetryFor = absl::Milliseconds(250);

uint64_t RandomBase() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v & ~uint64_t{0xFFFFFFFF};  // the low half counts requests
}

}  // namespace

SchedulerStore::SchedulerStore(v1::ClusterService::StubInterface* stub, std::string trainer_id,
                               std::string job_id, int attempt, SchedulerStoreOptions options)
    : stub_(stub),
      trainer_id_(std::move(trainer_id)),
      job_id_(std::move(job_id)),
      attempt_(attempt),
      options_(options),
      id_base_(RandomBase() | (uint64_t{1} << 63)) {}

absl::Status SchedulerStore::WithRetries(absl::string_view what, absl::Time until,
                                         absl::FunctionRef<absl::Status()> call) {
  RetryPolicy policy;
  policy.timeout = std::clamp(until - absl::Now(), absl::ZeroDuration(), options_.retry_for);
  policy.initial_backoff = absl::Milliseconds(50);
  policy.max_backoff = absl::Seconds(1);
  RetryHooks hooks;
  hooks.on_retry = [what](const absl::Status& error, int, absl::Duration wait) {
    DT_LOG(WARNING) << what << ": " << error << "; retrying in " << wait;
  };
  return Retry(policy, call, hooks);
}

absl::Status SchedulerStore::Set(absl::string_view key, absl::string_view value) {
  v1::StoreSetRequest req;
  req.set_trainer_id(trainer_id_);
  req.set_job_id(job_id_);
  req.set_attempt(attempt_);
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  return WithRetries(absl::StrCat("StoreSet ", key), absl::InfiniteFuture(), [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    v1::StoreSetReply reply;
    return FromGrpcStatus(stub_->StoreSet(&ctx, req, &reply), "ClusterService.StoreSet");
  });
}

absl::StatusOr<std::string> SchedulerStore::Get(absl::string_view key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + std::max(timeout, absl::ZeroDuration());
  v1::StoreGetRequest req;
  req.set_trainer_id(trainer_id_);
  req.set_job_id(job_id_);
  req.set_attempt(attempt_);
  req.set_key(std::string(key));
  // A poll (no timeout) is retried for kPollRetryFor only: its caller
  // reads again later, and a drain poll retried while the scheduler was
  // away held up training for 5 s (rpc_timeout) at a time. A wait retries
  // until its deadline and one RPC timeout more.
  const absl::Time retry_until = timeout <= absl::ZeroDuration() ? absl::Now() + kPollRetryFor
                                                                 : deadline + options_.rpc_timeout;
  while (true) {
    const absl::Duration wait =
        std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kWaitSlice);
    req.set_wait_ms(absl::ToInt64Milliseconds(wait));
    v1::StoreGetReply reply;
    absl::Status s = WithRetries(absl::StrCat("StoreGet ", key), retry_until, [&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + wait + options_.rpc_timeout));
      return FromGrpcStatus(stub_->StoreGet(&ctx, req, &reply), "ClusterService.StoreGet");
    });
    if (!s.ok()) return s;
    if (reply.found()) return std::move(*reply.mutable_value());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous key '", key, "' of job ", job_id_, " attempt ", attempt_,
                       " still missing after ", absl::FormatDuration(timeout)));
    }
  }
}

absl::StatusOr<int64_t> SchedulerStore::Add(absl::string_view key, int64_t delta) {
  v1::StoreAddRequest req;
  req.set_trainer_id(trainer_id_);
  req.set_job_id(job_id_);
  req.set_attempt(attempt_);
  req.set_key(std::string(key));
  req.set_delta(delta);
  req.set_request_id(id_base_ | next_request_.fetch_add(1));
  v1::StoreAddReply reply;
  absl::Status s = WithRetries(absl::StrCat("StoreAdd ", key), absl::InfiniteFuture(), [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    return FromGrpcStatus(stub_->StoreAdd(&ctx, req, &reply), "ClusterService.StoreAdd");
  });
  if (!s.ok()) return s;
  return reply.value();
}

}  // namespace trainer
}  // namespace dtrain
