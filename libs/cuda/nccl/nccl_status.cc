#include "libs/cuda/nccl/nccl_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace cuda {

const char* NcclResultName(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult(unknown)";
  }
}

absl::Status NcclStatus(ncclResult_t r, const char* expr, const char* file, int line,
                        const char* detail) {
  if (r == ncclSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(expr, " failed at ", file, ":", line, ": ", NcclResultName(r),
                                 " (", ncclGetErrorString(r), ")");
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&msg, ": ", detail);
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclInProgress:
    case ncclRemoteError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cuda
}  // namespace dtrain
