#include "libs/graph/flops.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace graph {
namespace {

// Counted by hand from the layer shapes (tests/reference/models.py).
TEST(FlopsTest, MlpByHand) {
  absl::StatusOr<TrainingFlops> f = TrainingFlopsPerSample("mlp");
  ASSERT_TRUE(f.ok()) << f.status();
  // Linear(784,256), Linear(256,10): 2 * (784*256 + 256*10).
  EXPECT_DOUBLE_EQ(f->forward, 2.0 * (784 * 256 + 256 * 10));
  // Weight gradients of both, the input gradient of the second only (the
  // images need none).
  EXPECT_DOUBLE_EQ(f->backward, 2.0 * (784 * 256 + 2 * 256 * 10));
}

TEST(FlopsTest, LenetByHand) {
  absl::StatusOr<TrainingFlops> f = TrainingFlopsPerSample("lenet");
  ASSERT_TRUE(f.ok()) << f.status();
  // Conv2d(1,20,3) on 28x28 -> 20x26x26; AvgPool -> 13x13; Conv2d(20,50,5)
  // -> 50x9x9; AvgPool -> 4x4; Linear(800,128), Linear(128,10).
  const double conv1 = 2.0 * 20 * 26 * 26 * (1 * 3 * 3);
  const double conv2 = 2.0 * 50 * 9 * 9 * (20 * 5 * 5);
  const double fc = 2.0 * (800 * 128 + 128 * 10);
  EXPECT_DOUBLE_EQ(f->forward, conv1 + conv2 + fc);
  EXPECT_DOUBLE_EQ(f->backward, 2 * (conv1 + conv2 + fc) - conv1);
}

TEST(FlopsTest, MlpOfAnotherDataSetByHand) {
  // RGB, 5 classes: Linear(3*784, 256), Linear(256, 5).
  absl::StatusOr<TrainingFlops> f =
      TrainingFlopsPerSample("mlp", {.num_classes = 5, .in_channels = 3});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_DOUBLE_EQ(f->forward, 2.0 * (3 * 784 * 256 + 256 * 5));
  EXPECT_DOUBLE_EQ(f->backward, 2.0 * (3 * 784 * 256 + 2 * 256 * 5));
}

TEST(FlopsTest, Resnet18IsAboutThreeForwardPasses) {
  absl::StatusOr<TrainingFlops> f = TrainingFlopsPerSample("resnet18");
  ASSERT_TRUE(f.ok()) << f.status();
  // d2l's ResNet-18 on 28x28 inputs: its 3x3 convolutions alone, counted by
  // stage (64 channels at 28x28, 128 at 14x14, 256 at 7x7, 512 at 4x4), are
  // 0.7 to 1 GFLOPs forward per sample.
  EXPECT_GT(f->forward, 0.7e9);
  EXPECT_LT(f->forward, 1.0e9);
  // Backward: both gradients of every product but the first layer's input.
  EXPECT_GT(f->backward, 1.9 * f->forward);
  EXPECT_LT(f->backward, 2.0 * f->forward);
}

TEST(FlopsTest, UnknownModelIsAnError) { EXPECT_FALSE(TrainingFlopsPerSample("alexnet").ok()); }

}  // namespace
}  // namespace graph
}  // namespace dtrain
