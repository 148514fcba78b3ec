// Modules: named parameters and buffers, train/eval mode, composition.
//
//   auto net = std::make_shared<Sequential>();
//   net->Add(std::make_shared<Linear>(784, 256));
//   net->Add(std::make_shared<ReLU>());
//   Variable y = net->Forward(x);
//   for (auto& [name, p] : net->NamedParameters()) ...   // "0.weight", ...
//
// Names follow PyTorch's state_dict convention ("<child>.<param>"), so
// checkpoints and reference tests line up with PyTorch models.
// Thread-safety: a module is used by one thread at a time.
#ifndef DTRAIN_LIBS_NN_MODULE_H_
#define DTRAIN_LIBS_NN_MODULE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "libs/autograd/variable.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace nn {

using autograd::Variable;

class Module {
 public:
  virtual ~Module() = default;

  virtual Variable Forward(const Variable& x) = 0;
  Variable operator()(const Variable& x) { return Forward(x); }

  // A short description such as "Conv2d(1, 20, kernel_size=3)".
  virtual std::string Describe() const = 0;

  // Parameters of this module and its children, depth first in registration
  // order, with dotted names.
  std::vector<std::pair<std::string, Variable>> NamedParameters() const;
  std::vector<Variable> Parameters() const;
  // Buffers (batch-norm running statistics), same naming.
  std::vector<std::pair<std::string, Tensor*>> NamedBuffers();
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> NamedChildren() const {
    return children_;
  }
  int64_t NumParameters() const;

  // Sets training mode here and in all children.
  void Train(bool on = true);
  void Eval() { Train(false); }
  bool training() const { return training_; }

  // Moves every parameter and buffer to `device`.
  absl::Status To(const Device& device);

  // Drops all parameter gradients.
  void ZeroGrad();

  // A multi-line tree of Describe() strings.
  std::string ToString() const;

 protected:
  Variable& RegisterParameter(const std::string& name, Tensor value);
  Tensor& RegisterBuffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> RegisterModule(const std::string& name, std::shared_ptr<M> module) {
    children_.emplace_back(name, module);
    return module;
  }

 private:
  void CollectParameters(const std::string& prefix,
                         std::vector<std::pair<std::string, Variable>>* out) const;
  void CollectBuffers(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>* out);
  void AppendTree(int depth, const std::string& name, std::string* out) const;

  // unique_ptr keeps references returned by Register* stable.
  std::vector<std::pair<std::string, std::unique_ptr<Variable>>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace nn
}  // namespace dtrain

#endif  // DTRAIN_LIBS_NN_MODULE_H_
