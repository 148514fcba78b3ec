#include "libs/nn/module.h"

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace nn {

Variable& Module::RegisterParameter(const std::string& name, Tensor value) {
  params_.emplace_back(name, std::make_unique<Variable>(std::move(value), true));
  return *params_.back().second;
}

Tensor& Module::RegisterBuffer(const std::string& name, Tensor value) {
  buffers_.emplace_back(name, std::make_unique<Tensor>(std::move(value)));
  return *buffers_.back().second;
}

void Module::CollectParameters(const std::string& prefix,
                               std::vector<std::pair<std::string, Variable>>* out) const {
  for (const auto& [name, p] : params_) out->emplace_back(prefix + name, *p);
  for (const auto& [name, child] : children_) child->CollectParameters(prefix + name + ".", out);
}

void Module::CollectBuffers(const std::string& prefix,
                            std::vector<std::pair<std::string, Tensor*>>* out) {
  for (auto& [name, b] : buffers_) out->emplace_back(prefix + name, b.get());
  for (auto& [name, child] : children_) child->CollectBuffers(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Variable>> Module::NamedParameters() const {
  std::vector<std::pair<std::string, Variable>> out;
  CollectParameters("", &out);
  return out;
}

std::vector<Variable> Module::Parameters() const {
  std::vector<Variable> out;
  for (auto& [name, p] : NamedParameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::NamedBuffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  CollectBuffers("", &out);
  return out;
}

int64_t Module::NumParameters() const {
  int64_t n = 0;
  for (auto& [name, p] : NamedParameters()) n += p.value().numel();
  return n;
}

void Module::Train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->Train(on);
}

absl::Status Module::To(const Device& device) {
  for (auto& [name, p] : params_) {
    absl::StatusOr<Tensor> t = p->value().To(device);
    if (!t.ok()) return t.status();
    p->mutable_value() = *t;
    p->ZeroGrad();
  }
  for (auto& [name, b] : buffers_) {
    absl::StatusOr<Tensor> t = b->To(device);
    if (!t.ok()) return t.status();
    *b = *t;
  }
  for (auto& [name, child] : children_) {
    absl::Status s = child->To(device);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void Module::ZeroGrad() {
  for (auto& [name, p] : params_) p->ZeroGrad();
  for (auto& [name, child] : children_) child->ZeroGrad();
}

void Module::AppendTree(int depth, const std::string& name, std::string* out) const {
  absl::StrAppend(out, std::string(2 * depth, ' '),
                  name.empty() ? "" : "(" + name + "): ", Describe(), "\n");
  for (const auto& [n, child] : children_) child->AppendTree(depth + 1, n, out);
}

std::string Module::ToString() const {
  std::string out;
  AppendTree(0, "", &out);
  return out;
}

}  // namespace nn
}  // namespace dtrain
