#include "libs/nn/layers.h"

#include "absl/strings/str_cat.h"
#include "libs/autograd/functions.h"
#include "libs/nn/sync_batch_norm.h"

namespace dtrain {
namespace nn {

namespace ag = ::dtrain::autograd;

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_(in_features), out_(out_features) {
  weight_ = &RegisterParameter("weight", Tensor::Zeros({out_features, in_features}));
  bias_ = bias ? &RegisterParameter("bias", Tensor::Zeros({out_features})) : &no_bias_;
}

Variable Linear::Forward(const Variable& x) { return ag::Linear(x, *weight_, *bias_, false); }
Variable Linear::ForwardRelu(const Variable& x) { return ag::Linear(x, *weight_, *bias_, true); }

std::string Linear::Describe() const {
  return absl::StrCat("Linear(in_features=", in_, ", out_features=", out_, ")");
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int kernel_size, int stride, int padding,
               bool bias)
    : in_(in_channels), out_(out_channels), k_(kernel_size), p_{stride, padding} {
  weight_ = &RegisterParameter(
      "weight", Tensor::Zeros({out_channels, in_channels, kernel_size, kernel_size}));
  bias_ = bias ? &RegisterParameter("bias", Tensor::Zeros({out_channels})) : &no_bias_;
}

Variable Conv2d::Forward(const Variable& x) { return ag::Conv2d(x, *weight_, *bias_, p_, false); }
Variable Conv2d::ForwardRelu(const Variable& x) {
  return ag::Conv2d(x, *weight_, *bias_, p_, true);
}

std::string Conv2d::Describe() const {
  return absl::StrCat("Conv2d(", in_, ", ", out_, ", kernel_size=", k_, ", stride=", p_.stride,
                      ", padding=", p_.padding, ")");
}

Variable ReLU::Forward(const Variable& x) { return ag::Relu(x); }

AvgPool2d::AvgPool2d(int kernel_size, int stride, int padding)
    : p_{kernel_size, stride < 0 ? kernel_size : stride, padding} {}
Variable AvgPool2d::Forward(const Variable& x) { return ag::AvgPool2d(x, p_); }
std::string AvgPool2d::Describe() const {
  return absl::StrCat("AvgPool2d(kernel_size=", p_.kernel, ", stride=", p_.stride, ")");
}

MaxPool2d::MaxPool2d(int kernel_size, int stride, int padding)
    : p_{kernel_size, stride < 0 ? kernel_size : stride, padding} {}
Variable MaxPool2d::Forward(const Variable& x) { return ag::MaxPool2d(x, p_); }
std::string MaxPool2d::Describe() const {
  return absl::StrCat("MaxPool2d(kernel_size=", p_.kernel, ", stride=", p_.stride, ")");
}

Variable GlobalAvgPool2d::Forward(const Variable& x) { return ag::GlobalAvgPool(x); }

Variable Flatten::Forward(const Variable& x) { return ag::Flatten(x); }

BatchNorm2d::BatchNorm2d(int64_t channels, float eps, float momentum)
    : channels_(channels), eps_(eps), momentum_(momentum) {
  weight_ = &RegisterParameter("weight", Tensor::Full({channels}, 1.0f));
  bias_ = &RegisterParameter("bias", Tensor::Zeros({channels}));
  running_mean_ = &RegisterBuffer("running_mean", Tensor::Zeros({channels}));
  running_var_ = &RegisterBuffer("running_var", Tensor::Full({channels}, 1.0f));
}

void BatchNorm2d::SetSyncGroup(std::shared_ptr<SyncBatchNormGroup> group, int member) {
  sync_group_ = std::move(group);
  sync_member_ = member;
}

Variable BatchNorm2d::Forward(const Variable& x) {
  if (sync_group_ != nullptr && training()) {
    return SyncBatchNorm(x, *weight_, *bias_, running_mean_, running_var_, momentum_, eps_,
                         sync_group_, sync_member_);
  }
  return ag::BatchNorm(x, *weight_, *bias_, running_mean_, running_var_, training(), momentum_,
                       eps_);
}

std::string BatchNorm2d::Describe() const {
  return absl::StrCat("BatchNorm2d(", channels_, ", eps=", eps_, ", momentum=", momentum_, ")");
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) Add(std::move(m));
}

void Sequential::Add(std::shared_ptr<Module> module) {
  Add(std::to_string(order_.size()), std::move(module));
}

void Sequential::Add(const std::string& name, std::shared_ptr<Module> module) {
  order_.push_back(module.get());
  RegisterModule(name, std::move(module));
}

Variable Sequential::Forward(const Variable& x) {
  Variable h = x;
  for (size_t i = 0; i < order_.size(); ++i) {
    bool next_is_relu = i + 1 < order_.size() && dynamic_cast<ReLU*>(order_[i + 1]) != nullptr;
    if (next_is_relu) {
      if (auto* lin = dynamic_cast<Linear*>(order_[i])) {
        h = lin->ForwardRelu(h);
        ++i;
        continue;
      }
      if (auto* conv = dynamic_cast<Conv2d*>(order_[i])) {
        h = conv->ForwardRelu(h);
        ++i;
        continue;
      }
    }
    h = order_[i]->Forward(h);
  }
  return h;
}

Residual::Residual(int64_t in_channels, int64_t out_channels, bool use_1x1conv, int stride)
    : in_(in_channels), out_(out_channels), stride_(stride) {
  conv1_ =
      RegisterModule("conv1", std::make_shared<Conv2d>(in_channels, out_channels, 3, stride, 1));
  conv2_ = RegisterModule("conv2", std::make_shared<Conv2d>(out_channels, out_channels, 3, 1, 1));
  if (use_1x1conv) {
    conv3_ =
        RegisterModule("conv3", std::make_shared<Conv2d>(in_channels, out_channels, 1, stride, 0));
  }
  bn1_ = RegisterModule("bn1", std::make_shared<BatchNorm2d>(out_channels));
  bn2_ = RegisterModule("bn2", std::make_shared<BatchNorm2d>(out_channels));
}

Variable Residual::Forward(const Variable& x) {
  Variable y = ag::Relu(bn1_->Forward(conv1_->Forward(x)));
  y = bn2_->Forward(conv2_->Forward(y));
  Variable shortcut = conv3_ ? conv3_->Forward(x) : x;
  return ag::Relu(ag::Add(y, shortcut));
}

std::string Residual::Describe() const {
  return absl::StrCat("Residual(", in_, ", ", out_, ", use_1x1conv=", conv3_ != nullptr,
                      ", stride=", stride_, ")");
}

}  // namespace nn
}  // namespace dtrain
