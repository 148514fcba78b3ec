// Which devices a trainer uses.
#ifndef DTRAIN_LIBS_CUDA_DEVICES_H_
#define DTRAIN_LIBS_CUDA_DEVICES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/tensor/device.h"

namespace dtrain {
namespace cuda {

// The devices to train on, from a --devices style request, with one log line
// (INFO) saying which were chosen and why:
//
//   "" or "auto"     every CUDA device found; cpu when there is none
//                    ("devices: cpu (no CUDA device: cudaErrorNoDevice: ...)")
//   "cuda"           every CUDA device; FailedPrecondition when there is none
//   "cpu", "cpu:N"   that CPU device
//   "cuda:0,cuda:2"  a comma-separated list of devices (Device::Parse forms),
//                    each of which must exist
//
// InvalidArgument for text Device::Parse rejects, duplicates, or a list that
// mixes CPU and CUDA devices; FailedPrecondition (with the runtime's reason)
// for CUDA devices this machine does not have. Never fails for "auto" or "cpu".
absl::StatusOr<std::vector<Device>> ChooseDevices(const std::string& requested);

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_DEVICES_H_
