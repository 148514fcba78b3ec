#include "libs/graph/passes.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "libs/graph/autodiff.h"
#include "libs/graph/executor.h"
#include "libs/ops/ops.h"
#include "libs/ops/testing/gradcheck.h"

namespace dtrain {
namespace graph {
namespace {

using ops::testing::RandomTensor;
using ops::testing::TensorsNear;

int Add1(Graph* g, OpKind op, std::vector<int> in, Attrs a = {}) {
  absl::StatusOr<std::vector<int>> out = g->AddNode(op, std::move(in), std::move(a));
  EXPECT_TRUE(out.ok()) << out.status();
  return (*out)[0];
}

std::vector<Tensor> RunGraph(const Graph& g, const std::vector<Tensor>& inputs) {
  absl::StatusOr<std::unique_ptr<Executable>> exe = Executable::Compile(g);
  EXPECT_TRUE(exe.ok()) << exe.status();
  EXPECT_TRUE((*exe)->Run(inputs).ok());
  std::vector<Tensor> out;
  for (int i = 0; i < (*exe)->num_outputs(); ++i) out.push_back((*exe)->output(i).Clone());
  return out;
}

int Count(const Graph& g, OpKind op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

// conv -> batch norm -> relu -> add(residual) -> relu, constant weights.
Graph ConvBnBlock() {
  Graph g;
  int x = g.AddInput("x", {2, 4, 6, 6});
  int w = g.AddTensor(ValueKind::kConstant, "w", RandomTensor({4, 4, 3, 3}, 1));
  int b = g.AddTensor(ValueKind::kConstant, "b", RandomTensor({4}, 2));
  int gamma = g.AddTensor(ValueKind::kConstant, "gamma", RandomTensor({4}, 3, 0.5f, 1.5f));
  int beta = g.AddTensor(ValueKind::kConstant, "beta", RandomTensor({4}, 4));
  int mean = g.AddTensor(ValueKind::kConstant, "mean", RandomTensor({4}, 5));
  int var = g.AddTensor(ValueKind::kConstant, "var", RandomTensor({4}, 6, 0.5f, 2.0f));
  Attrs c;
  c.padding = 1;
  int y = Add1(&g, OpKind::kConv2d, {x, w, b}, c);
  Attrs bn;
  bn.eps = 1e-5f;
  int n = Add1(&g, OpKind::kBatchNormInference, {y, gamma, beta, mean, var}, bn);
  int r = Add1(&g, OpKind::kRelu, {n});
  int s = Add1(&g, OpKind::kAdd, {r, x});
  g.outputs() = {Add1(&g, OpKind::kRelu, {s})};
  return g;
}

TEST(PassesTest, BatchNormFoldsIntoTheConvolution) {
  Graph g = ConvBnBlock();
  Tensor x = RandomTensor({2, 4, 6, 6}, 9);
  std::vector<Tensor> want = RunGraph(g, {x});
  EXPECT_EQ(FoldBatchNorm(&g), 1);
  EXPECT_EQ(Count(g, OpKind::kBatchNormInference), 0);
  EXPECT_TRUE(g.Validate().ok()) << g.Validate();
  EXPECT_TRUE(TensorsNear(RunGraph(g, {x})[0], want[0], 1e-5, 1e-5));
}

TEST(PassesTest, OptimizeLeavesConvReluAndOneFusedNode) {
  Graph g = ConvBnBlock();
  Tensor x = RandomTensor({2, 4, 6, 6}, 9);
  std::vector<Tensor> want = RunGraph(g, {x});
  absl::StatusOr<OptimizeStats> stats = Optimize(&g);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->batch_norms_folded, 1);
  EXPECT_EQ(stats->relus_fused, 1);
  EXPECT_EQ(stats->elementwise_fused, 1);
  ASSERT_EQ(g.nodes().size(), 2u) << g.ToString();
  EXPECT_EQ(g.nodes()[0].op, OpKind::kConv2d);
  EXPECT_TRUE(g.nodes()[0].attrs.relu);
  EXPECT_EQ(g.nodes()[1].op, OpKind::kFusedElementwise);
  EXPECT_TRUE(TensorsNear(RunGraph(g, {x})[0], want[0], 1e-5, 1e-5));
}

TEST(PassesTest, BatchNormWithTrainableWeightsIsNotFolded) {
  Graph g = ConvBnBlock();
  g.value(g.FindValue("w")).kind = ValueKind::kParameter;
  EXPECT_EQ(FoldBatchNorm(&g), 0);
}

TEST(PassesTest, ConstantSubgraphsAreFolded) {
  Graph g;
  int x = g.AddInput("x", {2, 3});
  int a = g.AddTensor(ValueKind::kConstant, "a", Tensor::Full({2, 3}, -2.0f));
  int b = g.AddTensor(ValueKind::kConstant, "b", Tensor::Full({2, 3}, 5.0f));
  int s = Add1(&g, OpKind::kAdd, {a, b});  // 3
  int r = Add1(&g, OpKind::kRelu, {a});    // 0
  int t = Add1(&g, OpKind::kAdd, {s, r});  // 3: folds too, after its inputs
  g.outputs() = {Add1(&g, OpKind::kAdd, {x, t})};
  absl::StatusOr<int> folded = FoldConstants(&g);
  ASSERT_TRUE(folded.ok());
  EXPECT_EQ(*folded, 3);
  EXPECT_EQ(EliminateDeadCode(&g), 0);
  ASSERT_EQ(g.nodes().size(), 1u) << g.ToString();
  EXPECT_TRUE(g.Validate().ok());
  EXPECT_EQ(RunGraph(g, {Tensor::Full({2, 3}, 1.0f)})[0].ToVector<float>(),
            std::vector<float>(6, 4.0f));
}

TEST(PassesTest, DeadCodeIsRemovedButUpdatesStay) {
  Graph g;
  int x = g.AddInput("x", {4});
  int p = g.AddTensor(ValueKind::kParameter, "p", Tensor::Zeros({4}));
  int unused = Add1(&g, OpKind::kRelu, {x});
  Add1(&g, OpKind::kScale, {unused});
  int out = Add1(&g, OpKind::kAdd, {x, p});
  ASSERT_TRUE(g.AddNode(OpKind::kSgdUpdate, {p, x, -1}, {}).ok());
  g.outputs() = {out};
  EXPECT_EQ(EliminateDeadCode(&g), 2);
  ASSERT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.nodes()[1].op, OpKind::kSgdUpdate);
  EXPECT_TRUE(g.Validate().ok());
}

TEST(PassesTest, UnreadOptionalOutputsAreDropped) {
  Graph g;
  int x = g.AddInput("x", {4, 3});
  int w = g.AddTensor(ValueKind::kParameter, "w", Tensor::Zeros({2, 3}));
  int dy = g.AddInput("dy", {4, 2});
  absl::StatusOr<std::vector<int>> d = g.AddNode(OpKind::kLinearBackward, {x, w, dy}, {});
  ASSERT_TRUE(d.ok());
  g.outputs() = {(*d)[1]};
  EliminateDeadCode(&g);
  EXPECT_EQ(g.nodes()[0].outputs[0], -1);
  EXPECT_GE(g.nodes()[0].outputs[1], 0);
  EXPECT_EQ(g.nodes()[0].outputs[2], -1);
}

TEST(PassesTest, ElementwiseFusionRespectsOtherReaders) {
  Graph g;
  int a = g.AddInput("a", {8});
  int b = g.AddInput("b", {8});
  int s = Add1(&g, OpKind::kAdd, {a, b});
  int r = Add1(&g, OpKind::kRelu, {s});
  Attrs h;
  h.alpha = 0.5f;
  int t = Add1(&g, OpKind::kScale, {r}, h);
  int u = Add1(&g, OpKind::kAdd, {t, r});  // r has two readers: t and u
  g.outputs() = {u, r};                    // and is an output: it must stay
  std::vector<Tensor> in = {RandomTensor({8}, 1), RandomTensor({8}, 2)};
  std::vector<Tensor> want = RunGraph(g, in);
  EXPECT_EQ(FuseElementwise(&g), 2);  // add into relu, scale into the last add
  EXPECT_EQ(g.nodes().size(), 2u) << g.ToString();
  EXPECT_EQ(RunGraph(g, in)[0].ToVector<float>(), want[0].ToVector<float>());
  EXPECT_EQ(RunGraph(g, in)[1].ToVector<float>(), want[1].ToVector<float>());
  // Without the second output, both of r's readers end up in one node.
  g.outputs().pop_back();
  EXPECT_EQ(FuseElementwise(&g), 1);
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(RunGraph(g, in)[0].ToVector<float>(), want[0].ToVector<float>());
}

TEST(PassesTest, InferShapesFollowsANewBatch) {
  Graph g;
  int x = g.AddInput("x", {2, 3, 4});
  Attrs f;
  f.shape = {0, -1};
  int v = Add1(&g, OpKind::kReshape, {x}, f);
  int w = g.AddTensor(ValueKind::kConstant, "w", Tensor::Zeros({5, 12}));
  g.outputs() = {Add1(&g, OpKind::kLinear, {v, w, -1})};
  ASSERT_TRUE(InferShapes(&g, {{7, 3, 4}}).ok());
  EXPECT_EQ(g.value(g.outputs()[0]).shape, (Shape{7, 5}));
  const std::string before = g.ToString();
  absl::Status s = InferShapes(&g, {{7, 3, 5}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("linear"), absl::string_view::npos) << s;
  EXPECT_EQ(g.ToString(), before);
  EXPECT_FALSE(InferShapes(&g, {}).ok());
}

TEST(PassesTest, TrainingStepFusesPoolingReluAndTheFirstLayersWeightGradient) {
  // conv(1 channel, relu) -> avg pool -> flatten -> linear: a LeNet prefix.
  Graph g;
  int x = g.AddInput("x", {4, 1, 10, 10});
  int w = g.AddTensor(ValueKind::kParameter, "w", RandomTensor({3, 1, 3, 3}, 1));
  int b = g.AddTensor(ValueKind::kParameter, "b", RandomTensor({3}, 2));
  int fw = g.AddTensor(ValueKind::kParameter, "fw", RandomTensor({5, 48}, 3));
  Attrs c;
  c.relu = true;
  int y = Add1(&g, OpKind::kConv2d, {x, w, b}, c);
  Attrs p;
  p.kernel = 2;
  p.stride = 2;
  int pooled = Add1(&g, OpKind::kAvgPool2d, {y}, p);
  Attrs f;
  f.shape = {0, -1};
  int flat = Add1(&g, OpKind::kReshape, {pooled}, f);
  g.outputs() = {Add1(&g, OpKind::kLinear, {flat, fw, -1})};
  ASSERT_TRUE(BuildTrainingStep(&g, {.lr = 0.1f}).ok());
  Graph plain = g;
  Tensor xin = RandomTensor({4, 1, 10, 10}, 4);
  Tensor labels = Tensor::FromVector<int32_t>({0, 1, 2, 3}, {4});
  absl::StatusOr<OptimizeStats> stats = Optimize(&g);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pool_relu_backward_fused, 1);
  EXPECT_EQ(stats->conv_weights_gradient_fused, 1);
  EXPECT_EQ(Count(g, OpKind::kConv2dBackwardWeightsAvgPoolRelu), 1) << g.ToString();
  // Both graphs update their own copies of the parameters: compare losses
  // and the updated conv weights.
  Graph* graphs[2] = {&plain, &g};
  std::vector<std::vector<float>> updated;
  std::vector<float> losses;
  for (Graph* gr : graphs) {
    for (Value& v : gr->values()) {
      if (v.kind == ValueKind::kParameter) v.data = v.data.Clone();
    }
    losses.push_back(RunGraph(*gr, {xin, labels})[0].ToVector<float>()[0]);
    updated.push_back(gr->value(gr->FindValue("w")).data.ToVector<float>());
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-6);
  for (size_t i = 0; i < updated[0].size(); ++i) EXPECT_NEAR(updated[0][i], updated[1][i], 1e-5);
}

TEST(PassesTest, AutodiffRejectsWhatItCannotDifferentiate) {
  Graph g;
  int x = g.AddInput("x", {2, 3});
  int w = g.AddTensor(ValueKind::kParameter, "w", Tensor::Zeros({3, 4}));
  Attrs t;
  t.transpose_a = true;
  int xt = Add1(&g, OpKind::kMatMul, {x, x}, t);  // [3, 3]
  g.outputs() = {Add1(&g, OpKind::kMatMul, {xt, w}, t)};
  const std::string before = g.ToString();
  absl::Status s = BuildTrainingStep(&g, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_EQ(g.ToString(), before);
}

}  // namespace
}  // namespace graph
}  // namespace dtrain
