// Tensor operations, dispatched by device through the op registry.
//
// Each op comes in two forms:
//  - a kernel signature `<Name>Fn` that writes into outputs the caller has
//    allocated (shape, dtype and device as documented). Backends register
//    kernels of exactly this type (see registry.h); the hybridized executor
//    calls them with planned buffers, so no op allocates on that path.
//  - a convenience function that allocates the outputs and calls the kernel.
//
// All tensor arguments of one call live on the same device. Unless noted,
// tensors are f32, NCHW for images, and outputs are overwritten (not
// accumulated). Shape mismatches are programming errors in model code and are
// fatal with a message naming the op and the shapes (DT_CHECK): models are
// built from validated configurations, never from raw user input.
//
// Thread-safety: ops may run concurrently on different tensors. CPU kernels
// use the calling thread's OpenMP thread count (SetCpuThreads).
#ifndef DTRAIN_LIBS_OPS_OPS_H_
#define DTRAIN_LIBS_OPS_OPS_H_

#include <cstdint>

#include "libs/tensor/tensor.h"

namespace dtrain {
namespace ops {

struct Conv2dParams {
  int stride = 1;
  int padding = 0;  // zero padding on every side
};

struct Pool2dParams {
  int kernel = 2;
  int stride = 2;
  int padding = 0;  // avg pooling excludes padding from the divisor
};

struct SgdParams {
  float lr = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// Output size of a convolution or pooling window along one axis.
int64_t ConvOutSize(int64_t in, int kernel, int stride, int padding);

// ---- kernel signatures (outputs preallocated by the caller) ----

// y[N,O,Ho,Wo] = conv(x[N,C,H,W], w[O,C,kh,kw]) + b[O] (b may be null),
// followed by relu when `relu`.
using Conv2dFn = void(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dParams& p,
                      bool relu, Tensor* y);
// dx[N,C,H,W] from dy[N,O,Ho,Wo] and w.
using Conv2dBackwardDataFn = void(const Tensor& dy, const Tensor& w, const Conv2dParams& p,
                                  Tensor* dx);
// dw[O,C,kh,kw] and db[O] (db may be null) from x and dy.
using Conv2dBackwardWeightsFn = void(const Tensor& x, const Tensor& dy, const Conv2dParams& p,
                                     Tensor* dw, Tensor* db);
// y[N,M] = x[N,K] * w[M,K]^T + b[M] (b may be null), relu when `relu`.
using LinearFn = void(const Tensor& x, const Tensor& w, const Tensor* b, bool relu, Tensor* y);
// Any of dx[N,K], dw[M,K], db[M] may be null (not computed).
using LinearBackwardFn = void(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                              Tensor* dw, Tensor* db);
// c = op(a) * op(b) for 2-D a, b; op transposes when the flag is set.
using MatMulFn = void(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                      Tensor* c);
using ReluFn = void(const Tensor& x, Tensor* y);
// dx = dy where y > 0, else 0 (y is relu's output).
using ReluBackwardFn = void(const Tensor& y, const Tensor& dy, Tensor* dx);
// c = a + b (same shapes); c may alias a or b.
using AddFn = void(const Tensor& a, const Tensor& b, Tensor* c);
// y += alpha * x (same shapes): gradient accumulation.
using AxpyFn = void(float alpha, const Tensor& x, Tensor* y);
// y = alpha * x; y may alias x.
using ScaleFn = void(const Tensor& x, float alpha, Tensor* y);
using AvgPool2dFn = void(const Tensor& x, const Pool2dParams& p, Tensor* y);
using AvgPool2dBackwardFn = void(const Tensor& dy, const Pool2dParams& p, Tensor* dx);
// indices (i32, shape of y): flat position of each maximum in its H*W plane.
using MaxPool2dFn = void(const Tensor& x, const Pool2dParams& p, Tensor* y, Tensor* indices);
using MaxPool2dBackwardFn = void(const Tensor& dy, const Tensor& indices, const Pool2dParams& p,
                                 Tensor* dx);
// y[N,C,1,1] = mean over H,W of x[N,C,H,W].
using GlobalAvgPoolFn = void(const Tensor& x, Tensor* y);
using GlobalAvgPoolBackwardFn = void(const Tensor& dy, Tensor* dx);
// Training-mode batch norm over N,H,W per channel (x is [N,C,H,W] or [N,C]).
// Normalizes with the batch mean and biased variance; updates the running
// statistics as PyTorch does (running = (1-momentum)*running + momentum*batch,
// with the unbiased variance); saves mean and 1/sqrt(var+eps) for backward.
using BatchNormTrainFn = void(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float momentum, float eps, Tensor* running_mean, Tensor* running_var,
                              Tensor* y, Tensor* saved_mean, Tensor* saved_inv_std);
using BatchNormInferenceFn = void(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, float eps,
                                  Tensor* y);
using BatchNormBackwardFn = void(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                 const Tensor& saved_mean, const Tensor& saved_inv_std, Tensor* dx,
                                 Tensor* dgamma, Tensor* dbeta);
// loss (f32 scalar, shape []) = mean over N of -log softmax(logits[N,C])[label];
// labels are i32 [N] in [0, C). dlogits (may be null) = d(loss)/d(logits).
using SoftmaxCrossEntropyFn = void(const Tensor& logits, const Tensor& labels, Tensor* loss,
                                   Tensor* dlogits);
// out (i32 [N]) = argmax over C of logits[N,C] (first maximum on ties).
using ArgmaxFn = void(const Tensor& logits, Tensor* out);
// correct (i64 scalar) = number of rows whose argmax equals the label.
using CountCorrectFn = void(const Tensor& logits, const Tensor& labels, Tensor* correct);
// y (f32 scalar) = sum of all elements of x.
using SumFn = void(const Tensor& x, Tensor* y);
// PyTorch's SGD: g = grad + weight_decay * param; buf = momentum * buf + g
// (buf starts at zero); param -= lr * (nesterov ? g + momentum * buf : buf).
// momentum_buf may be null when momentum is 0.
using SgdUpdateFn = void(Tensor* param, const Tensor& grad, Tensor* momentum_buf,
                         const SgdParams& p);
using FillFn = void(Tensor* t, float value);
// Counter-based (Philox4x32-10) normal / uniform numbers: element i of the
// tensor depends only on (seed, offset + i), never on thread count or device.
using RandomNormalFn = void(Tensor* t, float mean, float stddev, uint64_t seed, uint64_t offset);
using RandomUniformFn = void(Tensor* t, float low, float high, uint64_t seed, uint64_t offset);
// Element type conversion (f32 <-> f16/bf16, u8 -> f32 ...); same shape.
using CastFn = void(const Tensor& x, Tensor* y);

// ---- allocating convenience functions ----

Tensor Conv2d(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dParams& p,
              bool relu = false);
Tensor Conv2dBackwardData(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                          const Conv2dParams& p);
void Conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p, Tensor* dw,
                           Tensor* db);
Tensor Linear(const Tensor& x, const Tensor& w, const Tensor* b, bool relu = false);
void LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                    Tensor* db);
Tensor MatMul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
Tensor Relu(const Tensor& x);
Tensor ReluBackward(const Tensor& y, const Tensor& dy);
Tensor Add(const Tensor& a, const Tensor& b);
void Axpy(float alpha, const Tensor& x, Tensor* y);
Tensor Scale(const Tensor& x, float alpha);
Tensor AvgPool2d(const Tensor& x, const Pool2dParams& p);
Tensor AvgPool2dBackward(const Tensor& dy, const Shape& x_shape, const Pool2dParams& p);
Tensor MaxPool2d(const Tensor& x, const Pool2dParams& p, Tensor* indices);
Tensor MaxPool2dBackward(const Tensor& dy, const Tensor& indices, const Shape& x_shape,
                         const Pool2dParams& p);
Tensor GlobalAvgPool(const Tensor& x);
Tensor GlobalAvgPoolBackward(const Tensor& dy, const Shape& x_shape);
Tensor BatchNormTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float momentum,
                      float eps, Tensor* running_mean, Tensor* running_var, Tensor* saved_mean,
                      Tensor* saved_inv_std);
Tensor BatchNormInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                          const Tensor& running_mean, const Tensor& running_var, float eps);
void BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                       const Tensor& saved_mean, const Tensor& saved_inv_std, Tensor* dx,
                       Tensor* dgamma, Tensor* dbeta);
// Returns the scalar loss; fills *dlogits (allocated here) when non-null.
Tensor SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, Tensor* dlogits);
Tensor Argmax(const Tensor& logits);
int64_t CountCorrect(const Tensor& logits, const Tensor& labels);
Tensor Sum(const Tensor& x);
void SgdUpdate(Tensor* param, const Tensor& grad, Tensor* momentum_buf, const SgdParams& p);
void Fill(Tensor* t, float value);
void RandomNormal(Tensor* t, float mean, float stddev, uint64_t seed, uint64_t offset = 0);
void RandomUniform(Tensor* t, float low, float high, uint64_t seed, uint64_t offset = 0);
Tensor Cast(const Tensor& x, DType dtype);

// Reads a scalar (shape [] or one element) to the host.
float ScalarValue(const Tensor& t);

// OpenMP threads used by CPU kernels called from this thread (default: the
// machine's cores, or DTRAIN_CPU_THREADS). Each thread keeps its own setting,
// so two threads driving cpu:0 and cpu:1 can use one core each.
void SetCpuThreads(int n);
int CpuThreads();

}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_OPS_OPS_H_
