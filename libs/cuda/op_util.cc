#include "libs/cuda/op_util.h"

#include "libs/base/logging.h"

namespace dtrain {
namespace cuda {
namespace internal {

void CheckCuda(const char* op, const char* name, const Tensor& t) {
  DT_CHECK(t.defined()) << op << ": " << name << " is undefined";
  DT_CHECK(t.device().is_cuda()) << op << ": " << name << " " << t.DebugString()
                                 << " is not on a CUDA device";
}

void CheckFloat(const char* op, const char* name, const Tensor& t) {
  CheckCuda(op, name, t);
  DT_CHECK(IsFloat(t.dtype())) << op << ": " << name << " must be f32, f16 or bf16, got "
                               << t.DebugString();
}

void CheckF32(const char* op, const char* name, const Tensor& t) {
  CheckCuda(op, name, t);
  DT_CHECK(t.dtype() == DType::kF32)
      << op << ": " << name << " must be f32, got " << t.DebugString();
}

void CheckSameShape(const char* op, const char* na, const Tensor& a, const char* nb,
                    const Tensor& b) {
  DT_CHECK(a.shape() == b.shape()) << op << ": " << na << " " << a.DebugString() << " and " << nb
                                   << " " << b.DebugString() << " differ in shape";
}

void CheckLike(const char* op, const char* na, const Tensor& a, const char* nb, const Tensor& b) {
  DT_CHECK(a.dtype() == b.dtype() && a.device() == b.device())
      << op << ": " << na << " " << a.DebugString() << " and " << nb << " " << b.DebugString()
      << " must have the same dtype and device";
}

void CheckLaunch(const char* op, cudaError_t err) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  DT_CHECK(false) << op << ": CUDA kernel launch failed: " << cudaGetErrorName(err) << " ("
                  << cudaGetErrorString(err) << ")";
}

Tensor Scratch(int device, size_t bytes) {
  return Tensor::Empty({static_cast<int64_t>(bytes == 0 ? 1 : bytes)}, DType::kU8,
                       Device::Cuda(device));
}

}  // namespace internal
}  // namespace cuda
}  // namespace dtrain
