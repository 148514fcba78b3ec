// Layers of the book's models. Parameter names and shapes follow PyTorch
// (weight [out, in, kh, kw] / [out, in], bias [out]; batch norm weight, bias,
// running_mean, running_var).
#ifndef DTRAIN_LIBS_NN_LAYERS_H_
#define DTRAIN_LIBS_NN_LAYERS_H_

#include <memory>
#include <string>
#include <vector>

#include "libs/nn/module.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Variable Forward(const Variable& x) override;
  // relu(Forward(x)) in one fused kernel.
  Variable ForwardRelu(const Variable& x);
  std::string Describe() const override;
  Variable& weight() { return *weight_; }
  Variable& bias() { return *bias_; }

 private:
  int64_t in_, out_;
  Variable* weight_;
  Variable* bias_;
  Variable no_bias_;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int kernel_size, int stride = 1,
         int padding = 0, bool bias = true);
  Variable Forward(const Variable& x) override;
  Variable ForwardRelu(const Variable& x);
  std::string Describe() const override;
  Variable& weight() { return *weight_; }
  const ops::Conv2dParams& params() const { return p_; }

 private:
  int64_t in_, out_;
  int k_;
  ops::Conv2dParams p_;
  Variable* weight_;
  Variable* bias_;
  Variable no_bias_;
};

class ReLU : public Module {
 public:
  Variable Forward(const Variable& x) override;
  std::string Describe() const override { return "ReLU()"; }
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int kernel_size, int stride = -1, int padding = 0);
  Variable Forward(const Variable& x) override;
  std::string Describe() const override;

 private:
  ops::Pool2dParams p_;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int kernel_size, int stride = -1, int padding = 0);
  Variable Forward(const Variable& x) override;
  std::string Describe() const override;

 private:
  ops::Pool2dParams p_;
};

// nn.AdaptiveAvgPool2d((1, 1)).
class GlobalAvgPool2d : public Module {
 public:
  Variable Forward(const Variable& x) override;
  std::string Describe() const override { return "AdaptiveAvgPool2d((1, 1))"; }
};

class Flatten : public Module {
 public:
  Variable Forward(const Variable& x) override;
  std::string Describe() const override { return "Flatten()"; }
};

class SyncBatchNormGroup;  // sync_batch_norm.h

// BatchNorm2d (and BatchNorm1d on [N, C] inputs).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f);
  Variable Forward(const Variable& x) override;
  std::string Describe() const override;

  // Synchronized batch norm (sync_batch_norm.h): in training mode, normalize
  // with statistics over every member of `group`, this layer being member
  // `member`. A null group restores per-replica statistics.
  void SetSyncGroup(std::shared_ptr<SyncBatchNormGroup> group, int member);

 private:
  std::shared_ptr<SyncBatchNormGroup> sync_group_;
  int sync_member_ = 0;
  int64_t channels_;
  float eps_, momentum_;
  Variable* weight_;
  Variable* bias_;
  Tensor* running_mean_;
  Tensor* running_var_;
};

// Children run in order; children are named "0", "1", ... unless Add() is
// given a name. A Linear or Conv2d directly followed by a ReLU runs as one
// fused kernel (same result, one pass over memory less).
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  void Add(std::shared_ptr<Module> module);
  void Add(const std::string& name, std::shared_ptr<Module> module);
  Variable Forward(const Variable& x) override;
  std::string Describe() const override { return "Sequential"; }
  size_t size() const { return NamedChildren().size(); }

 private:
  std::vector<Module*> order_;
};

// The d2l residual block: Y = relu(bn1(conv1(X))); Y = bn2(conv2(Y));
// X' = conv3(X) when use_1x1conv; relu(Y + X').
class Residual : public Module {
 public:
  Residual(int64_t in_channels, int64_t out_channels, bool use_1x1conv = false, int stride = 1);
  Variable Forward(const Variable& x) override;
  std::string Describe() const override;

 private:
  int64_t in_, out_;
  int stride_;
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
};

}  // namespace nn
}  // namespace dtrain

#endif  // DTRAIN_LIBS_NN_LAYERS_H_
