#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/nn/layers.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/ops/testing/gradcheck.h"

namespace dtrain {
namespace nn {
namespace {

using ops::testing::RandomTensor;
using ops::testing::TensorsNear;

std::vector<std::string> Names(const Module& m) {
  std::vector<std::string> out;
  for (auto& [name, p] : m.NamedParameters()) out.push_back(name);
  return out;
}

TEST(ModelsTest, LeNetMatchesTheChapter) {
  auto net = *MakeModel("lenet");
  EXPECT_EQ(Names(*net), (std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias",
                                                   "7.weight", "7.bias", "9.weight", "9.bias"}));
  // 20*1*3*3+20 + 50*20*5*5+50 + 800*128+128 + 128*10+10
  EXPECT_EQ(net->NumParameters(), 180 + 20 + 25000 + 50 + 102400 + 128 + 1280 + 10);
  autograd::Variable y = net->Forward(autograd::Variable(Tensor::Zeros({3, 1, 28, 28})));
  EXPECT_EQ(y.shape(), (Shape{3, 10}));
}

TEST(ModelsTest, ResNet18Structure) {
  auto net = *MakeModel("resnet18");
  std::vector<std::string> names = Names(*net);
  EXPECT_EQ(names.front(), "0.weight");
  EXPECT_EQ(names.back(), "fc.1.bias");
  EXPECT_NE(std::find(names.begin(), names.end(), "resnet_block2.0.conv3.weight"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "resnet_block1.0.conv3.weight"), names.end());
  int bn_buffers = 0;
  for (auto& [name, t] : net->NamedBuffers())
    bn_buffers += name.find("running_") != std::string::npos;
  // stem + 8 blocks x 2 batch norms, each with mean and var
  EXPECT_EQ(bn_buffers, 2 * (1 + 16));
  autograd::NoGradGuard g;
  net->Eval();
  EXPECT_EQ(net->Forward(autograd::Variable(Tensor::Zeros({2, 1, 28, 28}))).shape(),
            (Shape{2, 10}));
}

TEST(ModelsTest, InputChannelsClassesAndResNetSizeFollowTheOptions) {
  const ModelOptions rgb = {.num_classes = 5, .in_channels = 3, .height = 16, .width = 12};
  EXPECT_EQ(*ModelInputShape("resnet18", rgb), (Shape{3, 16, 12}));
  EXPECT_EQ(*ModelInputShape("lenet", rgb), (Shape{3, 28, 28}));  // its Linear needs 28 x 28
  EXPECT_EQ(*ModelInputShape("mlp"), (Shape{1, 28, 28}));
  autograd::NoGradGuard g;
  auto resnet = *MakeModel("resnet18", rgb);
  resnet->Eval();
  EXPECT_EQ(resnet->Forward(autograd::Variable(Tensor::Zeros({2, 3, 16, 12}))).shape(),
            (Shape{2, 5}));
  auto lenet = *MakeModel("lenet", rgb);
  EXPECT_EQ(lenet->Forward(autograd::Variable(Tensor::Zeros({2, 3, 28, 28}))).shape(),
            (Shape{2, 5}));
}

TEST(ModelsTest, UnknownModelAndInitAreClearErrors) {
  auto m = MakeModel("vgg");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("known models: mlp, mlp_chapter, lenet, resnet18"),
            std::string::npos);
  EXPECT_FALSE(ParseInit("xavier").ok());
  EXPECT_FALSE(MakeModel("lenet", {.num_classes = 0}).ok());
}

TEST(ModelsTest, InitIsSeededAndHasTheRequestedSpread) {
  auto a = *MakeModel("mlp");
  auto b = *MakeModel("mlp");
  auto c = *MakeModel("mlp");
  InitParameters(a.get(), Init::kNormal, 7, 0.01f);
  InitParameters(b.get(), Init::kNormal, 7, 0.01f);
  InitParameters(c.get(), Init::kNormal, 8, 0.01f);
  std::vector<float> wa = a->NamedParameters()[0].second.value().ToVector<float>();
  EXPECT_EQ(wa, b->NamedParameters()[0].second.value().ToVector<float>());
  EXPECT_NE(wa, c->NamedParameters()[0].second.value().ToVector<float>());
  double ss = 0;
  for (float v : wa) ss += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(ss / wa.size()), 0.01, 0.0005);
  EXPECT_EQ(a->NamedParameters()[1].second.value().ToVector<float>(), std::vector<float>(256, 0.f));
  // Kaiming: std sqrt(2/784).
  InitParameters(a.get(), Init::kKaiming, 7);
  wa = a->NamedParameters()[0].second.value().ToVector<float>();
  ss = 0;
  for (float v : wa) ss += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(ss / wa.size()), std::sqrt(2.0 / 784), 0.002);
}

TEST(SequentialTest, FusedLinearReluEqualsUnfused) {
  auto lin = std::make_shared<Linear>(6, 5);
  lin->weight().mutable_value() = RandomTensor({5, 6}, 1);
  lin->bias().mutable_value() = RandomTensor({5}, 2);
  Sequential fused({lin, std::make_shared<ReLU>()});
  Tensor x = RandomTensor({4, 6}, 3);
  autograd::Variable a = fused.Forward(autograd::Variable(x));
  EXPECT_EQ(a.op_name(), "linear_relu");
  autograd::Variable b = autograd::Relu(lin->Forward(autograd::Variable(x)));
  EXPECT_TRUE(TensorsNear(a.value(), b.value(), 1e-6, 1e-6, "fused"));
}

TEST(SgdTest, MatchesTorchFormulaWithMomentumAndWeightDecay) {
  autograd::Variable w(Tensor::FromVector<float>({1.0f, -2.0f}, {2}), true);
  Sgd opt({{"w", w}}, {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f});
  double p[2] = {1.0, -2.0}, buf[2] = {0, 0};
  for (int step = 0; step < 3; ++step) {
    opt.ZeroGrad();
    autograd::Sum(autograd::Add(w, w)).Backward();  // grad = 2
    opt.Step();
    for (int i = 0; i < 2; ++i) {
      double g = 2.0 + 0.01 * p[i];
      buf[i] = 0.9 * buf[i] + g;
      p[i] -= 0.1 * buf[i];
    }
  }
  std::vector<float> got = w.value().ToVector<float>();
  EXPECT_NEAR(got[0], p[0], 1e-5);
  EXPECT_NEAR(got[1], p[1], 1e-5);
  ASSERT_EQ(opt.NamedState().size(), 1u);
  EXPECT_EQ(opt.NamedState()[0].first, "w.momentum_buffer");
}

TEST(ModuleTest, TrainEvalPropagatesAndBatchNormUsesRunningStatsInEval) {
  auto net = *MakeModel("resnet18");
  net->Eval();
  for (auto& [name, child] : net->NamedChildren()) EXPECT_FALSE(child->training()) << name;
  net->Train();
  EXPECT_TRUE(net->NamedChildren()[3].second->training());
  BatchNorm2d bn(3);
  Tensor x = RandomTensor({4, 3, 2, 2}, 5, 2.0f, 4.0f);  // mean ~3
  bn.Eval();
  // Running stats are mean 0, var 1: eval output is x * 1 + 0 (up to eps).
  autograd::NoGradGuard g;
  EXPECT_TRUE(TensorsNear(bn.Forward(autograd::Variable(x)).value(), x, 1e-4, 1e-4, "eval bn"));
}

}  // namespace
}  // namespace nn
}  // namespace dtrain
