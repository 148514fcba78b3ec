// The op registry: (op name, device type) -> kernel function.
//
// Every op in ops.h dispatches through here, so a backend adds a device by
// registering kernels, with no change to public headers:
//
//   // in a backend's .cc (linked with alwayslink = 1):
//   DT_REGISTER_KERNEL(relu, DeviceType::kCUDA, CudaRelu);
//
// The kernel's type must be exactly the op's signature type declared in
// ops.h (ops::ReluFn for relu); registration checks it at compile time.
// Lookup after the first call per (op, device) is a single array load.
#ifndef DTRAIN_LIBS_OPS_REGISTRY_H_
#define DTRAIN_LIBS_OPS_REGISTRY_H_

#include <atomic>
#include <string>
#include <vector>

#include "libs/tensor/device.h"

namespace dtrain {
namespace ops {

struct KernelInfo {
  std::string op;
  DeviceType device;
};

class KernelRegistry {
 public:
  static KernelRegistry& Global();

  // Registers `fn` for (op, device). A second registration of the same pair is
  // a programming error (fatal), naming the op.
  void Register(const char* op, DeviceType device, void* fn);

  // The kernel for (op, device), or null.
  void* Find(const char* op, DeviceType device) const;

  // Every registered pair, sorted by op then device.
  std::vector<KernelInfo> List() const;
};

// Caches the kernel pointers of one op per device type.
template <typename Fn>
class OpDispatcher {
 public:
  explicit constexpr OpDispatcher(const char* op) : op_(op) {}
  // The kernel for `device`; fatal with a clear message if the build has none.
  Fn* Get(const Device& device) const {
    int t = static_cast<int>(device.type);
    void* fn = cache_[t].load(std::memory_order_acquire);
    if (fn == nullptr) {
      fn = Resolve(op_, device);
      cache_[t].store(fn, std::memory_order_release);
    }
    return reinterpret_cast<Fn*>(fn);
  }

 private:
  static void* Resolve(const char* op, const Device& device);
  const char* op_;
  mutable std::atomic<void*> cache_[kNumDeviceTypes] = {};
};

// Fatal "no kernel" error, out of line.
void* ResolveKernelOrDie(const char* op, const Device& device);

template <typename Fn>
void* OpDispatcher<Fn>::Resolve(const char* op, const Device& device) {
  return ResolveKernelOrDie(op, device);
}

namespace internal {
struct KernelRegistrar {
  KernelRegistrar(const char* op, DeviceType device, void* fn) {
    KernelRegistry::Global().Register(op, device, fn);
  }
};
}  // namespace internal

}  // namespace ops
}  // namespace dtrain

#define DT_KERNEL_CONCAT_INNER_(a, b) a##b
#define DT_KERNEL_CONCAT_(a, b) DT_KERNEL_CONCAT_INNER_(a, b)

// Registers `fn` as the kernel of op `name` (an identifier from ops.h, whose
// signature type is ops::<Name>Fn spelled as the `fn_type` argument).
#define DT_REGISTER_KERNEL(name, device, fn_type, fn)                                       \
  static ::dtrain::ops::internal::KernelRegistrar DT_KERNEL_CONCAT_(_dt_kernel_, __LINE__)( \
      #name, device, reinterpret_cast<void*>(static_cast<::dtrain::ops::fn_type*>(&(fn))))

#endif  // DTRAIN_LIBS_OPS_REGISTRY_H_
