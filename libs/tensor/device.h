// Devices that hold tensors: "cpu" (one logical CPU device per index, used
// for data parallelism across thread pools) and "cuda:N".
#ifndef DTRAIN_LIBS_TENSOR_DEVICE_H_
#define DTRAIN_LIBS_TENSOR_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device Cpu(int index = 0) { return Device{DeviceType::kCPU, index}; }
  static Device Cuda(int index) { return Device{DeviceType::kCUDA, index}; }

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }

  // "cpu", "cpu:1", "cuda:0".
  std::string ToString() const;

  // Parses "cpu", "cpu:N", "cuda", "cuda:N" (case-sensitive). Errors name the
  // text and the accepted forms.
  static absl::StatusOr<Device> Parse(absl::string_view text);

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const Device& d) {
    return H::combine(std::move(h), d.type, d.index);
  }
};

}  // namespace dtrain

#endif  // DTRAIN_LIBS_TENSOR_DEVICE_H_
