#include "libs/cuda/dnn/cudnn_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace cuda {

absl::Status CudnnStatus(cudnnStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                                 cudnnGetErrorString(st), " (", static_cast<int>(st), ")");
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') absl::StrAppend(&msg, ": ", detail);
  const int code = static_cast<int>(st);
  if (code == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      code == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return absl::ResourceExhaustedError(msg);
  }
  // Categories are the thousands: 1xxx not initialized (1001 is the plain
  // CUDNN_STATUS_NOT_INITIALIZED), 2xxx bad parameters, 3xxx not supported.
  switch (CUDNN_STATUS_CATEGORY(code)) {
    case 1000:
      return absl::FailedPreconditionError(msg);
    case CUDNN_STATUS_BAD_PARAM:
      return absl::InvalidArgumentError(msg);
    case CUDNN_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cuda
}  // namespace dtrain
