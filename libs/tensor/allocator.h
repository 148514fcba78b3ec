// Device memory allocators with usage statistics.
//
// Every device has one process-wide Allocator (GetAllocator). The CPU one
// returns 64-byte aligned blocks and keeps freed blocks in size-class bins
// for reuse, so a training loop that allocates the same shapes every step
// stops calling malloc after the first step. The CUDA allocator (libs/cuda)
// registers itself through RegisterAllocatorFactory.
//
// Thread-safe.
#ifndef DTRAIN_LIBS_TENSOR_ALLOCATOR_H_
#define DTRAIN_LIBS_TENSOR_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "libs/tensor/device.h"

namespace dtrain {

struct AllocatorStats {
  int64_t bytes_in_use = 0;       // handed out and not yet returned
  int64_t peak_bytes_in_use = 0;  // since start or the last ResetPeak()
  int64_t bytes_cached = 0;       // freed blocks kept for reuse
  int64_t num_allocs = 0;         // Allocate() calls that succeeded
  int64_t num_cache_hits = 0;     // ... served from the cache
  std::string ToString() const;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;

  // Returns a block of at least `bytes` bytes (64-byte aligned), or
  // ResourceExhausted with a message saying what was asked and what is held.
  // Allocate(0) returns a valid unique pointer.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;

  // Returns a block from Allocate with the same `bytes`.
  virtual void Deallocate(void* ptr, size_t bytes) = 0;

  virtual AllocatorStats stats() const = 0;
  virtual void ResetPeak() = 0;

  // Releases cached blocks back to the system.
  virtual void EmptyCache() = 0;
};

// The allocator of `device`. CPU devices always have one (all CPU indices
// share the process heap but count separately); for other device types the
// factory must be registered, otherwise FailedPrecondition.
absl::StatusOr<Allocator*> GetAllocator(const Device& device);

// Registers the allocator factory of a device type; called once by backends.
void RegisterAllocatorFactory(DeviceType type, std::function<Allocator*(int index)> factory);

}  // namespace dtrain

#endif  // DTRAIN_LIBS_TENSOR_ALLOCATOR_H_
