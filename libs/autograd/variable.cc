#include "libs/autograd/variable.h"

#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "libs/base/logging.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace autograd {
namespace {

thread_local bool tls_grad_enabled = true;
thread_local Tensor tls_unit_seed;

const Tensor& UndefinedTensor() {
  static const Tensor* t = new Tensor();
  return *t;
}

}  // namespace

Variable::Variable(Tensor value, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  impl_->value = std::move(value);
  impl_->requires_grad = requires_grad;
}

const Tensor& Variable::value() const {
  DT_CHECK(impl_ != nullptr) << "undefined Variable";
  return impl_->value;
}

Tensor& Variable::mutable_value() {
  DT_CHECK(impl_ != nullptr) << "undefined Variable";
  return impl_->value;
}

bool Variable::requires_grad() const { return impl_ && impl_->requires_grad; }

const Tensor& Variable::grad() const { return impl_ ? impl_->grad : UndefinedTensor(); }

Tensor& Variable::mutable_grad() {
  DT_CHECK(impl_ != nullptr) << "undefined Variable";
  return impl_->grad;
}

void Variable::ZeroGrad() {
  if (impl_) impl_->grad = Tensor();
}

bool Variable::is_leaf() const { return impl_ && impl_->grad_fn == nullptr; }

std::string Variable::op_name() const {
  return impl_ && impl_->grad_fn ? impl_->grad_fn->name : "";
}

void Variable::AddGradHook(std::function<void(Tensor& grad)> hook) {
  DT_CHECK(impl_ != nullptr) << "AddGradHook on undefined Variable";
  impl_->hooks.push_back(std::move(hook));
}

Variable Variable::FromOp(Tensor value, std::shared_ptr<Node> node) {
  Variable v;
  v.impl_ = std::make_shared<VariableImpl>();
  v.impl_->value = std::move(value);
  v.impl_->requires_grad = true;
  v.impl_->grad_fn = std::move(node);
  return v;
}

void Variable::Backward() {
  DT_CHECK(value().numel() == 1) << "Backward() without a seed needs a scalar, got "
                                 << value().DebugString();
  // Filled on the device (no host-to-device copy) and remembered so that
  // backward functions can tell it is all ones without reading it.
  Tensor seed = Tensor::Empty(value().shape(), value().dtype(), value().device());
  ops::Fill(&seed, 1.0f);
  tls_unit_seed = seed;
  Backward(seed);
  tls_unit_seed = Tensor();
}

namespace {

void Accumulate(Tensor* dst, const Tensor& g) {
  if (!dst->defined()) {
    *dst = g;
  } else {
    // Copy-on-accumulate: `dst` may share storage with a tensor that a node
    // still needs, so never add into storage we did not allocate ourselves.
    if (dst->storage_use_count() > 1) *dst = dst->Clone();
    ops::Axpy(1.0f, g, dst);
  }
}

}  // namespace

void Variable::Backward(const Tensor& seed) {
  DT_CHECK(impl_ != nullptr) << "Backward on undefined Variable";
  DT_CHECK(seed.shape() == value().shape())
      << "seed " << seed.DebugString() << " for " << value().DebugString();
  if (!impl_->requires_grad) return;
  NoGradGuard no_grad;

  // Reverse topological order of the nodes reachable from this variable
  // (iterative DFS: deep ResNets must not overflow the stack).
  std::vector<VariableImpl*> order;
  // Owns every variable of the graph until the pass ends: freeing a node
  // below releases its inputs, which may be the last references.
  std::vector<std::shared_ptr<VariableImpl>> keep_alive;
  std::unordered_set<VariableImpl*> visited;
  std::unordered_map<VariableImpl*, int> leaf_uses;  // consumers of each leaf
  std::vector<std::pair<VariableImpl*, size_t>> stack;
  stack.emplace_back(impl_.get(), 0);
  visited.insert(impl_.get());
  while (!stack.empty()) {
    auto& [v, next] = stack.back();
    Node* node = v->grad_fn.get();
    if (node != nullptr && next < node->inputs.size()) {
      const std::shared_ptr<VariableImpl>& in_ptr = node->inputs[next++];
      VariableImpl* in = in_ptr.get();
      if (!in->requires_grad) continue;
      if (in->grad_fn == nullptr) ++leaf_uses[in];
      if (visited.insert(in).second) {
        keep_alive.push_back(in_ptr);
        stack.emplace_back(in, 0);
      }
      continue;
    }
    order.push_back(v);
    stack.pop_back();
  }

  std::unordered_map<VariableImpl*, Tensor> grads;
  // A leaf's gradient is final once every node that consumes it has run.
  auto fire_hooks = [](VariableImpl* leaf) {
    if (leaf->hooks.empty() || !leaf->grad.defined()) return;
    // Hooks may modify the gradient in place (an allreduce, say): make sure
    // it does not share storage with a gradient still flowing elsewhere.
    if (leaf->grad.storage_use_count() > 1) leaf->grad = leaf->grad.Clone();
    for (auto& hook : leaf->hooks) hook(leaf->grad);
  };
  if (impl_->grad_fn == nullptr) {
    Accumulate(&impl_->grad, seed);
    fire_hooks(impl_.get());
    return;
  }
  grads[impl_.get()] = seed;
  std::vector<Tensor> grad_inputs;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    VariableImpl* v = *it;
    if (v->grad_fn == nullptr) continue;  // leaves are finished by their consumers
    std::shared_ptr<Node> node = v->grad_fn;
    auto g = grads.find(v);
    grad_inputs.assign(node->inputs.size(), Tensor());
    if (g != grads.end()) {
      Tensor grad_out = std::move(g->second);
      grads.erase(g);
      node->backward(grad_out, &grad_inputs);
    }
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      VariableImpl* in = node->inputs[i].get();
      if (!in->requires_grad) continue;
      bool has = grad_inputs[i].defined();
      if (in->grad_fn != nullptr) {
        if (has) Accumulate(&grads[in], grad_inputs[i]);
        continue;
      }
      if (has) Accumulate(&in->grad, grad_inputs[i]);
      if (--leaf_uses[in] == 0) fire_hooks(in);
    }
    // Free what this node saved: the graph is single-use.
    node->backward = nullptr;
    node->inputs.clear();
    v->grad_fn.reset();
  }
}

bool GradEnabled() { return tls_grad_enabled; }

bool IsUnitSeed(const Tensor& t) {
  return tls_unit_seed.defined() && t.SharesStorageWith(tls_unit_seed) &&
         t.raw_data() == tls_unit_seed.raw_data() && t.numel() == tls_unit_seed.numel();
}

NoGradGuard::NoGradGuard() : prev_(tls_grad_enabled) { tls_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tls_grad_enabled = prev_; }

Variable MakeResult(Tensor value, const char* name, std::vector<Variable> inputs,
                    BackwardFn backward) {
  bool needs = false;
  if (tls_grad_enabled) {
    for (const Variable& in : inputs) needs = needs || in.requires_grad();
  }
  if (!needs) return Variable(std::move(value), false);
  auto node = std::make_shared<Node>();
  node->name = name;
  node->inputs.reserve(inputs.size());
  for (Variable& in : inputs) {
    node->inputs.push_back(in.defined() ? in.impl() : std::make_shared<VariableImpl>());
  }
  node->backward = std::move(backward);
  return Variable::FromOp(std::move(value), std::move(node));
}

}  // namespace autograd
}  // namespace dtrain
