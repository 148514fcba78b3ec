#include "libs/scheduler/timeline_store.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace scheduler {
namespace {

v1::RankTimeline Rank(int rank, int attempt, int spans) {
  v1::RankTimeline t;
  t.set_rank(rank);
  t.set_attempt(attempt);
  for (int i = 0; i < spans; ++i) {
    v1::TraceSpan* s = t.add_spans();
    s->set_name("step");
    s->set_step(i);
  }
  return t;
}

TEST(TimelineStoreTest, NewestUploadPerRankOfTheNewestAttempt) {
  TimelineStore store;
  EXPECT_TRUE(absl::IsNotFound(store.Get("job-1").status()));
  store.Put("job-1", Rank(1, 1, 2));
  store.Put("job-1", Rank(0, 1, 1));
  store.Put("job-1", Rank(0, 1, 3));  // replaces rank 0's
  absl::StatusOr<v1::Timeline> t = store.Get("job-1");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->ranks_size(), 2);
  EXPECT_EQ(t->ranks(0).rank(), 0);
  EXPECT_EQ(t->ranks(0).spans_size(), 3);
  EXPECT_EQ(t->ranks(1).rank(), 1);
  // A newer attempt drops the old one's ranks; an older one is ignored.
  store.Put("job-1", Rank(1, 2, 5));
  store.Put("job-1", Rank(0, 1, 7));
  t = store.Get("job-1");
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->ranks_size(), 1);
  EXPECT_EQ(t->ranks(0).rank(), 1);
  EXPECT_EQ(t->ranks(0).attempt(), 2);
}

TEST(TimelineStoreTest, BoundedInJobsAndSpans) {
  TimelineStore store(/*max_jobs=*/2, /*max_spans_per_rank=*/4);
  store.Put("a", Rank(0, 1, 10));
  store.Put("b", Rank(0, 1, 1));
  store.Put("a", Rank(1, 1, 1));  // a is now the newest
  store.Put("c", Rank(0, 1, 1));  // drops b
  EXPECT_TRUE(store.Get("a").ok());
  EXPECT_TRUE(absl::IsNotFound(store.Get("b").status()));
  EXPECT_TRUE(store.Get("c").ok());
  absl::StatusOr<v1::Timeline> a = store.Get("a");
  ASSERT_TRUE(a.ok());
  // The newest 4 of rank 0's 10 spans, the other 6 counted as dropped.
  ASSERT_EQ(a->ranks(0).spans_size(), 4);
  EXPECT_EQ(a->ranks(0).spans(0).step(), 6);
  EXPECT_EQ(a->ranks(0).dropped_spans(), 6);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
