// FindPreemption: reclaim within a cohort (never below a queue's quota),
// within a queue by priority, shrinking elastic jobs first, the fewest
// victims, the policies' gates, and messages that name no other user's job.
#include "libs/scheduler/preemptor.h"

#include "gtest/gtest.h"
#include "libs/scheduler/queue_test_util.h"

namespace dtrain {
namespace scheduler {
namespace {

using queue_test::Capacity;
using queue_test::kTwoTeamsQueues;

Workload Job(std::string id, std::string queue, std::string user, int trainers, int priority = 0,
             int min_trainers = 0) {
  Workload w;
  w.id = std::move(id);
  w.queue = std::move(queue);
  w.user = std::move(user);
  w.trainers = trainers;
  w.priority = priority;
  w.min_trainers = min_trainers;
  return w;
}

void Admitted(QueueManager& m, const Workload& w, double at) {
  ASSERT_TRUE(m.AddPending(w).ok());
  ASSERT_TRUE(m.Admit(w.id, at).ok());
}

TEST(PreemptorTest, ReclaimTakesTheBorrowersNewestJobAndNamesOnlyQueues) {
  QueueManager m(*ParseQueueConfig(kTwoTeamsQueues), Capacity(kUnlimited));
  Admitted(m, Job("alice-1", "team-a", "alice", 1), 1);
  Admitted(m, Job("alice-2", "team-a", "alice", 1), 2);  // borrowed from team-b
  const Workload bob = Job("bob-1", "team-b", "bob", 1);
  ASSERT_TRUE(m.AddPending(bob).ok());
  std::optional<PreemptionDecision> d = FindPreemption(m, bob);
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ(d->victims.size(), 1u);
  const Victim& v = d->victims[0];
  EXPECT_EQ(v.id, "alice-2");
  EXPECT_EQ(v.rule, PreemptRule::kReclaimWithinCohort);
  EXPECT_EQ(v.trainers_after, 0);
  EXPECT_EQ(v.message,
            "preempted (drained at a step, back at the head of its queue) to reclaim quota for "
            "queue team-b (reclaim_within_cohort: any; queue team-a borrows above its quota)");
  EXPECT_EQ(d->message,
            "waiting for preemption: draining 1 job of queue team-a (reclaim_within_cohort)");
  for (const std::string& text : {v.message, d->message}) {
    for (const char* secret : {"alice", "bob", "alice-2", "bob-1"}) {
      EXPECT_EQ(text.find(secret), std::string::npos) << text;
    }
  }
}

TEST(PreemptorTest, ReclaimNeverTakesAQueueBelowItsQuota) {
  // The cluster has 2 trainers: team-a at its quota of 1 plus 1 borrowed.
  QueueManager m(*ParseQueueConfig(kTwoTeamsQueues), Capacity(2));
  Admitted(m, Job("a1", "team-a", "alice", 1), 1);
  Admitted(m, Job("a2", "team-a", "alice", 1), 2);
  const Workload bob = Job("b", "team-b", "bob", 1);
  ASSERT_TRUE(m.AddPending(bob).ok());
  std::optional<PreemptionDecision> d = FindPreemption(m, bob);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->victims.size(), 1u);  // only the borrowed one, not a1 too
  // Once a2 is gone team-a no longer borrows: with the cluster full for
  // another reason (capacity 1), nothing may be reclaimed.
  QueueManager full(*ParseQueueConfig(kTwoTeamsQueues), Capacity(1));
  Admitted(full, Job("a1", "team-a", "alice", 1), 1);
  ASSERT_TRUE(full.AddPending(bob).ok());
  EXPECT_FALSE(FindPreemption(full, bob).has_value());
}

TEST(PreemptorTest, ReclaimLowerPriorityAndNeverAreHonoured) {
  std::string text = kTwoTeamsQueues;
  text.replace(text.find("reclaim_within_cohort: any"), 26,
               "reclaim_within_cohort: lower_priority");
  QueueManager m(*ParseQueueConfig(text), Capacity(kUnlimited));
  Admitted(m, Job("a1", "team-a", "alice", 1, /*priority=*/3), 1);
  Admitted(m, Job("a2", "team-a", "alice", 1, /*priority=*/3), 2);
  const Workload same = Job("b", "team-b", "bob", 1, 3);
  ASSERT_TRUE(m.AddPending(same).ok());
  EXPECT_FALSE(FindPreemption(m, same).has_value());  // team-a's jobs have the same priority
  const Workload higher = Job("b2", "team-b", "bob", 1, 4);
  ASSERT_TRUE(m.AddPending(higher).ok());
  ASSERT_TRUE(FindPreemption(m, higher).has_value());
  EXPECT_EQ(FindPreemption(m, higher)->victims[0].id, "a2");

  text.replace(text.find("reclaim_within_cohort: lower_priority"), 37,
               "reclaim_within_cohort: never");
  QueueManager never(*ParseQueueConfig(text), Capacity(kUnlimited));
  Admitted(never, Job("a1", "team-a", "alice", 1), 1);
  Admitted(never, Job("a2", "team-a", "alice", 1), 2);
  ASSERT_TRUE(never.AddPending(higher).ok());
  EXPECT_FALSE(FindPreemption(never, higher).has_value());
}

constexpr char kOneQueue[] = R"(queues:
  - name: q
    quota: {trainers: 4}
    users: [u, v]
preemption: {within_queue: lower_priority}
)";

TEST(PreemptorTest, WithinQueueOnlyLowerPriorityAndOnlyWhenAllowed) {
  QueueManager m(*ParseQueueConfig(kOneQueue), Capacity(kUnlimited));
  Admitted(m, Job("low", "q", "u", 2, 0), 1);
  Admitted(m, Job("equal", "q", "u", 2, 5), 2);
  const Workload w = Job("urgent", "q", "v", 2, 5);
  ASSERT_TRUE(m.AddPending(w).ok());
  std::optional<PreemptionDecision> d = FindPreemption(m, w);
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ(d->victims.size(), 1u);
  EXPECT_EQ(d->victims[0].id, "low");
  EXPECT_EQ(d->victims[0].rule, PreemptRule::kWithinQueue);
  EXPECT_EQ(d->victims[0].message,
            "preempted (drained at a step, back at the head of its queue) for a job of priority 5 "
            "in queue q (within_queue: lower_priority)");
  // An evicting job is not chosen twice; nothing else is lower.
  m.MarkEvicting("low", "urgent");
  EXPECT_FALSE(FindPreemption(m, w).has_value());

  std::string text = kOneQueue;
  text.replace(text.find("lower_priority"), 14, "never");
  QueueManager never(*ParseQueueConfig(text), Capacity(kUnlimited));
  Admitted(never, Job("low", "q", "u", 4, 0), 1);
  ASSERT_TRUE(never.AddPending(w).ok());
  EXPECT_FALSE(FindPreemption(never, w).has_value());
}

TEST(PreemptorTest, ShrinksAnElasticJobBeforePreemptingAny) {
  QueueManager m(*ParseQueueConfig(kOneQueue), Capacity(kUnlimited));
  Admitted(m, Job("elastic", "q", "u", 3, 0, /*min_trainers=*/1), 1);
  Admitted(m, Job("rigid", "q", "u", 1, 0), 2);  // newer: first in line to be preempted
  const Workload two = Job("urgent", "q", "v", 2, 5);
  ASSERT_TRUE(m.AddPending(two).ok());
  std::optional<PreemptionDecision> d = FindPreemption(m, two);
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ(d->victims.size(), 1u);
  EXPECT_EQ(d->victims[0].id, "elastic");
  EXPECT_EQ(d->victims[0].trainers_before, 3);
  EXPECT_EQ(d->victims[0].trainers_after, 1);  // by 2, all that is needed
  EXPECT_EQ(d->victims[0].message,
            "shrinking from 3 to 1 trainers for a job of priority 5 in queue q (within_queue: "
            "lower_priority)");
  EXPECT_EQ(d->message, "waiting for preemption: shrinking 1 job of queue q (within_queue)");

  // A job of 1 needs only one trainer of the elastic job.
  const Workload one = Job("small", "q", "v", 1, 5);
  ASSERT_TRUE(m.AddPending(one).ok());
  EXPECT_EQ(FindPreemption(m, one)->victims[0].trainers_after, 2);

  // 3 trainers: shrinking frees only 2, so whole jobs go; the fewest is the
  // elastic one alone (rigid, taken first, is given back).
  const Workload three = Job("big", "q", "v", 3, 5);
  ASSERT_TRUE(m.AddPending(three).ok());
  d = FindPreemption(m, three);
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ(d->victims.size(), 1u);
  EXPECT_EQ(d->victims[0].id, "elastic");
  EXPECT_EQ(d->victims[0].trainers_after, 0);
}

TEST(PreemptorTest, NothingWhenItFitsOrNoSetOfVictimsSuffices) {
  QueueManager m(*ParseQueueConfig(kOneQueue), Capacity(kUnlimited));
  const Workload fits = Job("fits", "q", "v", 2, 5);
  ASSERT_TRUE(m.AddPending(fits).ok());
  EXPECT_FALSE(FindPreemption(m, fits).has_value());
  Admitted(m, Job("high", "q", "u", 3, 9), 1);
  Admitted(m, Job("low", "q", "u", 1, 0), 2);
  const Workload w = Job("w", "q", "v", 2, 5);
  ASSERT_TRUE(m.AddPending(w).ok());
  EXPECT_FALSE(FindPreemption(m, w).has_value());  // removing "low" frees only 1
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
