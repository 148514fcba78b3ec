// RunAdmissionCycle: the issue's two-team story (borrow, reclaim, drain,
// requeue), weighted sharing of a cohort's spare quota, best-effort order
// with a reservation for a starving gang, and two users of one queue getting
// equal device-seconds.
#include "libs/scheduler/admission.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "libs/scheduler/queue_test_util.h"

namespace dtrain {
namespace scheduler {
namespace {

using queue_test::Capacity;
using queue_test::kTwoTeamsQueues;

Workload Job(std::string id, std::string queue, std::string user, int trainers, double submit,
             int priority = 0) {
  Workload w;
  w.id = std::move(id);
  w.queue = std::move(queue);
  w.user = std::move(user);
  w.trainers = trainers;
  w.submit_time = submit;
  w.priority = priority;
  return w;
}

std::vector<std::string> Ids(const CycleResult& r) {
  std::vector<std::string> ids;
  for (const Admission& a : r.admitted) ids.push_back(a.id);
  return ids;
}

TEST(AdmissionTest, TeamABorrowsTeamBReclaimsByDrainAndABorrowsAgainLater) {
  QueueManager m(*ParseQueueConfig(kTwoTeamsQueues), Capacity(2));
  ASSERT_TRUE(m.AddPending(Job("a1", "team-a", "alice", 1, 1)).ok());
  ASSERT_TRUE(m.AddPending(Job("a2", "team-a", "alice", 1, 2)).ok());
  CycleOptions o;
  o.now = 3;
  CycleResult r = RunAdmissionCycle(m, o);
  ASSERT_EQ(Ids(r), (std::vector<std::string>{"a1", "a2"}));
  EXPECT_FALSE(r.admitted[0].borrowing);
  EXPECT_TRUE(r.admitted[1].borrowing);  // team-b's idle quota

  ASSERT_TRUE(m.AddPending(Job("b1", "team-b", "bob", 1, 4)).ok());
  o.now = 5;
  r = RunAdmissionCycle(m, o);
  EXPECT_TRUE(r.admitted.empty());
  ASSERT_EQ(r.preemptions.size(), 1u);
  ASSERT_EQ(r.preemptions[0].victims.size(), 1u);
  EXPECT_EQ(r.preemptions[0].victims[0].id, "a2");
  EXPECT_TRUE(m.IsEvicting("a2"));
  EXPECT_EQ(r.pending_reasons.at("b1"),
            "cluster: trainers 2 in use + 1 requested > capacity 2; waiting for preemption: "
            "draining 1 job of queue team-a (reclaim_within_cohort)");

  // While a2 drains nothing more is preempted and b1 says what it waits for.
  o.now = 6;
  r = RunAdmissionCycle(m, o);
  EXPECT_TRUE(r.admitted.empty());
  EXPECT_TRUE(r.preemptions.empty());
  EXPECT_EQ(r.pending_reasons.at("b1"),
            "cluster: trainers 2 in use + 1 requested > capacity 2; waiting for 1 preempted job "
            "to drain");

  // Drained: a2 goes back to the head of team-a, b1 is admitted.
  ASSERT_TRUE(m.Requeue("a2").ok());
  o.now = 7;
  r = RunAdmissionCycle(m, o);
  EXPECT_EQ(Ids(r), (std::vector<std::string>{"b1"}));
  EXPECT_FALSE(r.admitted[0].borrowing);
  EXPECT_TRUE(r.preemptions.empty());  // a2 may not reclaim: team-a would borrow
  EXPECT_EQ(r.pending_reasons.at("a2"),
            "queue team-a: trainers 1 in use + 1 requested > quota 1 + borrowable 0 (cohort "
            "research: 2 of 2 shared in use)");
  EXPECT_EQ(m.QueuePosition("a2"), 1);

  // b1 ends: a2 borrows again.
  ASSERT_TRUE(m.Finish("b1").ok());
  o.now = 8;
  r = RunAdmissionCycle(m, o);
  EXPECT_EQ(Ids(r), (std::vector<std::string>{"a2"}));
  EXPECT_TRUE(r.admitted[0].borrowing);
}

TEST(AdmissionTest, PendingReasonNamesTheQuotaThatBlocks) {
  QueueManager m(*ParseQueueConfig(kTwoTeamsQueues), Capacity(kUnlimited));
  ASSERT_TRUE(m.AddPending(Job("a1", "team-a", "alice", 2, 1)).ok());
  ASSERT_TRUE(m.AddPending(Job("a2", "team-a", "alice", 2, 2)).ok());
  CycleResult r = RunAdmissionCycle(m, CycleOptions());
  EXPECT_EQ(Ids(r), (std::vector<std::string>{"a1"}));
  EXPECT_EQ(r.pending_reasons.at("a2"),
            "queue team-a: trainers 2 in use + 2 requested > quota 1 + borrowing limit 1");
}

TEST(AdmissionTest, SpareQuotaOfACohortIsSharedByWeight) {
  QueueManager m(*ParseQueueConfig(R"(queues:
  - name: heavy
    cohort: c
    quota: {trainers: 10}
    weight: 2
    users: [u]
  - name: light
    cohort: c
    quota: {trainers: 10}
    users: [v]
  - name: idle
    cohort: c
    quota: {trainers: 10}
    users: [w]
)"),
                 Capacity(30));
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(m.AddPending(Job("h" + std::to_string(i), "heavy", "u", 1, i)).ok());
    ASSERT_TRUE(m.AddPending(Job("l" + std::to_string(i), "light", "v", 1, i)).ok());
  }
  CycleResult r = RunAdmissionCycle(m, CycleOptions());
  EXPECT_EQ(r.admitted.size(), 30u);
  // idle's 10 split 2:1 on top of each one's 10.
  EXPECT_GE(m.quota().usage(0)[kTrainers], 16);
  EXPECT_LE(m.quota().usage(0)[kTrainers], 17);
  EXPECT_EQ(m.quota().usage(0)[kTrainers] + m.quota().usage(1)[kTrainers], 30);
}

TEST(AdmissionTest, SmallJobsBackfillUntilABlockedGangHasWaitedLongEnough) {
  const char* text = "queues:\n  - name: q\n    quota: {trainers: 4}\n    users: [u]\n";
  for (double now : {10.0, 1000.0}) {
    SCOPED_TRACE(now);
    QueueManager m(*ParseQueueConfig(text), Capacity(kUnlimited));
    ASSERT_TRUE(m.AddPending(Job("running", "q", "u", 2, 0)).ok());
    ASSERT_TRUE(m.Admit("running", 0).ok());
    ASSERT_TRUE(m.AddPending(Job("big", "q", "u", 4, 1)).ok());
    ASSERT_TRUE(m.AddPending(Job("small", "q", "u", 1, 2)).ok());
    CycleOptions o;
    o.now = now;
    CycleResult r = RunAdmissionCycle(m, o);
    if (now < o.reserve_after_seconds) {
      EXPECT_EQ(Ids(r), (std::vector<std::string>{"small"}));
      EXPECT_EQ(r.pending_reasons.at("big"), "queue q: trainers 3 in use + 4 requested > quota 4");
    } else {
      EXPECT_TRUE(r.admitted.empty());  // big reserves
      EXPECT_EQ(r.pending_reasons.at("big"), "queue q: trainers 2 in use + 4 requested > quota 4");
    }
  }
}

TEST(AdmissionTest, AJobWaitingForItsVictimsKeepsWhatTheyFree) {
  const char* text =
      "queues:\n  - name: q\n    quota: {trainers: 4}\n    users: [u]\n"
      "preemption: {within_queue: lower_priority}\n";
  QueueManager m(*ParseQueueConfig(text), Capacity(kUnlimited));
  ASSERT_TRUE(m.AddPending(Job("low1", "q", "u", 2, 0)).ok());
  ASSERT_TRUE(m.AddPending(Job("low2", "q", "u", 2, 1)).ok());
  ASSERT_EQ(RunAdmissionCycle(m, CycleOptions()).admitted.size(), 2u);
  ASSERT_TRUE(m.AddPending(Job("urgent", "q", "u", 4, 2, /*priority=*/5)).ok());
  ASSERT_TRUE(m.AddPending(Job("small", "q", "u", 1, 3)).ok());
  CycleOptions o;
  o.now = 4;
  CycleResult r = RunAdmissionCycle(m, o);
  ASSERT_EQ(r.preemptions.size(), 1u);
  ASSERT_EQ(r.preemptions[0].victims.size(), 2u);
  // low2 drains first: its 2 trainers wait for urgent, small does not take one.
  ASSERT_TRUE(m.Requeue("low2").ok());
  o.now = 5;
  r = RunAdmissionCycle(m, o);
  EXPECT_TRUE(r.admitted.empty());
  EXPECT_TRUE(r.preemptions.empty());
  ASSERT_TRUE(m.Requeue("low1").ok());
  o.now = 6;
  r = RunAdmissionCycle(m, o);
  EXPECT_EQ(Ids(r), (std::vector<std::string>{"urgent"}));
}

TEST(AdmissionTest, HigherPriorityIsAdmittedFirstAndPreemptsWithinTheQueue) {
  QueueManager m(*ParseQueueConfig(kTwoTeamsQueues), Capacity(kUnlimited));
  ASSERT_TRUE(m.AddPending(Job("old", "team-a", "alice", 2, 1)).ok());
  ASSERT_TRUE(RunAdmissionCycle(m, CycleOptions()).admitted.size() == 1);
  ASSERT_TRUE(m.AddPending(Job("urgent", "team-a", "alice", 1, 5, /*priority=*/7)).ok());
  CycleResult r = RunAdmissionCycle(m, CycleOptions());
  ASSERT_EQ(r.preemptions.size(), 1u);
  EXPECT_EQ(r.preemptions[0].victims[0].id, "old");
  EXPECT_EQ(r.preemptions[0].victims[0].rule, PreemptRule::kWithinQueue);
}

// Two users of equal weight submit streams of jobs to one queue; one submits
// twice as many, and each alone would want more than half the queue. Over
// the run their device-seconds are within 10% (in arrival order the eager
// one would get about two thirds).
TEST(AdmissionTest, TwoUsersOfEqualWeightGetEqualDeviceSeconds) {
  QueueManager m(*ParseQueueConfig(R"(queues:
  - name: shared
    quota: {trainers: 16, cpu_devices: 64}
    users: [eager, calm]
)"),
                 Capacity(16));
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> size(1, 4), devices(1, 4);
  std::exponential_distribution<double> duration(1.0 / 60);
  struct Running {
    std::string id;
    std::string user;
    double end;
    int devices;
  };
  std::vector<Running> running;
  std::map<std::string, double> device_seconds;
  int next = 0;
  double now = 0;
  const double dt = 1, horizon = 20000;
  for (; now < horizon; now += dt) {
    // eager submits 4 jobs every 20 s, calm 2 (about 15 trainers busy).
    if (static_cast<int>(now) % 20 == 0) {
      for (const char* user : {"eager", "eager", "eager", "eager", "calm", "calm"}) {
        Workload w =
            Job(std::string(user) + "-" + std::to_string(next++), "shared", user, size(rng), now);
        w.devices_per_trainer = devices(rng);
        ASSERT_TRUE(m.AddPending(w).ok());
      }
    }
    for (size_t i = 0; i < running.size();) {
      if (running[i].end <= now) {
        ASSERT_TRUE(m.Finish(running[i].id).ok());
        running[i] = running.back();
        running.pop_back();
      } else {
        ++i;
      }
    }
    CycleOptions o;
    o.now = now;
    for (const Admission& a : RunAdmissionCycle(m, o).admitted) {
      const Workload* w = m.Find(a.id);
      running.push_back({a.id, w->user, now + duration(rng), w->trainers * w->devices_per_trainer});
    }
    for (const Running& r : running) device_seconds[r.user] += r.devices * dt;
  }
  std::map<std::string, int> backlog;
  m.ForEachPending(0, [&](const Workload& w) {
    ++backlog[w.user];
    return true;
  });
  ASSERT_GT(backlog["calm"], 10);  // both still wanted more at the end
  ASSERT_GT(backlog["eager"], 10);
  const double eager = device_seconds["eager"], calm = device_seconds["calm"];
  ASSERT_GT(calm, 0);
  EXPECT_LE(std::max(eager, calm) / std::min(eager, calm), 1.10)
      << "eager " << eager << " calm " << calm;
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
