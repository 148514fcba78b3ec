#include "libs/base/retry.h"

#include <algorithm>
#include <optional>

#include "absl/random/random.h"
#include "absl/time/clock.h"
#include "libs/base/logging.h"

namespace dtrain {

bool IsTransient(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) || absl::IsAborted(status);
}

absl::Duration BackoffBeforeJitter(const RetryPolicy& policy, int attempts) {
  absl::Duration wait = policy.initial_backoff;
  for (int i = 1; i < attempts && wait < policy.max_backoff; ++i) wait = wait * policy.multiplier;
  return std::min(wait, policy.max_backoff);
}

absl::Status Retry(const RetryPolicy& policy, absl::FunctionRef<absl::Status()> attempt,
                   const RetryHooks& hooks) {
  DT_CHECK(policy.max_attempts >= 0) << "RetryPolicy.max_attempts " << policy.max_attempts;
  DT_CHECK(policy.timeout >= absl::ZeroDuration()) << "RetryPolicy.timeout " << policy.timeout;
  DT_CHECK(policy.initial_backoff >= absl::ZeroDuration() &&
           policy.max_backoff >= policy.initial_backoff)
      << "RetryPolicy backoff " << policy.initial_backoff << " to " << policy.max_backoff;
  DT_CHECK(policy.multiplier >= 1) << "RetryPolicy.multiplier " << policy.multiplier;
  DT_CHECK(policy.jitter >= 0 && policy.jitter <= 1) << "RetryPolicy.jitter " << policy.jitter;
  const absl::Time deadline = absl::Now() + policy.timeout;  // infinite stays infinite
  std::optional<absl::BitGen> random;  // seeded on the first retry: success costs nothing
  for (int attempts = 1;; ++attempts) {
    absl::Status status = attempt();
    if (status.ok() || !IsTransient(status)) return status;
    if (policy.max_attempts > 0 && attempts >= policy.max_attempts) return status;
    absl::Duration wait = BackoffBeforeJitter(policy, attempts);
    if (policy.jitter > 0) {
      if (!random) random.emplace();
      wait = wait * absl::Uniform(*random, 1 - policy.jitter, 1 + policy.jitter);
    }
    if (absl::Now() + wait > deadline) return status;
    if (hooks.on_retry) hooks.on_retry(status, attempts, wait);
    if (hooks.wait) {
      if (hooks.wait(wait)) return status;
    } else {
      absl::SleepFor(wait);
    }
  }
}

}  // namespace dtrain
