// CUDA kernels of the ops in libs/ops/ops.h that need neither cuDNN nor
// cuBLAS: elementwise ops, pooling, classification losses and counts,
// reductions, SGD, fill, Philox random numbers and casts. The semantics are
// the CPU kernels' (libs/ops/cpu/basic_kernels.cc, whose comments state the
// rules); float inputs may be f32, f16 or bf16 (computed in f32) except where
// the CPU kernel's contract names f32 (random numbers, SGD's master weights).
//
// Pooling uses own kernels rather than cuDNN's: max pooling must return the
// index of each maximum (cuDNN's does not), and cuDNN's pooling backward
// wants the forward's input and output, which AvgPool2dBackwardFn does not
// carry.
//
// Every kernel is asynchronous on the calling thread's CurrentStream of the
// tensors' device; argument errors are fatal (DT_CHECK) with the op's name,
// as on the CPU. Errors the GPU finds while running (a label out of range)
// cannot stop the host without a synchronization, so they show in the result
// instead (a NaN loss), as kernels.h describes.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "libs/base/logging.h"
#include "libs/cuda/kernels.h"
#include "libs/cuda/op_util.h"
#include "libs/cuda/stream.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"

namespace dtrain {
namespace ops {
namespace cuda_kernels {
namespace {

// ---- elementwise ----

void Relu(const Tensor& x, Tensor* y) {
  CheckFloat("relu", "x", x);
  CheckLike("relu", "x", x, "y", *y);
  CheckSameShape("relu", "x", x, "y", *y);
  const int d = x.device().index;
  DeviceGuard g(d);
  CheckLaunch("relu",
              k::Relu(Dt(x.dtype()), x.raw_data(), y->raw_data(), x.numel(), CurrentCudaStream(d)));
}

void ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
  const char* op = "relu_backward";
  CheckFloat(op, "y", y);
  CheckLike(op, "y", y, "dy", dy);
  CheckLike(op, "y", y, "dx", *dx);
  CheckSameShape(op, "y", y, "dy", dy);
  CheckSameShape(op, "y", y, "dx", *dx);
  const int d = y.device().index;
  DeviceGuard g(d);
  CheckLaunch(op, k::ReluBackward(Dt(y.dtype()), y.raw_data(), dy.raw_data(), dx->raw_data(),
                                  y.numel(), CurrentCudaStream(d)));
}

void Add(const Tensor& a, const Tensor& b, Tensor* c) {
  CheckFloat("add", "a", a);
  CheckLike("add", "a", a, "b", b);
  CheckLike("add", "a", a, "c", *c);
  CheckSameShape("add", "a", a, "b", b);
  CheckSameShape("add", "a", a, "c", *c);
  const int d = a.device().index;
  DeviceGuard g(d);
  CheckLaunch("add", k::Add(Dt(a.dtype()), a.raw_data(), b.raw_data(), c->raw_data(), a.numel(),
                            CurrentCudaStream(d)));
}

void Axpy(float alpha, const Tensor& x, Tensor* y) {
  CheckFloat("axpy", "x", x);
  CheckLike("axpy", "x", x, "y", *y);
  CheckSameShape("axpy", "x", x, "y", *y);
  const int d = x.device().index;
  DeviceGuard g(d);
  CheckLaunch("axpy", k::Axpy(Dt(x.dtype()), alpha, x.raw_data(), y->raw_data(), x.numel(),
                              CurrentCudaStream(d)));
}

void Scale(const Tensor& x, float alpha, Tensor* y) {
  CheckFloat("scale", "x", x);
  CheckLike("scale", "x", x, "y", *y);
  CheckSameShape("scale", "x", x, "y", *y);
  const int d = x.device().index;
  DeviceGuard g(d);
  CheckLaunch("scale", k::Scale(Dt(x.dtype()), x.raw_data(), alpha, y->raw_data(), x.numel(),
                                CurrentCudaStream(d)));
}

// ---- pooling ----

void CheckPool(const char* op, const Pool2dParams& p) {
  DT_CHECK(p.kernel > 0 && p.stride > 0 && p.padding >= 0 && 2 * p.padding <= p.kernel)
      << op << ": kernel " << p.kernel << ", stride " << p.stride << ", padding " << p.padding
      << " (need kernel > 0, stride > 0, 0 <= padding <= kernel / 2)";
}

// Geometry of pooling x_shape (NCHW) into y_shape; fatal on a mismatch.
k::PoolGeom PoolGeometry(const char* op, const Shape& xs, const Shape& ys, const Pool2dParams& p) {
  CheckPool(op, p);
  DT_CHECK(xs.size() == 4) << op << ": input " << ShapeToString(xs) << " is not NCHW";
  const int64_t H = xs[2], W = xs[3];
  const int64_t Ho = ConvOutSize(H, p.kernel, p.stride, p.padding);
  const int64_t Wo = ConvOutSize(W, p.kernel, p.stride, p.padding);
  DT_CHECK(H + 2 * int64_t{p.padding} >= p.kernel && W + 2 * int64_t{p.padding} >= p.kernel)
      << op << ": input " << ShapeToString(xs) << " is smaller than the window (kernel " << p.kernel
      << ", padding " << p.padding << ")";
  DT_CHECK(ys == Shape({xs[0], xs[1], Ho, Wo}))
      << op << ": output " << ShapeToString(ys) << " for input " << ShapeToString(xs) << ", kernel "
      << p.kernel << ", stride " << p.stride << ", padding " << p.padding;
  DT_CHECK(H * W <= std::numeric_limits<int32_t>::max())
      << op << ": plane of " << ShapeToString(xs) << " too large for i32 indices";
  return k::PoolGeom{xs[0] * xs[1], H, W, Ho, Wo, p.kernel, p.stride, p.padding};
}

void MaxPool2d(const Tensor& x, const Pool2dParams& p, Tensor* y, Tensor* indices) {
  const char* op = "max_pool2d";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "y", *y);
  CheckCuda(op, "indices", *indices);
  const k::PoolGeom geom = PoolGeometry(op, x.shape(), y->shape(), p);
  DT_CHECK(indices->dtype() == DType::kI32 && indices->shape() == y->shape())
      << op << ": indices " << indices->DebugString() << " for y " << y->DebugString();
  const int d = x.device().index;
  DeviceGuard g(d);
  CheckLaunch(op, k::MaxPool(Dt(x.dtype()), x.raw_data(), geom, y->raw_data(),
                             indices->data<int32_t>(), CurrentCudaStream(d)));
}

void MaxPool2dBackward(const Tensor& dy, const Tensor& indices, const Pool2dParams& p, Tensor* dx) {
  const char* op = "max_pool2d_backward";
  CheckFloat(op, "dy", dy);
  CheckLike(op, "dy", dy, "dx", *dx);
  CheckCuda(op, "indices", indices);
  const k::PoolGeom geom = PoolGeometry(op, dx->shape(), dy.shape(), p);
  DT_CHECK(indices.dtype() == DType::kI32 && indices.shape() == dy.shape())
      << op << ": indices " << indices.DebugString() << " for dy " << dy.DebugString();
  const int d = dy.device().index;
  DeviceGuard g(d);
  CheckLaunch(op, k::MaxPoolBackward(Dt(dy.dtype()), dy.raw_data(), indices.data<int32_t>(), geom,
                                     dx->raw_data(), CurrentCudaStream(d)));
}

void AvgPool2d(const Tensor& x, const Pool2dParams& p, Tensor* y) {
  const char* op = "avg_pool2d";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "y", *y);
  const k::PoolGeom geom = PoolGeometry(op, x.shape(), y->shape(), p);
  const int d = x.device().index;
  DeviceGuard g(d);
  CheckLaunch(op,
              k::AvgPool(Dt(x.dtype()), x.raw_data(), geom, y->raw_data(), CurrentCudaStream(d)));
}

void AvgPool2dBackward(const Tensor& dy, const Pool2dParams& p, Tensor* dx) {
  const char* op = "avg_pool2d_backward";
  CheckFloat(op, "dy", dy);
  CheckLike(op, "dy", dy, "dx", *dx);
  const k::PoolGeom geom = PoolGeometry(op, dx->shape(), dy.shape(), p);
  const int d = dy.device().index;
  DeviceGuard g(d);
  CheckLaunch(op, k::AvgPoolBackward(Dt(dy.dtype()), dy.raw_data(), geom, dx->raw_data(),
                                     CurrentCudaStream(d)));
}

void GlobalAvgPool(const Tensor& x, Tensor* y) {
  const char* op = "global_avg_pool";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "y", *y);
  DT_CHECK(x.ndim() == 4 && y->shape() == Shape({x.dim(0), x.dim(1), 1, 1}))
      << op << ": y " << y->DebugString() << " for x " << x.DebugString();
  const int d = x.device().index;
  DeviceGuard g(d);
  CheckLaunch(op, k::GlobalAvgPool(Dt(x.dtype()), x.raw_data(), x.dim(0) * x.dim(1),
                                   x.dim(2) * x.dim(3), y->raw_data(), CurrentCudaStream(d)));
}

void GlobalAvgPoolBackward(const Tensor& dy, Tensor* dx) {
  const char* op = "global_avg_pool_backward";
  CheckFloat(op, "dy", dy);
  CheckLike(op, "dy", dy, "dx", *dx);
  DT_CHECK(dx->ndim() == 4 && dy.shape() == Shape({dx->dim(0), dx->dim(1), 1, 1}))
      << op << ": dy " << dy.DebugString() << " for dx " << dx->DebugString();
  const int d = dy.device().index;
  DeviceGuard g(d);
  CheckLaunch(
      op, k::GlobalAvgPoolBackward(Dt(dy.dtype()), dy.raw_data(), dx->dim(0) * dx->dim(1),
                                   dx->dim(2) * dx->dim(3), dx->raw_data(), CurrentCudaStream(d)));
}

// ---- classification ----

void CheckLabels(const char* op, const Tensor& logits, const Tensor& labels) {
  CheckCuda(op, "labels", labels);
  DT_CHECK(logits.ndim() == 2 && labels.ndim() == 1 && labels.dim(0) == logits.dim(0) &&
           labels.dtype() == DType::kI32 && labels.device() == logits.device())
      << op << ": logits " << logits.DebugString() << ", labels " << labels.DebugString()
      << " (need logits [N, C] and i32 labels [N] on the same device)";
}

void SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, Tensor* loss,
                         Tensor* dlogits) {
  const char* op = "softmax_cross_entropy";
  CheckFloat(op, "logits", logits);
  CheckF32(op, "loss", *loss);
  CheckLabels(op, logits, labels);
  DT_CHECK(loss->numel() == 1 && loss->device() == logits.device())
      << op << ": loss " << loss->DebugString() << " is not a scalar on "
      << logits.device().ToString();
  if (dlogits != nullptr) {
    CheckLike(op, "logits", logits, "dlogits", *dlogits);
    CheckSameShape(op, "logits", logits, "dlogits", *dlogits);
  }
  const int64_t N = logits.dim(0), C = logits.dim(1);
  DT_CHECK(C > 0 || N == 0) << op << ": no classes in " << logits.DebugString();
  const int d = logits.device().index;
  DeviceGuard g(d);
  Tensor scratch = Scratch(d, sizeof(double) * static_cast<size_t>(N > 0 ? N : 1));
  CheckLaunch(op, k::SoftmaxCrossEntropy(Dt(logits.dtype()), logits.raw_data(),
                                         labels.data<int32_t>(), N, C, loss->data<float>(),
                                         dlogits != nullptr ? dlogits->raw_data() : nullptr,
                                         scratch.data<double>(), CurrentCudaStream(d)));
}

void Argmax(const Tensor& logits, Tensor* out) {
  const char* op = "argmax";
  CheckFloat(op, "logits", logits);
  CheckCuda(op, "out", *out);
  DT_CHECK(logits.ndim() == 2 && out->dtype() == DType::kI32 && out->ndim() == 1 &&
           out->dim(0) == logits.dim(0) && out->device() == logits.device())
      << op << ": logits " << logits.DebugString() << ", out " << out->DebugString()
      << " (need logits [N, C] and i32 out [N])";
  DT_CHECK(logits.dim(1) > 0 || logits.dim(0) == 0)
      << op << ": no classes in " << logits.DebugString();
  const int d = logits.device().index;
  DeviceGuard g(d);
  CheckLaunch(op, k::Argmax(Dt(logits.dtype()), logits.raw_data(), logits.dim(0), logits.dim(1),
                            out->data<int32_t>(), CurrentCudaStream(d)));
}

void CountCorrect(const Tensor& logits, const Tensor& labels, Tensor* correct) {
  const char* op = "count_correct";
  CheckFloat(op, "logits", logits);
  CheckCuda(op, "correct", *correct);
  CheckLabels(op, logits, labels);
  DT_CHECK(correct->dtype() == DType::kI64 && correct->numel() == 1 &&
           correct->device() == logits.device())
      << op << ": correct " << correct->DebugString() << " is not an i64 scalar";
  DT_CHECK(logits.dim(1) > 0 || logits.dim(0) == 0)
      << op << ": no classes in " << logits.DebugString();
  const int d = logits.device().index;
  DeviceGuard g(d);
  CheckLaunch(op, k::CountCorrect(Dt(logits.dtype()), logits.raw_data(), labels.data<int32_t>(),
                                  logits.dim(0), logits.dim(1), correct->data<int64_t>(),
                                  CurrentCudaStream(d)));
}

void Sum(const Tensor& x, Tensor* y) {
  CheckFloat("sum", "x", x);
  CheckF32("sum", "y", *y);
  DT_CHECK(y->numel() == 1 && y->device() == x.device())
      << "sum: y " << y->DebugString() << " is not a scalar on " << x.device().ToString();
  const int d = x.device().index;
  DeviceGuard g(d);
  Tensor scratch = Scratch(d, sizeof(double) * static_cast<size_t>(k::SumScratch(x.numel())));
  CheckLaunch("sum", k::Sum(Dt(x.dtype()), x.raw_data(), x.numel(), y->data<float>(),
                            scratch.data<double>(), CurrentCudaStream(d)));
}

// ---- optimizer ----

void SgdUpdate(Tensor* param, const Tensor& grad, Tensor* momentum_buf, const SgdParams& p) {
  const char* op = "sgd_update";
  CheckF32(op, "param", *param);
  CheckFloat(op, "grad", grad);
  CheckSameShape(op, "param", *param, "grad", grad);
  DT_CHECK(grad.device() == param->device())
      << op << ": grad " << grad.DebugString() << " for param " << param->DebugString();
  DT_CHECK(!p.nesterov || p.momentum > 0.0f)
      << op << ": nesterov needs a positive momentum, got " << p.momentum;
  float* buf = nullptr;
  if (p.momentum != 0.0f) {
    DT_CHECK(momentum_buf != nullptr) << op << ": momentum " << p.momentum
                                      << " without a momentum buffer for " << param->DebugString();
    CheckF32(op, "momentum_buf", *momentum_buf);
    CheckSameShape(op, "param", *param, "momentum_buf", *momentum_buf);
    buf = momentum_buf->data<float>();
  }
  const int d = param->device().index;
  DeviceGuard g(d);
  k::SgdTensor t{param->data<float>(), grad.raw_data(), buf, nullptr, param->numel()};
  k::SgdHyper h;
  h.lr = p.lr;
  h.momentum = p.momentum;
  h.weight_decay = p.weight_decay;
  h.nesterov = p.nesterov;
  CheckLaunch(
      op, k::MultiTensorSgd(&t, 1, Dt(grad.dtype()), k::kF32, h, nullptr, CurrentCudaStream(d)));
}

// ---- fill, random numbers, casts ----

void Fill(Tensor* t, float value) {
  CheckCuda("fill", "t", *t);
  const int d = t->device().index;
  DeviceGuard g(d);
  CheckLaunch("fill",
              k::Fill(Dt(t->dtype()), t->raw_data(), value, t->numel(), CurrentCudaStream(d)));
}

void RandomUniform(Tensor* t, float low, float high, uint64_t seed, uint64_t offset) {
  CheckF32("random_uniform", "t", *t);
  DT_CHECK(low <= high) << "random_uniform: low " << low << " > high " << high;
  const float top = high > low ? std::nextafter(high, low) : high;
  const int d = t->device().index;
  DeviceGuard g(d);
  CheckLaunch("random_uniform", k::RandomUniform(t->data<float>(), t->numel(), low, high, top, seed,
                                                 offset, CurrentCudaStream(d)));
}

void RandomNormal(Tensor* t, float mean, float stddev, uint64_t seed, uint64_t offset) {
  CheckF32("random_normal", "t", *t);
  DT_CHECK(stddev >= 0) << "random_normal: stddev " << stddev << " < 0";
  const int d = t->device().index;
  DeviceGuard g(d);
  CheckLaunch("random_normal", k::RandomNormal(t->data<float>(), t->numel(), mean, stddev, seed,
                                               offset, CurrentCudaStream(d)));
}

void Cast(const Tensor& x, Tensor* y) {
  CheckCuda("cast", "x", x);
  CheckCuda("cast", "y", *y);
  CheckSameShape("cast", "x", x, "y", *y);
  DT_CHECK(x.device() == y->device())
      << "cast: x " << x.DebugString() << " and y " << y->DebugString() << " on different devices";
  const int d = x.device().index;
  DeviceGuard g(d);
  cudaStream_t s = CurrentCudaStream(d);
  if (x.dtype() == y->dtype()) {
    if (x.numel() > 0 && x.raw_data() != y->raw_data()) {
      CheckLaunch("cast", cudaMemcpyAsync(y->raw_data(), x.raw_data(), x.nbytes(),
                                          cudaMemcpyDeviceToDevice, s));
    }
    return;
  }
  CheckLaunch("cast",
              k::Cast(Dt(x.dtype()), x.raw_data(), Dt(y->dtype()), y->raw_data(), x.numel(), s));
}

}  // namespace
}  // namespace cuda_kernels

DT_REGISTER_KERNEL(relu, DeviceType::kCUDA, ReluFn, cuda_kernels::Relu);
DT_REGISTER_KERNEL(relu_backward, DeviceType::kCUDA, ReluBackwardFn, cuda_kernels::ReluBackward);
DT_REGISTER_KERNEL(add, DeviceType::kCUDA, AddFn, cuda_kernels::Add);
DT_REGISTER_KERNEL(axpy, DeviceType::kCUDA, AxpyFn, cuda_kernels::Axpy);
DT_REGISTER_KERNEL(scale, DeviceType::kCUDA, ScaleFn, cuda_kernels::Scale);
DT_REGISTER_KERNEL(max_pool2d, DeviceType::kCUDA, MaxPool2dFn, cuda_kernels::MaxPool2d);
DT_REGISTER_KERNEL(max_pool2d_backward, DeviceType::kCUDA, MaxPool2dBackwardFn,
                   cuda_kernels::MaxPool2dBackward);
DT_REGISTER_KERNEL(avg_pool2d, DeviceType::kCUDA, AvgPool2dFn, cuda_kernels::AvgPool2d);
DT_REGISTER_KERNEL(avg_pool2d_backward, DeviceType::kCUDA, AvgPool2dBackwardFn,
                   cuda_kernels::AvgPool2dBackward);
DT_REGISTER_KERNEL(global_avg_pool, DeviceType::kCUDA, GlobalAvgPoolFn,
                   cuda_kernels::GlobalAvgPool);
DT_REGISTER_KERNEL(global_avg_pool_backward, DeviceType::kCUDA, GlobalAvgPoolBackwardFn,
                   cuda_kernels::GlobalAvgPoolBackward);
DT_REGISTER_KERNEL(softmax_cross_entropy, DeviceType::kCUDA, SoftmaxCrossEntropyFn,
                   cuda_kernels::SoftmaxCrossEntropy);
DT_REGISTER_KERNEL(argmax, DeviceType::kCUDA, ArgmaxFn, cuda_kernels::Argmax);
DT_REGISTER_KERNEL(count_correct, DeviceType::kCUDA, CountCorrectFn, cuda_kernels::CountCorrect);
DT_REGISTER_KERNEL(sum, DeviceType::kCUDA, SumFn, cuda_kernels::Sum);
DT_REGISTER_KERNEL(sgd_update, DeviceType::kCUDA, SgdUpdateFn, cuda_kernels::SgdUpdate);
DT_REGISTER_KERNEL(fill, DeviceType::kCUDA, FillFn, cuda_kernels::Fill);
DT_REGISTER_KERNEL(random_normal, DeviceType::kCUDA, RandomNormalFn, cuda_kernels::RandomNormal);
DT_REGISTER_KERNEL(random_uniform, DeviceType::kCUDA, RandomUniformFn, cuda_kernels::RandomUniform);
DT_REGISTER_KERNEL(cast, DeviceType::kCUDA, CastFn, cuda_kernels::Cast);

}  // namespace ops
}  // namespace dtrain
