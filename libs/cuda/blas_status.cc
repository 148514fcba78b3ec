#include "libs/cuda/blas_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace cuda {

absl::Status CublasStatus(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                                 cublasGetStatusName(st), " (", cublasGetStatusString(st), ")");
  switch (st) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(msg);
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cuda
}  // namespace dtrain
