// CUDA kernels of batch_norm_train, batch_norm_inference and
// batch_norm_backward (libs/ops/ops.h). x and y are f32, f16 or bf16; gamma
// and beta f32 or x's dtype; saved and running statistics f32.
//
// Training passes run on cuDNN (cudnnBatchNormalizationForwardTraining /
// Backward, spatial mode; a [N, C] input is viewed as [N, C, 1, 1]) or on own
// kernels (kernels.h), as batch_norm.h describes. Either way the running
// statistics are updated by an own kernel from the saved batch statistics,
// with the CPU kernel's rule (unbiased variance, PyTorch's momentum), and the
// backward pass uses the forward's saved mean and 1 / sqrt(var + eps) as they
// are. Inference is one elementwise kernel.
#include "libs/cuda/dnn/batch_norm.h"

#include <cudnn.h>

#include <atomic>

#include "libs/base/logging.h"
#include "libs/cuda/dnn/cudnn_status.h"
#include "libs/cuda/dnn/cudnn_util.h"
#include "libs/cuda/kernels.h"
#include "libs/cuda/op_util.h"
#include "libs/cuda/stream.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"

namespace dtrain {
namespace cuda {
namespace dnn {
namespace {

std::atomic<int> g_impl{static_cast<int>(BatchNormImpl::kAuto)};
// Set once cuDNN has refused a dtype (index: DType code).
std::atomic<bool> g_cudnn_refused[3] = {};

}  // namespace

void SetBatchNormImplForTesting(BatchNormImpl impl) {
  g_impl.store(static_cast<int>(impl), std::memory_order_relaxed);
}

}  // namespace dnn
}  // namespace cuda

namespace ops {
namespace cuda_kernels {
namespace {

using ::dtrain::cuda::dnn::BatchNormImpl;
using ::dtrain::cuda::dnn::CudnnHandle;
using ::dtrain::cuda::dnn::TensorDesc;

// x as [outer, C, inner].
struct BnGeom {
  int64_t outer = 0, c = 0, inner = 0;
  int64_t count() const { return outer * inner; }
};

BnGeom MakeGeom(const char* op, const Tensor& x) {
  DT_CHECK(x.ndim() == 4 || x.ndim() == 2)
      << op << ": x " << x.DebugString() << " (want [N,C,H,W] or [N,C])";
  BnGeom g;
  g.outer = x.dim(0);
  g.c = x.dim(1);
  g.inner = x.ndim() == 4 ? x.dim(2) * x.dim(3) : 1;
  return g;
}

void CheckParam(const char* op, const char* name, const Tensor& t, const Tensor& x, int64_t c) {
  CheckFloat(op, name, t);
  DT_CHECK(t.numel() == c && t.device() == x.device())
      << op << ": " << name << " " << t.DebugString() << ", want " << c << " elements on "
      << x.device().ToString();
}

void CheckStat(const char* op, const char* name, const Tensor& t, const Tensor& x, int64_t c) {
  CheckF32(op, name, t);
  DT_CHECK(t.numel() == c && t.device() == x.device())
      << op << ": " << name << " " << t.DebugString() << ", want " << c << " f32 elements on "
      << x.device().ToString();
}

bool UseCudnn(DType dt) {
  const auto impl =
      static_cast<BatchNormImpl>(::dtrain::cuda::dnn::g_impl.load(std::memory_order_relaxed));
  if (impl == BatchNormImpl::kOwn) return false;
  if (impl == BatchNormImpl::kCudnn) return true;
  return dt != DType::kBF16 && !::dtrain::cuda::dnn::g_cudnn_refused[static_cast<int>(dt)].load(
                                   std::memory_order_relaxed);
}

// True if cuDNN refused the dtype (remembered; the caller falls back).
bool Refused(cudnnStatus_t st, DType dt, const char* op) {
  if (CUDNN_STATUS_CATEGORY(static_cast<int>(st)) != CUDNN_STATUS_NOT_SUPPORTED) return false;
  const auto impl =
      static_cast<BatchNormImpl>(::dtrain::cuda::dnn::g_impl.load(std::memory_order_relaxed));
  if (impl == BatchNormImpl::kCudnn) return false;
  if (!::dtrain::cuda::dnn::g_cudnn_refused[static_cast<int>(dt)].exchange(true)) {
    DT_LOG(WARNING) << op << ": cuDNN does not support " << DTypeName(dt) << " ("
                    << cudnnGetErrorString(st) << "); using the own kernels";
  }
  return true;
}

// An f32 copy of a parameter (or the parameter itself when f32).
Tensor AsF32(const Tensor& t, cudaStream_t s) {
  if (t.dtype() == DType::kF32) return t;
  Tensor f = Tensor::Empty(t.shape(), DType::kF32, t.device());
  CheckLaunch("batch_norm",
              k::Cast(Dt(t.dtype()), t.raw_data(), k::kF32, f.raw_data(), t.numel(), s));
  return f;
}

void DescribeX(TensorDesc* d, const Tensor& x, const BnGeom& g) {
  if (x.ndim() == 4) {
    d->Set(x.dtype(), x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  } else {
    d->Set(x.dtype(), g.outer, g.c, 1, 1);
  }
}

struct BnDesc {
  cudnnTensorDescriptor_t d = nullptr;
  explicit BnDesc(const TensorDesc& x) {
    DT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    DT_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(d, x.get(), CUDNN_BATCHNORM_SPATIAL));
  }
  ~BnDesc() { cudnnDestroyTensorDescriptor(d); }
};

void BatchNormTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float momentum,
                    float eps, Tensor* running_mean, Tensor* running_var, Tensor* y,
                    Tensor* saved_mean, Tensor* saved_inv_std) {
  const char* op = "batch_norm_train";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "y", *y);
  DT_CHECK(y->shape() == x.shape())
      << op << ": y " << y->DebugString() << " for x " << x.DebugString();
  const BnGeom g = MakeGeom(op, x);
  CheckParam(op, "gamma", gamma, x, g.c);
  CheckParam(op, "beta", beta, x, g.c);
  DT_CHECK(gamma.dtype() == beta.dtype())
      << op << ": gamma " << gamma.DebugString() << " and beta " << beta.DebugString();
  CheckStat(op, "saved_mean", *saved_mean, x, g.c);
  CheckStat(op, "saved_inv_std", *saved_inv_std, x, g.c);
  if (running_mean != nullptr) CheckStat(op, "running_mean", *running_mean, x, g.c);
  if (running_var != nullptr) CheckStat(op, "running_var", *running_var, x, g.c);
  DT_CHECK(g.count() > 1) << op << ": x " << x.DebugString()
                          << " has one value per channel; training needs more";
  DT_CHECK(eps >= 0.0f) << op << ": eps " << eps << " < 0";
  const int d = x.device().index;
  DeviceGuard guard(d);
  cudaStream_t s = CurrentCudaStream(d);
  bool done = false;
  if (UseCudnn(x.dtype())) {
    TensorDesc xd;
    DescribeX(&xd, x, g);
    BnDesc bn(xd);
    Tensor g32 = AsF32(gamma, s), b32 = AsF32(beta, s);
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t st = cudnnBatchNormalizationForwardTraining(
        CudnnHandle(d, s), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.get(), x.raw_data(), xd.get(),
        y->raw_data(), bn.d, g32.raw_data(), b32.raw_data(), static_cast<double>(momentum), nullptr,
        nullptr, static_cast<double>(eps), saved_mean->raw_data(), saved_inv_std->raw_data());
    if (!Refused(st, x.dtype(), op)) {
      DT_CUDNN_CHECK(st);
      done = true;
    }
  }
  if (!done) {
    CheckLaunch(op, k::BatchNormStats(Dt(x.dtype()), x.raw_data(), g.outer, g.c, g.inner, eps,
                                      saved_mean->data<float>(), saved_inv_std->data<float>(), s));
    CheckLaunch(op, k::BatchNormApply(Dt(x.dtype()), x.raw_data(), g.outer, g.c, g.inner,
                                      saved_mean->data<float>(), saved_inv_std->data<float>(),
                                      Dt(gamma.dtype()), gamma.raw_data(), beta.raw_data(),
                                      y->raw_data(), s));
  }
  CheckLaunch(op, k::BatchNormUpdateRunning(
                      saved_mean->data<float>(), saved_inv_std->data<float>(), g.c, eps, momentum,
                      static_cast<double>(g.count()),
                      running_mean != nullptr ? running_mean->data<float>() : nullptr,
                      running_var != nullptr ? running_var->data<float>() : nullptr, s));
}

void BatchNormInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                        const Tensor& running_mean, const Tensor& running_var, float eps,
                        Tensor* y) {
  const char* op = "batch_norm_inference";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "y", *y);
  DT_CHECK(y->shape() == x.shape())
      << op << ": y " << y->DebugString() << " for x " << x.DebugString();
  const BnGeom g = MakeGeom(op, x);
  CheckParam(op, "gamma", gamma, x, g.c);
  CheckParam(op, "beta", beta, x, g.c);
  DT_CHECK(gamma.dtype() == beta.dtype())
      << op << ": gamma " << gamma.DebugString() << " and beta " << beta.DebugString();
  CheckStat(op, "running_mean", running_mean, x, g.c);
  CheckStat(op, "running_var", running_var, x, g.c);
  const int d = x.device().index;
  DeviceGuard guard(d);
  CheckLaunch(op, k::BatchNormInference(Dt(x.dtype()), x.raw_data(), g.outer, g.c, g.inner,
                                        Dt(gamma.dtype()), gamma.raw_data(), beta.raw_data(),
                                        running_mean.data<float>(), running_var.data<float>(), eps,
                                        y->raw_data(), CurrentCudaStream(d)));
}

void BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                       const Tensor& saved_mean, const Tensor& saved_inv_std, Tensor* dx,
                       Tensor* dgamma, Tensor* dbeta) {
  const char* op = "batch_norm_backward";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "dy", dy);
  DT_CHECK(dy.shape() == x.shape())
      << op << ": dy " << dy.DebugString() << " for x " << x.DebugString();
  const BnGeom g = MakeGeom(op, x);
  CheckParam(op, "gamma", gamma, x, g.c);
  CheckStat(op, "saved_mean", saved_mean, x, g.c);
  CheckStat(op, "saved_inv_std", saved_inv_std, x, g.c);
  if (dx != nullptr) {
    CheckLike(op, "x", x, "dx", *dx);
    DT_CHECK(dx->shape() == x.shape())
        << op << ": dx " << dx->DebugString() << " for x " << x.DebugString();
  }
  if (dgamma != nullptr) CheckParam(op, "dgamma", *dgamma, x, g.c);
  if (dbeta != nullptr) CheckParam(op, "dbeta", *dbeta, x, g.c);
  if (dgamma != nullptr && dbeta != nullptr) {
    DT_CHECK(dgamma->dtype() == dbeta->dtype())
        << op << ": dgamma " << dgamma->DebugString() << " and dbeta " << dbeta->DebugString();
  }
  if (dx == nullptr && dgamma == nullptr && dbeta == nullptr) return;
  const int d = x.device().index;
  DeviceGuard guard(d);
  cudaStream_t s = CurrentCudaStream(d);
  if (UseCudnn(x.dtype())) {
    TensorDesc xd;
    DescribeX(&xd, x, g);
    BnDesc bn(xd);
    Tensor g32 = AsF32(gamma, s);
    Tensor dx_buf = dx != nullptr ? *dx : Tensor::Empty(x.shape(), x.dtype(), x.device());
    auto f32_out = [&](Tensor* t) {
      return t != nullptr && t->dtype() == DType::kF32
                 ? *t
                 : Tensor::Empty({g.c}, DType::kF32, x.device());
    };
    Tensor dg32 = f32_out(dgamma), db32 = f32_out(dbeta);
    const float one = 1.0f, zero = 0.0f;
    // With the saved statistics given, cuDNN uses them as they are; epsilon
    // (which the op does not carry) would only matter for recomputing them.
    cudnnStatus_t st = cudnnBatchNormalizationBackward(
        CudnnHandle(d, s), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd.get(),
        x.raw_data(), xd.get(), dy.raw_data(), xd.get(), dx_buf.raw_data(), bn.d, g32.raw_data(),
        dg32.raw_data(), db32.raw_data(), 1e-5, saved_mean.raw_data(), saved_inv_std.raw_data());
    if (!Refused(st, x.dtype(), op)) {
      DT_CUDNN_CHECK(st);
      for (auto [out, f] : {std::make_pair(dgamma, &dg32), std::make_pair(dbeta, &db32)}) {
        if (out != nullptr && out->dtype() != DType::kF32) {
          CheckLaunch(op,
                      k::Cast(k::kF32, f->raw_data(), Dt(out->dtype()), out->raw_data(), g.c, s));
        }
      }
      return;
    }
  }
  Tensor sums = Tensor::Empty({2, g.c}, DType::kF32, x.device());
  float* sum_dy = sums.data<float>();
  float* sum_dy_xhat = sum_dy + g.c;
  const DType gdt =
      dgamma != nullptr ? dgamma->dtype() : (dbeta != nullptr ? dbeta->dtype() : DType::kF32);
  CheckLaunch(op, k::BatchNormBackwardReduce(
                      Dt(x.dtype()), x.raw_data(), dy.raw_data(), g.outer, g.c, g.inner,
                      saved_mean.data<float>(), saved_inv_std.data<float>(), sum_dy, sum_dy_xhat,
                      Dt(gdt), dgamma != nullptr ? dgamma->raw_data() : nullptr,
                      dbeta != nullptr ? dbeta->raw_data() : nullptr, s));
  if (dx != nullptr) {
    CheckLaunch(op, k::BatchNormBackwardData(
                        Dt(x.dtype()), x.raw_data(), dy.raw_data(), g.outer, g.c, g.inner,
                        saved_mean.data<float>(), saved_inv_std.data<float>(), Dt(gamma.dtype()),
                        gamma.raw_data(), sum_dy, sum_dy_xhat, dx->raw_data(), s));
  }
}

}  // namespace
}  // namespace cuda_kernels

DT_REGISTER_KERNEL(batch_norm_train, DeviceType::kCUDA, BatchNormTrainFn,
                   cuda_kernels::BatchNormTrain);
DT_REGISTER_KERNEL(batch_norm_inference, DeviceType::kCUDA, BatchNormInferenceFn,
                   cuda_kernels::BatchNormInference);
DT_REGISTER_KERNEL(batch_norm_backward, DeviceType::kCUDA, BatchNormBackwardFn,
                   cuda_kernels::BatchNormBackward);

}  // namespace ops
}  // namespace dtrain
