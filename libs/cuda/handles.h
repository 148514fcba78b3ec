// Library handles of the calling thread: a cuBLAS handle per device, bound to
// the stream the caller passes and to a workspace allocated for that stream.
// Handles are not thread-safe, so each thread gets its own; a thread that
// exits returns its handles to a process-wide pool for the next thread (they
// are never destroyed: destroying them at process exit could run after the
// CUDA runtime has shut down). Internal to libs/cuda.
#ifndef DTRAIN_LIBS_CUDA_HANDLES_H_
#define DTRAIN_LIBS_CUDA_HANDLES_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace dtrain {
namespace cuda {

// Workspace cuBLAS gets per stream (NVIDIA recommends 32 MiB on Hopper; a
// user-provided workspace is also what lets cuBLAS run inside a CUDA graph
// capture without allocating).
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// The calling thread's cuBLAS handle for `device` (which must be current),
// set to `stream` and its workspace. Fatal if cuBLAS cannot be initialized.
cublasHandle_t CublasHandle(int device, cudaStream_t stream);

// A per-thread, per-device handle pool for any library whose handles follow
// the create / set-stream pattern (cuDNN uses it from dnn/).
class ThreadHandlePool {
 public:
  // `create` makes a new handle for the current device (fatal on failure).
  explicit ThreadHandlePool(std::function<void*()> create) : create_(std::move(create)) {}
  // The calling thread's handle for `device`.
  void* Get(int device);

 private:
  std::function<void*()> create_;
};

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_HANDLES_H_
