// NCCL errors as absl::Status, like libs/cuda/cuda_status.h for the runtime:
//
//   DT_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
//
// Calls on a communicator should go through NcclCommunicator
// (communicator.h), which adds the rank and NCCL's last error text for that
// communicator and aborts it on failure.
#ifndef DTRAIN_LIBS_CUDA_NCCL_NCCL_STATUS_H_
#define DTRAIN_LIBS_CUDA_NCCL_NCCL_STATUS_H_

#include <nccl.h>

#include "absl/status/status.h"

namespace dtrain {
namespace cuda {

// OK for ncclSuccess; otherwise an error naming NCCL's result, the call's
// text and file:line, and `detail` (ncclGetLastError's text) when non-empty.
// ncclInvalidArgument and ncclInvalidUsage are InvalidArgument, ncclInProgress
// Unavailable (the caller polls), ncclRemoteError Unavailable (a peer or the
// network failed), ncclSystemError / ncclUnhandledCudaError / ncclInternalError
// Internal.
absl::Status NcclStatus(ncclResult_t r, const char* expr, const char* file, int line,
                        const char* detail = nullptr);

// Name of a result code ("ncclRemoteError").
const char* NcclResultName(ncclResult_t r);

}  // namespace cuda
}  // namespace dtrain

#define DT_NCCL_RETURN_IF_ERROR(expr)                                  \
  do {                                                                 \
    ::absl::Status _dt_nccl_status =                                   \
        ::dtrain::cuda::NcclStatus((expr), #expr, __FILE__, __LINE__); \
    if (!_dt_nccl_status.ok()) return _dt_nccl_status;                 \
  } while (0)

#endif  // DTRAIN_LIBS_CUDA_NCCL_NCCL_STATUS_H_
