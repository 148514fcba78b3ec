// CUDA errors as absl::Status.
//
//   DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, kind, stream));
//   DT_CUDA_CHECK(cudaGetLastError());   // in code that cannot return a Status
//
// The Status carries the library's error name and string, the call's text,
// and file:line, like nccl-tests' CUDACHECK. cuBLAS (blas_status.h), cuDNN
// (dnn/cudnn_status.h) and NCCL (nccl/nccl_status.h) get the same treatment.
//
// DT_CUDA_CHECK is for the op kernels, whose signatures (libs/ops/ops.h)
// return nothing: a failed CUDA call there is fatal, with the same message.
#ifndef DTRAIN_LIBS_CUDA_CUDA_STATUS_H_
#define DTRAIN_LIBS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "libs/base/logging.h"

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

#define DT_CUDA_CHECK(expr)                                            \
  do {                                                                 \
    ::absl::Status _dt_cuda_status =                                   \
        ::dtrain::cuda::CudaStatus((expr), #expr, __FILE__, __LINE__); \
    DT_CHECK(_dt_cuda_status.ok()) << _dt_cuda_status.message();       \
  } while (0)

// Fatal unless `status_expr` (an absl::Status) is OK; for void kernels.
#define DT_CUDA_CHECK_OK(status_expr)                                  \
  do {                                                                 \
    ::absl::Status _dt_cuda_status_ok = (status_expr);                 \
    DT_CHECK(_dt_cuda_status_ok.ok()) << _dt_cuda_status_ok.message(); \
  } while (0)

#endif  // DTRAIN_LIBS_CUDA_CUDA_STATUS_H_
