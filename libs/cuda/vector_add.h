// A first CUDA kernel, proving the nvcc -> cc_library -> cc_test chain.
#ifndef DTRAIN_LIBS_CUDA_VECTOR_ADD_H_
#define DTRAIN_LIBS_CUDA_VECTOR_ADD_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain {
namespace cuda {

// c[i] = alpha * a[i] + b[i] for i < n, on `stream`. Device pointers.
cudaError_t LaunchAxpy(float alpha, const float* a, const float* b, float* c, int64_t n,
                       cudaStream_t stream);

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_VECTOR_ADD_H_
