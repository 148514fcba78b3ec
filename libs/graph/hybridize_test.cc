// Hybridized vs imperative results for the book's models: inference (eval
// mode) and whole training steps (train mode, batch-norm statistics
// included).
#include "libs/graph/hybridize.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/autograd/variable.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace graph {
namespace {

using autograd::Variable;

std::shared_ptr<nn::Module> Model(const std::string& name, uint64_t seed) {
  absl::StatusOr<std::shared_ptr<nn::Module>> m = nn::MakeModel(name);
  EXPECT_TRUE(m.ok()) << m.status();
  nn::InitParameters(m->get(), nn::Init::kKaiming, seed);
  // Non-trivial batch-norm parameters and statistics, so that folding them
  // is really tested.
  uint64_t off = 0;
  for (auto& [pname, p] : (*m)->NamedParameters()) {
    if (p.value().ndim() == 1) {
      ops::RandomUniform(&p.mutable_value(), 0.5f, 1.5f, seed + 7, off);
      off += 1 << 20;
    }
  }
  for (auto& [bname, t] : (*m)->NamedBuffers()) {
    bool var = bname.find("running_var") != std::string::npos;
    ops::RandomUniform(t, var ? 0.5f : -0.2f, var ? 1.5f : 0.2f, seed + 9, off);
    off += 1 << 20;
  }
  return *m;
}

Shape InputShape(const std::string& name, int64_t batch) {
  absl::StatusOr<Shape> s = nn::ModelInputShape(name);
  Shape shape = {batch};
  shape.insert(shape.end(), s->begin(), s->end());
  return shape;
}

Tensor RandomInput(const Shape& shape, uint64_t seed) {
  Tensor x = Tensor::Empty(shape);
  ops::RandomUniform(&x, -1.0f, 1.0f, seed);
  return x;
}

// |a - b| <= atol + rtol * |b| elementwise, reporting the worst element.
void ExpectClose(const Tensor& a, const Tensor& b, double rtol, double atol,
                 const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  std::vector<float> va = a.ToVector<float>(), vb = b.ToVector<float>();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    double err = std::fabs(double(va[i]) - vb[i]) - (atol + rtol * std::fabs(double(vb[i])));
    if (err > worst || i == 0) {
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " is " << va[at] << ", want " << vb[at];
}

double MaxAbs(const Tensor& t) {
  double m = 0;
  for (float v : t.ToVector<float>()) m = std::max(m, double(std::fabs(v)));
  return m;
}

class HybridizeModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridizeModelTest, InferenceMatchesImperativeEvalMode) {
  const std::string name = GetParam();
  std::shared_ptr<nn::Module> m = Model(name, 1);
  const Shape shape = InputShape(name, name == "resnet18" ? 2 : 4);
  Tensor x = RandomInput(shape, 3);
  m->Eval();
  Tensor want;
  {
    autograd::NoGradGuard no_grad;
    want = m->Forward(Variable(x)).value();
  }
  m->Train();
  absl::StatusOr<std::unique_ptr<HybridModule>> h = HybridModule::Create(m.get(), shape);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(m->training()) << "Create must restore the module's mode";
  absl::StatusOr<Tensor> got = (*h)->Forward(x);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectClose(*got, want, 1e-4, 1e-5 * MaxAbs(want), name + " logits");
  if (name == "resnet18") {
    EXPECT_EQ((*h)->optimize_stats().batch_norms_folded, 17);
    for (const Node& n : (*h)->graph().nodes()) {
      EXPECT_NE(n.op, OpKind::kBatchNormInference) << "every batch norm folds into its conv";
    }
  }
  // A second run on other data reuses the plan.
  Tensor x2 = RandomInput(shape, 4);
  Tensor want2;
  {
    m->Eval();
    autograd::NoGradGuard no_grad;
    want2 = m->Forward(Variable(x2)).value();
  }
  got = (*h)->Forward(x2);
  ASSERT_TRUE(got.ok());
  ExpectClose(*got, want2, 1e-4, 1e-5 * MaxAbs(want2), name + " logits, second run");
}

TEST_P(HybridizeModelTest, TrainingStepMatchesImperativeStep) {
  const std::string name = GetParam();
  const int64_t batch = name == "resnet18" ? 2 : 8;
  const Shape shape = InputShape(name, batch);
  const int64_t classes = name == "mlp_chapter" ? 2 : 10;
  const ops::SgdParams sgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
  std::shared_ptr<nn::Module> ref = Model(name, 5);
  std::shared_ptr<nn::Module> hyb = Model(name, 5);
  ref->Train();
  hyb->Train();
  nn::Sgd opt(ref->NamedParameters(), sgd);
  absl::StatusOr<std::unique_ptr<TrainStep>> step =
      HybridizeTrainingStep(hyb.get(), shape, classes, sgd);
  ASSERT_TRUE(step.ok()) << step.status();
  for (int it = 0; it < 3; ++it) {
    SCOPED_TRACE("step " + std::to_string(it));
    // Each step starts from the same state: a step is compared, not a
    // trajectory (a last-bit difference can flip a relu in later steps and
    // then grow, in any two implementations that sum in different orders).
    // Momentum buffers are not synchronized; they differ by rounding only.
    auto rp0 = ref->NamedParameters(), hp0 = hyb->NamedParameters();
    for (size_t i = 0; i < rp0.size(); ++i) {
      ASSERT_TRUE(hp0[i].second.mutable_value().CopyFrom(rp0[i].second.value()).ok());
    }
    auto rb0 = ref->NamedBuffers(), hb0 = hyb->NamedBuffers();
    for (size_t i = 0; i < rb0.size(); ++i)
      ASSERT_TRUE(hb0[i].second->CopyFrom(*rb0[i].second).ok());
    Tensor x = RandomInput(shape, 100 + it);
    std::vector<int32_t> lv(batch);
    for (int64_t i = 0; i < batch; ++i) lv[i] = static_cast<int32_t>((i * 3 + it) % classes);
    Tensor labels = Tensor::FromVector(lv, {batch});

    Variable logits = ref->Forward(Variable(x));
    Variable loss = autograd::SoftmaxCrossEntropy(logits, labels);
    opt.ZeroGrad();
    loss.Backward();
    opt.Step();
    const float want_loss = ops::ScalarValue(loss.value());

    const float got_loss = (*step)->Run(x, labels);
    EXPECT_NEAR(got_loss, want_loss, 1e-5 * std::fabs(want_loss)) << name;
    ExpectClose((*step)->logits(), logits.value(), 1e-5, 1e-6 * MaxAbs(logits.value()),
                name + " logits");
    auto rp = ref->NamedParameters(), hp = hyb->NamedParameters();
    ASSERT_EQ(rp.size(), hp.size());
    for (size_t i = 0; i < rp.size(); ++i) {
      ExpectClose(hp[i].second.value(), rp[i].second.value(), 1e-5,
                  1e-6 * MaxAbs(rp[i].second.value()), name + " " + rp[i].first);
    }
    auto rb = ref->NamedBuffers(), hb = hyb->NamedBuffers();
    for (size_t i = 0; i < rb.size(); ++i) {
      ExpectClose(*hb[i].second, *rb[i].second, 1e-5, 1e-6, name + " " + rb[i].first);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HybridizeModelTest,
                         ::testing::Values("mlp", "mlp_chapter", "lenet", "resnet18"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(HybridizeTest, TrainingPlanUsesLessMemoryThanUnsharedBuffers) {
  std::shared_ptr<nn::Module> m = Model("lenet", 1);
  absl::StatusOr<std::unique_ptr<TrainStep>> step =
      HybridizeTrainingStep(m.get(), InputShape("lenet", 16), 10, {.lr = 0.1f});
  ASSERT_TRUE(step.ok()) << step.status();
  const MemoryPlan& plan = (*step)->module().executable().memory_plan();
  EXPECT_LT(plan.total_bytes, plan.unshared_bytes);
  EXPECT_GE(plan.total_bytes, plan.lower_bound_bytes);
}

TEST(HybridizeTest, ChapterMlpUsesSmallLinearKernelsAtBatchOne) {
  std::shared_ptr<nn::Module> m = Model("mlp_chapter", 1);
  absl::StatusOr<std::unique_ptr<HybridModule>> h = HybridModule::Create(m.get(), {1, 512});
  ASSERT_TRUE(h.ok()) << h.status();
  // Three linear layers, relus fused into the first two.
  ASSERT_EQ((*h)->graph().nodes().size(), 3u);
  EXPECT_TRUE((*h)->graph().nodes()[0].attrs.relu);
  EXPECT_TRUE((*h)->graph().nodes()[1].attrs.relu);
  EXPECT_FALSE((*h)->graph().nodes()[2].attrs.relu);
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_EQ((*h)->executable().num_small_linear(), 3);
  }
}

TEST(HybridizeTest, ResidualAddReluIsFusedInTraining) {
  std::shared_ptr<nn::Module> m = Model("resnet18", 1);
  absl::StatusOr<std::unique_ptr<TrainStep>> step =
      HybridizeTrainingStep(m.get(), InputShape("resnet18", 2), 10, {.lr = 0.1f});
  ASSERT_TRUE(step.ok()) << step.status();
  int fused = 0;
  for (const Node& n : (*step)->module().graph().nodes())
    fused += n.op == OpKind::kFusedElementwise;
  EXPECT_GE(fused, 8);  // one add + relu per residual block, at least
}

TEST(HybridizeTest, WrongInputShapeIsAnError) {
  std::shared_ptr<nn::Module> m = Model("mlp", 1);
  absl::StatusOr<std::unique_ptr<HybridModule>> h =
      HybridModule::Create(m.get(), InputShape("mlp", 2));
  ASSERT_TRUE(h.ok());
  absl::StatusOr<Tensor> y = (*h)->Forward(Tensor::Zeros(InputShape("mlp", 3)));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*h)->Step(Tensor(), Tensor()).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HybridizeTest, LearningRateCanChangeBetweenSteps) {
  std::shared_ptr<nn::Module> ref = Model("mlp", 2), hyb = Model("mlp", 2);
  const Shape shape = InputShape("mlp", 4);
  nn::Sgd opt(ref->NamedParameters(), {.lr = 0.1f});
  absl::StatusOr<std::unique_ptr<TrainStep>> step =
      HybridizeTrainingStep(hyb.get(), shape, 10, {.lr = 0.1f});
  ASSERT_TRUE(step.ok());
  opt.set_lr(0.02f);
  (*step)->set_lr(0.02f);
  Tensor x = RandomInput(shape, 1);
  Tensor labels = Tensor::FromVector<int32_t>({1, 2, 3, 4}, {4});
  Variable loss = autograd::SoftmaxCrossEntropy(ref->Forward(Variable(x)), labels);
  opt.ZeroGrad();
  loss.Backward();
  opt.Step();
  (*step)->Run(x, labels);
  auto rp = ref->NamedParameters(), hp = hyb->NamedParameters();
  for (size_t i = 0; i < rp.size(); ++i) {
    ExpectClose(hp[i].second.value(), rp[i].second.value(), 1e-5, 1e-7, rp[i].first);
  }
}

TEST(HybridizeTest, WrongClassCountIsAnError) {
  std::shared_ptr<nn::Module> m = Model("lenet", 1);
  EXPECT_EQ(HybridizeTrainingStep(m.get(), InputShape("lenet", 2), 7, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HybridizeTest, TracingLeavesRunningStatisticsAlone) {
  std::shared_ptr<nn::Module> m = Model("resnet18", 1);
  std::vector<std::vector<float>> before;
  for (auto& [name, t] : m->NamedBuffers()) before.push_back(t->ToVector<float>());
  absl::StatusOr<Graph> g = TraceModule(m.get(), InputShape("resnet18", 2), /*training=*/true);
  ASSERT_TRUE(g.ok()) << g.status();
  size_t i = 0;
  for (auto& [name, t] : m->NamedBuffers()) EXPECT_EQ(t->ToVector<float>(), before[i++]) << name;
}

}  // namespace
}  // namespace graph
}  // namespace dtrain
