#include "libs/nn/optim.h"

namespace dtrain {
namespace nn {

Sgd::Sgd(std::vector<std::pair<std::string, autograd::Variable>> params, const ops::SgdParams& p)
    : vars_(std::move(params)), momentum_(vars_.size()), p_(p) {}

void Sgd::Step() {
  for (size_t i = 0; i < vars_.size(); ++i) {
    autograd::Variable& v = vars_[i].second;
    if (!v.grad().defined()) continue;
    Tensor* buf = nullptr;
    if (p_.momentum != 0.0f) {
      if (!momentum_[i].defined()) {
        momentum_[i] = Tensor::Zeros(v.value().shape(), v.value().dtype(), v.value().device());
      }
      buf = &momentum_[i];
    }
    ops::SgdUpdate(&v.mutable_value(), v.grad(), buf, p_);
  }
}

void Sgd::ZeroGrad() {
  for (auto& [name, v] : vars_) v.ZeroGrad();
}

std::vector<std::pair<std::string, Tensor*>> Sgd::NamedState() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < vars_.size(); ++i) {
    if (momentum_[i].defined())
      out.emplace_back(vars_[i].first + ".momentum_buffer", &momentum_[i]);
  }
  return out;
}

absl::Status Sgd::LoadState(
    const std::function<absl::Status(const std::string& name, Tensor* dst)>& read) {
  if (p_.momentum == 0.0f) return absl::OkStatus();
  std::vector<Tensor> loaded(vars_.size());
  for (size_t i = 0; i < vars_.size(); ++i) {
    const Tensor& v = vars_[i].second.value();
    Tensor t = Tensor::Zeros(v.shape(), v.dtype(), v.device());
    absl::Status s = read(vars_[i].first + ".momentum_buffer", &t);
    if (absl::IsNotFound(s)) continue;
    if (!s.ok()) return s;
    loaded[i] = t;
  }
  for (size_t i = 0; i < vars_.size(); ++i) {
    if (loaded[i].defined()) momentum_[i] = loaded[i];
  }
  return absl::OkStatus();
}

}  // namespace nn
}  // namespace dtrain
