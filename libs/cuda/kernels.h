// Launchers of the hand-written CUDA kernels (elementwise.cu, reduce.cu,
// optim.cu). Internal to libs/cuda: the op kernels (cuda_ops.cc,
// dnn/, blas_ops.cc) check shapes and dtypes and call these with raw device
// pointers; model code uses libs/ops.
//
// Every launcher enqueues its work on `stream` and returns the launch status
// (cudaErrorInvalidValue for an unsupported dtype). Element types are
// libs/tensor's DType codes; "float types" are f32, f16 and bf16, computed in
// f32 whatever the storage type. Outputs may alias inputs element for element
// where the op allows it (ops.h). Results are deterministic: no atomics on
// floating-point values, and reductions combine fixed blocks in a fixed order.
#ifndef DTRAIN_LIBS_CUDA_KERNELS_H_
#define DTRAIN_LIBS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain {
namespace cuda {
namespace kernels {

// Same values as dtrain::DType.
enum DT : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kI64 = 4, kU8 = 5 };

// ---- elementwise.cu ----

cudaError_t Relu(DT dt, const void* x, void* y, int64_t n, cudaStream_t s);
// dx = y > 0 ? dy : 0.
cudaError_t ReluBackward(DT dt, const void* y, const void* dy, void* dx, int64_t n, cudaStream_t s);
cudaError_t Add(DT dt, const void* a, const void* b, void* c, int64_t n, cudaStream_t s);
// y += alpha * x.
cudaError_t Axpy(DT dt, float alpha, const void* x, void* y, int64_t n, cudaStream_t s);
// y = alpha * x.
cudaError_t Scale(DT dt, const void* x, float alpha, void* y, int64_t n, cudaStream_t s);
// Every element = `value` converted as Cast converts an f32 (any dtype).
cudaError_t Fill(DT dt, void* p, float value, int64_t n, cudaStream_t s);
// Any dtype to any dtype, with the CPU kernel's rules (libs/ops/cpu/basic_kernels.cc).
cudaError_t Cast(DT from, const void* x, DT to, void* y, int64_t n, cudaStream_t s);
// For y viewed as [outer, channels, inner]: y += bias[c] (bias of dtype
// `bias_dt`, may be null), then relu when `relu`.
cudaError_t BiasAct(DT dt, void* y, DT bias_dt, const void* bias, int64_t outer, int64_t channels,
                    int64_t inner, bool relu, cudaStream_t s);
// Philox4x32-10 streams exactly as the CPU kernels lay them out (element i of
// the tensor is stream element offset + i). `top` is the largest value
// RandomUniform may return (nextafter(high, low), computed by the caller).
cudaError_t RandomUniform(float* p, int64_t n, float low, float high, float top, uint64_t seed,
                          uint64_t offset, cudaStream_t s);
cudaError_t RandomNormal(float* p, int64_t n, float mean, float stddev, uint64_t seed,
                         uint64_t offset, cudaStream_t s);
// Keeps `s` busy for about `nanoseconds` (tests of overlap and asynchrony).
cudaError_t Spin(int64_t nanoseconds, cudaStream_t s);

// ---- reduce.cu ----

// y[0] (f32) = sum of x (a float type), accumulated in f64. `scratch` holds at
// least SumScratch(n) doubles.
int64_t SumScratch(int64_t n);
cudaError_t Sum(DT dt, const void* x, int64_t n, float* y, double* scratch, cudaStream_t s);

// Mean cross-entropy of softmax(logits [N, C]) against labels; loss (f32
// scalar); dlogits (logits' dtype, may be null) = (softmax - onehot) / N.
// Labels outside [0, C) make their row's loss and gradient NaN (the CPU
// kernel stops instead; a GPU kernel cannot without a synchronization).
// `scratch` holds at least N doubles.
cudaError_t SoftmaxCrossEntropy(DT dt, const void* logits, const int32_t* labels, int64_t N,
                                int64_t C, float* loss, void* dlogits, double* scratch,
                                cudaStream_t s);
// First maximum of each row (a NaN counts as the maximum).
cudaError_t Argmax(DT dt, const void* logits, int64_t N, int64_t C, int32_t* out, cudaStream_t s);
cudaError_t CountCorrect(DT dt, const void* logits, const int32_t* labels, int64_t N, int64_t C,
                         int64_t* correct, cudaStream_t s);

// planes = N * C, hw = H * W.
cudaError_t GlobalAvgPool(DT dt, const void* x, int64_t planes, int64_t hw, void* y,
                          cudaStream_t s);
cudaError_t GlobalAvgPoolBackward(DT dt, const void* dy, int64_t planes, int64_t hw, void* dx,
                                  cudaStream_t s);

struct PoolGeom {
  int64_t planes, h, w, ho, wo;
  int kernel, stride, pad;
};
// Max pooling as the CPU kernel: padding never wins, ties keep the first
// cell in row-major order, a NaN wins; indices are flat positions in the plane.
cudaError_t MaxPool(DT dt, const void* x, const PoolGeom& g, void* y, int32_t* indices,
                    cudaStream_t s);
cudaError_t MaxPoolBackward(DT dt, const void* dy, const int32_t* indices, const PoolGeom& g,
                            void* dx, cudaStream_t s);
// Average pooling excluding padding from the divisor.
cudaError_t AvgPool(DT dt, const void* x, const PoolGeom& g, void* y, cudaStream_t s);
cudaError_t AvgPoolBackward(DT dt, const void* dy, const PoolGeom& g, void* dx, cudaStream_t s);

// out[c] (dtype out_dt) = sum over o, i of x[o, c, i] for x [outer, channels, inner].
cudaError_t ChannelSum(DT dt, const void* x, int64_t outer, int64_t channels, int64_t inner,
                       DT out_dt, void* out, cudaStream_t s);

// Batch norm over x [outer, C, inner] per channel (the own kernels; cuDNN
// does the f32/f16 training passes, see dnn/batch_norm.cc). Parameters
// gamma/beta have dtype `pdt`; statistics are f32.
cudaError_t BatchNormStats(DT dt, const void* x, int64_t outer, int64_t C, int64_t inner, float eps,
                           float* mean, float* inv_std, cudaStream_t s);
cudaError_t BatchNormApply(DT dt, const void* x, int64_t outer, int64_t C, int64_t inner,
                           const float* mean, const float* inv_std, DT pdt, const void* gamma,
                           const void* beta, void* y, cudaStream_t s);
cudaError_t BatchNormInference(DT dt, const void* x, int64_t outer, int64_t C, int64_t inner,
                               DT pdt, const void* gamma, const void* beta,
                               const float* running_mean, const float* running_var, float eps,
                               void* y, cudaStream_t s);
// dgamma = sum dy * xhat, dbeta = sum dy (dtype `gdt`, either may be null),
// and the same two sums in f32 for BatchNormBackwardData.
cudaError_t BatchNormBackwardReduce(DT dt, const void* x, const void* dy, int64_t outer, int64_t C,
                                    int64_t inner, const float* mean, const float* inv_std,
                                    float* sum_dy, float* sum_dy_xhat, DT gdt, void* dgamma,
                                    void* dbeta, cudaStream_t s);
cudaError_t BatchNormBackwardData(DT dt, const void* x, const void* dy, int64_t outer, int64_t C,
                                  int64_t inner, const float* mean, const float* inv_std, DT pdt,
                                  const void* gamma, const float* sum_dy, const float* sum_dy_xhat,
                                  void* dx, cudaStream_t s);
// running = (1 - momentum) * running + momentum * batch, with the batch
// variance (1 / inv_std^2 - eps) made unbiased by count / (count - 1).
cudaError_t BatchNormUpdateRunning(const float* mean, const float* inv_std, int64_t C, float eps,
                                   float momentum, double count, float* running_mean,
                                   float* running_var, cudaStream_t s);

// ---- optim.cu ----

struct SgdHyper {
  float lr = 0.0f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// One parameter of a multi-tensor update: f32 master `param` (updated in
// place), `grad` (dtype grad_dt), f32 `momentum` buffer (null when momentum is
// 0) and an optional low-precision copy of the updated parameter (dtype
// copy_dt; null for none).
struct SgdTensor {
  float* param;
  const void* grad;
  float* momentum;
  void* copy;
  int64_t n;
};

// PyTorch's SGD (libs/ops/ops.h SgdUpdateFn) on `count` tensors in as few
// launches as possible. When `found_inf` is non-null and *found_inf != 0 on
// the device, nothing is updated (a skipped step of mixed-precision training;
// read on the device, so no synchronization).
cudaError_t MultiTensorSgd(const SgdTensor* tensors, int count, DT grad_dt, DT copy_dt,
                           const SgdHyper& hyper, const float* found_inf, cudaStream_t s);

// grads[i] *= 1 / *scale in place (all of dtype dt) and *found_inf = 1 if any
// result is not finite (found_inf is not cleared here).
cudaError_t MultiTensorUnscale(void* const* grads, const int64_t* sizes, int count, DT dt,
                               const float* scale, float* found_inf, cudaStream_t s);

// One step of the dynamic loss-scale rule (loss_scale_rule.h) on the device.
cudaError_t UpdateLossScale(float* scale, int32_t* growth_tracker, float* found_inf,
                            float growth_factor, float backoff_factor, int32_t growth_interval,
                            cudaStream_t s);

}  // namespace kernels
}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_KERNELS_H_
