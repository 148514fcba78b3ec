// Mixed-precision training on CUDA: f16 or bf16 compute with f32 master
// weights, and dynamic loss scaling for f16.
//
//   MixedPrecisionSgd opt(model->NamedParameters(), {.lr = 0.1f}, DType::kBF16);
//   // the model's parameters are now bf16 copies; opt holds the f32 masters
//   Variable loss = SoftmaxCrossEntropy(model->Forward(Variable(x_bf16)), labels);
//   opt.ZeroGrad();
//   loss.Backward();
//   opt.Step();                 // f32 update, fresh bf16 copies, one launch per dtype
//
// With f16, whose range is narrow, scale the loss so that small gradients do
// not flush to zero, and skip steps whose gradients overflowed:
//
//   DT_ASSIGN_OR_RETURN(auto scaler, LossScaler::Create(Device::Cuda(0)));
//   loss.Backward(scaler->seed());               // gradients times the scale
//   scaler->UnscaleAndCheck(opt.Gradients());    // divided back; overflow noted
//   opt.Step(&scaler->found_inf());              // skipped on the device if so
//   scaler->Update();                            // back off, or grow
//
// Nothing here synchronizes with the host: the scale, the overflow flag and
// the decision to skip live on the device.
#ifndef DTRAIN_LIBS_CUDA_AMP_H_
#define DTRAIN_LIBS_CUDA_AMP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/autograd/variable.h"
#include "libs/ops/ops.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace cuda {

struct LossScalerOptions {
  float init_scale = 65536.0f;  // 2^16, PyTorch's default
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int32_t growth_interval = 2000;  // good steps in a row before growing
};

class LossScaler {
 public:
  // A scaler on CUDA device `device`. InvalidArgument for a bad option or a
  // non-CUDA device; the allocator's error when the device is unavailable.
  static absl::StatusOr<std::unique_ptr<LossScaler>> Create(const Device& device,
                                                            const LossScalerOptions& options = {});

  // f32 scalar (shape []) holding the current scale: the seed of Backward.
  const Tensor& seed() const { return scale_; }
  // Multiplies each gradient (CUDA tensors of a float type, any mix) by
  // 1 / scale in place, and sets found_inf() if any result is inf or NaN.
  // Clears found_inf() first.
  void UnscaleAndCheck(const std::vector<Tensor*>& grads);
  // f32 [1]: non-zero when the last UnscaleAndCheck saw an overflow.
  const Tensor& found_inf() const { return found_inf_; }
  // Applies the scale rule (loss_scale_rule.h) on the device and clears
  // found_inf().
  void Update();

  // Host reads, which wait for the device: for logs and tests.
  float scale_value() const;
  bool found_inf_value() const;

 private:
  LossScaler(const LossScalerOptions& o, Tensor scale, Tensor tracker, Tensor found_inf)
      : options_(o), scale_(scale), tracker_(tracker), found_inf_(found_inf) {}
  LossScalerOptions options_;
  Tensor scale_;      // f32 []
  Tensor tracker_;    // i32 [1]: good steps in a row
  Tensor found_inf_;  // f32 [1]
};

class MixedPrecisionSgd {
 public:
  // Takes over `params` (f32 parameters on one CUDA device): their current
  // values become the f32 master weights, and for compute_dtype f16 or bf16
  // each parameter's value is replaced by a copy in that dtype, which the
  // model computes with. compute_dtype f32 keeps the values (plain SGD, with
  // the multi-tensor kernel). Fatal on arguments that break this contract.
  MixedPrecisionSgd(std::vector<std::pair<std::string, autograd::Variable>> params,
                    const ops::SgdParams& p, DType compute_dtype);

  // Updates the masters from the parameters' gradients (of any float dtype;
  // parameters without one are skipped) with torch.optim.SGD's rule, and
  // refreshes the low-precision copies: one kernel launch per gradient dtype
  // for every ~320 chunks of 16K elements. With `found_inf` (a LossScaler's),
  // the whole update is skipped on the device when it is set.
  void Step(const Tensor* found_inf = nullptr);
  void ZeroGrad();

  // The parameters' gradients that are defined (for UnscaleAndCheck).
  std::vector<Tensor*> Gradients();
  // Master weights, in the order of the parameters given.
  const std::vector<Tensor>& master_weights() const { return masters_; }
  DType compute_dtype() const { return compute_; }
  const ops::SgdParams& params() const { return p_; }
  void set_lr(float lr) { p_.lr = lr; }

 private:
  std::vector<std::pair<std::string, autograd::Variable>> vars_;
  std::vector<Tensor> masters_;
  std::vector<Tensor> momentum_;
  ops::SgdParams p_;
  DType compute_;
  int device_ = 0;
};

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_AMP_H_
