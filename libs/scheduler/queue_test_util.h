// What the queue tests share: the issue's two-team queues file (also in
// docs/queues.md), verbatim, and a cluster capacity of N trainers.
#ifndef DTRAIN_LIBS_SCHEDULER_QUEUE_TEST_UTIL_H_
#define DTRAIN_LIBS_SCHEDULER_QUEUE_TEST_UTIL_H_

#include <cstdint>

#include "libs/scheduler/queue_config.h"

namespace dtrain {
namespace scheduler {
namespace queue_test {

// team-a (quota 1, may borrow 1) and team-b (quota 1) in cohort research;
// preemption within a queue by priority, reclaim within the cohort of any job.
inline constexpr char kTwoTeamsQueues[] = R"(queues:
  - name: team-a
    cohort: research
    quota: {trainers: 1}
    borrowing_limit: {trainers: 1}
    users: [alice]
  - name: team-b
    cohort: research
    quota: {trainers: 1}
    users: [bob]
preemption:
  within_queue: lower_priority
  reclaim_within_cohort: any
)";

// `trainers` trainers; every other resource unlimited.
inline Resources Capacity(int64_t trainers) {
  Resources r;
  for (int i = 0; i < kNumResources; ++i) r[i] = kUnlimited;
  r[kTrainers] = trainers;
  return r;
}

}  // namespace queue_test
}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_QUEUE_TEST_UTIL_H_
