#include "libs/cuda/device_allocator.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/base/logging.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/stream.h"

namespace dtrain {
namespace cuda {
namespace {

// Events shared by the device and pinned backends. Events are created on the
// device of the stream they are recorded on.
absl::StatusOr<void*> RecordEventOn(uintptr_t stream_id) {
  RelaxedCaptureModeGuard relaxed;
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_id);
  int device = 0;
  DT_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(stream, &device));
  DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  DT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(e, stream);
  if (err != cudaSuccess) {
    cudaEventDestroy(e);
    DT_CUDA_RETURN_IF_ERROR(err);
  }
  return static_cast<void*>(e);
}

bool EventDoneOn(void* event) {
  RelaxedCaptureModeGuard relaxed;
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaSuccess) return true;
  cudaGetLastError();
  if (err == cudaErrorNotReady) return false;
  // A broken device: nothing runs any more, so nothing still uses the block.
  DT_LOG(ERROR) << "cudaEventQuery: " << cudaGetErrorString(err);
  return true;
}

void WaitEventOn(void* event) {
  RelaxedCaptureModeGuard relaxed;
  cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(event));
  if (err != cudaSuccess) {
    cudaGetLastError();
    DT_LOG(ERROR) << "cudaEventSynchronize: " << cudaGetErrorString(err);
  }
}

void DestroyEventOn(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

class CudaMemoryBackend final : public MemoryBackend {
 public:
  explicit CudaMemoryBackend(int device) : device_(device) {}

  absl::StatusOr<void*> Malloc(size_t bytes) override {
    DeviceGuard guard(device_);
    RelaxedCaptureModeGuard relaxed;
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it
      return absl::ResourceExhaustedError("cudaMalloc: out of memory");
    }
    DT_CUDA_RETURN_IF_ERROR(err);
    return p;
  }

  void Free(void* ptr) override {
    DeviceGuard guard(device_);
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) {
      cudaGetLastError();
      DT_LOG(ERROR) << "cuda:" << device_ << ": cudaFree: " << cudaGetErrorString(err);
    }
  }

  absl::StatusOr<void*> RecordEvent(uintptr_t stream) override { return RecordEventOn(stream); }
  bool EventDone(void* event) override { return EventDoneOn(event); }
  void WaitEvent(void* event) override { WaitEventOn(event); }
  void DestroyEvent(void* event) override { DestroyEventOn(event); }

  std::string MemoryInfo() override {
    DeviceGuard guard(device_);
    RelaxedCaptureModeGuard relaxed;
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
      cudaGetLastError();
      return absl::StrCat("cuda:", device_, " did not report its free memory");
    }
    return absl::StrCat("cuda:", device_, " reports ",
                        FormatBytes(static_cast<int64_t>(free_bytes)), " free of ",
                        FormatBytes(static_cast<int64_t>(total)));
  }

 private:
  int device_;
};

class PinnedMemoryBackend final : public MemoryBackend {
 public:
  absl::StatusOr<void*> Malloc(size_t bytes) override {
    RelaxedCaptureModeGuard relaxed;
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError("cudaHostAlloc: out of pinned memory");
    }
    DT_CUDA_RETURN_IF_ERROR(err);
    return p;
  }
  void Free(void* ptr) override {
    if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
  }
  absl::StatusOr<void*> RecordEvent(uintptr_t stream) override { return RecordEventOn(stream); }
  bool EventDone(void* event) override { return EventDoneOn(event); }
  void WaitEvent(void* event) override { WaitEventOn(event); }
  void DestroyEvent(void* event) override { DestroyEventOn(event); }
  std::string MemoryInfo() override { return "pinned host memory is exhausted"; }
};

struct DeviceTable {
  absl::Mutex mu;
  std::atomic<CachingAllocator*> allocators[kMaxDevices] = {};
};

DeviceTable& Table() {
  static DeviceTable* t = new DeviceTable();
  return *t;
}

// dtrain::Allocator for one device: allocations for the current stream.
class CudaTensorAllocator final : public Allocator {
 public:
  CudaTensorAllocator(int device, CachingAllocator* core) : device_(device), core_(core) {}
  Device device() const override { return Device::Cuda(device_); }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    Stream* s = CurrentStream(device_);
    if (s == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda:", device_, " has no stream (is the device usable?)"));
    }
    return core_->Allocate(bytes, reinterpret_cast<uintptr_t>(s->native_handle()));
  }
  void Deallocate(void* ptr, size_t) override { core_->Free(ptr); }

  AllocatorStats stats() const override {
    CachingAllocatorStats c = core_->stats();
    AllocatorStats s;
    s.bytes_in_use = c.bytes_in_use;
    s.peak_bytes_in_use = c.peak_bytes_in_use;
    s.bytes_cached = c.bytes_cached;
    s.num_allocs = c.num_allocs;
    s.num_cache_hits = c.num_cache_hits;
    return s;
  }
  void ResetPeak() override { core_->ResetPeak(); }
  void EmptyCache() override { core_->EmptyCache(); }

 private:
  int device_;
  CachingAllocator* core_;
};

}  // namespace

absl::StatusOr<CachingAllocator*> DeviceAllocator(int device) {
  DeviceTable& t = Table();
  if (device >= 0 && device < kMaxDevices) {
    CachingAllocator* a = t.allocators[device].load(std::memory_order_acquire);
    if (a != nullptr) return a;
  }
  std::string reason;
  int count = DeviceCount(&reason);
  if (device < 0 || device >= count || device >= kMaxDevices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, " is not available on this machine (",
        count == 0 ? "no CUDA device: " + reason : absl::StrCat(count, " CUDA device(s)"), ")"));
  }
  absl::MutexLock lock(&t.mu);
  CachingAllocator* a = t.allocators[device].load(std::memory_order_acquire);
  if (a == nullptr) {
    // Never destroyed: blocks may be freed during process exit, after static
    // destructors and the CUDA runtime's own teardown would have run.
    a = new CachingAllocator(absl::StrCat("cuda:", device),
                             std::make_unique<CudaMemoryBackend>(device));
    t.allocators[device].store(a, std::memory_order_release);
  }
  return a;
}

CachingAllocatorStats DeviceMemoryStats(int device) {
  if (device < 0 || device >= kMaxDevices) return {};
  CachingAllocator* a = Table().allocators[device].load(std::memory_order_acquire);
  return a == nullptr ? CachingAllocatorStats{} : a->stats();
}

void RecordStream(const Tensor& t, Stream* stream) {
  if (!t.defined() || !t.device().is_cuda() || stream == nullptr) return;
  absl::StatusOr<CachingAllocator*> a = DeviceAllocator(t.device().index);
  if (!a.ok()) return;
  (*a)->RecordStream(t.raw_data(), reinterpret_cast<uintptr_t>(NativeStream(stream)));
}

CachingAllocator& PinnedAllocator() {
  static CachingAllocator* a =
      new CachingAllocator("pinned host memory", std::make_unique<PinnedMemoryBackend>());
  return *a;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  // All pinned blocks share one "stream": they are used by host code, and
  // copies announce themselves with RecordStream.
  absl::StatusOr<void*> p = PinnedAllocator().Allocate(bytes, 0);
  if (!p.ok()) return p.status();
  PinnedBuffer b;
  b.data_ = *p;
  b.size_ = bytes;
  return b;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) PinnedAllocator().Free(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) PinnedAllocator().Free(data_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void PinnedBuffer::RecordStream(Stream* stream) {
  if (data_ != nullptr) {
    PinnedAllocator().RecordStream(data_, reinterpret_cast<uintptr_t>(NativeStream(stream)));
  }
}

Allocator* NewCudaTensorAllocator(int device) {
  absl::StatusOr<CachingAllocator*> a = DeviceAllocator(device);
  if (!a.ok()) return nullptr;
  return new CudaTensorAllocator(device, *a);
}

}  // namespace cuda
}  // namespace dtrain
