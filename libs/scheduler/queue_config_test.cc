// ParseQueueConfig: the issue's example means what it says; every invalid
// file is refused with the queue, line and numbers; CheckQuotaChange refuses
// a change that would strand running jobs.
#include "libs/scheduler/queue_config.h"

#include "gtest/gtest.h"
#include "libs/scheduler/queue_test_util.h"

namespace dtrain {
namespace scheduler {
namespace {

using queue_test::kTwoTeamsQueues;

TEST(QueueConfigTest, TheIssuesExampleMeansWhatItSays) {
  absl::StatusOr<QueueConfig> c = ParseQueueConfig(kTwoTeamsQueues);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->queues.size(), 2u);
  const QueueSpec& a = c->queues[0];
  EXPECT_EQ(a.name, "team-a");
  EXPECT_EQ(a.cohort, "research");
  EXPECT_TRUE(a.managed[kTrainers]);
  EXPECT_FALSE(a.managed[kCpuDevices]);
  EXPECT_FALSE(a.managed[kCudaDevices]);
  EXPECT_EQ(a.quota[kTrainers], 1);
  EXPECT_EQ(a.borrowing_limit[kTrainers], 1);
  EXPECT_EQ(a.lending_limit[kTrainers], 1);  // lends all of it by default
  EXPECT_EQ(a.weight, 1.0);
  EXPECT_EQ(a.within_queue, WithinQueuePolicy::kLowerPriority);
  EXPECT_EQ(a.reclaim_within_cohort, ReclaimPolicy::kAny);
  const QueueSpec& b = c->queues[1];
  EXPECT_EQ(b.borrowing_limit[kTrainers], kUnlimited);  // no limit named
  EXPECT_EQ(b.reclaim_within_cohort, ReclaimPolicy::kAny);
  EXPECT_EQ(c->default_queue.at("alice"), "team-a");
  EXPECT_EQ(c->default_queue.at("bob"), "team-b");

  EXPECT_EQ(*c->Resolve("alice", {}, ""), 0);
  EXPECT_EQ(*c->Resolve("bob", {}, "team-b"), 1);
  absl::StatusOr<int> other = c->Resolve("alice", {}, "team-b");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other.status().message(),
            "user alice may not submit to queue team-b (your queues: team-a)");
  absl::StatusOr<int> unknown = c->Resolve("alice", {}, "team-z");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(),
            "unknown queue 'team-z' (queues: team-a, team-b; yours: team-a)");
  EXPECT_EQ(c->Resolve("mallory", {}, "").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(QueueConfigTest, FullSchemaGroupsDefaultsWeightsAndPerQueuePolicies) {
  absl::StatusOr<QueueConfig> c = ParseQueueConfig(R"(
queues:
  - name: vision
    cohort: gpu
    quota: {trainers: 8, cuda_devices: 32}
    lending_limit: {cuda_devices: 16}
    weight: 2
    groups: [vision-team]
    users: [alice]
    preemption: {within_queue: never, reclaim_within_cohort: lower_priority}
  - name: nlp
    cohort: gpu
    quota: {trainers: 4, cuda_devices: 16}
    borrowing_limit: {cuda_devices: 16}
    users: [alice, bob]
  - name: batch
    quota: {trainers: 10}
    users: ["*"]
default_queues: {alice: nlp}
groups:
  vision-team: [carol]
)");
  ASSERT_TRUE(c.ok()) << c.status();
  const QueueSpec& v = c->queues[0];
  EXPECT_EQ(v.weight, 2.0);
  EXPECT_EQ(v.lending_limit[kCudaDevices], 16);
  EXPECT_EQ(v.lending_limit[kTrainers], 8);
  EXPECT_EQ(v.within_queue, WithinQueuePolicy::kNever);
  EXPECT_EQ(v.reclaim_within_cohort, ReclaimPolicy::kLowerPriority);
  EXPECT_EQ(c->queues[1].reclaim_within_cohort, ReclaimPolicy::kNever);  // file default
  EXPECT_EQ(c->queues[2].borrowing_limit[kTrainers], 0);                 // no cohort
  EXPECT_EQ(*c->Resolve("alice", {}, ""), 1);
  EXPECT_EQ(*c->Resolve("alice", {}, "vision"), 0);
  EXPECT_EQ(*c->Resolve("dave", {"vision-team"}, "vision"), 0);
  EXPECT_EQ(*c->Resolve("carol", {}, "vision"), 0);  // a member by the file
  EXPECT_EQ(*c->Resolve("dave", {}, "batch"), 2);    // "*"
  // dave may use vision (group) and batch ("*") and has no default.
  EXPECT_EQ(c->Resolve("dave", {"vision-team"}, "").status().message(),
            "user dave may use queues vision, batch and has no default; set the job's queue");
}

// Groups: the file's `groups:` maps each group to its users; a queue's
// `groups:` admits their members as if listed (defaults, several queues and
// refusals alike). A user listed and in a listed group is one user.
TEST(QueueConfigTest, GroupsInTheFileAdmitTheirMembers) {
  absl::StatusOr<QueueConfig> c = ParseQueueConfig(R"(
groups:
  ml-research: [alice, carol]
  infra: [bob]
queues:
  - name: research
    quota: {trainers: 2}
    groups: [ml-research]
    users: [alice]
  - name: ops
    quota: {trainers: 1}
    groups: [infra]
    users: [dave]
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->group_members.at("ml-research"), (std::vector<std::string>{"alice", "carol"}));
  EXPECT_EQ(*c->Resolve("alice", {}, ""), 0);
  EXPECT_EQ(*c->Resolve("carol", {}, ""), 0);
  EXPECT_EQ(*c->Resolve("bob", {}, ""), 1);
  EXPECT_EQ(*c->Resolve("dave", {}, ""), 1);
  EXPECT_EQ(c->default_queue.at("carol"), "research");
  absl::StatusOr<int> other = c->Resolve("carol", {}, "ops");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other.status().message(),
            "user carol may not submit to queue ops (your queues: research)");
  absl::StatusOr<int> none = c->Resolve("erin", {}, "");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  // A group the caller's identity carries counts too.
  EXPECT_EQ(*c->Resolve("erin", {"infra"}, ""), 1);

  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"queues:\n  - name: a\n    quota: {trainers: 1}\n    groups: [ml]\n",
       "line 2: queue a: group 'ml' is not defined under 'groups:'"},
      {"groups: {ml: [u]}\nqueues:\n  - name: a\n    quota: {trainers: 1}\n    groups: [ml]\n"
       "  - name: b\n    quota: {trainers: 1}\n    users: [u]\n",
       "user u is mapped to several queues (a, b)"},
      {"groups: [ml]\nqueues:\n  - name: a\n    quota: {trainers: 1}\n",
       "line 1: groups must be a mapping like {ml-research: [alice, carol]}"},
      {"groups: {ml: [u, u]}\nqueues:\n  - name: a\n    quota: {trainers: 1}\n",
       "line 1: groups: ml: 'u' listed twice in its users"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.text);
    absl::StatusOr<QueueConfig> q = ParseQueueConfig(k.text);
    ASSERT_FALSE(q.ok());
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(q.status().message().find(k.want), absl::string_view::npos) << q.status();
  }
}

TEST(QueueConfigTest, InvalidFilesNameTheProblem) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"queues:\n  - name: a\n    quota: {trainers: -1}\n",
       "line 3: queue a: negative quota "
       "trainers (-1)"},
      {"queues:\n  - name: a\n    quota: {gpus: 1}\n", "unknown resource 'gpus'"},
      {"queues:\n  - name: a\n    quota: {trainers: x}\n", "must be a whole number, got 'x'"},
      {"queues:\n  - name: a\n    quota: {trainers: 1}\n    users: [u]\n"
       "  - name: b\n    quota: {trainers: 1}\n    users: [u]\n",
       "user u is mapped to several queues (a, b)"},
      {"queues:\n  - name: a\n    quota: {trainers: 1}\n    users: [u, u]\n",
       "line 4: queue a: 'u' listed twice in users"},
      {"queues:\n  - name: a\n    cohort: c\n    quota: {trainers: 1}\n"
       "    borrowing_limit: {trainers: 3}\n"
       "  - name: b\n    cohort: c\n    quota: {trainers: 2}\n",
       "line 2: queue a: borrowing_limit trainers 3 is more than the rest of cohort c can lend "
       "(2)"},
      {"queues:\n  - name: a\n    quota: {trainers: 1}\n    borrowing_limit: {trainers: 1}\n",
       "line 4: queue a: borrowing_limit without a cohort"},
      {"queues:\n  - name: a\n    cohort: c\n    quota: {trainers: 1}\n"
       "    lending_limit: {trainers: 2}\n",
       "lending_limit trainers 2 is above its quota 1"},
      {"queues:\n  - name: a\n    quota: {trainers: 1}\n"
       "preemption: {within_queue: always}\n",
       "line 4: preemption: within_queue must be never or lower_priority, got 'always'"},
      {"queues:\n  - name: a\n    quota: {trainers: 1}\n    users: [u]\n"
       "default_queues: {u: b}\n",
       "default_queues: unknown queue 'b' for user u"},
      {"queues:\n  - name: a\n    quota: {trainers: 1}\n    colour: red\n",
       "line 4: unknown key 'colour' in queue a"},
      {"queues:\n  - name: a\n    cohort: c\n    quota: {trainers: 1}\n"
       "  - name: b\n    cohort: c\n    quota: {trainers: 1, cuda_devices: 4}\n",
       "queue a of cohort c has no quota for cuda_devices but queue b has"},
      {"queues:\n  - name: a\n    quota: {trainers: 1}\n  - name: a\n    quota: {}\n",
       "line 4: queue a twice"},
      {"queues:\n  - name: a\n", "line 2: queue a: no quota"},
      {"queues:\n  - name: a\n    quota: {trainers: 1\n", "line 3: expected ',' or '}'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<QueueConfig> q = ParseQueueConfig(c.text);
    ASSERT_FALSE(q.ok());
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(q.status().message().find(c.want), absl::string_view::npos) << q.status();
  }
}

TEST(QueueConfigTest, QuotaChangeThatWouldStrandRunningJobsIsRefused) {
  QueueConfig now = *ParseQueueConfig(kTwoTeamsQueues);
  // team-a runs 2 trainers (1 borrowed from team-b), team-b none.
  std::map<std::string, Resources> usage;
  usage["team-a"][kTrainers] = 2;
  EXPECT_TRUE(CheckQuotaChange(now, usage).ok());

  // Taking away team-a's borrowing limit strands its second trainer.
  QueueConfig no_borrowing = *ParseQueueConfig(R"(queues:
  - name: team-a
    cohort: research
    quota: {trainers: 1}
    borrowing_limit: {trainers: 0}
    users: [alice]
  - name: team-b
    cohort: research
    quota: {trainers: 1}
    users: [bob]
)");
  absl::Status s = CheckQuotaChange(no_borrowing, usage);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("queue team-a uses trainers 2 > new quota 1 + borrowing limit 0"),
            absl::string_view::npos)
      << s;

  // team-b no longer lends: team-a's borrowed trainer has no pool left.
  QueueConfig no_lending = *ParseQueueConfig(R"(queues:
  - name: team-a
    cohort: research
    quota: {trainers: 1}
    users: [alice]
  - name: team-b
    cohort: research
    quota: {trainers: 1}
    lending_limit: {trainers: 0}
    users: [bob]
)");
  s = CheckQuotaChange(no_lending, usage);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("cohort research uses trainers 2 of its shared pool but the new "
                             "quotas share only 1"),
            absl::string_view::npos)
      << s;

  // Removing a queue that runs jobs.
  QueueConfig only_b = *ParseQueueConfig("queues:\n  - name: team-b\n    quota: {trainers: 1}\n");
  s = CheckQuotaChange(only_b, usage);
  EXPECT_NE(s.message().find("queue team-a runs jobs using trainers 2 and is not in it"),
            absl::string_view::npos)
      << s;
  // ... is fine once they are gone.
  EXPECT_TRUE(CheckQuotaChange(only_b, {}).ok());
}

TEST(QueueConfigTest, DefaultConfigIsOneUnlimitedQueueForEveryone) {
  QueueConfig c = DefaultQueueConfig();
  ASSERT_EQ(c.queues.size(), 1u);
  EXPECT_EQ(*c.Resolve("anyone", {}, ""), 0);
  for (int r = 0; r < kNumResources; ++r) EXPECT_FALSE(c.queues[0].managed[r]);
}

TEST(ResourcesTest, GangAndToString) {
  EXPECT_EQ(GangResources(4, 2, true).ToString(), "trainers 4, cuda_devices 8");
  EXPECT_EQ(GangResources(3, 0, false).ToString(), "trainers 3, cpu_devices 3");
  EXPECT_EQ(Resources().ToString(), "nothing");
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
