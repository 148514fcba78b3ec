#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/autograd/variable.h"
#include "libs/ops/testing/gradcheck.h"

namespace dtrain {
namespace autograd {
namespace {

using ops::testing::NumericGradient;
using ops::testing::RandomTensor;
using ops::testing::TensorsNear;

TEST(AutogradTest, SharedInputGetsSumOfGradients) {
  Variable x(Tensor::FromVector<float>({1, -2, 3}, {3}), true);
  Variable y = Add(x, x);  // dy/dx = 2
  Variable z = Add(y, x);  // dz/dx = 3
  Sum(z).Backward();
  EXPECT_EQ(x.grad().ToVector<float>(), (std::vector<float>{3, 3, 3}));
}

TEST(AutogradTest, GradientsAccumulateAcrossBackwardCallsUntilZeroed) {
  Variable x(Tensor::FromVector<float>({1, 2}, {2}), true);
  Sum(Add(x, x)).Backward();
  Sum(x).Backward();
  EXPECT_EQ(x.grad().ToVector<float>(), (std::vector<float>{3, 3}));
  x.ZeroGrad();
  Sum(x).Backward();
  EXPECT_EQ(x.grad().ToVector<float>(), (std::vector<float>{1, 1}));
}

TEST(AutogradTest, NoGradGuardRecordsNothing) {
  Variable x(Tensor::FromVector<float>({1, 2}, {2}), true);
  Variable y;
  {
    NoGradGuard guard;
    y = Add(x, x);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  Variable z = Add(x, x);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_EQ(z.op_name(), "add");
}

// loss = sum(dy * relu(linear(relu(conv(x))))) checked against finite
// differences for every parameter and the input.
TEST(AutogradTest, SmallConvNetMatchesFiniteDifferences) {
  Tensor x0 = RandomTensor({2, 2, 6, 6}, 1);
  Tensor w0 = RandomTensor({3, 2, 3, 3}, 2, -0.5f, 0.5f);
  Tensor b0 = RandomTensor({3}, 3, -0.1f, 0.1f);
  Tensor w1 = RandomTensor({4, 3 * 2 * 2}, 4, -0.5f, 0.5f);
  Tensor b1 = RandomTensor({4}, 5);
  Tensor dy = RandomTensor({2, 4}, 6);
  ops::Conv2dParams cp{1, 0};
  ops::Pool2dParams pp{2, 2, 0};
  auto forward = [&](const Tensor& xx, const Tensor& ww0, const Tensor& bb0, const Tensor& ww1,
                     bool track, Variable* vx, Variable* vw0, Variable* vb0, Variable* vw1,
                     Variable* vb1) {
    *vx = Variable(xx, track);
    *vw0 = Variable(ww0, track);
    *vb0 = Variable(bb0, track);
    *vw1 = Variable(ww1, track);
    *vb1 = Variable(b1, track);
    Variable h = Conv2d(*vx, *vw0, *vb0, cp, /*relu=*/true);
    h = AvgPool2d(h, pp);
    h = Flatten(h);
    return Linear(h, *vw1, *vb1);
  };
  Variable vx, vw0, vb0, vw1, vb1;
  Variable out = forward(x0, w0, b0, w1, true, &vx, &vw0, &vb0, &vw1, &vb1);
  out.Backward(dy);
  auto out_of = [&](int which) {
    return [&, which](const Tensor& t) {
      Variable a, b, c, d, e;
      NoGradGuard g;
      return forward(which == 0 ? t : x0, which == 1 ? t : w0, which == 2 ? t : b0,
                     which == 3 ? t : w1, false, &a, &b, &c, &d, &e)
          .value();
    };
  };
  EXPECT_TRUE(TensorsNear(vx.grad(), NumericGradient(out_of(0), x0, dy, 1e-3), 2e-2, 2e-3, "dx"));
  EXPECT_TRUE(TensorsNear(vw0.grad(), NumericGradient(out_of(1), w0, dy, 1e-3), 2e-2, 2e-3, "dw0"));
  EXPECT_TRUE(TensorsNear(vb0.grad(), NumericGradient(out_of(2), b0, dy, 1e-3), 2e-2, 2e-3, "db0"));
  EXPECT_TRUE(TensorsNear(vw1.grad(), NumericGradient(out_of(3), w1, dy, 1e-3), 2e-2, 2e-3, "dw1"));
}

TEST(AutogradTest, HooksFireOnceWithFinalGradientBeforeBackwardEnds) {
  Variable w1(RandomTensor({4, 3}, 1), true);
  Variable w2(RandomTensor({2, 4}, 2), true);
  Variable x(RandomTensor({5, 3}, 3), false);
  std::vector<std::string> fired;
  std::vector<float> w1_seen;
  w1.AddGradHook([&](Tensor& g) {
    fired.push_back("w1");
    w1_seen = g.ToVector<float>();
  });
  w2.AddGradHook([&](Tensor&) { fired.push_back("w2"); });
  Variable h = Linear(x, w1, Variable(), true);
  Variable y = Linear(h, w2, Variable());
  Sum(y).Backward();
  // Reverse layer order: the last layer's gradient is ready first.
  ASSERT_EQ(fired, (std::vector<std::string>{"w2", "w1"}));
  EXPECT_EQ(w1_seen, w1.grad().ToVector<float>());
}

TEST(AutogradTest, DeepChainDoesNotOverflowTheStack) {
  Variable x(Tensor::FromVector<float>({1}, {1}), true);
  Variable y = x;
  for (int i = 0; i < 20000; ++i) y = Add(y, Variable(Tensor::FromVector<float>({0}, {1})));
  y.Backward();
  EXPECT_EQ(x.grad().ToVector<float>()[0], 1.0f);
}

TEST(AutogradTest, UnitSeedIsRecognizedOnlyDuringItsBackward) {
  Variable x(Tensor::FromVector<float>({1, 2, 3}, {3}), true);
  bool seen_unit = false;
  Tensor scaled_seed = Tensor::Full({}, 2.0f);
  // A custom node that records whether it received the unit seed.
  Variable y =
      MakeResult(ops::Sum(x.value()), "probe", {x}, [&](const Tensor& dy, std::vector<Tensor>* g) {
        seen_unit = IsUnitSeed(dy);
        (*g)[0] = Tensor::Full({3}, ops::ScalarValue(dy));
      });
  y.Backward();
  EXPECT_TRUE(seen_unit);
  EXPECT_EQ(x.grad().ToVector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_FALSE(IsUnitSeed(scaled_seed));
  x.ZeroGrad();
  Variable y2 =
      MakeResult(ops::Sum(x.value()), "probe", {x}, [&](const Tensor& dy, std::vector<Tensor>* g) {
        seen_unit = IsUnitSeed(dy);
        (*g)[0] = Tensor::Full({3}, ops::ScalarValue(dy));
      });
  y2.Backward(scaled_seed);  // an explicit seed is never "unit"
  EXPECT_FALSE(seen_unit);
  EXPECT_EQ(x.grad().ToVector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(AutogradTest, ScaledSeedScalesSoftmaxCrossEntropyAndSumGradients) {
  Tensor logits0 = RandomTensor({2, 4}, 3);
  Tensor labels = Tensor::FromVector<int32_t>({1, 3}, {2});
  Variable a(logits0, true), b(logits0, true);
  SoftmaxCrossEntropy(a, labels).Backward();
  SoftmaxCrossEntropy(b, labels).Backward(Tensor::Full({}, 3.0f));
  EXPECT_TRUE(TensorsNear(b.grad(), ops::Scale(a.grad(), 3.0f), 1e-6, 1e-7, "3x seed"));
  Variable c(logits0, true);
  Sum(c).Backward(Tensor::Full({}, -2.0f));
  EXPECT_EQ(c.grad().ToVector<float>(), std::vector<float>(8, -2.0f));
}

TEST(AutogradTest, SoftmaxCrossEntropyGradient) {
  Tensor logits0 = RandomTensor({3, 5}, 9, -2, 2);
  Tensor labels = Tensor::FromVector<int32_t>({0, 4, 2}, {3});
  Variable logits(logits0, true);
  SoftmaxCrossEntropy(logits, labels).Backward();
  Tensor dy = Tensor::Full({}, 1.0f);
  Tensor numeric =
      NumericGradient([&](const Tensor& t) { return ops::SoftmaxCrossEntropy(t, labels, nullptr); },
                      logits0, dy, 1e-3);
  EXPECT_TRUE(TensorsNear(logits.grad(), numeric, 1e-2, 1e-4, "dlogits"));
}

}  // namespace
}  // namespace autograd
}  // namespace dtrain
