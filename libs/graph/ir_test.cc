#include "libs/graph/ir.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace graph {
namespace {

TEST(IrTest, AddNodeInfersOutputTypes) {
  Graph g;
  int x = g.AddInput("x", {8, 3, 32, 32});
  int w = g.AddTensor(ValueKind::kParameter, "w", Tensor::Zeros({16, 3, 3, 3}));
  int b = g.AddTensor(ValueKind::kParameter, "b", Tensor::Zeros({16}));
  Attrs a;
  a.stride = 2;
  a.padding = 1;
  absl::StatusOr<std::vector<int>> y = g.AddNode(OpKind::kConv2d, {x, w, b}, a);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(g.value((*y)[0]).shape, (Shape{8, 16, 16, 16}));
  Attrs p;
  p.kernel = 2;
  p.stride = 2;
  absl::StatusOr<std::vector<int>> mp = g.AddNode(OpKind::kMaxPool2d, {(*y)[0]}, p);
  ASSERT_TRUE(mp.ok());
  EXPECT_EQ(g.value((*mp)[1]).dtype, DType::kI32);
  EXPECT_EQ(g.value((*mp)[1]).shape, (Shape{8, 16, 8, 8}));
  Attrs f;
  f.shape = {0, -1};
  absl::StatusOr<std::vector<int>> flat = g.AddNode(OpKind::kReshape, {(*mp)[0]}, f);
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(g.value((*flat)[0]).shape, (Shape{8, 1024}));
  g.outputs() = {(*flat)[0]};
  EXPECT_TRUE(g.Validate().ok()) << g.Validate();
}

TEST(IrTest, ShapeErrorsNameTheOpAndLeaveTheGraphUnchanged) {
  struct Case {
    OpKind op;
    std::vector<Shape> inputs;
    Attrs attrs;
    std::string want;
  };
  Attrs pool;
  pool.kernel = 5;
  pool.stride = 1;
  Attrs reshape;
  reshape.shape = {7, -1};
  Attrs bad_eps;
  bad_eps.eps = -1.0f;
  std::vector<Case> cases = {
      {OpKind::kConv2d, {{1, 3, 8, 8}, {4, 2, 3, 3}}, {}, "conv2d"},
      {OpKind::kConv2d, {{1, 3, 2, 2}, {4, 3, 3, 3}}, {}, "empty output"},
      {OpKind::kLinear, {{2, 5}, {3, 4}}, {}, "linear"},
      {OpKind::kAdd, {{2, 5}, {2, 4}}, {}, "differ in shape"},
      {OpKind::kAvgPool2d, {{1, 1, 4, 4}}, pool, "window"},
      {OpKind::kReshape, {{2, 6}}, reshape, "cannot reshape"},
      {OpKind::kMatMul, {{2, 3}, {4, 5}}, {}, "inner sizes"},
      {OpKind::kBatchNormInference, {{2, 3}, {3}, {3}, {3}, {3}}, bad_eps, "eps"},
      {OpKind::kGlobalAvgPool, {{2, 3}}, {}, "rank"},
  };
  for (const Case& c : cases) {
    Graph g;
    std::vector<int> ins;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      ins.push_back(g.AddInput("in" + std::to_string(i), c.inputs[i]));
    }
    const size_t before = g.values().size();
    absl::StatusOr<std::vector<int>> out = g.AddNode(c.op, ins, c.attrs);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << GetOpInfo(c.op).name;
    EXPECT_NE(out.status().message().find(c.want), absl::string_view::npos) << out.status();
    EXPECT_EQ(g.values().size(), before);
    EXPECT_TRUE(g.nodes().empty());
  }
}

TEST(IrTest, OptionalOutputsAreCreatedOnRequest) {
  Graph g;
  int x = g.AddInput("x", {4, 3});
  int w = g.AddTensor(ValueKind::kParameter, "w", Tensor::Zeros({2, 3}));
  int dy = g.AddInput("dy", {4, 2});
  absl::StatusOr<std::vector<int>> d = g.AddNode(OpKind::kLinearBackward, {x, w, dy}, {}, 0b010);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)[0], -1);
  EXPECT_GE((*d)[1], 0);
  EXPECT_EQ((*d)[2], -1);
  EXPECT_EQ(g.value((*d)[1]).shape, (Shape{2, 3}));
}

TEST(IrTest, ValidateFindsBrokenGraphs) {
  auto base = [] {
    Graph g;
    int x = g.AddInput("x", {2, 3});
    int r = *g.AddNode(OpKind::kRelu, {x}, {})->begin();
    g.outputs() = {*g.AddNode(OpKind::kRelu, {r}, {})->begin()};
    return g;
  };
  ASSERT_TRUE(base().Validate().ok());
  {
    Graph g = base();
    std::swap(g.nodes()[0], g.nodes()[1]);  // use before definition
    EXPECT_FALSE(g.Validate().ok());
  }
  {
    Graph g = base();
    g.value(g.nodes()[0].outputs[0]).shape = {3, 2};  // wrong type
    EXPECT_NE(g.Validate().message().find("gives"), absl::string_view::npos);
  }
  {
    Graph g = base();
    g.value(0).name = "dup";
    int c = g.AddTensor(ValueKind::kConstant, "dup", Tensor::Zeros({1}));
    (void)c;
    EXPECT_NE(g.Validate().message().find("duplicate"), absl::string_view::npos);
  }
  {
    Graph g = base();
    g.outputs() = {99};
    EXPECT_FALSE(g.Validate().ok());
  }
  {
    // sgd_update may only write parameters or state.
    Graph g;
    int p = g.AddTensor(ValueKind::kConstant, "p", Tensor::Zeros({3}));
    int gr = g.AddInput("g", {3});
    ASSERT_TRUE(g.AddNode(OpKind::kSgdUpdate, {p, gr, -1}, {}).ok());
    EXPECT_NE(g.Validate().message().find("updates"), absl::string_view::npos) << g.Validate();
  }
}

TEST(IrTest, OpNamesRoundTrip) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    const OpKind op = static_cast<OpKind>(i);
    absl::StatusOr<OpKind> back = OpKindFromName(GetOpInfo(op).name);
    ASSERT_TRUE(back.ok()) << GetOpInfo(op).name;
    EXPECT_EQ(*back, op);
  }
  EXPECT_FALSE(OpKindFromName("frobnicate").ok());
}

TEST(IrTest, RemoveNodesRenumbersValues) {
  Graph g;
  int x = g.AddInput("x", {2});
  int a = (*g.AddNode(OpKind::kRelu, {x}, {}))[0];
  int dead = (*g.AddNode(OpKind::kRelu, {x}, {}))[0];
  (void)dead;
  int b = (*g.AddNode(OpKind::kAdd, {a, x}, {}))[0];
  g.outputs() = {b};
  g.RemoveNodes({false, true, false});
  ASSERT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.values().size(), 3u);
  EXPECT_TRUE(g.Validate().ok()) << g.Validate();
  EXPECT_EQ(g.ToString(),
            "%0 = input \"x\" : f32[2]\n"
            "%1 = relu(%0) : f32[2]\n"
            "%2 = add(%1, %0) : f32[2]\n"
            "return %2\n");
}

}  // namespace
}  // namespace graph
}  // namespace dtrain
