// Test helpers for CUDA code: skipping without a GPU, moving test tensors
// between the CPU and cuda:0 in a chosen dtype.
#ifndef DTRAIN_LIBS_CUDA_GPU_TEST_UTIL_H_
#define DTRAIN_LIBS_CUDA_GPU_TEST_UTIL_H_

#include <string>

#include "gtest/gtest.h"
#include "libs/cuda/cuda_status.h"
#include "libs/tensor/tensor.h"

// Skips the current test, with the runtime's reason, on a machine without a
// usable CUDA device.
#define DT_SKIP_WITHOUT_GPU()                                                    \
  do {                                                                           \
    std::string _dt_reason;                                                      \
    if (::dtrain::cuda::DeviceCount(&_dt_reason) == 0) {                         \
      GTEST_SKIP() << "no CUDA device (" << _dt_reason << "): test needs a GPU"; \
    }                                                                            \
  } while (0)

// Skips unless at least `n` CUDA devices are present.
#define DT_SKIP_WITHOUT_GPUS(n)                                                   \
  do {                                                                            \
    std::string _dt_reason;                                                       \
    int _dt_count = ::dtrain::cuda::DeviceCount(&_dt_reason);                     \
    if (_dt_count < (n)) {                                                        \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << _dt_count     \
                   << (_dt_count == 0 ? " (" + _dt_reason + ")" : std::string()); \
    }                                                                             \
  } while (0)

namespace dtrain {
namespace cuda {
namespace testing {

// `cpu` (a CPU tensor of any dtype) cast to `dtype` on the CPU, then copied to
// cuda:`device`.
Tensor ToCuda(const Tensor& cpu, DType dtype = DType::kF32, int device = 0);
// A copy on the CPU, cast to f32 (exact for f16 and bf16).
Tensor ToCpuF32(const Tensor& t);
// `cpu` (f32) rounded to `dtype` and widened back: what a kernel reading the
// `dtype` copy sees.
Tensor RoundTo(const Tensor& cpu, DType dtype);
// Tolerance for results stored in `dtype` (relative and absolute).
double Tolerance(DType dtype);

}  // namespace testing
}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_GPU_TEST_UTIL_H_
