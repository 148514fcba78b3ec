#include "libs/graph/planner.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace graph {
namespace {

int Add1(Graph* g, OpKind op, std::vector<int> in, Attrs a = {}) {
  absl::StatusOr<std::vector<int>> out = g->AddNode(op, std::move(in), std::move(a));
  EXPECT_TRUE(out.ok()) << out.status();
  return (*out)[0];
}

// Checks the plan's invariant: buffers whose lifetimes overlap never share
// bytes, and every offset is aligned.
void ExpectNoConflicts(const MemoryPlan& plan, int64_t alignment) {
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const PlannedBuffer& a = plan.buffers[i];
    EXPECT_EQ(a.offset % alignment, 0);
    EXPECT_LE(a.offset + a.bytes, plan.arena_bytes[static_cast<int>(a.dtype)]);
    for (size_t j = i + 1; j < plan.buffers.size(); ++j) {
      const PlannedBuffer& b = plan.buffers[j];
      if (a.dtype != b.dtype || a.last < b.first || b.last < a.first) continue;
      EXPECT_TRUE(a.offset + a.bytes <= b.offset || b.offset + b.bytes <= a.offset)
          << "buffers " << i << " and " << j << " overlap in time and memory";
    }
  }
}

TEST(PlannerTest, ElementwiseChainRunsInPlace) {
  Graph g;
  int x = g.AddInput("x", {1024});
  int w = g.AddTensor(ValueKind::kConstant, "w", Tensor::Zeros({1024}));
  int a = Add1(&g, OpKind::kAdd, {x, w});  // a new buffer (x is external)
  int b = Add1(&g, OpKind::kRelu, {a});    // over a
  int c = Add1(&g, OpKind::kScale, {b});   // over b
  g.outputs() = {c};
  absl::StatusOr<MemoryPlan> plan = PlanMemory(g);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->buffers.size(), 1u);
  EXPECT_EQ(plan->total_bytes, 4096);
  EXPECT_EQ(plan->in_place_input, (std::vector<int>{-1, 0, 0}));
  EXPECT_EQ(plan->value_buffer[a], plan->value_buffer[c]);
}

TEST(PlannerTest, NoInPlaceWhenTheInputIsReadLater) {
  Graph g;
  int x = g.AddInput("x", {256});
  int a = Add1(&g, OpKind::kRelu, {x});
  int b = Add1(&g, OpKind::kRelu, {a});  // a is still needed below
  int c = Add1(&g, OpKind::kAdd, {a, b});
  g.outputs() = {c};
  absl::StatusOr<MemoryPlan> plan = PlanMemory(g);
  ASSERT_TRUE(plan.ok());
  EXPECT_NE(plan->value_buffer[a], plan->value_buffer[b]);
  EXPECT_EQ(plan->in_place_input[1], -1);
  EXPECT_EQ(plan->value_buffer[c], plan->value_buffer[a]);  // a dies at c
  ExpectNoConflicts(*plan, 64);
}

TEST(PlannerTest, DisjointLifetimesShareMemoryAndOutputsLiveToTheEnd) {
  // x -> conv -> pool -> conv -> pool: the first conv's output is dead once
  // pooled, so the second conv's output can take its place.
  Graph g;
  int x = g.AddInput("x", {1, 1, 32, 32});
  int w = g.AddTensor(ValueKind::kConstant, "w", Tensor::Zeros({4, 1, 3, 3}));
  int w2 = g.AddTensor(ValueKind::kConstant, "w2", Tensor::Zeros({4, 4, 3, 3}));
  Attrs c;
  c.padding = 1;
  Attrs p;
  p.kernel = 2;
  p.stride = 2;
  int y1 = Add1(&g, OpKind::kConv2d, {x, w, -1}, c);  // 16 KiB
  int p1 = Add1(&g, OpKind::kAvgPool2d, {y1}, p);     // 4 KiB
  int y2 = Add1(&g, OpKind::kConv2d, {p1, w2, -1}, c);
  int p2 = Add1(&g, OpKind::kAvgPool2d, {y2}, p);
  g.outputs() = {p2, p1};
  absl::StatusOr<MemoryPlan> plan = PlanMemory(g);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->buffers[plan->value_buffer[y2]].offset,
            plan->buffers[plan->value_buffer[y1]].offset);
  EXPECT_EQ(plan->buffers[plan->value_buffer[p1]].last, 4);  // a graph output
  EXPECT_LT(plan->total_bytes, plan->unshared_bytes);
  EXPECT_GE(plan->total_bytes, plan->lower_bound_bytes);
  ExpectNoConflicts(*plan, 64);

  PlannerOptions no_reuse;
  no_reuse.reuse = false;
  no_reuse.in_place = false;
  absl::StatusOr<MemoryPlan> naive = PlanMemory(g, no_reuse);
  ASSERT_TRUE(naive.ok());
  EXPECT_EQ(naive->total_bytes, naive->unshared_bytes);
}

TEST(PlannerTest, ViewsShareTheirSourceAndExtendItsLifetime) {
  Graph g;
  int x = g.AddInput("x", {4, 8});
  int r = Add1(&g, OpKind::kRelu, {x});
  Attrs f;
  f.shape = {32};
  int v = Add1(&g, OpKind::kReshape, {r}, f);
  int v2 = Add1(&g, OpKind::kReshape, {x}, f);  // a view of the input: no buffer
  int s = Add1(&g, OpKind::kAdd, {v, v2});
  g.outputs() = {s};
  absl::StatusOr<MemoryPlan> plan = PlanMemory(g);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->view_of[v], r);
  EXPECT_EQ(plan->value_buffer[v], plan->value_buffer[r]);
  EXPECT_EQ(plan->value_buffer[v2], -1);
  EXPECT_EQ(plan->view_of[v2], x);
  // add runs in place over r's buffer (r dies there, through its view).
  EXPECT_EQ(plan->value_buffer[s], plan->value_buffer[r]);
}

TEST(PlannerTest, RandomGraphsNeverConflict) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    Graph g;
    std::vector<int> pool = {g.AddInput("x", {64})};
    const int n = 5 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      int a = pool[rng() % pool.size()], b = pool[rng() % pool.size()];
      pool.push_back(rng() % 2 ? Add1(&g, OpKind::kAdd, {a, b}) : Add1(&g, OpKind::kRelu, {a}));
    }
    g.outputs() = {pool.back(), pool[pool.size() / 2]};
    for (bool in_place : {false, true}) {
      PlannerOptions o;
      o.in_place = in_place;
      o.alignment = 128;
      absl::StatusOr<MemoryPlan> plan = PlanMemory(g, o);
      ASSERT_TRUE(plan.ok());
      ExpectNoConflicts(*plan, 128);
      EXPECT_GE(plan->total_bytes, plan->lower_bound_bytes);
    }
  }
}

TEST(PlannerTest, BadAlignmentIsAnError) {
  Graph g;
  g.AddInput("x", {1});
  PlannerOptions o;
  o.alignment = 48;
  EXPECT_EQ(PlanMemory(g, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace graph
}  // namespace dtrain
