// A caching allocator for device memory (and pinned host memory), with the
// device left abstract so the caching logic is testable without a GPU.
//
//   CachingAllocator alloc("cuda:0", std::make_unique<CudaMemoryBackend>(0));
//   DT_ASSIGN_OR_RETURN(void* p, alloc.Allocate(bytes, stream));
//   ...                       // kernels on `stream` use p
//   alloc.Free(p);            // cached; reused by the next Allocate on `stream`
//
// Size classes. Requests are rounded up to a size class (RoundSize): 512-byte
// multiples up to 1 MiB, then eight classes per power of two (at most 12.5%
// slack). Freed blocks go to a bin per (pool, stream, size class) and a
// request takes a block from its own bin only: a training step that allocates
// the same shapes every step stops calling the backend after the first step.
//
// Streams. Device work is asynchronous: when the host frees a block, kernels
// enqueued on its stream may still be using it. Reusing it for the next
// request on the same stream is safe (stream order runs the new user after
// the old ones); reusing it on another stream is not, so a block only ever
// returns to its own stream's bins. A block used on further streams
// (RecordStream) gets one event per such stream when it is freed, and joins
// its bin once all of them have completed.
//
// Out of memory. When the backend has no memory left, the allocator waits for
// pending events, returns every cached block to the backend and tries once
// more; if that fails too, Allocate returns ResourceExhausted saying what was
// asked, what tensors hold, what is cached and what the device reports free.
//
// Private pools (CUDA graphs). Between BeginPrivatePool(stream) and
// EndPrivatePool(stream), allocations on `stream` come from a pool of their
// own, and blocks of that pool go back only to it, even after the capture
// ends: a captured graph replays into the same addresses, so nobody else may
// get them while the graph lives. ReleasePrivatePool (when the graph is
// destroyed) returns the pool's blocks to the common bins. No memory is
// returned to the backend while a private pool is being filled (a cudaFree
// would break the capture).
//
// Thread-safe.
#ifndef DTRAIN_LIBS_CUDA_CACHING_ALLOCATOR_H_
#define DTRAIN_LIBS_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {
namespace cuda {

// What the caching allocator needs from the memory it manages. Streams and
// events are opaque handles (cudaStream_t and cudaEvent_t for CUDA).
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  // `bytes` of fresh memory; ResourceExhausted when none is left.
  virtual absl::StatusOr<void*> Malloc(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // An event recorded now on `stream`. EventDone polls it (true once the work
  // enqueued before it has completed), WaitEvent blocks until then.
  virtual absl::StatusOr<void*> RecordEvent(uintptr_t stream) = 0;
  virtual bool EventDone(void* event) = 0;
  virtual void WaitEvent(void* event) = 0;
  virtual void DestroyEvent(void* event) = 0;
  // A short phrase on the memory left, for out-of-memory errors
  // ("the device has 1.2 GiB free of 80 GiB").
  virtual std::string MemoryInfo() = 0;
};

struct CachingAllocatorStats {
  int64_t bytes_in_use = 0;         // handed out (size classes) and not yet freed
  int64_t peak_bytes_in_use = 0;    // since start or ResetPeak()
  int64_t bytes_cached = 0;         // in bins, ready for reuse
  int64_t bytes_pending = 0;        // freed, waiting for other streams' events
  int64_t bytes_reserved = 0;       // obtained from the backend and not returned
  int64_t peak_bytes_reserved = 0;  // since start or ResetPeak()
  int64_t num_allocs = 0;           // successful Allocate calls
  int64_t num_cache_hits = 0;       // ... served from a bin
  int64_t num_backend_mallocs = 0;  // backend Malloc calls that succeeded
  int64_t num_backend_frees = 0;    // blocks returned to the backend
  int64_t num_ooms = 0;             // Allocate calls that failed for lack of memory
  int64_t num_cache_flushes = 0;    // times the cache was emptied to retry an allocation
  std::string ToString() const;
};

class CachingAllocator {
 public:
  using StreamId = uintptr_t;
  using PoolId = uint64_t;
  static constexpr PoolId kDefaultPool = 0;

  // `name` prefixes error messages ("cuda:0").
  CachingAllocator(std::string name, std::unique_ptr<MemoryBackend> backend);
  // Returns cached blocks to the backend. Blocks still in use are not freed.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` bytes (at least one byte: Allocate(0) gives a
  // unique pointer) for use on `stream`.
  absl::StatusOr<void*> Allocate(size_t bytes, StreamId stream);
  // Returns a block from Allocate. Fatal for a pointer this allocator does not
  // hold (a double free is a bug in our own code).
  void Free(void* ptr);
  // Marks the block holding `ptr` (which may point inside it) as used on
  // `stream` too (a tensor read by a copy stream, say); see the file comment.
  void RecordStream(void* ptr, StreamId stream);
  // The size class of a block in use, or 0 for an unknown pointer.
  size_t BlockSize(const void* ptr) const;

  PoolId BeginPrivatePool(StreamId stream);
  void EndPrivatePool(StreamId stream);
  void ReleasePrivatePool(PoolId pool);

  // Returns every cached block (of the common bins) to the backend, after
  // waiting for pending events. Does nothing while a private pool is being
  // filled.
  void EmptyCache();

  CachingAllocatorStats stats() const;
  void ResetPeak();

  // The size class of a request of `bytes` bytes.
  static size_t RoundSize(size_t bytes);

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    StreamId stream = 0;
    PoolId pool = kDefaultPool;
    bool in_use = false;
    int pending_events = 0;
    absl::InlinedVector<StreamId, 2> other_streams;
  };
  using BinKey = std::tuple<PoolId, StreamId, size_t>;

  void ProcessPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WaitPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReturnToBinLocked(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordEventsLocked(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the cached blocks of the common bins; returns the bytes freed.
  int64_t ReleaseCachedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StreamCapturingLocked(StreamId s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const std::unique_ptr<MemoryBackend> backend_;

  mutable absl::Mutex mu_;
  CachingAllocatorStats stats_ ABSL_GUARDED_BY(mu_);
  // Every block obtained from the backend, by address (ordered: RecordStream
  // accepts pointers into a block).
  std::map<uintptr_t, std::unique_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BinKey, std::vector<Block*>> bins_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<void*, Block*>> pending_ ABSL_GUARDED_BY(mu_);
  // Freed blocks used on a stream that was being captured at the time: their
  // events are recorded when that capture ends.
  std::vector<Block*> deferred_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StreamId, PoolId> capturing_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PoolId, bool> pool_released_ ABSL_GUARDED_BY(mu_);
  PoolId next_pool_ ABSL_GUARDED_BY(mu_) = 1;
};

// "1.5 GiB", "512 B": for messages.
std::string FormatBytes(int64_t bytes);

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_CACHING_ALLOCATOR_H_
