// The book's models, built with the names PyTorch's nn.Sequential gives them.
//
//   mlp          Flatten, Linear(784, 256), ReLU, Linear(256, 10)
//   mlp_chapter  the hybridize section's Linear(512, 256), ReLU, Linear(256, 128),
//                ReLU, Linear(128, 2) on [N, 512] inputs
//   lenet        the multi-GPU section's: Conv2d(1, 20, 3), ReLU, AvgPool2d(2),
//                Conv2d(20, 50, 5), ReLU, AvgPool2d(2), Flatten,
//                Linear(800, 128), ReLU, Linear(128, 10)
//   resnet18     the concise multi-GPU section's: 3x3 stride-1 stem with batch
//                norm and no max-pool, four stages of two Residual blocks
//                (64, 128, 256, 512 channels), global average pooling, Linear
//
// Inputs are [N, 1, 28, 28] (Fashion-MNIST) by default, except mlp_chapter;
// ModelOptions give other channels and classes (and resnet18 other sizes).
#ifndef DTRAIN_LIBS_NN_MODELS_H_
#define DTRAIN_LIBS_NN_MODELS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/nn/layers.h"

namespace dtrain {
namespace nn {

struct ModelOptions {
  int64_t num_classes = 10;
  int64_t in_channels = 1;
  // The input's height and width: resnet18 (global average pooling) takes
  // any; mlp and lenet take 28 x 28 only.
  int64_t height = 28;
  int64_t width = 28;
};

// "mlp", "mlp_chapter", "lenet" or "resnet18"; any other name is
// InvalidArgument listing the known ones.
absl::StatusOr<std::shared_ptr<Module>> MakeModel(const std::string& name,
                                                  const ModelOptions& options = {});
std::vector<std::string> ModelNames();

// Shape of one input sample of the model (without the batch dimension):
// [in_channels, 28, 28] ([512] for mlp_chapter); resnet18's takes the
// options' height and width.
absl::StatusOr<Shape> ModelInputShape(const std::string& name, const ModelOptions& options = {});

// Initialization, seeded and independent of thread count (Philox).
enum class Init {
  kNormal,   // the chapter's: weights ~ N(0, std), biases 0 (batch norm: 1 and 0)
  kKaiming,  // He normal: N(0, sqrt(2 / fan_in)) for weights, biases 0
};
absl::StatusOr<Init> ParseInit(const std::string& name);  // "normal", "kaiming"
void InitParameters(Module* module, Init init, uint64_t seed, float normal_std = 0.01f);

}  // namespace nn
}  // namespace dtrain

#endif  // DTRAIN_LIBS_NN_MODELS_H_
