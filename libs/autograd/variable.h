// Define-by-run automatic differentiation.
//
// A Variable wraps a Tensor. Operations on Variables (functions.h) compute
// their result at once and, when any input requires a gradient and grad mode
// is on, record a Node holding what backward needs. Backward() on a scalar
// walks the recorded graph in reverse topological order and accumulates
// gradients into the leaves (parameters), then frees the graph.
//
//   Variable w(Tensor::Zeros({10, 784}), /*requires_grad=*/true);
//   Variable loss = SoftmaxCrossEntropy(Linear(x, w, b), labels);
//   loss.Backward();
//   const Tensor& g = w.grad();
//
// Gradient hooks (AddGradHook) fire as soon as a leaf's gradient is final
// within a backward pass, while the rest of backward is still to run: this is
// what lets data-parallel training reduce early buckets during backward.
//
// Thread-safety: a graph belongs to one thread at a time. Grad mode is
// per thread (NoGradGuard).
#ifndef DTRAIN_LIBS_AUTOGRAD_VARIABLE_H_
#define DTRAIN_LIBS_AUTOGRAD_VARIABLE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "libs/tensor/tensor.h"

namespace dtrain {
namespace autograd {

struct Node;
struct VariableImpl;

class Variable {
 public:
  Variable() = default;
  explicit Variable(Tensor value, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const Tensor& value() const;
  // The value, for in-place updates by optimizers and initializers.
  Tensor& mutable_value();
  const Shape& shape() const { return value().shape(); }

  bool requires_grad() const;
  // The accumulated gradient (undefined until a backward pass reaches it).
  const Tensor& grad() const;
  Tensor& mutable_grad();
  // Drops the gradient (the next backward assigns instead of adding).
  void ZeroGrad();

  // True for variables created by the user (no grad_fn).
  bool is_leaf() const;
  // Name of the op that produced this variable ("" for leaves).
  std::string op_name() const;

  // Runs backward from this scalar (numel 1) with seed gradient 1, or from
  // any variable with the given seed gradient.
  void Backward();
  void Backward(const Tensor& seed);

  // Called with the final gradient of this leaf during each backward pass.
  void AddGradHook(std::function<void(Tensor& grad)> hook);

  // Identity of the underlying variable (for maps).
  const void* id() const { return impl_.get(); }

  // For functions.h: builds a non-leaf result.
  static Variable FromOp(Tensor value, std::shared_ptr<Node> node);
  const std::shared_ptr<VariableImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<VariableImpl> impl_;
};

// Computes gradients of `input i` from the output gradient. Entries for
// inputs that need no gradient may be left undefined.
using BackwardFn = std::function<void(const Tensor& grad_output, std::vector<Tensor>* grad_inputs)>;

struct Node {
  std::string name;
  std::vector<std::shared_ptr<VariableImpl>> inputs;
  BackwardFn backward;
};

struct VariableImpl {
  Tensor value;
  Tensor grad;
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  std::vector<std::function<void(Tensor&)>> hooks;
};

// True when operations record graphs on this thread (the default).
bool GradEnabled();

// True if `t` is the all-ones seed that Variable::Backward() (without a seed)
// is propagating on this thread right now. Backward functions use it to skip
// reading a scalar gradient back to the host: one device sync less per step,
// and what lets a whole step be captured in a CUDA graph.
bool IsUnitSeed(const Tensor& t);

// Disables recording on this thread for its lifetime (evaluation, optimizer
// updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Records `node` as the producer of a result with `value`, if any of
// `inputs` requires a gradient and grad mode is on; otherwise returns a
// plain variable. Used by functions.h.
Variable MakeResult(Tensor value, const char* name, std::vector<Variable> inputs,
                    BackwardFn backward);

}  // namespace autograd
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AUTOGRAD_VARIABLE_H_
