#include "libs/tensor/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dtrain {

std::string Device::ToString() const {
  const char* name = type == DeviceType::kCPU ? "cpu" : "cuda";
  if (type == DeviceType::kCPU && index == 0) return name;
  return absl::StrCat(name, ":", index);
}

absl::StatusOr<Device> Device::Parse(absl::string_view text) {
  absl::string_view kind = text;
  int index = 0;
  size_t colon = text.find(':');
  if (colon != absl::string_view::npos) {
    kind = text.substr(0, colon);
    if (!absl::SimpleAtoi(text.substr(colon + 1), &index) || index < 0 || index > 1023) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad device '", text, "': the index after ':' must be 0..1023"));
    }
  }
  if (kind == "cpu") return Device::Cpu(index);
  if (kind == "cuda") return Device::Cuda(index);
  return absl::InvalidArgumentError(
      absl::StrCat("bad device '", text, "': expected cpu, cpu:N, cuda or cuda:N"));
}

}  // namespace dtrain
