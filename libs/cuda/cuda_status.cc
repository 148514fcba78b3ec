#include "libs/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace cuda {

absl::Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(expr, " failed at ", file, ":", line, ": ", cudaGetErrorName(err),
                                 " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

int DeviceCount(std::string* reason) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (reason != nullptr) {
      *reason = absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
    }
    cudaGetLastError();  // clear the sticky error for later callers
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "the CUDA runtime found no devices";
  return count;
}

}  // namespace cuda
}  // namespace dtrain
