// CUDA errors as absl::Status.
//
//   DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, kind, stream));
//
// The Status carries the library's error name and string, the call's text,
// and file:line, like nccl-tests' CUDACHECK. cuBLAS, cuDNN and NCCL get the
// same treatment in their own wrappers.
#ifndef DTRAIN_LIBS_CUDA_CUDA_STATUS_H_
#define DTRAIN_LIBS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace dtrain {
namespace cuda {

// Returns OK for cudaSuccess, otherwise an error naming `expr`, `file`, `line`.
absl::Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line);

// Number of usable CUDA devices. Zero (not an error) when the machine has no
// GPU or no driver; `reason` (if non-null) then says why, for a log line.
int DeviceCount(std::string* reason = nullptr);

}  // namespace cuda
}  // namespace dtrain

#define DT_CUDA_RETURN_IF_ERROR(expr)                                  \
  do {                                                                 \
    ::absl::Status _dt_cuda_status =                                   \
        ::dtrain::cuda::CudaStatus((expr), #expr, __FILE__, __LINE__); \
    if (!_dt_cuda_status.ok()) return _dt_cuda_status;                 \
  } while (0)

#endif  // DTRAIN_LIBS_CUDA_CUDA_STATUS_H_
