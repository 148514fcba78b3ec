#include "libs/tensor/stream.h"

#include <cstring>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {
namespace {

class CpuStream final : public Stream {
 public:
  explicit CpuStream(int index) : device_(Device::Cpu(index)) {}
  Device device() const override { return device_; }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  Device device_;
};

struct Registry {
  absl::Mutex mu;
  std::function<Stream*(int)> stream_factories[kNumDeviceTypes];
  absl::flat_hash_map<Device, std::unique_ptr<Stream>> streams;
  CopyFn copies[kNumDeviceTypes][kNumDeviceTypes];
};

Registry& GetRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    reg->stream_factories[0] = [](int index) -> Stream* { return new CpuStream(index); };
    reg->copies[0][0] = [](const Device&, void* dst, const Device&, const void* src, size_t bytes,
                           Stream*) {
      if (bytes > 0) std::memcpy(dst, src, bytes);
      return absl::OkStatus();
    };
    return reg;
  }();
  return *r;
}

}  // namespace

Stream* DefaultStream(const Device& device) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.streams.find(device);
  if (it != r.streams.end()) return it->second.get();
  auto& factory = r.stream_factories[static_cast<int>(device.type)];
  if (!factory) return nullptr;
  Stream* s = factory(device.index);
  r.streams[device].reset(s);
  return s;
}

void RegisterStreamFactory(DeviceType type, std::function<Stream*(int index)> factory) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.stream_factories[static_cast<int>(type)] = std::move(factory);
}

absl::Status CopyBytes(const Device& dst_device, void* dst, const Device& src_device,
                       const void* src, size_t bytes, Stream* stream) {
  CopyFn fn;
  {
    Registry& r = GetRegistry();
    absl::MutexLock lock(&r.mu);
    fn = r.copies[static_cast<int>(dst_device.type)][static_cast<int>(src_device.type)];
  }
  if (!fn) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no copy from ", src_device.ToString(), " to ", dst_device.ToString(), " in this build"));
  }
  return fn(dst_device, dst, src_device, src, bytes, stream);
}

void RegisterCopyFn(DeviceType dst, DeviceType src, CopyFn fn) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.copies[static_cast<int>(dst)][static_cast<int>(src)] = std::move(fn);
}

}  // namespace dtrain
