#include "libs/ops/ops.h"

#include <omp.h>

#include <cstdlib>
#include <thread>

#include "libs/base/logging.h"
#include "libs/ops/registry.h"

namespace dtrain {
namespace ops {

#define DT_DISPATCH(name, Fn, device)                   \
  static const OpDispatcher<Fn> name##_dispatch(#name); \
  name##_dispatch.Get(device)

int64_t ConvOutSize(int64_t in, int kernel, int stride, int padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

namespace {

void CheckSameDevice(const char* op, const Tensor& a, const Tensor& b) {
  DT_CHECK(a.device() == b.device())
      << op << ": tensors on " << a.device().ToString() << " and " << b.device().ToString();
}

}  // namespace

Tensor Conv2d(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dParams& p, bool relu) {
  DT_CHECK(x.ndim() == 4 && w.ndim() == 4 && x.dim(1) == w.dim(1))
      << "conv2d: x " << x.DebugString() << ", w " << w.DebugString();
  CheckSameDevice("conv2d", x, w);
  Tensor y =
      Tensor::Empty({x.dim(0), w.dim(0), ConvOutSize(x.dim(2), w.dim(2), p.stride, p.padding),
                     ConvOutSize(x.dim(3), w.dim(3), p.stride, p.padding)},
                    x.dtype(), x.device());
  DT_DISPATCH(conv2d, Conv2dFn, x.device())(x, w, b, p, relu, &y);
  return y;
}

Tensor Conv2dBackwardData(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                          const Conv2dParams& p) {
  Tensor dx = Tensor::Empty(x_shape, dy.dtype(), dy.device());
  DT_DISPATCH(conv2d_backward_data, Conv2dBackwardDataFn, dy.device())(dy, w, p, &dx);
  return dx;
}

void Conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p, Tensor* dw,
                           Tensor* db) {
  DT_DISPATCH(conv2d_backward_weights, Conv2dBackwardWeightsFn, x.device())(x, dy, p, dw, db);
}

Tensor Linear(const Tensor& x, const Tensor& w, const Tensor* b, bool relu) {
  DT_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1))
      << "linear: x " << x.DebugString() << ", w " << w.DebugString();
  CheckSameDevice("linear", x, w);
  Tensor y = Tensor::Empty({x.dim(0), w.dim(0)}, x.dtype(), x.device());
  DT_DISPATCH(linear, LinearFn, x.device())(x, w, b, relu, &y);
  return y;
}

void LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                    Tensor* db) {
  DT_DISPATCH(linear_backward, LinearBackwardFn, x.device())(x, w, dy, dx, dw, db);
}

Tensor MatMul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  DT_CHECK(a.ndim() == 2 && b.ndim() == 2)
      << "matmul: " << a.DebugString() << ", " << b.DebugString();
  int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  int64_t ka = transpose_a ? a.dim(0) : a.dim(1);
  int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  DT_CHECK(ka == kb) << "matmul: inner sizes " << ka << " and " << kb;
  Tensor c = Tensor::Empty({m, n}, a.dtype(), a.device());
  DT_DISPATCH(matmul, MatMulFn, a.device())(a, b, transpose_a, transpose_b, &c);
  return c;
}

Tensor Relu(const Tensor& x) {
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  DT_DISPATCH(relu, ReluFn, x.device())(x, &y);
  return y;
}

Tensor ReluBackward(const Tensor& y, const Tensor& dy) {
  Tensor dx = Tensor::Empty(y.shape(), y.dtype(), y.device());
  DT_DISPATCH(relu_backward, ReluBackwardFn, y.device())(y, dy, &dx);
  return dx;
}

Tensor Add(const Tensor& a, const Tensor& b) {
  DT_CHECK(a.shape() == b.shape()) << "add: " << a.DebugString() << " + " << b.DebugString();
  Tensor c = Tensor::Empty(a.shape(), a.dtype(), a.device());
  DT_DISPATCH(add, AddFn, a.device())(a, b, &c);
  return c;
}

void Axpy(float alpha, const Tensor& x, Tensor* y) {
  DT_CHECK(x.shape() == y->shape()) << "axpy: " << x.DebugString() << " into " << y->DebugString();
  DT_DISPATCH(axpy, AxpyFn, x.device())(alpha, x, y);
}

Tensor Scale(const Tensor& x, float alpha) {
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  DT_DISPATCH(scale, ScaleFn, x.device())(x, alpha, &y);
  return y;
}

Tensor AvgPool2d(const Tensor& x, const Pool2dParams& p) {
  DT_CHECK(x.ndim() == 4) << "avg_pool2d: " << x.DebugString();
  Tensor y =
      Tensor::Empty({x.dim(0), x.dim(1), ConvOutSize(x.dim(2), p.kernel, p.stride, p.padding),
                     ConvOutSize(x.dim(3), p.kernel, p.stride, p.padding)},
                    x.dtype(), x.device());
  DT_DISPATCH(avg_pool2d, AvgPool2dFn, x.device())(x, p, &y);
  return y;
}

Tensor AvgPool2dBackward(const Tensor& dy, const Shape& x_shape, const Pool2dParams& p) {
  Tensor dx = Tensor::Empty(x_shape, dy.dtype(), dy.device());
  DT_DISPATCH(avg_pool2d_backward, AvgPool2dBackwardFn, dy.device())(dy, p, &dx);
  return dx;
}

Tensor MaxPool2d(const Tensor& x, const Pool2dParams& p, Tensor* indices) {
  DT_CHECK(x.ndim() == 4) << "max_pool2d: " << x.DebugString();
  Shape ys = {x.dim(0), x.dim(1), ConvOutSize(x.dim(2), p.kernel, p.stride, p.padding),
              ConvOutSize(x.dim(3), p.kernel, p.stride, p.padding)};
  Tensor y = Tensor::Empty(ys, x.dtype(), x.device());
  *indices = Tensor::Empty(ys, DType::kI32, x.device());
  DT_DISPATCH(max_pool2d, MaxPool2dFn, x.device())(x, p, &y, indices);
  return y;
}

Tensor MaxPool2dBackward(const Tensor& dy, const Tensor& indices, const Shape& x_shape,
                         const Pool2dParams& p) {
  Tensor dx = Tensor::Empty(x_shape, dy.dtype(), dy.device());
  DT_DISPATCH(max_pool2d_backward, MaxPool2dBackwardFn, dy.device())(dy, indices, p, &dx);
  return dx;
}

Tensor GlobalAvgPool(const Tensor& x) {
  DT_CHECK(x.ndim() == 4) << "global_avg_pool: " << x.DebugString();
  Tensor y = Tensor::Empty({x.dim(0), x.dim(1), 1, 1}, x.dtype(), x.device());
  DT_DISPATCH(global_avg_pool, GlobalAvgPoolFn, x.device())(x, &y);
  return y;
}

Tensor GlobalAvgPoolBackward(const Tensor& dy, const Shape& x_shape) {
  Tensor dx = Tensor::Empty(x_shape, dy.dtype(), dy.device());
  DT_DISPATCH(global_avg_pool_backward, GlobalAvgPoolBackwardFn, dy.device())(dy, &dx);
  return dx;
}

Tensor BatchNormTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float momentum,
                      float eps, Tensor* running_mean, Tensor* running_var, Tensor* saved_mean,
                      Tensor* saved_inv_std) {
  DT_CHECK(x.ndim() == 4 || x.ndim() == 2) << "batch_norm: " << x.DebugString();
  DT_CHECK(gamma.numel() == x.dim(1))
      << "batch_norm: gamma " << gamma.DebugString() << " for " << x.DebugString();
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  *saved_mean = Tensor::Empty({x.dim(1)}, DType::kF32, x.device());
  *saved_inv_std = Tensor::Empty({x.dim(1)}, DType::kF32, x.device());
  DT_DISPATCH(batch_norm_train, BatchNormTrainFn, x.device())
  (x, gamma, beta, momentum, eps, running_mean, running_var, &y, saved_mean, saved_inv_std);
  return y;
}

Tensor BatchNormInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                          const Tensor& running_mean, const Tensor& running_var, float eps) {
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  DT_DISPATCH(batch_norm_inference, BatchNormInferenceFn, x.device())
  (x, gamma, beta, running_mean, running_var, eps, &y);
  return y;
}

void BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                       const Tensor& saved_mean, const Tensor& saved_inv_std, Tensor* dx,
                       Tensor* dgamma, Tensor* dbeta) {
  DT_DISPATCH(batch_norm_backward, BatchNormBackwardFn, x.device())
  (x, dy, gamma, saved_mean, saved_inv_std, dx, dgamma, dbeta);
}

Tensor SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, Tensor* dlogits) {
  DT_CHECK(logits.ndim() == 2 && labels.ndim() == 1 && labels.dim(0) == logits.dim(0) &&
           labels.dtype() == DType::kI32)
      << "softmax_cross_entropy: logits " << logits.DebugString() << ", labels "
      << labels.DebugString();
  Tensor loss = Tensor::Empty({}, DType::kF32, logits.device());
  if (dlogits != nullptr) *dlogits = Tensor::Empty(logits.shape(), logits.dtype(), logits.device());
  DT_DISPATCH(softmax_cross_entropy, SoftmaxCrossEntropyFn, logits.device())
  (logits, labels, &loss, dlogits);
  return loss;
}

Tensor Argmax(const Tensor& logits) {
  Tensor out = Tensor::Empty({logits.dim(0)}, DType::kI32, logits.device());
  DT_DISPATCH(argmax, ArgmaxFn, logits.device())(logits, &out);
  return out;
}

int64_t CountCorrect(const Tensor& logits, const Tensor& labels) {
  Tensor correct = Tensor::Empty({}, DType::kI64, logits.device());
  DT_DISPATCH(count_correct, CountCorrectFn, logits.device())(logits, labels, &correct);
  return correct.ToVector<int64_t>()[0];
}

Tensor Sum(const Tensor& x) {
  Tensor y = Tensor::Empty({}, DType::kF32, x.device());
  DT_DISPATCH(sum, SumFn, x.device())(x, &y);
  return y;
}

void SgdUpdate(Tensor* param, const Tensor& grad, Tensor* momentum_buf, const SgdParams& p) {
  DT_CHECK(param->shape() == grad.shape())
      << "sgd_update: param " << param->DebugString() << ", grad " << grad.DebugString();
  DT_DISPATCH(sgd_update, SgdUpdateFn, param->device())(param, grad, momentum_buf, p);
}

void Fill(Tensor* t, float value) { DT_DISPATCH(fill, FillFn, t->device())(t, value); }

void RandomNormal(Tensor* t, float mean, float stddev, uint64_t seed, uint64_t offset) {
  DT_DISPATCH(random_normal, RandomNormalFn, t->device())(t, mean, stddev, seed, offset);
}

void RandomUniform(Tensor* t, float low, float high, uint64_t seed, uint64_t offset) {
  DT_DISPATCH(random_uniform, RandomUniformFn, t->device())(t, low, high, seed, offset);
}

Tensor Cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::Empty(x.shape(), dtype, x.device());
  DT_DISPATCH(cast, CastFn, x.device())(x, &y);
  return y;
}

float ScalarValue(const Tensor& t) {
  DT_CHECK(t.numel() == 1) << "ScalarValue of " << t.DebugString();
  switch (t.dtype()) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return t.ToVector<float>()[0];
    case DType::kI32:
      return static_cast<float>(t.ToVector<int32_t>()[0]);
    case DType::kI64:
      return static_cast<float>(t.ToVector<int64_t>()[0]);
    case DType::kU8:
      return static_cast<float>(t.ToVector<uint8_t>()[0]);
  }
  return 0;
}

namespace {

int DefaultThreads() {
  const char* env = std::getenv("DTRAIN_CPU_THREADS");
  if (env != nullptr && std::atoi(env) > 0) return std::atoi(env);
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

thread_local int tls_threads = 0;

}  // namespace

void SetCpuThreads(int n) {
  DT_CHECK(n > 0) << "SetCpuThreads(" << n << ")";
  tls_threads = n;
  omp_set_num_threads(n);
}

int CpuThreads() {
  if (tls_threads == 0) SetCpuThreads(DefaultThreads());
  return tls_threads;
}

}  // namespace ops
}  // namespace dtrain
