#include "libs/scheduler/job_queues.h"

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/scheduler/queue_test_util.h"

namespace dtrain {
namespace scheduler {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

QueueConfig TwoTeams() {
  absl::StatusOr<QueueConfig> c = ParseQueueConfig(queue_test::kTwoTeamsQueues);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// A job table: statuses live in a deque (stable addresses).
class Jobs {
 public:
  // A job of `owner` in `queue` ("" : the owner's default) on `trainers`
  // trainers: RUNNING with them placed, or QUEUED asking for them.
  v1::JobStatus& Add(const std::string& owner, const std::string& queue, v1::JobState state,
                     int trainers, int priority = 0) {
    v1::JobStatus& s = statuses_.emplace_back();
    s.set_id(absl::StrCat("job-", statuses_.size()));
    s.set_owner(owner);
    s.set_queue(queue);
    s.set_state(state);
    s.mutable_spec()->set_num_trainers(trainers);
    s.mutable_spec()->set_devices_per_trainer(1);
    s.mutable_spec()->set_device_kind("cpu");
    s.mutable_spec()->set_priority(priority);
    if (state == v1::RUNNING) {
      for (int i = 0; i < trainers; ++i) s.add_trainers(absl::StrCat("t", statuses_.size(), i));
    }
    refs_.push_back({&s, static_cast<int64_t>(statuses_.size())});
    return s;
  }
  std::vector<JobRef>& refs() { return refs_; }
  std::vector<JobRef> Queued() const {
    std::vector<JobRef> out;
    for (const JobRef& r : refs_) {
      if (r.status->state() == v1::QUEUED) out.push_back(r);
    }
    return out;
  }

 private:
  std::deque<v1::JobStatus> statuses_;
  std::vector<JobRef> refs_;
};

v1::JobSpec Spec(int trainers, const std::string& queue = "") {
  v1::JobSpec spec;
  spec.set_num_trainers(trainers);
  spec.set_devices_per_trainer(1);
  spec.set_device_kind("cpu");
  spec.set_queue(queue);
  return spec;
}

TEST(JobQueuesTest, WithoutAFileEveryJobGoesToOneQueueWithoutQuota) {
  JobQueues queues(std::nullopt);
  EXPECT_FALSE(queues.enabled());
  absl::StatusOr<std::string> q = queues.ForSubmit(Spec(64), "anyone");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, "");
  Jobs jobs;
  jobs.Add("alice", "", v1::RUNNING, 4);
  EXPECT_FALSE(queues.Usage(jobs.refs()).has_value());
  EXPECT_EQ(queues.QueueOf(*jobs.refs()[0].status), -1);
  EXPECT_FALSE(queues.FindVictims(jobs.refs()[0], jobs.refs()).has_value());
  EXPECT_TRUE(queues.Summaries(jobs.refs()).empty());
}

TEST(JobQueuesTest, SubmitPicksTheNamedQueueOrTheDefaultAndNamesEachProblem) {
  JobQueues queues(TwoTeams());
  absl::StatusOr<std::string> q = queues.ForSubmit(Spec(1), "alice");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, "team-a");
  q = queues.ForSubmit(Spec(1, "team-a"), "alice");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, "team-a");

  q = queues.ForSubmit(Spec(1, "team-z"), "alice");
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.status().message(),
            "queue: unknown queue 'team-z' (queues: team-a, team-b; yours: team-a)");

  q = queues.ForSubmit(Spec(1, "team-b"), "alice");
  EXPECT_EQ(q.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(q.status().message(),
            "user alice may not submit to queue team-b (your queues: team-a)");

  q = queues.ForSubmit(Spec(1), "mallory");
  EXPECT_EQ(q.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(q.status().message(), HasSubstr("user mallory is in no queue"));

  // team-a: quota 1 + borrowing limit 1.
  q = queues.ForSubmit(Spec(3), "alice");
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(q.status().message(), HasSubstr("the job can never be admitted: queue team-a"));
  EXPECT_THAT(q.status().message(), HasSubstr("ask for less"));
}

TEST(JobQueuesTest, QueueOfFollowsTheJobsQueueElseItsOwnersDefault) {
  JobQueues queues(TwoTeams());
  Jobs jobs;
  const v1::JobStatus& named = jobs.Add("alice", "team-b", v1::QUEUED, 1);
  const v1::JobStatus& old = jobs.Add("bob", "", v1::QUEUED, 1);
  const v1::JobStatus& gone = jobs.Add("alice", "team-x", v1::QUEUED, 1);
  const v1::JobStatus& stranger = jobs.Add("mallory", "", v1::QUEUED, 1);
  EXPECT_EQ(queues.QueueOf(named), 1);
  EXPECT_EQ(queues.QueueOf(old), 1);
  EXPECT_EQ(queues.QueueOf(gone), 0);  // team-x is not in the file: alice's default
  EXPECT_EQ(queues.QueueOf(stranger), -1);
}

TEST(JobQueuesTest, PlacementOrderIsWithinQuotaThenPriorityThenShareThenArrival) {
  absl::StatusOr<QueueConfig> c = ParseQueueConfig(
      "queues:\n"
      "  - name: q\n    cohort: c\n    quota: {trainers: 2}\n    users: [alice, bob]\n"
      "  - name: r\n    cohort: c\n    quota: {trainers: 2}\n    users: [carol]\n");
  ASSERT_TRUE(c.ok()) << c.status();
  JobQueues queues(*c);
  Jobs jobs;
  jobs.Add("alice", "q", v1::RUNNING, 1);
  const v1::JobStatus& big = jobs.Add("bob", "q", v1::QUEUED, 2, /*priority=*/9);  // borrows
  const v1::JobStatus& a1 = jobs.Add("alice", "q", v1::QUEUED, 1);
  const v1::JobStatus& b1 = jobs.Add("bob", "q", v1::QUEUED, 1);  // smaller share than alice
  const v1::JobStatus& high = jobs.Add("carol", "r", v1::QUEUED, 1, /*priority=*/5);
  std::vector<JobRef> queued = jobs.Queued();
  const std::optional<QuotaState> usage = queues.Usage(jobs.refs());
  ASSERT_TRUE(usage.has_value());
  EXPECT_EQ(usage->usage(0)[kTrainers], 1);
  queues.SortForPlacement(&queued, jobs.refs(), usage);
  std::vector<std::string> order;
  for (const JobRef& r : queued) order.push_back(r.status->id());
  EXPECT_EQ(order, (std::vector<std::string>{high.id(), b1.id(), a1.id(), big.id()}));
}

// Jobs that would borrow go by their queue's borrowed share by weight: y
// (weight 3) borrows as much as x (weight 1) but has the smaller share.
TEST(JobQueuesTest, BorrowingJobsGoByTheirQueuesWeightedShare) {
  absl::StatusOr<QueueConfig> c = ParseQueueConfig(
      "queues:\n"
      "  - name: x\n    cohort: c\n    quota: {trainers: 2}\n    users: [xavier]\n"
      "  - name: y\n    cohort: c\n    quota: {trainers: 2}\n    weight: 3\n    users: [yves]\n"
      "  - name: z\n    cohort: c\n    quota: {trainers: 4}\n    users: [zoe]\n");
  ASSERT_TRUE(c.ok()) << c.status();
  JobQueues queues(*c);
  Jobs jobs;
  jobs.Add("xavier", "x", v1::RUNNING, 3);
  jobs.Add("yves", "y", v1::RUNNING, 3);
  const v1::JobStatus& x = jobs.Add("xavier", "x", v1::QUEUED, 1, /*priority=*/9);
  const v1::JobStatus& y = jobs.Add("yves", "y", v1::QUEUED, 1);
  std::vector<JobRef> queued = jobs.Queued();
  queues.SortForPlacement(&queued, jobs.refs(), queues.Usage(jobs.refs()));
  ASSERT_EQ(queued.size(), 2u);
  EXPECT_EQ(queued[0].status->id(), y.id());
  EXPECT_EQ(queued[1].status->id(), x.id());
}

TEST(JobQueuesTest, ABorrowersJobIsTheVictimOnceAndTheReclaimerWaitsForIt) {
  JobQueues queues(TwoTeams());
  Jobs jobs;
  jobs.Add("alice", "team-a", v1::RUNNING, 1);
  const v1::JobStatus& borrower = jobs.Add("alice", "team-a", v1::RUNNING, 1);
  const v1::JobStatus& bobs = jobs.Add("bob", "team-b", v1::QUEUED, 1);
  const JobRef bob = jobs.refs()[2];
  std::optional<PreemptionDecision> d = queues.FindVictims(bob, jobs.refs());
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ(d->victims.size(), 1u);
  EXPECT_EQ(d->victims[0].id, borrower.id());  // the newer placement
  EXPECT_EQ(d->victims[0].rule, PreemptRule::kReclaimWithinCohort);
  EXPECT_THAT(d->victims[0].message, HasSubstr("queue team-b"));
  EXPECT_THAT(d->message, HasSubstr("team-a"));
  EXPECT_THAT(d->message, Not(HasSubstr(borrower.id())));

  // While it drains, bob's job waits for it (the scheduler looks for no
  // more victims meanwhile), and it is not chosen again.
  jobs.refs()[1].preempting = true;
  jobs.refs()[1].preempted_for = &bobs.id();
  EXPECT_EQ(JobQueues::WaitingFor(bob, jobs.refs()), 1);
  EXPECT_EQ(JobQueues::WaitingFor(jobs.refs()[0], jobs.refs()), 0);
  d = queues.FindVictims(bob, jobs.refs());
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ(d->victims.size(), 1u);
  EXPECT_NE(d->victims[0].id, borrower.id());
}

TEST(JobQueuesTest, NoVictimWhenTheLenderIsWithinItsQuota) {
  JobQueues queues(TwoTeams());
  Jobs jobs;
  jobs.Add("alice", "team-a", v1::RUNNING, 1);
  jobs.Add("bob", "team-b", v1::RUNNING, 1);
  jobs.Add("bob", "team-b", v1::QUEUED, 1);
  EXPECT_FALSE(queues.FindVictims(jobs.refs()[2], jobs.refs()).has_value());
}

TEST(JobQueuesTest, SummariesSayUsageBorrowedLentAndPositions) {
  JobQueues queues(TwoTeams());
  Jobs jobs;
  jobs.Add("alice", "team-a", v1::RUNNING, 2);
  const v1::JobStatus& first = jobs.Add("alice", "team-a", v1::QUEUED, 1, /*priority=*/1);
  const v1::JobStatus& second = jobs.Add("alice", "team-a", v1::QUEUED, 1);
  const v1::JobStatus& bobs = jobs.Add("bob", "team-b", v1::QUEUED, 1);
  std::map<std::string, int> positions;
  const std::vector<QueueSummary> s = queues.Summaries(jobs.refs(), &positions);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "team-a");
  EXPECT_EQ(s[0].usage[kTrainers], 2);
  EXPECT_EQ(s[0].borrowed[kTrainers], 1);
  EXPECT_EQ(s[0].lent[kTrainers], 0);
  EXPECT_EQ(s[0].admitted, 1);
  EXPECT_EQ(s[0].pending, 2);
  EXPECT_EQ(s[1].usage[kTrainers], 0);
  EXPECT_EQ(s[1].borrowed[kTrainers], 0);
  EXPECT_EQ(s[1].lent[kTrainers], 1);
  EXPECT_EQ(s[1].pending, 1);
  EXPECT_EQ(positions[first.id()], 1);
  EXPECT_EQ(positions[second.id()], 2);
  EXPECT_EQ(positions[bobs.id()], 1);
}

TEST(JobQueuesTest, AQuotaChangeThatWouldStrandRunningJobsIsRefused) {
  JobQueues queues(TwoTeams());
  Jobs jobs;
  jobs.Add("alice", "team-a", v1::RUNNING, 2);  // borrows 1 from team-b
  absl::StatusOr<QueueConfig> no_borrowing = ParseQueueConfig(
      "queues:\n"
      "  - name: team-a\n    cohort: research\n    quota: {trainers: 1}\n"
      "    borrowing_limit: {trainers: 0}\n    users: [alice]\n"
      "  - name: team-b\n    cohort: research\n    quota: {trainers: 1}\n    users: [bob]\n");
  ASSERT_TRUE(no_borrowing.ok()) << no_borrowing.status();
  absl::Status s = queues.CheckApply(*no_borrowing, jobs.refs());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("queue team-a uses trainers 2 > new quota 1"));

  absl::StatusOr<QueueConfig> gone =
      ParseQueueConfig("queues:\n  - name: team-b\n    quota: {trainers: 4}\n    users: [bob]\n");
  ASSERT_TRUE(gone.ok()) << gone.status();
  s = queues.CheckApply(*gone, jobs.refs());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("team-a"));

  absl::StatusOr<QueueConfig> bigger = ParseQueueConfig(
      "queues:\n"
      "  - name: team-a\n    quota: {trainers: 3}\n    users: [alice, bob]\n");
  ASSERT_TRUE(bigger.ok()) << bigger.status();
  ASSERT_TRUE(queues.CheckApply(*bigger, jobs.refs()).ok());
  queues.Replace(*bigger, "the file");
  EXPECT_EQ(queues.yaml(), "the file");
  // bob's default is team-a now (it was team-b).
  jobs.Add("bob", "", v1::QUEUED, 1);
  EXPECT_EQ(queues.QueueOf(*jobs.refs()[1].status), 0);
  EXPECT_EQ(queues.Usage(jobs.refs())->usage(0)[kTrainers], 2);
}

TEST(JobQueuesTest, MetricsCountWaitsPreemptionsAndJobsPendingWithinQuota) {
  JobQueues queues(TwoTeams());
  queues.RecordAdmission("team-a", 0.5);
  queues.RecordAdmission("team-a", 7);
  queues.RecordAdmission("team-a", 99999);
  Victim drained;
  drained.rule = PreemptRule::kReclaimWithinCohort;
  queues.RecordPreemption("team-a", drained);
  Victim shrunk = drained;
  shrunk.trainers_before = 2;
  shrunk.trainers_after = 1;
  queues.RecordPreemption("team-a", shrunk);
  Jobs jobs;
  jobs.Add("alice", "team-a", v1::RUNNING, 1);
  v1::JobStatus& waiting = jobs.Add("bob", "team-b", v1::QUEUED, 1);  // fits team-b's quota
  waiting.set_submit_time_unix_ms(1000);
  jobs.Add("alice", "team-a", v1::QUEUED, 2);  // does not fit: 1 + 2 > 1 + 1
  const std::vector<QueueMetrics> m = queues.Metrics(jobs.refs(), /*now_unix_ms=*/61000);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].wait_counts[0], 1);  // <= 1 s
  EXPECT_EQ(m[0].wait_counts[2], 1);  // <= 10 s
  EXPECT_EQ(m[0].wait_counts.back(), 1);
  EXPECT_DOUBLE_EQ(m[0].wait_sum, 0.5 + 7 + 99999);
  EXPECT_EQ(m[0].preemptions.at("reclaim_within_cohort"), 1);
  EXPECT_EQ(m[0].preemptions.at("within_queue"), 0);
  EXPECT_EQ(m[0].preemptions.at("shrink"), 1);  // counted by its own reason, not its rule
  EXPECT_EQ(m[1].preemptions.at("reclaim_within_cohort"), 0);
  EXPECT_EQ(m[1].preemptions.at("shrink"), 0);
  EXPECT_EQ(m[0].pending_within_quota, 0);
  EXPECT_EQ(m[1].pending_within_quota, 1);
  EXPECT_DOUBLE_EQ(m[1].oldest_pending_within_quota_seconds, 60);
}

TEST(JobQueuesTest, APreemptorsEventDoesNotRestartItsWait) {
  v1::JobStatus s;
  s.set_submit_time_unix_ms(1000);
  auto event = [&s](v1::JobState state, int64_t ms) {
    v1::JobEvent* e = s.add_events();
    e->set_state(state);
    e->set_time_unix_ms(ms);
  };
  event(v1::QUEUED, 1000);
  EXPECT_DOUBLE_EQ(QueuedSeconds(s, 3000), 2);
  event(v1::RUNNING, 4000);
  event(v1::QUEUED, 10000);  // drained, requeued
  event(v1::QUEUED, 12000);  // it preempted others
  EXPECT_DOUBLE_EQ(QueuedSeconds(s, 15000), 5);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
