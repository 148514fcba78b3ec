// QueueManager and QuotaState: quota arithmetic with borrowing and lending,
// the reasons a job does not fit, and the order inside a queue.
#include "libs/scheduler/queue_manager.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

constexpr char kTwoTeams[] = R"(queues:
  - name: team-a
    cohort: research
    quota: {trainers: 2}
    borrowing_limit: {trainers: 1}
    users: [alice, carol]
  - name: team-b
    cohort: research
    quota: {trainers: 2}
    lending_limit: {trainers: 1}
    users: [bob]
  - name: solo
    quota: {trainers: 1}
    users: [dave]
)";

Resources Unlimited() {
  Resources r;
  for (int i = 0; i < kNumResources; ++i) r[i] = kUnlimited;
  return r;
}

Workload Job(std::string id, std::string queue, std::string user, int trainers, int priority = 0,
             double submit = 0) {
  Workload w;
  w.id = std::move(id);
  w.queue = std::move(queue);
  w.user = std::move(user);
  w.trainers = trainers;
  w.priority = priority;
  w.submit_time = submit;
  return w;
}

class QueueManagerTest : public ::testing::Test {
 protected:
  QueueManagerTest() : m_(*ParseQueueConfig(kTwoTeams), Unlimited()) {}
  void AddAndAdmit(const Workload& w) {
    ASSERT_TRUE(m_.AddPending(w).ok());
    ASSERT_TRUE(m_.Admit(w.id, 0).ok());
  }
  QueueManager m_;
};

TEST_F(QueueManagerTest, BorrowsWithinLimitsAndSaysWhyNot) {
  const QuotaState& s = m_.quota();
  // team-a: quota 2 + borrowing limit 1; team-b lends at most 1.
  EXPECT_EQ(s.Available(0, kTrainers), 3);
  EXPECT_FALSE(s.Fits(0, GangResources(4, 1, false)));
  std::string why;
  EXPECT_FALSE(s.Fits(0, GangResources(4, 1, false), &why));
  EXPECT_EQ(why, "queue team-a: trainers 0 in use + 4 requested > quota 2 + borrowing limit 1");
  AddAndAdmit(Job("a1", "team-a", "alice", 3));
  EXPECT_TRUE(s.Borrowing(0));
  // team-a keeps nothing for itself (it lends all its quota), so all 3 come
  // from the pool: its 2 and team-b's lendable 1.
  EXPECT_EQ(s.PoolUsed(0)[kTrainers], 3);
  EXPECT_EQ(s.PoolCapacity(0)[kTrainers], 3);
  EXPECT_EQ(s.Available(1, kTrainers), 1);  // team-b's guaranteed one
  AddAndAdmit(Job("b1", "team-b", "bob", 1));
  EXPECT_EQ(s.Available(1, kTrainers), 0);
  EXPECT_FALSE(s.Fits(1, GangResources(1, 1, false), &why));
  EXPECT_EQ(why,
            "queue team-b: trainers 1 in use + 1 requested is within quota 2, but other queues of "
            "cohort research borrow 1 of it; reclaim is never");
  ASSERT_TRUE(m_.Finish("a1").ok());
  AddAndAdmit(Job("a2", "team-a", "alice", 2));
  EXPECT_FALSE(s.Borrowing(0));
  EXPECT_EQ(s.Available(1, kTrainers), 1);
  EXPECT_FALSE(s.Fits(1, GangResources(2, 1, false), &why));
  EXPECT_EQ(why,
            "queue team-b: trainers 1 in use + 2 requested > quota 2 + borrowable 0 (cohort "
            "research: 2 of 3 shared in use)");
  EXPECT_FALSE(s.Fits(2, GangResources(2, 1, false), &why));
  EXPECT_EQ(why, "queue solo: trainers 0 in use + 2 requested > quota 1");
  EXPECT_EQ(m_.UsageByQueue().at("team-a")[kTrainers], 2);
}

TEST_F(QueueManagerTest, SummariesShowQuotaUsageBorrowingAndCounts) {
  AddAndAdmit(Job("a1", "team-a", "alice", 3));
  ASSERT_TRUE(m_.AddPending(Job("a2", "team-a", "alice", 1)).ok());
  ASSERT_TRUE(m_.AddPending(Job("b1", "team-b", "bob", 1)).ok());
  const std::vector<QueueSummary> s = m_.Summaries();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].name, "team-a");
  EXPECT_EQ(s[0].cohort, "research");
  EXPECT_EQ(s[0].quota[kTrainers], 2);
  EXPECT_EQ(s[0].usage[kTrainers], 3);
  EXPECT_EQ(s[0].borrowed[kTrainers], 1);
  EXPECT_EQ(s[0].available[kTrainers], 0);  // at quota + borrowing limit
  EXPECT_EQ(s[0].pending, 1);
  EXPECT_EQ(s[0].admitted, 1);
  EXPECT_EQ(s[1].borrowed[kTrainers], 0);
  EXPECT_EQ(s[1].available[kTrainers], 1);  // its guaranteed one
  EXPECT_EQ(s[1].pending, 1);
  EXPECT_EQ(s[1].admitted, 0);
  EXPECT_EQ(s[2].available[kTrainers], 1);
  EXPECT_FALSE(s[2].managed[kCpuDevices]);
  EXPECT_EQ(s[2].available[kCpuDevices], kUnlimited);
}

TEST_F(QueueManagerTest, ClusterCapacityBoundsEveryQueue) {
  Resources cap = Unlimited();
  cap[kTrainers] = 2;
  QueueManager m(*ParseQueueConfig(kTwoTeams), cap);
  ASSERT_TRUE(m.AddPending(Job("a1", "team-a", "alice", 2)).ok());
  ASSERT_TRUE(m.Admit("a1", 0).ok());
  std::string why;
  EXPECT_FALSE(m.quota().Fits(1, GangResources(1, 1, false), &why));
  EXPECT_EQ(why, "cluster: trainers 2 in use + 1 requested > capacity 2");
}

TEST_F(QueueManagerTest, RefusesJobsThatCanNeverFit) {
  absl::Status s = m_.AddPending(Job("big", "team-a", "alice", 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "job needs trainers 4 but queue team-a can never have more than 3 (quota 2 + "
            "borrowing limit 1); ask for less or use another queue");
  EXPECT_EQ(m_.AddPending(Job("x", "team-z", "alice", 1)).message(), "unknown queue 'team-z'");
  ASSERT_TRUE(m_.AddPending(Job("x", "team-a", "alice", 1)).ok());
  EXPECT_EQ(m_.AddPending(Job("x", "team-a", "alice", 1)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(QueueManagerTest, OrderIsPriorityThenUserShareThenAge) {
  AddAndAdmit(Job("running", "team-a", "alice", 1));  // alice has a share, carol none
  ASSERT_TRUE(m_.AddPending(Job("alice-old", "team-a", "alice", 1, 0, 1)).ok());
  ASSERT_TRUE(m_.AddPending(Job("carol-new", "team-a", "carol", 1, 0, 5)).ok());
  ASSERT_TRUE(m_.AddPending(Job("carol-newer", "team-a", "carol", 1, 0, 6)).ok());
  ASSERT_TRUE(m_.AddPending(Job("alice-urgent", "team-a", "alice", 1, 10, 9)).ok());
  std::vector<std::string> order;
  m_.ForEachPending(0, [&](const Workload& w) {
    order.push_back(w.id);
    return true;
  });
  EXPECT_EQ(order,
            (std::vector<std::string>{"alice-urgent", "carol-new", "carol-newer", "alice-old"}));
  EXPECT_EQ(m_.QueuePosition("carol-newer"), 3);
  EXPECT_EQ(m_.QueuePosition("running"), 0);
  // Once alice's job ends the users are even: age decides.
  ASSERT_TRUE(m_.Finish("running").ok());
  EXPECT_EQ(m_.QueuePosition("alice-old"), 2);
  EXPECT_EQ(m_.num_pending(), 4);
  EXPECT_EQ(m_.PendingIn(0), 4);
}

TEST_F(QueueManagerTest, RequeueKeepsTheJobsAgeAndResizeMovesUsage) {
  ASSERT_TRUE(m_.AddPending(Job("first", "team-a", "alice", 2, 0, 1)).ok());
  ASSERT_TRUE(m_.Admit("first", 2).ok());
  EXPECT_EQ(m_.AdmitTime("first"), 2);
  ASSERT_TRUE(m_.AddPending(Job("second", "team-a", "alice", 1, 0, 3)).ok());
  ASSERT_TRUE(m_.Requeue("first").ok());
  EXPECT_EQ(m_.QueuePosition("first"), 1);
  EXPECT_EQ(m_.quota().usage(0)[kTrainers], 0);
  EXPECT_EQ(m_.Requeue("first").code(), absl::StatusCode::kNotFound);

  Workload e = Job("elastic", "team-b", "bob", 2);
  e.min_trainers = 1;
  AddAndAdmit(e);
  ASSERT_TRUE(m_.Resize("elastic", 1).ok());
  EXPECT_EQ(m_.quota().usage(1)[kTrainers], 1);
  EXPECT_EQ(m_.UserUsage(1, "bob")[kTrainers], 1);
  EXPECT_EQ(m_.Resize("elastic", 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(QueueManagerTest, EvictingVictimsReleaseTheirPreemptor) {
  AddAndAdmit(Job("v1", "team-a", "alice", 1));
  AddAndAdmit(Job("v2", "team-a", "alice", 1));
  ASSERT_TRUE(m_.AddPending(Job("p", "team-a", "carol", 2, 5)).ok());
  m_.MarkEvicting("v1", "p");
  m_.MarkEvicting("v2", "p");
  m_.MarkEvicting("v2", "p");  // already evicting: not counted twice
  EXPECT_EQ(m_.WaitingForVictims("p"), 2);
  EXPECT_TRUE(m_.IsEvicting("v1"));
  ASSERT_TRUE(m_.Requeue("v1").ok());
  EXPECT_FALSE(m_.IsEvicting("v1"));
  EXPECT_EQ(m_.WaitingForVictims("p"), 1);
  ASSERT_TRUE(m_.Finish("v2").ok());
  EXPECT_EQ(m_.WaitingForVictims("p"), 0);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
