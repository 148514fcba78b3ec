// Which errors are worth another attempt, and how to retry them.
//
//   RetryPolicy policy;
//   policy.timeout = absl::Seconds(30);
//   absl::Status s = Retry(policy, [&] { return CallTheScheduler(); });
//
// Every client in dtrain (the kvstore client, the trainers' rendezvous
// store, trainctl) decides "transient?" with IsTransient and waits with
// Retry, so one set of codes means the same thing everywhere.
#ifndef DTRAIN_LIBS_BASE_RETRY_H_
#define DTRAIN_LIBS_BASE_RETRY_H_

#include <functional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace dtrain {

// True for errors that may go away if the same call is made again:
//   UNAVAILABLE        the server is down, restarting or not reachable yet;
//   DEADLINE_EXCEEDED  this attempt ran out of time (the server may be slow
//                      or a round not complete yet);
//   ABORTED            a conflict (gRPC's "retry at a higher level").
// Not RESOURCE_EXHAUSTED: our servers return it for quotas and size limits
// (kvstore's bytes per job, the scheduler's key and value limits, gRPC's
// message size), which the same call hits again. Not UNKNOWN or INTERNAL:
// they are bugs or damaged data, and retrying hides them. A call is retried
// only if it is safe to repeat (idempotent, or deduplicated by a request
// id); that is the caller's decision, not this function's.
bool IsTransient(const absl::Status& status);

// How often and how long to retry. Waits grow exponentially from
// initial_backoff by `multiplier` up to max_backoff; each wait is scaled by
// a random factor in [1 - jitter, 1 + jitter] so that clients that failed
// together do not retry together.
struct RetryPolicy {
  // Attempts in all (the first one included); 0: no limit.
  int max_attempts = 0;
  // No new attempt starts once this much time has passed since the first;
  // a wait that would end later is not begun. InfiniteDuration: no limit.
  // With neither limit, Retry retries a transient error forever.
  absl::Duration timeout = absl::InfiniteDuration();
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  double multiplier = 2;
  double jitter = 0.2;  // in [0, 1]
};

// Optional hooks of Retry.
struct RetryHooks {
  // Called before each wait with the error of the attempt just made, the
  // number of attempts made so far, and the wait (for logging).
  std::function<void(const absl::Status& error, int attempts, absl::Duration wait)> on_retry;
  // Waits for `wait`; returns true if the retries should stop (a shutdown
  // signal, a cancelled call). Default: sleeps and returns false. Waiting on
  // a notification makes the wait end early; tests record the waits here.
  std::function<bool(absl::Duration wait)> wait;
};

// Calls `attempt` until it returns OK or an error that is not transient
// (IsTransient), max_attempts were made, the next wait would end after
// `timeout`, or hooks.wait returned true; returns the status of the last
// attempt. Invalid policies (negative values, jitter outside [0, 1],
// multiplier < 1) are our own bugs and CHECK-fail.
absl::Status Retry(const RetryPolicy& policy, absl::FunctionRef<absl::Status()> attempt,
                   const RetryHooks& hooks = {});

// The wait after `attempts` failed attempts (1 for the first wait), without
// jitter: min(initial_backoff * multiplier^(attempts-1), max_backoff).
absl::Duration BackoffBeforeJitter(const RetryPolicy& policy, int attempts);

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_RETRY_H_
