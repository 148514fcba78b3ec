#include "libs/graph/executor.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "libs/ops/ops.h"
#include "libs/ops/testing/gradcheck.h"
#include "libs/tensor/allocator.h"

namespace dtrain {
namespace graph {
namespace {

using ops::testing::RandomTensor;
using ops::testing::TensorsNear;

// Runs `g` with the given options and returns its outputs (copies).
std::vector<Tensor> RunGraph(const Graph& g, const std::vector<Tensor>& inputs,
                             const ExecutorOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Executable>> exe = Executable::Compile(g, options);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  absl::Status s = (*exe)->Run(inputs);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<Tensor> out;
  for (int i = 0; i < (*exe)->num_outputs(); ++i) out.push_back((*exe)->output(i).Clone());
  return out;
}

ExecutorOptions RegistryOnly() {
  ExecutorOptions o;
  o.small_conv = false;
  o.small_linear_max_batch = 0;
  return o;
}

int Node1(Graph* g, OpKind op, std::vector<int> in, Attrs a = {}, uint32_t mask = ~0u) {
  absl::StatusOr<std::vector<int>> out = g->AddNode(op, std::move(in), std::move(a), mask);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0] : -1;
}

struct ConvCase {
  Shape x, w;
  int padding;
  bool relu;
};

class SmallConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(SmallConvTest, ForwardAndWeightGradientMatchTheRegistryKernels) {
  const ConvCase& c = GetParam();
  Graph g;
  int x = g.AddInput("x", c.x);
  int w = g.AddTensor(ValueKind::kConstant, "w", RandomTensor(c.w, 1));
  int b = g.AddTensor(ValueKind::kConstant, "b", RandomTensor({c.w[0]}, 2));
  Attrs a;
  a.padding = c.padding;
  a.relu = c.relu;
  int y = Node1(&g, OpKind::kConv2d, {x, w, b}, a);
  Attrs wa;
  wa.padding = c.padding;
  wa.shape.assign(c.w.begin(), c.w.end());
  absl::StatusOr<std::vector<int>> dw = g.AddNode(OpKind::kConv2dBackwardWeights, {x, y}, wa);
  ASSERT_TRUE(dw.ok()) << dw.status();
  g.outputs() = {y, (*dw)[0], (*dw)[1]};
  Tensor xin = RandomTensor(c.x, 3);
  std::vector<Tensor> want = RunGraph(g, {xin}, RegistryOnly());
  std::vector<Tensor> got = RunGraph(g, {xin});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(TensorsNear(got[0], want[0], 1e-5, 1e-6, "y"));
  EXPECT_TRUE(TensorsNear(got[1], want[1], 1e-4, 1e-4, "dw"));
  EXPECT_TRUE(TensorsNear(got[2], want[2], 1e-4, 1e-4, "db"));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SmallConvTest,
    ::testing::Values(ConvCase{{4, 1, 28, 28}, {20, 1, 3, 3}, 0, true},   // lenet conv1
                      ConvCase{{3, 1, 28, 28}, {64, 1, 3, 3}, 1, false},  // resnet18 stem
                      ConvCase{{2, 3, 17, 40}, {5, 3, 3, 3}, 1, true},    // 27 taps, wide rows
                      ConvCase{{2, 1, 12, 12}, {4, 1, 5, 5}, 2, false},   // 25 taps
                      ConvCase{{9, 2, 10, 7}, {3, 2, 2, 3}, 0, true},     // 12 taps (generic)
                      ConvCase{{2, 8, 9, 9}, {4, 8, 3, 3}, 1, false}));   // 72 taps: registry

TEST(ExecutorTest, FusedWeightGradientMatchesUnfusedOps) {
  // conv (relu) -> avg pool; backward from the pooled gradient.
  for (int pool : {2, 3}) {
    Graph g;
    int x = g.AddInput("x", {10, 1, 14, 14});
    int dyp = g.AddInput("dy_pooled", {10, 6, 12 / pool, 12 / pool});
    int y = g.AddInput("y", {10, 6, 12, 12});
    Attrs pa;
    pa.kernel = pool;
    pa.stride = pool;
    pa.shape = {0, 6, 12, 12};
    int d = Node1(&g, OpKind::kAvgPool2dBackward, {dyp}, pa);
    int dm = Node1(&g, OpKind::kReluBackward, {y, d});
    Attrs wa;
    wa.shape = {6, 1, 3, 3};
    absl::StatusOr<std::vector<int>> dw = g.AddNode(OpKind::kConv2dBackwardWeights, {x, dm}, wa);
    ASSERT_TRUE(dw.ok());
    g.outputs() = {(*dw)[0], (*dw)[1]};
    std::vector<Tensor> in = {RandomTensor({10, 1, 14, 14}, 1),
                              RandomTensor({10, 6, 12 / pool, 12 / pool}, 2),
                              RandomTensor({10, 6, 12, 12}, 3)};
    std::vector<Tensor> want = RunGraph(g, in, RegistryOnly());
    Graph fused = g;
    Node& cw = fused.nodes()[2];
    cw.op = OpKind::kConv2dBackwardWeightsAvgPoolRelu;
    cw.inputs = {x, dyp, y};
    cw.attrs.kernel = pool;
    fused.RemoveNodes({true, true, false});
    ASSERT_TRUE(fused.Validate().ok()) << fused.Validate();
    std::vector<Tensor> got = RunGraph(fused, in);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(TensorsNear(got[0], want[0], 1e-4, 1e-5, "dw"));
    EXPECT_TRUE(TensorsNear(got[1], want[1], 1e-4, 1e-5, "db"));
  }
}

TEST(ExecutorTest, AvgPoolReluBackwardMatchesUnfusedOps) {
  struct Case {
    Shape x;
    int k, s, p;
  };
  for (const Case& c : {Case{{2, 3, 9, 9}, 2, 2, 0}, Case{{2, 3, 8, 8}, 2, 2, 0},
                        Case{{1, 2, 7, 6}, 3, 2, 1}, Case{{1, 2, 5, 5}, 3, 3, 0}}) {
    Graph g;
    int y = g.AddInput("y", c.x);
    const int64_t ho = (c.x[2] + 2 * c.p - c.k) / c.s + 1, wo = (c.x[3] + 2 * c.p - c.k) / c.s + 1;
    int dy = g.AddInput("dy", {c.x[0], c.x[1], ho, wo});
    Attrs pa;
    pa.kernel = c.k;
    pa.stride = c.s;
    pa.padding = c.p;
    pa.shape.assign(c.x.begin(), c.x.end());
    int d = Node1(&g, OpKind::kAvgPool2dBackward, {dy}, pa);
    g.outputs() = {Node1(&g, OpKind::kReluBackward, {y, d})};
    Graph fused;
    int fy = fused.AddInput("y", c.x);
    int fdy = fused.AddInput("dy", {c.x[0], c.x[1], ho, wo});
    fused.outputs() = {Node1(&fused, OpKind::kAvgPool2dReluBackward, {fdy, fy}, pa)};
    std::vector<Tensor> in = {RandomTensor(c.x, 1), RandomTensor({c.x[0], c.x[1], ho, wo}, 2)};
    EXPECT_TRUE(TensorsNear(RunGraph(fused, in)[0], RunGraph(g, in)[0], 1e-6, 1e-7))
        << "kernel " << c.k << " stride " << c.s << " padding " << c.p;
  }
}

TEST(ExecutorTest, FusedElementwiseProgramMatchesSeparateOps) {
  const Shape shape = {3, 70001};  // several blocks, a partial last one, parallel
  Graph g;
  int a = g.AddInput("a", shape);
  int b = g.AddInput("b", shape);
  int y = g.AddInput("y", shape);
  Attrs sa;
  sa.alpha = -0.5f;
  int s = Node1(&g, OpKind::kAdd, {a, b});
  int r = Node1(&g, OpKind::kRelu, {s});
  int c = Node1(&g, OpKind::kScale, {r}, sa);
  int m = Node1(&g, OpKind::kReluBackward, {y, c});
  g.outputs() = {m};
  Graph f;
  int fa = f.AddInput("a", shape);
  int fb = f.AddInput("b", shape);
  int fy = f.AddInput("y", shape);
  Attrs fused;
  // inputs 0 a, 1 b, 2 y; results 3.. : add, relu, scale, relu_mask(y, .)
  fused.program = {{ElementwiseOp::kAdd, 0, 1, 0},
                   {ElementwiseOp::kRelu, 3, 0, 0},
                   {ElementwiseOp::kScale, 4, 0, -0.5f},
                   {ElementwiseOp::kReluMask, 2, 5, 0}};
  f.outputs() = {Node1(&f, OpKind::kFusedElementwise, {fa, fb, fy}, fused)};
  std::vector<Tensor> in = {RandomTensor(shape, 1), RandomTensor(shape, 2), RandomTensor(shape, 3)};
  for (int threads : {1, 2}) {
    ops::SetCpuThreads(threads);
    std::vector<float> want = RunGraph(g, in)[0].ToVector<float>();
    std::vector<float> got = RunGraph(f, in)[0].ToVector<float>();
    EXPECT_EQ(got, want) << threads << " threads";  // same arithmetic, bit for bit
  }
}

TEST(ExecutorTest, SmallBatchLinearMatchesTheRegistryKernel) {
  for (int64_t n : {1, 3}) {
    for (int64_t m : {2, 37, 256, 300}) {
      Graph g;
      int x = g.AddInput("x", {n, 129});
      int w = g.AddTensor(ValueKind::kConstant, "w", RandomTensor({m, 129}, 1));
      int b = g.AddTensor(ValueKind::kConstant, "b", RandomTensor({m}, 2));
      Attrs a;
      a.relu = m % 2 == 0;
      g.outputs() = {Node1(&g, OpKind::kLinear, {x, w, b}, a)};
      Tensor xin = RandomTensor({n, 129}, 3);
      absl::StatusOr<std::unique_ptr<Executable>> exe = Executable::Compile(g);
      ASSERT_TRUE(exe.ok());
      if (__builtin_cpu_supports("avx2")) EXPECT_EQ((*exe)->num_small_linear(), 1);
      EXPECT_TRUE(
          TensorsNear(RunGraph(g, {xin})[0], RunGraph(g, {xin}, RegistryOnly())[0], 1e-5, 1e-5))
          << "n " << n << " m " << m;
    }
  }
}

TEST(ExecutorTest, RunAllocatesNothingAfterCompile) {
  // A small network with views, in-place ops and both dtypes (max pool
  // indices are i32).
  Graph g;
  int x = g.AddInput("x", {8, 3, 12, 12});
  int w = g.AddTensor(ValueKind::kConstant, "w", RandomTensor({4, 3, 3, 3}, 1));
  Attrs c;
  c.padding = 1;
  int y = Node1(&g, OpKind::kConv2d, {x, w, -1}, c);
  int r = Node1(&g, OpKind::kRelu, {y});
  Attrs p;
  p.kernel = 2;
  p.stride = 2;
  int mp = Node1(&g, OpKind::kMaxPool2d, {r}, p);
  Attrs f;
  f.shape = {0, -1};
  int flat = Node1(&g, OpKind::kReshape, {mp}, f);
  int fw = g.AddTensor(ValueKind::kConstant, "fw", RandomTensor({5, 144}, 2));
  int out = Node1(&g, OpKind::kLinear, {flat, fw, -1});
  g.outputs() = {out};
  absl::StatusOr<std::unique_ptr<Executable>> exe = Executable::Compile(g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  Tensor in = RandomTensor({8, 3, 12, 12}, 3);
  ASSERT_TRUE((*exe)->Run({in}).ok());  // kernels' first-call setup
  Allocator* alloc = *GetAllocator(Device::Cpu());
  const int64_t before = alloc->stats().num_allocs;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*exe)->Run({in}).ok());
  EXPECT_EQ(alloc->stats().num_allocs, before);
  EXPECT_GT((*exe)->memory_plan().arena_bytes[static_cast<int>(DType::kI32)], 0);
}

TEST(ExecutorTest, ViewsOfTheInputFollowEachRunsTensor) {
  Graph g;
  int x = g.AddInput("x", {2, 3, 2});
  Attrs f;
  f.shape = {0, -1};
  int v = Node1(&g, OpKind::kReshape, {x}, f);
  g.outputs() = {Node1(&g, OpKind::kRelu, {v})};
  absl::StatusOr<std::unique_ptr<Executable>> exe = Executable::Compile(g);
  ASSERT_TRUE(exe.ok());
  for (float value : {1.0f, 2.0f}) {
    ASSERT_TRUE((*exe)->Run({Tensor::Full({2, 3, 2}, value)}).ok());
    EXPECT_EQ((*exe)->output(0).shape(), (Shape{2, 6}));
    EXPECT_EQ((*exe)->output(0).ToVector<float>(), std::vector<float>(12, value));
  }
}

TEST(ExecutorTest, WrongInputsAreErrors) {
  Graph g;
  int x = g.AddInput("x", {2, 3});
  g.outputs() = {Node1(&g, OpKind::kRelu, {x})};
  absl::StatusOr<std::unique_ptr<Executable>> exe = Executable::Compile(g);
  ASSERT_TRUE(exe.ok());
  EXPECT_EQ((*exe)->Run({}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*exe)->Run({Tensor::Zeros({3, 2})}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*exe)->Run({Tensor::Zeros({2, 3}, DType::kI32)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*exe)->Run({Tensor()}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*exe)->Run({Tensor::Zeros({2, 3})}).ok());
}

TEST(ExecutorTest, InvalidGraphDoesNotCompile) {
  Graph g;
  int x = g.AddInput("x", {2, 3});
  g.outputs() = {Node1(&g, OpKind::kRelu, {x})};
  g.nodes()[0].inputs[0] = 7;  // out of range
  EXPECT_EQ(Executable::Compile(g).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExecutorTest, ProfileReportsEveryStep) {
  Graph g;
  int x = g.AddInput("x", {2, 3});
  int r = Node1(&g, OpKind::kRelu, {x});
  g.outputs() = {Node1(&g, OpKind::kAdd, {r, x})};
  absl::StatusOr<std::unique_ptr<Executable>> exe = Executable::Compile(g);
  ASSERT_TRUE(exe.ok());
  absl::StatusOr<std::vector<NodeProfile>> prof = (*exe)->Profile({Tensor::Zeros({2, 3})}, 3);
  ASSERT_TRUE(prof.ok());
  ASSERT_EQ(prof->size(), 2u);
  EXPECT_EQ((*prof)[0].op, "relu");
  EXPECT_EQ((*prof)[1].op, "add");
  EXPECT_LE((*prof)[1].min_ms, (*prof)[1].total_ms);
}

}  // namespace
}  // namespace graph
}  // namespace dtrain
