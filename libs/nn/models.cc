#include "libs/nn/models.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace nn {
namespace {

std::shared_ptr<Module> Mlp(const ModelOptions& o) {
  auto net = std::make_shared<Sequential>();
  net->Add(std::make_shared<Flatten>());
  net->Add(std::make_shared<Linear>(784 * o.in_channels, 256));
  net->Add(std::make_shared<ReLU>());
  net->Add(std::make_shared<Linear>(256, o.num_classes));
  return net;
}

std::shared_ptr<Module> MlpChapter(const ModelOptions&) {
  auto net = std::make_shared<Sequential>();
  net->Add(std::make_shared<Linear>(512, 256));
  net->Add(std::make_shared<ReLU>());
  net->Add(std::make_shared<Linear>(256, 128));
  net->Add(std::make_shared<ReLU>());
  net->Add(std::make_shared<Linear>(128, 2));
  return net;
}

std::shared_ptr<Module> LeNet(const ModelOptions& o) {
  auto net = std::make_shared<Sequential>();
  net->Add(std::make_shared<Conv2d>(o.in_channels, 20, 3));
  net->Add(std::make_shared<ReLU>());
  net->Add(std::make_shared<AvgPool2d>(2));
  net->Add(std::make_shared<Conv2d>(20, 50, 5));
  net->Add(std::make_shared<ReLU>());
  net->Add(std::make_shared<AvgPool2d>(2));
  net->Add(std::make_shared<Flatten>());
  net->Add(std::make_shared<Linear>(800, 128));
  net->Add(std::make_shared<ReLU>());
  net->Add(std::make_shared<Linear>(128, o.num_classes));
  return net;
}

std::shared_ptr<Module> ResnetStage(int64_t in, int64_t out, int blocks, bool first) {
  auto stage = std::make_shared<Sequential>();
  for (int i = 0; i < blocks; ++i) {
    if (i == 0 && !first) {
      stage->Add(std::make_shared<Residual>(in, out, /*use_1x1conv=*/true, /*stride=*/2));
    } else {
      stage->Add(std::make_shared<Residual>(out, out));
    }
  }
  return stage;
}

std::shared_ptr<Module> Resnet18(const ModelOptions& o) {
  auto net = std::make_shared<Sequential>();
  net->Add(std::make_shared<Conv2d>(o.in_channels, 64, 3, 1, 1));
  net->Add(std::make_shared<BatchNorm2d>(64));
  net->Add(std::make_shared<ReLU>());
  net->Add("resnet_block1", ResnetStage(64, 64, 2, true));
  net->Add("resnet_block2", ResnetStage(64, 128, 2, false));
  net->Add("resnet_block3", ResnetStage(128, 256, 2, false));
  net->Add("resnet_block4", ResnetStage(256, 512, 2, false));
  net->Add("global_avg_pool", std::make_shared<GlobalAvgPool2d>());
  auto fc = std::make_shared<Sequential>();
  fc->Add(std::make_shared<Flatten>());
  fc->Add(std::make_shared<Linear>(512, o.num_classes));
  net->Add("fc", fc);
  return net;
}

}  // namespace

std::vector<std::string> ModelNames() { return {"mlp", "mlp_chapter", "lenet", "resnet18"}; }

absl::StatusOr<std::shared_ptr<Module>> MakeModel(const std::string& name,
                                                  const ModelOptions& options) {
  if (options.num_classes <= 0 || options.in_channels <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model ", name, ": num_classes (",
                                                   options.num_classes, ") and in_channels (",
                                                   options.in_channels, ") must be positive"));
  }
  if (name == "mlp") return Mlp(options);
  if (name == "mlp_chapter") return MlpChapter(options);
  if (name == "lenet") return LeNet(options);
  if (name == "resnet18") return Resnet18(options);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model '", name, "'; known models: ", absl::StrJoin(ModelNames(), ", ")));
}

absl::StatusOr<Shape> ModelInputShape(const std::string& name, const ModelOptions& options) {
  if (name == "mlp_chapter") return Shape{512};
  if (name == "mlp" || name == "lenet") return Shape{options.in_channels, 28, 28};
  if (name == "resnet18") return Shape{options.in_channels, options.height, options.width};
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model '", name, "'; known models: ", absl::StrJoin(ModelNames(), ", ")));
}

absl::StatusOr<Init> ParseInit(const std::string& name) {
  if (name == "normal") return Init::kNormal;
  if (name == "kaiming") return Init::kKaiming;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown init '", name, "'; expected normal or kaiming"));
}

void InitParameters(Module* module, Init init, uint64_t seed, float normal_std) {
  uint64_t index = 0;
  for (auto& [name, p] : module->NamedParameters()) {
    Tensor& t = p.mutable_value();
    if (t.ndim() == 1) {
      // Rank-1 parameters are biases (zero) and batch-norm scales, which
      // PyTorch names "weight" (one).
      ops::Fill(&t, absl::EndsWith(name, "weight") ? 1.0f : 0.0f);
      ++index;
      continue;
    }
    int64_t fan_in = t.numel() / t.dim(0);
    float stddev =
        init == Init::kNormal ? normal_std : std::sqrt(2.0f / static_cast<float>(fan_in));
    // Each parameter draws from its own stretch of the Philox stream.
    ops::RandomNormal(&t, 0.0f, stddev, seed, index << 32);
    ++index;
  }
}

}  // namespace nn
}  // namespace dtrain
