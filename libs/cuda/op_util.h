// Helpers of the CUDA op kernels (cuda_ops.cc, blas_ops.cc, dnn/): argument
// checks with messages naming the op, dtype codes for kernels.h, scratch
// memory. Internal to libs/cuda.
#ifndef DTRAIN_LIBS_CUDA_OP_UTIL_H_
#define DTRAIN_LIBS_CUDA_OP_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "libs/cuda/kernels.h"
#include "libs/cuda/stream.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace cuda {
namespace internal {

inline kernels::DT Dt(DType d) { return static_cast<kernels::DT>(static_cast<int>(d)); }
inline bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// Fatal unless `t` is defined and on a CUDA device.
void CheckCuda(const char* op, const char* name, const Tensor& t);
// ... and of a float type (f32, f16, bf16).
void CheckFloat(const char* op, const char* name, const Tensor& t);
// ... and f32.
void CheckF32(const char* op, const char* name, const Tensor& t);
void CheckSameShape(const char* op, const char* na, const Tensor& a, const char* nb,
                    const Tensor& b);
// Same dtype and device.
void CheckLike(const char* op, const char* na, const Tensor& a, const char* nb, const Tensor& b);

// Fatal with the op's name unless `err` is cudaSuccess.
void CheckLaunch(const char* op, cudaError_t err);

// Device memory for the duration of one op call, allocated for the current
// stream: freeing it when the op returns is safe, since later users on that
// stream run after the op's kernels.
Tensor Scratch(int device, size_t bytes);

}  // namespace internal
}  // namespace cuda

// The names above and stream.h's, where the op kernel files register their kernels.
namespace ops {
namespace cuda_kernels {
namespace k = ::dtrain::cuda::kernels;
using ::dtrain::cuda::CurrentCudaStream;
using ::dtrain::cuda::DeviceGuard;
using ::dtrain::cuda::internal::CheckCuda;
using ::dtrain::cuda::internal::CheckF32;
using ::dtrain::cuda::internal::CheckFloat;
using ::dtrain::cuda::internal::CheckLaunch;
using ::dtrain::cuda::internal::CheckLike;
using ::dtrain::cuda::internal::CheckSameShape;
using ::dtrain::cuda::internal::Dt;
using ::dtrain::cuda::internal::Scratch;
}  // namespace cuda_kernels
}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_OP_UTIL_H_
