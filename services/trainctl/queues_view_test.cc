#include "services/trainctl/queues_view.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace trainctl {
namespace {

using scheduler::v1::ListQueuesReply;
using scheduler::v1::QueueStatus;

TEST(QueuesViewTest, WithoutQueuesSaysSo) {
  EXPECT_EQ(QueuesTable(ListQueuesReply()),
            "no queues: the scheduler runs without a queues file (one queue, no quota; "
            "scheduler_server --queues=FILE, docs/queues.md)\n");
}

TEST(QueuesViewTest, OneRowPerLimitedResourceAndUnlimitedQueues) {
  ListQueuesReply r;
  r.set_configured(true);
  QueueStatus* a = r.add_queues();
  a->set_name("team-a");
  a->set_cohort("research");
  a->add_resources("trainers");
  a->add_resources("cpu_devices");
  a->mutable_quota()->set_trainers(1);
  a->mutable_quota()->set_cpu_devices(4);
  a->mutable_usage()->set_trainers(2);
  a->mutable_usage()->set_cpu_devices(2);
  a->mutable_borrowed()->set_trainers(1);
  a->set_pending(3);
  a->set_admitted(2);
  (*a->mutable_preempted())["reclaim_within_cohort"] = 1;
  (*a->mutable_preempted())["within_queue"] = 0;
  QueueStatus* d = r.add_queues();
  d->set_name("default");
  d->set_pending(0);
  d->set_admitted(5);
  EXPECT_EQ(QueuesTable(r),
            "QUEUE            COHORT       RESOURCE          QUOTA   USED  BORROWED   LENT  "
            "AVAILABLE  PENDING  ADMITTED  PREEMPTED\n"
            "team-a           research     trainers              1      2         1      0  "
            "        0        3         2  1 reclaim_within_cohort\n"
            "                              cpu_devices           4      2         0      0  "
            "        0\n"
            "default          -            -             unlimited      -         -      -  "
            "        -        0         5  -\n");
}

TEST(QueuesViewTest, QueuePlaceNamesThePositionOfQueuedJobsOnly) {
  scheduler::v1::JobStatus j;
  EXPECT_EQ(QueuePlace(j), "");
  j.set_queue("team-b");
  j.set_state(scheduler::v1::QUEUED);
  j.set_queue_position(2);
  EXPECT_EQ(QueuePlace(j), "queue team-b, position 2");
  j.set_state(scheduler::v1::RUNNING);
  j.set_queue_position(0);
  EXPECT_EQ(QueuePlace(j), "queue team-b");
}

}  // namespace
}  // namespace trainctl
}  // namespace dtrain
