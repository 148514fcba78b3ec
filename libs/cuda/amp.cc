#include "libs/cuda/amp.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/cuda/kernels.h"
#include "libs/cuda/op_util.h"
#include "libs/cuda/stream.h"

namespace dtrain {
namespace cuda {

using internal::CheckLaunch;
using internal::Dt;
using internal::IsFloat;

absl::StatusOr<std::unique_ptr<LossScaler>> LossScaler::Create(const Device& device,
                                                               const LossScalerOptions& o) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LossScaler: ", device.ToString(), " is not a CUDA device"));
  }
  if (!(o.init_scale > 0.0f) || !std::isfinite(o.init_scale) || !(o.growth_factor > 1.0f) ||
      !(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f) || o.growth_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LossScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
        "growth_interval >= 1; got ",
        o.init_scale, ", ", o.growth_factor, ", ", o.backoff_factor, ", ", o.growth_interval));
  }
  absl::StatusOr<Tensor> scale = Tensor::TryEmpty({}, DType::kF32, device);
  if (!scale.ok()) return scale.status();
  absl::StatusOr<Tensor> tracker = Tensor::TryEmpty({1}, DType::kI32, device);
  if (!tracker.ok()) return tracker.status();
  absl::StatusOr<Tensor> found = Tensor::TryEmpty({1}, DType::kF32, device);
  if (!found.ok()) return found.status();
  ops::Fill(&*scale, o.init_scale);
  ops::Fill(&*tracker, 0.0f);
  ops::Fill(&*found, 0.0f);
  return std::unique_ptr<LossScaler>(new LossScaler(o, *scale, *tracker, *found));
}

void LossScaler::UnscaleAndCheck(const std::vector<Tensor*>& grads) {
  const int d = scale_.device().index;
  DeviceGuard guard(d);
  cudaStream_t s = CurrentCudaStream(d);
  CheckLaunch("LossScaler::UnscaleAndCheck",
              cudaMemsetAsync(found_inf_.raw_data(), 0, sizeof(float), s));
  std::map<DType, std::pair<std::vector<void*>, std::vector<int64_t>>> by_dtype;
  for (Tensor* g : grads) {
    if (g == nullptr || !g->defined() || g->numel() == 0) continue;
    DT_CHECK(g->device() == scale_.device() && IsFloat(g->dtype()))
        << "LossScaler::UnscaleAndCheck: gradient " << g->DebugString() << " is not a float "
        << "tensor on " << scale_.device().ToString();
    auto& [ptrs, sizes] = by_dtype[g->dtype()];
    ptrs.push_back(g->raw_data());
    sizes.push_back(g->numel());
  }
  for (auto& [dt, list] : by_dtype) {
    CheckLaunch("LossScaler::UnscaleAndCheck",
                kernels::MultiTensorUnscale(list.first.data(), list.second.data(),
                                            static_cast<int>(list.first.size()), Dt(dt),
                                            scale_.data<float>(), found_inf_.data<float>(), s));
  }
}

void LossScaler::Update() {
  const int d = scale_.device().index;
  DeviceGuard guard(d);
  CheckLaunch("LossScaler::Update",
              kernels::UpdateLossScale(scale_.data<float>(), tracker_.data<int32_t>(),
                                       found_inf_.data<float>(), options_.growth_factor,
                                       options_.backoff_factor, options_.growth_interval,
                                       CurrentCudaStream(d)));
}

float LossScaler::scale_value() const { return ops::ScalarValue(scale_); }
bool LossScaler::found_inf_value() const { return ops::ScalarValue(found_inf_) != 0.0f; }

MixedPrecisionSgd::MixedPrecisionSgd(std::vector<std::pair<std::string, autograd::Variable>> params,
                                     const ops::SgdParams& p, DType compute_dtype)
    : vars_(std::move(params)), momentum_(vars_.size()), p_(p), compute_(compute_dtype) {
  DT_CHECK(IsFloat(compute_)) << "MixedPrecisionSgd: compute dtype " << DTypeName(compute_)
                              << " is not f32, f16 or bf16";
  DT_CHECK(!p_.nesterov || p_.momentum > 0.0f)
      << "MixedPrecisionSgd: nesterov needs a positive momentum, got " << p_.momentum;
  masters_.reserve(vars_.size());
  for (size_t i = 0; i < vars_.size(); ++i) {
    auto& [name, v] = vars_[i];
    const Tensor& value = v.value();
    DT_CHECK(value.device().is_cuda() && value.dtype() == DType::kF32)
        << "MixedPrecisionSgd: parameter " << name << " is " << value.DebugString()
        << "; want f32 on a CUDA device";
    if (i == 0) device_ = value.device().index;
    DT_CHECK(value.device().index == device_)
        << "MixedPrecisionSgd: parameter " << name << " is on " << value.device().ToString()
        << ", the first on cuda:" << device_;
    masters_.push_back(value);
    if (compute_ != DType::kF32) v.mutable_value() = ops::Cast(value, compute_);
  }
}

void MixedPrecisionSgd::Step(const Tensor* found_inf) {
  if (found_inf != nullptr) {
    DT_CHECK(found_inf->dtype() == DType::kF32 && found_inf->device() == Device::Cuda(device_))
        << "MixedPrecisionSgd::Step: found_inf " << found_inf->DebugString();
  }
  std::map<DType, std::vector<kernels::SgdTensor>> by_dtype;
  for (size_t i = 0; i < vars_.size(); ++i) {
    autograd::Variable& v = vars_[i].second;
    const Tensor& g = v.grad();
    if (!g.defined()) continue;
    DT_CHECK(g.shape() == masters_[i].shape() && g.device() == masters_[i].device() &&
             IsFloat(g.dtype()))
        << "MixedPrecisionSgd::Step: gradient " << g.DebugString() << " of " << vars_[i].first
        << " for " << masters_[i].DebugString();
    float* mom = nullptr;
    if (p_.momentum != 0.0f) {
      if (!momentum_[i].defined()) {
        momentum_[i] = Tensor::Zeros(masters_[i].shape(), DType::kF32, masters_[i].device());
      }
      mom = momentum_[i].data<float>();
    }
    void* copy = compute_ != DType::kF32 ? v.mutable_value().raw_data() : nullptr;
    by_dtype[g.dtype()].push_back(
        kernels::SgdTensor{masters_[i].data<float>(), g.raw_data(), mom, copy, g.numel()});
  }
  kernels::SgdHyper h;
  h.lr = p_.lr;
  h.momentum = p_.momentum;
  h.weight_decay = p_.weight_decay;
  h.nesterov = p_.nesterov;
  DeviceGuard guard(device_);
  cudaStream_t s = CurrentCudaStream(device_);
  for (auto& [dt, list] : by_dtype) {
    CheckLaunch(
        "MixedPrecisionSgd::Step",
        kernels::MultiTensorSgd(list.data(), static_cast<int>(list.size()), Dt(dt),
                                compute_ != DType::kF32 ? Dt(compute_) : kernels::kF32, h,
                                found_inf != nullptr ? found_inf->data<float>() : nullptr, s));
  }
}

void MixedPrecisionSgd::ZeroGrad() {
  for (auto& [name, v] : vars_) v.ZeroGrad();
}

std::vector<Tensor*> MixedPrecisionSgd::Gradients() {
  std::vector<Tensor*> out;
  for (auto& [name, v] : vars_) {
    if (v.grad().defined()) out.push_back(&v.mutable_grad());
  }
  return out;
}

}  // namespace cuda
}  // namespace dtrain
