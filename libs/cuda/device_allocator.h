// The process-wide caching allocators of the CUDA backend: one per device for
// device memory, one for pinned (page-locked) host memory. See
// caching_allocator.h for the caching rules.
//
// Tensors on "cuda:N" get their memory from DeviceAllocator(N) through
// libs/tensor's GetAllocator (the backend registers the factory); each
// allocation is made for the calling thread's CurrentStream(N). A tensor that
// another stream reads or writes must be announced with RecordStream, or its
// memory could be handed out again while that stream still uses it.
#ifndef DTRAIN_LIBS_CUDA_DEVICE_ALLOCATOR_H_
#define DTRAIN_LIBS_CUDA_DEVICE_ALLOCATOR_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "libs/cuda/caching_allocator.h"
#include "libs/tensor/allocator.h"
#include "libs/tensor/stream.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace cuda {

// The caching allocator of device `device` (created on first use), or
// FailedPrecondition naming the device when it does not exist here.
absl::StatusOr<CachingAllocator*> DeviceAllocator(int device);

// Statistics of device `device` (all zero for a device never used).
CachingAllocatorStats DeviceMemoryStats(int device);

// Marks the memory of CUDA tensor `t` as used on `stream` as well (see the
// file comment). No-op for tensors that are not on a CUDA device.
void RecordStream(const Tensor& t, Stream* stream);

// The pinned host memory allocator (cudaHostAlloc, portable across devices).
// Blocks are cached like device blocks; a block that a copy on some stream
// reads or writes must be announced with RecordStream(ptr, stream) before it
// is freed.
CachingAllocator& PinnedAllocator();

// A block of pinned host memory, returned to PinnedAllocator() on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // Copies on `stream` use this buffer: it is reused only after they finish.
  void RecordStream(Stream* stream);

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// The dtrain::Allocator for "cuda:N" tensors; null when the device does not
// exist (GetAllocator then reports it unavailable). Used by the backend's
// factory.
Allocator* NewCudaTensorAllocator(int device);

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_DEVICE_ALLOCATOR_H_
