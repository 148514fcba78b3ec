// cuBLAS errors as absl::Status, like cuda_status.h for the runtime:
//
//   DT_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(handle, ...));
//   DT_CUBLAS_CHECK(cublasGemmEx(handle, ...));   // fatal, for void kernels
#ifndef DTRAIN_LIBS_CUDA_BLAS_STATUS_H_
#define DTRAIN_LIBS_CUDA_BLAS_STATUS_H_

#include <cublas_api.h>

#include "absl/status/status.h"
#include "libs/base/logging.h"

namespace dtrain {
namespace cuda {

// OK for CUBLAS_STATUS_SUCCESS; otherwise an error with cuBLAS's status name
// and description, the call's text and file:line. Allocation failures are
// ResourceExhausted, bad arguments InvalidArgument, unsupported
// configurations Unimplemented, a missing initialization FailedPrecondition.
absl::Status CublasStatus(cublasStatus_t st, const char* expr, const char* file, int line);

}  // namespace cuda
}  // namespace dtrain

#define DT_CUBLAS_RETURN_IF_ERROR(expr)                                  \
  do {                                                                   \
    ::absl::Status _dt_cublas_status =                                   \
        ::dtrain::cuda::CublasStatus((expr), #expr, __FILE__, __LINE__); \
    if (!_dt_cublas_status.ok()) return _dt_cublas_status;               \
  } while (0)

#define DT_CUBLAS_CHECK(expr)                                            \
  do {                                                                   \
    ::absl::Status _dt_cublas_status =                                   \
        ::dtrain::cuda::CublasStatus((expr), #expr, __FILE__, __LINE__); \
    DT_CHECK(_dt_cublas_status.ok()) << _dt_cublas_status.message();     \
  } while (0)

#endif  // DTRAIN_LIBS_CUDA_BLAS_STATUS_H_
