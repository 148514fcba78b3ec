// cuBLAS kernels of matmul, linear and linear_backward (libs/ops/ops.h), for
// f32 (TF32 tensor cores when AllowTf32(), see config.h), f16 and bf16 (f32
// accumulation). Tensors are row-major; cuBLAS is column-major, so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T, which needs no copies.
// Bias and relu are one fused elementwise pass after the product; the bias
// gradient is a per-column sum (kernels::ChannelSum).
#include <cublas_v2.h>

#include <climits>

#include "libs/base/logging.h"
#include "libs/cuda/blas_status.h"
#include "libs/cuda/config.h"
#include "libs/cuda/handles.h"
#include "libs/cuda/kernels.h"
#include "libs/cuda/op_util.h"
#include "libs/cuda/stream.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"

namespace dtrain {
namespace ops {
namespace cuda_kernels {
namespace {

cudaDataType_t CudaType(DType dt) {
  switch (dt) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

// Row-major c[m, n] = op(a)[m, k] * op(b)[k, n] on `device`'s current stream.
// a is [m, k] (or [k, m] when ta), b is [k, n] (or [n, k] when tb).
void Gemm(const char* op, int device, DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
          const void* a, const void* b, void* c) {
  DT_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX)
      << op << ": matrix dimensions " << m << " x " << n << " x " << k << " exceed cuBLAS's int";
  cudaStream_t s = CurrentCudaStream(device);
  cublasHandle_t h = ::dtrain::cuda::CublasHandle(device, s);
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t type = CudaType(dt);
  const cublasComputeType_t compute = dt == DType::kF32 && ::dtrain::cuda::AllowTf32()
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  const int lda = static_cast<int>(ta ? m : k);
  const int ldb = static_cast<int>(tb ? k : n);
  DT_CUBLAS_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                               static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                               &alpha, b, type, ldb, a, type, lda, &beta, c, type,
                               static_cast<int>(n), compute, CUBLAS_GEMM_DEFAULT));
}

void Zero(const char* op, const Tensor& t, int device) {
  if (t.numel() == 0) return;
  CheckLaunch(op, cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), CurrentCudaStream(device)));
}

void MatMul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, Tensor* c) {
  const char* op = "matmul";
  CheckFloat(op, "a", a);
  CheckLike(op, "a", a, "b", b);
  CheckLike(op, "a", a, "c", *c);
  DT_CHECK(a.ndim() == 2 && b.ndim() == 2 && c->ndim() == 2)
      << op << ": a " << a.DebugString() << ", b " << b.DebugString() << ", c " << c->DebugString();
  const int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  const int64_t kk = transpose_a ? a.dim(0) : a.dim(1);
  const int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  const int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  DT_CHECK(kk == kb && c->dim(0) == m && c->dim(1) == n)
      << op << ": a " << ShapeToString(a.shape()) << (transpose_a ? "^T" : "") << " * b "
      << ShapeToString(b.shape()) << (transpose_b ? "^T" : "") << " into c "
      << ShapeToString(c->shape());
  if (m == 0 || n == 0) return;
  const int d = a.device().index;
  DeviceGuard g(d);
  if (kk == 0) {
    Zero(op, *c, d);
    return;
  }
  Gemm(op, d, a.dtype(), transpose_a, transpose_b, m, n, kk, a.raw_data(), b.raw_data(),
       c->raw_data());
}

void CheckBias(const char* op, const char* name, const Tensor& b, const Tensor& like, int64_t m) {
  CheckFloat(op, name, b);
  DT_CHECK(b.device() == like.device() && b.numel() == m && b.ndim() == 1)
      << op << ": " << name << " " << b.DebugString() << " for " << m << " outputs on "
      << like.device().ToString();
}

void Linear(const Tensor& x, const Tensor& w, const Tensor* b, bool relu, Tensor* y) {
  const char* op = "linear";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "w", w);
  CheckLike(op, "x", x, "y", *y);
  DT_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1))
      << op << ": x " << x.DebugString() << ", w " << w.DebugString()
      << " (want x [N,K] and w [M,K])";
  const int64_t n = x.dim(0), kk = x.dim(1), m = w.dim(0);
  DT_CHECK(y->shape() == Shape({n, m}))
      << op << ": y " << y->DebugString() << ", want [" << n << ", " << m << "]";
  if (b != nullptr) CheckBias(op, "b", *b, x, m);
  if (n == 0 || m == 0) return;
  DT_CHECK(kk > 0) << op << ": empty inner dimension, x " << x.DebugString();
  const int d = x.device().index;
  DeviceGuard g(d);
  Gemm(op, d, x.dtype(), false, true, n, m, kk, x.raw_data(), w.raw_data(), y->raw_data());
  CheckLaunch(
      op, k::BiasAct(Dt(y->dtype()), y->raw_data(), b != nullptr ? Dt(b->dtype()) : Dt(y->dtype()),
                     b != nullptr ? b->raw_data() : nullptr, n, m, 1, relu, CurrentCudaStream(d)));
}

void LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                    Tensor* db) {
  const char* op = "linear_backward";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "w", w);
  CheckLike(op, "x", x, "dy", dy);
  DT_CHECK(x.ndim() == 2 && w.ndim() == 2 && dy.ndim() == 2 && x.dim(1) == w.dim(1) &&
           dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(0))
      << op << ": x " << x.DebugString() << ", w " << w.DebugString() << ", dy "
      << dy.DebugString();
  const int64_t n = x.dim(0), kk = x.dim(1), m = w.dim(0);
  if (dx != nullptr) {
    CheckLike(op, "x", x, "dx", *dx);
    DT_CHECK(dx->shape() == x.shape())
        << op << ": dx " << dx->DebugString() << " for x " << x.DebugString();
  }
  if (dw != nullptr) {
    CheckLike(op, "w", w, "dw", *dw);
    DT_CHECK(dw->shape() == w.shape())
        << op << ": dw " << dw->DebugString() << " for w " << w.DebugString();
  }
  if (db != nullptr) CheckBias(op, "db", *db, x, m);
  const int d = x.device().index;
  DeviceGuard g(d);
  cudaStream_t s = CurrentCudaStream(d);
  if (n == 0) {
    if (dw != nullptr) Zero(op, *dw, d);
    if (db != nullptr) Zero(op, *db, d);
    return;
  }
  if (m == 0) {
    if (dx != nullptr) Zero(op, *dx, d);
    return;
  }
  if (kk > 0) {
    // dx[n, k] = dy[n, m] * w[m, k]
    if (dx != nullptr) {
      Gemm(op, d, x.dtype(), false, false, n, kk, m, dy.raw_data(), w.raw_data(), dx->raw_data());
    }
    // dw[m, k] = dy[n, m]^T * x[n, k]
    if (dw != nullptr) {
      Gemm(op, d, x.dtype(), true, false, m, kk, n, dy.raw_data(), x.raw_data(), dw->raw_data());
    }
  }
  if (db != nullptr) {
    CheckLaunch(op, k::ChannelSum(Dt(dy.dtype()), dy.raw_data(), n, m, 1, Dt(db->dtype()),
                                  db->raw_data(), s));
  }
}

}  // namespace
}  // namespace cuda_kernels

DT_REGISTER_KERNEL(matmul, DeviceType::kCUDA, MatMulFn, cuda_kernels::MatMul);
DT_REGISTER_KERNEL(linear, DeviceType::kCUDA, LinearFn, cuda_kernels::Linear);
DT_REGISTER_KERNEL(linear_backward, DeviceType::kCUDA, LinearBackwardFn,
                   cuda_kernels::LinearBackward);

}  // namespace ops
}  // namespace dtrain
