// Element-wise reductions used by the collectives.
//
// The collectives work on raw buffers described by (pointer, element count,
// DType). Reductions are defined for f32, f16 and bf16: half-precision inputs
// are widened to float, combined in float and rounded back once per call
// (round to nearest even), so a reduction over n ranks rounds n-1 times in
// f16/bf16, as NCCL and Gloo do.
//
// The loops run on whatever the CPU offers: an AVX2+F16C version is chosen at
// run time when available, otherwise a portable version (x86-64-v2) is used.
// All functions are thread-safe and allocate nothing.
#ifndef DTRAIN_LIBS_COLLECTIVE_REDUCE_H_
#define DTRAIN_LIBS_COLLECTIVE_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "libs/tensor/dtype.h"

namespace dtrain {
namespace collective {

enum class ReduceOp : uint8_t {
  kSum = 0,
  // The sum divided by the number of ranks (a correctly rounded division, so
  // an exact sum of integers divisible by n gives an exact mean).
  kAverage = 1,
};

const char* ReduceOpName(ReduceOp op);  // "sum", "average"

// OK when `dtype` can be reduced (f32, f16, bf16); INVALID_ARGUMENT otherwise.
absl::Status CheckReducible(DType dtype);

// dst[i] = dst[i] + src[i] for i < count.
// REQUIRES: CheckReducible(dtype).ok(); dst and src are equal or do not overlap.
void ReduceSum(DType dtype, void* dst, const void* src, size_t count);

// dst[i] = (dst[i] + src[i]) / divisor, computed in float and rounded once.
// REQUIRES: as ReduceSum.
void ReduceSumDivide(DType dtype, void* dst, const void* src, size_t count, float divisor);

// buf[i] = buf[i] / divisor. REQUIRES: CheckReducible(dtype).ok().
void DivideInPlace(DType dtype, void* buf, size_t count, float divisor);

// True when the AVX2+F16C kernels are in use (for tests and benchmarks):
// on a CPU that has AVX2, FMA and F16C, unless the environment variable
// DTRAIN_REDUCE_KERNELS is "portable" when the first reduction runs.
bool UsingVectorKernels();

}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_REDUCE_H_
