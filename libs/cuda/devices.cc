#include "libs/cuda/devices.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/base/logging.h"
#include "libs/cuda/cuda_status.h"

namespace dtrain {
namespace cuda {
namespace {

std::string DeviceName(int index) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    cudaGetLastError();
    return "unknown GPU";
  }
  return prop.name;
}

std::string Names(const std::vector<Device>& devices) {
  return absl::StrJoin(devices, ", ",
                       [](std::string* out, const Device& d) { out->append(d.ToString()); });
}

std::string GpuList(int count) {
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.push_back(DeviceName(i));
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::StatusOr<std::vector<Device>> ChooseDevices(const std::string& requested) {
  const std::string req(absl::StripAsciiWhitespace(requested));
  std::string reason;
  if (req.empty() || req == "auto" || req == "cuda") {
    const int count = DeviceCount(&reason);
    if (count == 0) {
      if (req == "cuda") {
        return absl::FailedPreconditionError(
            absl::StrCat("--devices=cuda: this machine has no CUDA device (", reason, ")"));
      }
      DT_LOG(INFO) << "devices: cpu (no CUDA device: " << reason << ")";
      return std::vector<Device>{Device::Cpu()};
    }
    std::vector<Device> out;
    for (int i = 0; i < count; ++i) out.push_back(Device::Cuda(i));
    DT_LOG(INFO) << "devices: " << Names(out) << " (" << count << " CUDA device"
                 << (count == 1 ? "" : "s") << " found: " << GpuList(count) << ")";
    return out;
  }
  std::vector<Device> out;
  bool any_cpu = false, any_cuda = false;
  for (absl::string_view part : absl::StrSplit(req, ',')) {
    absl::StatusOr<Device> d = Device::Parse(absl::StripAsciiWhitespace(part));
    if (!d.ok()) return d.status();
    for (const Device& seen : out) {
      if (seen == *d) {
        return absl::InvalidArgumentError(
            absl::StrCat("--devices=", req, ": ", d->ToString(), " is listed twice"));
      }
    }
    any_cpu = any_cpu || d->is_cpu();
    any_cuda = any_cuda || d->is_cuda();
    out.push_back(*d);
  }
  if (any_cpu && any_cuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices=", req, ": mixing CPU and CUDA devices is not supported"));
  }
  if (any_cuda) {
    const int count = DeviceCount(&reason);
    for (const Device& d : out) {
      if (d.index >= count) {
        return absl::FailedPreconditionError(
            absl::StrCat("--devices=", req, ": ", d.ToString(), " does not exist on this machine (",
                         count == 0 ? absl::StrCat("no CUDA device: ", reason)
                                    : absl::StrCat(count, " CUDA device", count == 1 ? "" : "s"),
                         ")"));
      }
    }
    DT_LOG(INFO) << "devices: " << Names(out) << " (as requested; " << count << " CUDA device"
                 << (count == 1 ? "" : "s") << " found: " << GpuList(count) << ")";
  } else {
    DT_LOG(INFO) << "devices: " << Names(out) << " (as requested)";
  }
  return out;
}

}  // namespace cuda
}  // namespace dtrain
