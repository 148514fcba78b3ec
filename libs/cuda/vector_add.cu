#include "libs/cuda/vector_add.h"

namespace dtrain {
namespace cuda {
namespace {

__global__ void AxpyKernel(float alpha, const float* __restrict__ a, const float* __restrict__ b,
                           float* __restrict__ c, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    c[i] = alpha * a[i] + b[i];
  }
}

}  // namespace

cudaError_t LaunchAxpy(float alpha, const float* a, const float* b, float* c, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535) blocks = 65535;
  AxpyKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(alpha, a, b, c, n);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace dtrain
