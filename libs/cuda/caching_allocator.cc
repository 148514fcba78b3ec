#include "libs/cuda/caching_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/logging.h"

namespace dtrain {
namespace cuda {

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", v, units[u]);
}

std::string CachingAllocatorStats::ToString() const {
  return absl::StrCat("in_use=", bytes_in_use, " peak=", peak_bytes_in_use,
                      " cached=", bytes_cached, " pending=", bytes_pending,
                      " reserved=", bytes_reserved, " peak_reserved=", peak_bytes_reserved,
                      " allocs=", num_allocs, " cache_hits=", num_cache_hits,
                      " backend_mallocs=", num_backend_mallocs,
                      " backend_frees=", num_backend_frees, " ooms=", num_ooms,
                      " cache_flushes=", num_cache_flushes);
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  constexpr size_t kSmallStep = 512;
  constexpr size_t kSmallLimit = size_t{1} << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmallLimit) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  size_t p = kSmallLimit;
  while (p * 2 <= bytes) p *= 2;
  const size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::CachingAllocator(std::string name, std::unique_ptr<MemoryBackend> backend)
    : name_(std::move(name)), backend_(std::move(backend)) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  WaitPendingLocked();
  ReleaseCachedLocked();
}

bool CachingAllocator::StreamCapturingLocked(StreamId s) const {
  return capturing_.find(s) != capturing_.end();
}

void CachingAllocator::ReturnToBinLocked(Block* b) {
  if (b->pool != kDefaultPool) {
    auto it = pool_released_.find(b->pool);
    if (it == pool_released_.end() || it->second) b->pool = kDefaultPool;
  }
  bins_[BinKey(b->pool, b->stream, b->size)].push_back(b);
  stats_.bytes_cached += static_cast<int64_t>(b->size);
}

void CachingAllocator::RecordEventsLocked(Block* b) {
  for (StreamId s : b->other_streams) {
    absl::StatusOr<void*> ev = backend_->RecordEvent(s);
    if (!ev.ok()) {
      // Without an event we cannot tell when the other stream is done with
      // the block: keep it out of circulation rather than risk a race.
      DT_LOG(ERROR) << name_ << ": cannot record an event for a freed block ("
                    << ev.status().message() << "); " << b->size << " bytes will not be reused";
      continue;
    }
    pending_.emplace_back(*ev, b);
    ++b->pending_events;
  }
  b->other_streams.clear();
  // Counted as pending until its events complete (forever if every
  // RecordEvent failed).
  stats_.bytes_pending += static_cast<int64_t>(b->size);
}

void CachingAllocator::ProcessPendingLocked() {
  if (pending_.empty()) return;
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    auto [ev, b] = pending_[i];
    if (backend_->EventDone(ev)) {
      backend_->DestroyEvent(ev);
      if (--b->pending_events == 0) {
        stats_.bytes_pending -= static_cast<int64_t>(b->size);
        ReturnToBinLocked(b);
      }
    } else {
      pending_[keep++] = pending_[i];
    }
  }
  pending_.resize(keep);
}

void CachingAllocator::WaitPendingLocked() {
  for (auto& [ev, b] : pending_) {
    backend_->WaitEvent(ev);
    backend_->DestroyEvent(ev);
    if (--b->pending_events == 0) {
      stats_.bytes_pending -= static_cast<int64_t>(b->size);
      ReturnToBinLocked(b);
    }
  }
  pending_.clear();
}

int64_t CachingAllocator::ReleaseCachedLocked() {
  int64_t freed = 0;
  for (auto it = bins_.begin(); it != bins_.end();) {
    if (std::get<0>(it->first) != kDefaultPool) {
      ++it;
      continue;
    }
    for (Block* b : it->second) {
      backend_->Free(b->ptr);
      freed += static_cast<int64_t>(b->size);
      ++stats_.num_backend_frees;
      blocks_.erase(reinterpret_cast<uintptr_t>(b->ptr));  // destroys b
    }
    bins_.erase(it++);
  }
  stats_.bytes_cached -= freed;
  stats_.bytes_reserved -= freed;
  return freed;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes, StreamId stream) {
  const size_t size = RoundSize(bytes);
  absl::MutexLock lock(&mu_);
  ProcessPendingLocked();
  PoolId pool = kDefaultPool;
  auto cap = capturing_.find(stream);
  if (cap != capturing_.end()) pool = cap->second;

  auto account = [&](Block* b) {
    b->in_use = true;
    stats_.bytes_in_use += static_cast<int64_t>(b->size);
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    ++stats_.num_allocs;
    return b->ptr;
  };

  auto bin = bins_.find(BinKey(pool, stream, size));
  if (bin != bins_.end() && !bin->second.empty()) {
    Block* b = bin->second.back();
    bin->second.pop_back();
    stats_.bytes_cached -= static_cast<int64_t>(b->size);
    ++stats_.num_cache_hits;
    return account(b);
  }

  absl::StatusOr<void*> p = backend_->Malloc(size);
  if (!p.ok() && absl::IsResourceExhausted(p.status()) && capturing_.empty()) {
    // Give the cache back and retry once.
    WaitPendingLocked();
    if (stats_.bytes_cached > 0) {
      ++stats_.num_cache_flushes;
      ReleaseCachedLocked();
      p = backend_->Malloc(size);
    }
  }
  if (!p.ok()) {
    if (!absl::IsResourceExhausted(p.status())) {
      return absl::Status(p.status().code(), absl::StrCat(name_, ": allocating ", bytes,
                                                          " bytes: ", p.status().message()));
    }
    ++stats_.num_ooms;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: out of memory allocating %d bytes (size class %d): %s in use by tensors (peak %s), "
        "%s cached, %s waiting for other streams, %s reserved in all%s; %s",
        name_, bytes, size, FormatBytes(stats_.bytes_in_use), FormatBytes(stats_.peak_bytes_in_use),
        FormatBytes(stats_.bytes_cached), FormatBytes(stats_.bytes_pending),
        FormatBytes(stats_.bytes_reserved),
        capturing_.empty() ? "" : " (a CUDA graph capture is filling a private pool)",
        backend_->MemoryInfo()));
  }
  auto block = std::make_unique<Block>();
  block->ptr = *p;
  block->size = size;
  block->stream = stream;
  block->pool = pool;
  Block* b = block.get();
  blocks_[reinterpret_cast<uintptr_t>(*p)] = std::move(block);
  ++stats_.num_backend_mallocs;
  stats_.bytes_reserved += static_cast<int64_t>(size);
  stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, stats_.bytes_reserved);
  return account(b);
}

void CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  DT_CHECK(it != blocks_.end() && it->second->in_use)
      << name_ << ": freeing " << ptr << ", which is not a block in use";
  Block* b = it->second.get();
  b->in_use = false;
  stats_.bytes_in_use -= static_cast<int64_t>(b->size);
  if (b->other_streams.empty()) {
    ReturnToBinLocked(b);
    return;
  }
  bool capture = false;
  for (StreamId s : b->other_streams) capture = capture || StreamCapturingLocked(s);
  if (capture) {
    deferred_.push_back(b);
    stats_.bytes_pending += static_cast<int64_t>(b->size);
    return;
  }
  RecordEventsLocked(b);
}

void CachingAllocator::RecordStream(void* ptr, StreamId stream) {
  absl::MutexLock lock(&mu_);
  // `ptr` may point inside a block (a view of a tensor).
  auto it = blocks_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
  Block* b = nullptr;
  if (it != blocks_.begin()) {
    --it;
    uintptr_t start = it->first, p = reinterpret_cast<uintptr_t>(ptr);
    if (p < start + it->second->size) b = it->second.get();
  }
  DT_CHECK(b != nullptr && b->in_use)
      << name_ << ": RecordStream on " << ptr << ", which is not in a block in use";
  if (stream == b->stream) return;
  if (std::find(b->other_streams.begin(), b->other_streams.end(), stream) !=
      b->other_streams.end()) {
    return;
  }
  b->other_streams.push_back(stream);
}

size_t CachingAllocator::BlockSize(const void* ptr) const {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  return it == blocks_.end() || !it->second->in_use ? 0 : it->second->size;
}

CachingAllocator::PoolId CachingAllocator::BeginPrivatePool(StreamId stream) {
  absl::MutexLock lock(&mu_);
  DT_CHECK(!StreamCapturingLocked(stream))
      << name_ << ": a private pool is already being filled on this stream";
  PoolId id = next_pool_++;
  capturing_[stream] = id;
  pool_released_[id] = false;
  return id;
}

void CachingAllocator::EndPrivatePool(StreamId stream) {
  absl::MutexLock lock(&mu_);
  capturing_.erase(stream);
  std::vector<Block*> deferred;
  deferred.swap(deferred_);
  for (Block* b : deferred) {
    bool still = false;
    for (StreamId s : b->other_streams) still = still || StreamCapturingLocked(s);
    if (still) {
      deferred_.push_back(b);
      continue;
    }
    stats_.bytes_pending -= static_cast<int64_t>(b->size);
    RecordEventsLocked(b);
  }
}

void CachingAllocator::ReleasePrivatePool(PoolId pool) {
  absl::MutexLock lock(&mu_);
  auto it = pool_released_.find(pool);
  if (it == pool_released_.end() || it->second) return;
  it->second = true;
  // Move the pool's cached blocks to the common bins.
  std::vector<BinKey> keys;
  for (auto& [key, blocks] : bins_) {
    if (std::get<0>(key) == pool) keys.push_back(key);
  }
  for (const BinKey& key : keys) {
    std::vector<Block*> blocks = std::move(bins_[key]);
    bins_.erase(key);
    for (Block* b : blocks) {
      stats_.bytes_cached -= static_cast<int64_t>(b->size);
      b->pool = kDefaultPool;
      ReturnToBinLocked(b);
    }
  }
  // Blocks of the pool still in use become common when freed
  // (ReturnToBinLocked sees the pool released); the entry stays so.
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  if (!capturing_.empty()) return;
  WaitPendingLocked();
  ReleaseCachedLocked();
}

CachingAllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  absl::MutexLock lock(&mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
}

}  // namespace cuda
}  // namespace dtrain
