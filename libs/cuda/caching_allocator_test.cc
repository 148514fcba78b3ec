// The caching rules of CachingAllocator against a fake device whose memory
// and events the test controls. Runs on every machine.
#include "libs/cuda/caching_allocator.h"

#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace cuda {
namespace {

// What the fake device knows; shared between the test and the backend.
struct FakeDevice {
  absl::Mutex mu;
  int64_t capacity = int64_t{1} << 40;
  int64_t used = 0;
  uintptr_t next = 1 << 20;
  std::map<uintptr_t, size_t> live;
  int64_t mallocs = 0, frees = 0;
  struct Event {
    uintptr_t stream;
    bool done = false;
  };
  std::set<Event*> events;
  int64_t events_recorded = 0, events_destroyed = 0;

  // Completes every event recorded on `stream` so far.
  void Complete(uintptr_t stream) {
    absl::MutexLock lock(&mu);
    for (Event* e : events) {
      if (e->stream == stream) e->done = true;
    }
  }
};

class FakeBackend : public MemoryBackend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeDevice> dev) : dev_(std::move(dev)) {}

  absl::StatusOr<void*> Malloc(size_t bytes) override {
    absl::MutexLock lock(&dev_->mu);
    if (dev_->used + static_cast<int64_t>(bytes) > dev_->capacity) {
      return absl::ResourceExhaustedError("fake: out of memory");
    }
    uintptr_t p = dev_->next;
    dev_->next += (bytes + 4095) / 4096 * 4096 + 4096;
    dev_->used += static_cast<int64_t>(bytes);
    dev_->live[p] = bytes;
    ++dev_->mallocs;
    return reinterpret_cast<void*>(p);
  }
  void Free(void* ptr) override {
    absl::MutexLock lock(&dev_->mu);
    auto it = dev_->live.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_TRUE(it != dev_->live.end()) << "freeing unknown " << ptr;
    dev_->used -= static_cast<int64_t>(it->second);
    dev_->live.erase(it);
    ++dev_->frees;
  }
  absl::StatusOr<void*> RecordEvent(uintptr_t stream) override {
    absl::MutexLock lock(&dev_->mu);
    auto* e = new FakeDevice::Event{stream};
    dev_->events.insert(e);
    ++dev_->events_recorded;
    return static_cast<void*>(e);
  }
  bool EventDone(void* event) override {
    absl::MutexLock lock(&dev_->mu);
    return static_cast<FakeDevice::Event*>(event)->done;
  }
  void WaitEvent(void* event) override {
    absl::MutexLock lock(&dev_->mu);
    static_cast<FakeDevice::Event*>(event)->done = true;  // "waits" until done
  }
  void DestroyEvent(void* event) override {
    absl::MutexLock lock(&dev_->mu);
    auto* e = static_cast<FakeDevice::Event*>(event);
    dev_->events.erase(e);
    delete e;
    ++dev_->events_destroyed;
  }
  std::string MemoryInfo() override {
    absl::MutexLock lock(&dev_->mu);
    return absl::StrCat("the fake device has ", dev_->capacity - dev_->used, " bytes free of ",
                        dev_->capacity);
  }

 private:
  std::shared_ptr<FakeDevice> dev_;
};

constexpr uintptr_t kS1 = 0x1000, kS2 = 0x2000;

class CachingAllocatorTest : public ::testing::Test {
 protected:
  CachingAllocatorTest()
      : dev_(std::make_shared<FakeDevice>()),
        alloc_(std::make_unique<CachingAllocator>("fake:0", std::make_unique<FakeBackend>(dev_))) {}

  void* Alloc(size_t bytes, uintptr_t stream) {
    absl::StatusOr<void*> p = alloc_->Allocate(bytes, stream);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }

  std::shared_ptr<FakeDevice> dev_;
  std::unique_ptr<CachingAllocator> alloc_;
};

TEST(RoundSizeTest, SizeClasses) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((1 << 20) + 1), (size_t{1} << 20) + (128 << 10));
  EXPECT_EQ(CachingAllocator::RoundSize(3 << 20), size_t{3} << 20);
  std::mt19937_64 rng(7);
  size_t prev_in = 0, prev_out = 0;
  std::vector<size_t> sizes;
  for (int i = 0; i < 20000; ++i) sizes.push_back(rng() % (size_t{1} << (10 + i % 24)));
  std::sort(sizes.begin(), sizes.end());
  for (size_t b : sizes) {
    size_t r = CachingAllocator::RoundSize(b);
    ASSERT_GE(r, b);
    ASSERT_LE(static_cast<double>(r), static_cast<double>(b) * 1.125 + 512) << b;
    ASSERT_EQ(r % 512, 0u) << b;
    ASSERT_EQ(CachingAllocator::RoundSize(r), r) << "a class rounds to itself: " << b;
    if (b >= prev_in) {
      ASSERT_GE(r, prev_out) << "monotonic at " << b;
    }
    prev_in = b;
    prev_out = r;
  }
}

TEST_F(CachingAllocatorTest, ReusesAFreedBlockOnTheSameStream) {
  void* a = Alloc(1000, kS1);
  alloc_->Free(a);
  EXPECT_EQ(Alloc(900, kS1), a);  // same size class
  CachingAllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.num_allocs, 2);
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_backend_mallocs, 1);
  EXPECT_EQ(s.bytes_in_use, 1024);
  EXPECT_EQ(s.bytes_cached, 0);
  EXPECT_EQ(alloc_->BlockSize(a), 1024u);
}

TEST_F(CachingAllocatorTest, DifferentSizeClassesDoNotShare) {
  void* a = Alloc(1000, kS1);
  alloc_->Free(a);
  void* b = Alloc(5000, kS1);
  EXPECT_NE(a, b);
  EXPECT_EQ(alloc_->stats().bytes_cached, 1024);
}

TEST_F(CachingAllocatorTest, NeverReusesAcrossStreams) {
  void* a = Alloc(1000, kS1);
  alloc_->Free(a);
  void* b = Alloc(1000, kS2);
  EXPECT_NE(a, b);
  EXPECT_EQ(dev_->mallocs, 2);
  alloc_->Free(b);
  EXPECT_EQ(Alloc(1000, kS1), a);
  EXPECT_EQ(Alloc(1000, kS2), b);
}

TEST_F(CachingAllocatorTest, RecordStreamDelaysReuseUntilTheOtherStreamIsDone) {
  void* a = Alloc(4096, kS1);
  alloc_->RecordStream(static_cast<char*>(a) + 100, kS2);  // a pointer inside the block
  alloc_->Free(a);
  EXPECT_EQ(dev_->events_recorded, 1);
  EXPECT_EQ(alloc_->stats().bytes_pending, 4096);
  void* b = Alloc(4096, kS1);
  EXPECT_NE(b, a) << "reused while stream 2 may still read it";
  alloc_->Free(b);
  dev_->Complete(kS2);
  void* c = Alloc(4096, kS1);
  // Both a and b are free now; either may come back, but a must be free.
  EXPECT_TRUE(c == a || c == b);
  EXPECT_EQ(alloc_->stats().bytes_pending, 0);
  EXPECT_EQ(dev_->events_destroyed, 1);
  void* d = Alloc(4096, kS1);
  EXPECT_TRUE((d == a || d == b) && d != c);
}

TEST_F(CachingAllocatorTest, RecordStreamOnItsOwnStreamNeedsNoEvent) {
  void* a = Alloc(4096, kS1);
  alloc_->RecordStream(a, kS1);
  alloc_->Free(a);
  EXPECT_EQ(dev_->events_recorded, 0);
  EXPECT_EQ(Alloc(4096, kS1), a);
}

TEST_F(CachingAllocatorTest, OutOfMemoryFreesTheCacheAndRetries) {
  dev_->capacity = 12 << 10;
  void* a = Alloc(8 << 10, kS1);
  alloc_->Free(a);                // cached on stream 1
  void* b = Alloc(8 << 10, kS2);  // needs the cached block's memory
  ASSERT_NE(b, nullptr);
  CachingAllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.num_cache_flushes, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.bytes_cached, 0);
  EXPECT_EQ(s.bytes_reserved, 8 << 10);
  EXPECT_EQ(dev_->frees, 1);
}

TEST_F(CachingAllocatorTest, OutOfMemorySaysWhatWasAskedAndWhatIsHeld) {
  dev_->capacity = 4096;
  void* a = Alloc(3000, kS1);
  ASSERT_NE(a, nullptr);
  absl::StatusOr<void*> p = alloc_->Allocate(2048, kS1);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(p.status().message());
  EXPECT_NE(msg.find("fake:0: out of memory allocating 2048 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3.0 KiB in use by tensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the fake device has 1024 bytes free of 4096"), std::string::npos) << msg;
  EXPECT_EQ(alloc_->stats().num_ooms, 1);
}

TEST_F(CachingAllocatorTest, StatsTrackUseCacheAndPeak) {
  void* a = Alloc(1 << 20, kS1);
  void* b = Alloc(1 << 20, kS1);
  alloc_->Free(a);
  CachingAllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.bytes_in_use, 1 << 20);
  EXPECT_EQ(s.peak_bytes_in_use, 2 << 20);
  EXPECT_EQ(s.bytes_cached, 1 << 20);
  EXPECT_EQ(s.bytes_reserved, 2 << 20);
  alloc_->ResetPeak();
  EXPECT_EQ(alloc_->stats().peak_bytes_in_use, 1 << 20);
  alloc_->Free(b);
  alloc_->EmptyCache();
  s = alloc_->stats();
  EXPECT_EQ(s.bytes_cached, 0);
  EXPECT_EQ(s.bytes_reserved, 0);
  EXPECT_EQ(s.num_backend_frees, 2);
  EXPECT_EQ(dev_->used, 0);
}

TEST_F(CachingAllocatorTest, EmptyCacheWaitsForPendingBlocks) {
  void* a = Alloc(4096, kS1);
  alloc_->RecordStream(a, kS2);
  alloc_->Free(a);
  alloc_->EmptyCache();
  EXPECT_EQ(dev_->frees, 1);
  EXPECT_EQ(alloc_->stats().bytes_pending, 0);
  EXPECT_EQ(dev_->events_destroyed, 1);
}

TEST_F(CachingAllocatorTest, PrivatePoolKeepsItsBlocksUntilReleased) {
  void* outside = Alloc(4096, kS1);
  alloc_->Free(outside);  // cached in the common bins of stream 1
  auto pool = alloc_->BeginPrivatePool(kS1);
  void* in_pool = Alloc(4096, kS1);
  EXPECT_NE(in_pool, outside) << "a capture must not take common blocks";
  alloc_->Free(in_pool);
  void* again = Alloc(4096, kS1);
  EXPECT_EQ(again, in_pool) << "blocks are reused within the pool";
  alloc_->Free(again);
  alloc_->EmptyCache();  // no-op while a pool is being filled
  EXPECT_EQ(dev_->frees, 0);
  alloc_->EndPrivatePool(kS1);
  void* after = Alloc(4096, kS1);
  EXPECT_EQ(after, outside) << "the pool's block stays reserved for the graph";
  void* after2 = Alloc(4096, kS1);
  EXPECT_NE(after2, in_pool);
  alloc_->ReleasePrivatePool(pool);
  void* freed = Alloc(4096, kS1);
  EXPECT_EQ(freed, in_pool) << "released pool blocks join the common bins";
}

TEST_F(CachingAllocatorTest, BlocksInUseWhenThePoolIsReleasedBecomeCommon) {
  auto pool = alloc_->BeginPrivatePool(kS1);
  void* a = Alloc(4096, kS1);
  alloc_->EndPrivatePool(kS1);
  alloc_->ReleasePrivatePool(pool);
  alloc_->Free(a);
  EXPECT_EQ(Alloc(4096, kS1), a);
}

TEST_F(CachingAllocatorTest, FreesOfBlocksUsedByACaptureAreDeferred) {
  void* a = Alloc(4096, kS1);
  auto pool = alloc_->BeginPrivatePool(kS2);
  alloc_->RecordStream(a, kS2);
  alloc_->Free(a);
  EXPECT_EQ(dev_->events_recorded, 0) << "no event may be recorded on a capturing stream";
  alloc_->EndPrivatePool(kS2);
  EXPECT_EQ(dev_->events_recorded, 1);
  dev_->Complete(kS2);
  EXPECT_EQ(Alloc(4096, kS1), a);
  alloc_->ReleasePrivatePool(pool);
}

TEST_F(CachingAllocatorTest, AllocateZeroGivesUniquePointers) {
  void* a = Alloc(0, kS1);
  void* b = Alloc(0, kS1);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
}

TEST_F(CachingAllocatorTest, FreeingAnUnknownPointerIsFatal) {
  EXPECT_DEATH(alloc_->Free(reinterpret_cast<void*>(0x1234)), "not a block in use");
}

TEST_F(CachingAllocatorTest, ConcurrentThreadsKeepTheBooksStraight) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      std::mt19937 rng(t);
      const uintptr_t stream = 0x100 * (t + 1);
      std::vector<void*> held;
      for (int i = 0; i < 2000; ++i) {
        if (held.empty() || rng() % 3 != 0) {
          absl::StatusOr<void*> p = alloc_->Allocate(rng() % 100000, stream);
          ASSERT_TRUE(p.ok());
          held.push_back(*p);
        } else {
          size_t k = rng() % held.size();
          alloc_->Free(held[k]);
          held.erase(held.begin() + static_cast<long>(k));
        }
      }
      for (void* p : held) alloc_->Free(p);
    });
  }
  for (auto& th : threads) th.join();
  CachingAllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_EQ(s.bytes_reserved, s.bytes_cached);
  alloc_->EmptyCache();
  EXPECT_EQ(dev_->used, 0);
  EXPECT_TRUE(dev_->live.empty());
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
