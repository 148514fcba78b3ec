// Device helpers shared by the .cu files of libs/cuda (nvcc only).
#ifndef DTRAIN_LIBS_CUDA_KERNEL_UTIL_CUH_
#define DTRAIN_LIBS_CUDA_KERNEL_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "libs/cuda/kernels.h"

namespace dtrain {
namespace cuda {
namespace kernels {

// Loads and stores of float types through f32.
template <typename T>
__device__ __forceinline__ float ToF(T v);
template <>
__device__ __forceinline__ float ToF<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToF<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float ToF<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromF<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Runs `body` with T bound to the storage type of float dtype `dt`; returns
// cudaErrorInvalidValue for other dtypes.
#define DT_DISPATCH_FLOAT(dt, T, ...) \
  switch (dt) {                       \
    case kF32: {                      \
      using T = float;                \
      __VA_ARGS__;                    \
      break;                          \
    }                                 \
    case kF16: {                      \
      using T = __half;               \
      __VA_ARGS__;                    \
      break;                          \
    }                                 \
    case kBF16: {                     \
      using T = __nv_bfloat16;        \
      __VA_ARGS__;                    \
      break;                          \
    }                                 \
    default:                          \
      return cudaErrorInvalidValue;   \
  }

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items, kThreads per block.
inline unsigned GridFor(int64_t n, int64_t per_thread = 1) {
  int64_t threads = (n + per_thread - 1) / per_thread;
  int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;
  return static_cast<unsigned>(blocks);
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <typename A>
__device__ __forceinline__ A WarpSum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024),
// returned to every thread. The order of additions is fixed.
template <typename A>
__device__ A BlockSum(A v) {
  __shared__ A partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  A t = lane < warps ? partial[lane] : A(0);
  if (warp == 0) t = WarpSum(t);
  if (threadIdx.x == 0) partial[0] = t;
  __syncthreads();
  t = partial[0];
  __syncthreads();  // partial may be reused by the next call
  return t;
}

}  // namespace kernels
}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_KERNEL_UTIL_CUH_
