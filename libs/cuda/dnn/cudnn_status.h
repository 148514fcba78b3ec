// cuDNN errors as absl::Status, like libs/cuda/cuda_status.h for the runtime:
//
//   DT_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(handle, ...));
//   DT_CUDNN_CHECK(cudnnConvolutionForward(handle, ...));   // fatal, for void kernels
#ifndef DTRAIN_LIBS_CUDA_DNN_CUDNN_STATUS_H_
#define DTRAIN_LIBS_CUDA_DNN_CUDNN_STATUS_H_

#include <cudnn.h>

#include "absl/status/status.h"
#include "libs/base/logging.h"

namespace dtrain {
namespace cuda {

// OK for CUDNN_STATUS_SUCCESS; otherwise an error with cuDNN's status string,
// its last detailed error message (cudnnGetLastErrorString) when it has one,
// the call's text and file:line. By cuDNN 9's status categories: BAD_PARAM is
// InvalidArgument, NOT_SUPPORTED Unimplemented, NOT_INITIALIZED
// FailedPrecondition, allocation failures ResourceExhausted, the rest Internal.
absl::Status CudnnStatus(cudnnStatus_t st, const char* expr, const char* file, int line);

}  // namespace cuda
}  // namespace dtrain

#define DT_CUDNN_RETURN_IF_ERROR(expr)                                  \
  do {                                                                  \
    ::absl::Status _dt_cudnn_status =                                   \
        ::dtrain::cuda::CudnnStatus((expr), #expr, __FILE__, __LINE__); \
    if (!_dt_cudnn_status.ok()) return _dt_cudnn_status;                \
  } while (0)

#define DT_CUDNN_CHECK(expr)                                            \
  do {                                                                  \
    ::absl::Status _dt_cudnn_status =                                   \
        ::dtrain::cuda::CudnnStatus((expr), #expr, __FILE__, __LINE__); \
    DT_CHECK(_dt_cudnn_status.ok()) << _dt_cudnn_status.message();      \
  } while (0)

#endif  // DTRAIN_LIBS_CUDA_DNN_CUDNN_STATUS_H_
