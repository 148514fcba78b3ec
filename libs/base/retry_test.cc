#include "libs/base/retry.h"

#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(IsTransientTest, OnlyTheRetryableCodes) {
  EXPECT_TRUE(IsTransient(absl::UnavailableError("down")));
  EXPECT_TRUE(IsTransient(absl::DeadlineExceededError("slow")));
  EXPECT_TRUE(IsTransient(absl::AbortedError("conflict")));
  EXPECT_FALSE(IsTransient(absl::OkStatus()));
  EXPECT_FALSE(IsTransient(absl::ResourceExhaustedError("quota")));
  EXPECT_FALSE(IsTransient(absl::InvalidArgumentError("bad")));
  EXPECT_FALSE(IsTransient(absl::NotFoundError("gone")));
  EXPECT_FALSE(IsTransient(absl::InternalError("bug")));
  EXPECT_FALSE(IsTransient(absl::UnknownError("?")));
  EXPECT_FALSE(IsTransient(absl::CancelledError("cancelled")));
  EXPECT_FALSE(IsTransient(absl::FailedPreconditionError("state")));
  EXPECT_FALSE(IsTransient(absl::PermissionDeniedError("no")));
}

// Records the waits instead of sleeping.
struct Recorder {
  std::vector<absl::Duration> waits;
  RetryHooks Hooks() {
    RetryHooks hooks;
    hooks.wait = [this](absl::Duration d) {
      waits.push_back(d);
      return false;
    };
    return hooks;
  }
};

TEST(RetryTest, ReturnsAtOnceOnSuccess) {
  Recorder r;
  int calls = 0;
  absl::Status s = Retry(
      RetryPolicy(),
      [&] {
        ++calls;
        return absl::OkStatus();
      },
      r.Hooks());
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(r.waits.empty());
}

TEST(RetryTest, RetriesTransientErrorsUntilSuccess) {
  Recorder r;
  int calls = 0;
  absl::Status s = Retry(
      RetryPolicy(),
      [&] {
        ++calls;
        if (calls == 1) return absl::UnavailableError("restarting");
        if (calls == 2) return absl::DeadlineExceededError("slow");
        if (calls == 3) return absl::AbortedError("conflict");
        return absl::OkStatus();
      },
      r.Hooks());
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(r.waits.size(), 3u);
}

TEST(RetryTest, DoesNotRetryOtherErrors) {
  Recorder r;
  int calls = 0;
  absl::Status s = Retry(
      RetryPolicy(),
      [&] {
        ++calls;
        return absl::ResourceExhaustedError("quota of job 'a'");
      },
      r.Hooks());
  EXPECT_TRUE(absl::IsResourceExhausted(s));
  EXPECT_EQ(s.message(), "quota of job 'a'");
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(r.waits.empty());
}

TEST(RetryTest, StopsAfterMaxAttemptsWithTheLastError) {
  Recorder r;
  RetryPolicy policy;
  policy.max_attempts = 3;
  int calls = 0;
  absl::Status s = Retry(
      policy,
      [&] {
        ++calls;
        return absl::UnavailableError(absl::StrCat("attempt ", calls));
      },
      r.Hooks());
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_EQ(s.message(), "attempt 3");
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(r.waits.size(), 2u);
}

TEST(RetryTest, BackoffGrowsExponentiallyUpToTheCap) {
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.multiplier = 2;
  policy.max_backoff = absl::Milliseconds(500);
  EXPECT_EQ(BackoffBeforeJitter(policy, 1), absl::Milliseconds(100));
  EXPECT_EQ(BackoffBeforeJitter(policy, 2), absl::Milliseconds(200));
  EXPECT_EQ(BackoffBeforeJitter(policy, 3), absl::Milliseconds(400));
  EXPECT_EQ(BackoffBeforeJitter(policy, 4), absl::Milliseconds(500));
  EXPECT_EQ(BackoffBeforeJitter(policy, 100), absl::Milliseconds(500));

  policy.jitter = 0;
  policy.max_attempts = 6;
  Recorder r;
  (void)Retry(
      policy, [] { return absl::UnavailableError("down"); }, r.Hooks());
  const std::vector<absl::Duration> expected = {absl::Milliseconds(100), absl::Milliseconds(200),
                                                absl::Milliseconds(400), absl::Milliseconds(500),
                                                absl::Milliseconds(500)};
  EXPECT_EQ(r.waits, expected);
}

TEST(RetryTest, JitterStaysInItsBandAndVaries) {
  RetryPolicy policy;
  policy.initial_backoff = absl::Seconds(1);
  policy.max_backoff = absl::Seconds(1);
  policy.jitter = 0.25;
  policy.max_attempts = 201;
  Recorder r;
  (void)Retry(
      policy, [] { return absl::UnavailableError("down"); }, r.Hooks());
  ASSERT_EQ(r.waits.size(), 200u);
  absl::Duration lo = absl::InfiniteDuration(), hi = absl::ZeroDuration();
  for (absl::Duration w : r.waits) {
    EXPECT_GE(w, absl::Milliseconds(750));
    EXPECT_LE(w, absl::Milliseconds(1250));
    lo = std::min(lo, w);
    hi = std::max(hi, w);
  }
  // 200 uniform draws over a 500 ms band: the spread is far above 250 ms
  // unless the jitter is not random.
  EXPECT_GT(hi - lo, absl::Milliseconds(250));
}

TEST(RetryTest, TimeoutEndsRetriesBeforeAWaitThatWouldPassIt) {
  RetryPolicy policy;
  policy.timeout = absl::Milliseconds(300);
  policy.initial_backoff = absl::Milliseconds(40);
  policy.max_backoff = absl::Milliseconds(40);
  policy.jitter = 0;
  int calls = 0;
  const absl::Time start = absl::Now();
  absl::Status s = Retry(policy, [&] {
    ++calls;
    return absl::UnavailableError("down");
  });
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsUnavailable(s));
  // It stops at the timeout (give or take one wait), not before, and never
  // begins a wait that would end after it: at most 300 / 40 waits.
  EXPECT_GE(took, absl::Milliseconds(300) - absl::Milliseconds(40)) << took;
  EXPECT_LE(took, absl::Seconds(2)) << took;
  EXPECT_GE(calls, 2);
  EXPECT_LE(calls, 8);
}

TEST(RetryTest, ZeroTimeoutMakesOneAttempt) {
  RetryPolicy policy;
  policy.timeout = absl::ZeroDuration();
  int calls = 0;
  absl::Status s = Retry(policy, [&] {
    ++calls;
    return absl::UnavailableError("down");
  });
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_EQ(calls, 1);
}

TEST(RetryTest, CancellationHookStopsRetrying) {
  int calls = 0, waits = 0;
  RetryHooks hooks;
  hooks.wait = [&](absl::Duration) { return ++waits == 2; };  // cancelled in the 2nd wait
  absl::Status s = Retry(
      RetryPolicy(),
      [&] {
        ++calls;
        return absl::UnavailableError(absl::StrCat("attempt ", calls));
      },
      hooks);
  EXPECT_EQ(s.message(), "attempt 2");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(waits, 2);
}

TEST(RetryTest, OnRetrySeesEachErrorAndWait) {
  RetryPolicy policy;
  policy.jitter = 0;
  policy.max_attempts = 3;
  std::vector<std::string> seen;
  RetryHooks hooks;
  hooks.wait = [](absl::Duration) { return false; };
  hooks.on_retry = [&](const absl::Status& error, int attempts, absl::Duration wait) {
    seen.push_back(absl::StrCat(error.message(), " #", attempts, " ", absl::FormatDuration(wait)));
  };
  int calls = 0;
  (void)Retry(
      policy, [&] { return absl::UnavailableError(absl::StrCat("e", ++calls)); }, hooks);
  EXPECT_EQ(seen, (std::vector<std::string>{"e1 #1 100ms", "e2 #2 200ms"}));
}

TEST(RetryDeathTest, InvalidPolicyIsABug) {
  RetryPolicy policy;
  policy.jitter = 2;
  EXPECT_DEATH((void)Retry(policy, [] { return absl::OkStatus(); }), "jitter");
}

}  // namespace
}  // namespace dtrain
