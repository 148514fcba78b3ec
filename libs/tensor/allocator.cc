#include "libs/tensor/allocator.h"

#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {
namespace {

constexpr size_t kAlignment = 64;
// Freed blocks above this total are returned to the system instead of cached.
constexpr int64_t kMaxCachedBytes = int64_t{2} << 30;

// Rounds up to a size class: multiples of 64 bytes up to 4 KiB, then four
// classes per power of two (at most 25% slack).
size_t SizeClass(size_t bytes) {
  if (bytes <= 4096) return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  size_t p = 1;
  while (p * 2 <= bytes) p *= 2;
  size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

class CpuAllocator final : public Allocator {
 public:
  explicit CpuAllocator(int index) : device_(Device::Cpu(index)) {}

  Device device() const override { return device_; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    size_t cls = SizeClass(bytes == 0 ? 1 : bytes);
    {
      absl::MutexLock lock(&mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.bytes_cached -= cls;
        ++stats_.num_cache_hits;
        Account(cls);
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlignment, cls);
    if (p == nullptr) {
      absl::MutexLock lock(&mu_);
      return absl::ResourceExhaustedError(
          absl::StrFormat("%s: out of memory allocating %d bytes; %d bytes in use, %d cached",
                          device_.ToString(), bytes, stats_.bytes_in_use, stats_.bytes_cached));
    }
    absl::MutexLock lock(&mu_);
    Account(cls);
    return p;
  }

  void Deallocate(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    size_t cls = SizeClass(bytes == 0 ? 1 : bytes);
    absl::MutexLock lock(&mu_);
    stats_.bytes_in_use -= cls;
    if (stats_.bytes_cached + static_cast<int64_t>(cls) > kMaxCachedBytes) {
      std::free(ptr);
      return;
    }
    free_[cls].push_back(ptr);
    stats_.bytes_cached += cls;
  }

  AllocatorStats stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  void ResetPeak() override {
    absl::MutexLock lock(&mu_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  void EmptyCache() override {
    absl::MutexLock lock(&mu_);
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) std::free(p);
      blocks.clear();
    }
    stats_.bytes_cached = 0;
  }

 private:
  void Account(size_t cls) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stats_.bytes_in_use += cls;
    ++stats_.num_allocs;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
      stats_.peak_bytes_in_use = stats_.bytes_in_use;
    }
  }

  const Device device_;
  mutable absl::Mutex mu_;
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<size_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);
};

struct Registry {
  absl::Mutex mu;
  std::function<Allocator*(int)> factories[kNumDeviceTypes];
  absl::flat_hash_map<Device, std::unique_ptr<Allocator>> allocators;
};

Registry& GetRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    reg->factories[static_cast<int>(DeviceType::kCPU)] = [](int index) -> Allocator* {
      return new CpuAllocator(index);
    };
    return reg;
  }();
  return *r;
}

}  // namespace

std::string AllocatorStats::ToString() const {
  return absl::StrCat("in_use=", bytes_in_use, " peak=", peak_bytes_in_use,
                      " cached=", bytes_cached, " allocs=", num_allocs,
                      " cache_hits=", num_cache_hits);
}

absl::StatusOr<Allocator*> GetAllocator(const Device& device) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.allocators.find(device);
  if (it != r.allocators.end()) return it->second.get();
  auto& factory = r.factories[static_cast<int>(device.type)];
  if (!factory) {
    return absl::FailedPreconditionError(absl::StrCat("no allocator for device ", device.ToString(),
                                                      ": this build has no backend for it"));
  }
  Allocator* a = factory(device.index);
  if (a == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device.ToString(), " is not available on this machine"));
  }
  r.allocators[device].reset(a);
  return a;
}

void RegisterAllocatorFactory(DeviceType type, std::function<Allocator*(int index)> factory) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.factories[static_cast<int>(type)] = std::move(factory);
}

}  // namespace dtrain
