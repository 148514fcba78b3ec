#include "libs/data/loader.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/sampler.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;

// `n` samples of 3 x 4 pixels; sample i's first two pixels encode i, the
// rest vary with i and the position, and its label is i % 10.
Dataset MakeDataset(int64_t n) {
  Dataset d;
  d.size = n;
  d.rows = 3;
  d.cols = 4;
  for (int64_t i = 0; i < n; ++i) {
    d.images.push_back(i % 256);
    d.images.push_back(i / 256);
    for (int p = 2; p < 12; ++p) d.images.push_back((i * 31 + p * 7) % 256);
    d.labels.push_back(i % 10);
  }
  return d;
}

int64_t SampleId(const Batch& batch, int64_t k) {
  const float* image = batch.images.data() + k * 12;
  return static_cast<int64_t>(image[0] * 255.0f + 0.5f) +
         256 * static_cast<int64_t>(image[1] * 255.0f + 0.5f);
}

std::unique_ptr<DataLoader> MakeLoader(const Dataset* data, const LoaderOptions& options) {
  absl::StatusOr<std::unique_ptr<DataLoader>> loader = DataLoader::Create(data, options);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return loader.ok() ? *std::move(loader) : nullptr;
}

std::vector<Batch> Epoch(DataLoader* loader, int64_t epoch) {
  std::vector<Batch> batches;
  loader->StartEpoch(epoch);
  Batch batch;
  while (loader->Next(&batch)) batches.push_back(batch);
  return batches;
}

// Runs `fn`, failing the test (and ending the process) if it takes longer
// than `seconds`: a hang is reported as such instead of as a test timeout.
template <typename Fn>
void WithDeadline(double seconds, Fn fn) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread worker([&] {
    fn();
    done.set_value();
  });
  if (finished.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "deadline of %.0f s exceeded: the loader hangs\n", seconds);
    std::abort();
  }
  worker.join();
}

TEST(LoaderTest, BatchesFollowTheShardedEpochOrderAndHoldPixelsOver255) {
  const Dataset data = MakeDataset(103);
  for (int world_size : {1, 3}) {
    for (int rank = 0; rank < world_size; ++rank) {
      LoaderOptions options;
      options.batch_size = 10;
      options.seed = 99;
      options.rank = rank;
      options.world_size = world_size;
      std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
      ASSERT_NE(loader, nullptr);
      for (int64_t epoch : {0, 1}) {
        const std::vector<int64_t> expected =
            *ShardOrder(EpochOrder(103, 99, epoch, true), rank, world_size);
        const std::vector<Batch> batches = Epoch(loader.get(), epoch);
        ASSERT_EQ(static_cast<int64_t>(batches.size()), loader->batches_per_epoch());
        size_t pos = 0;
        for (size_t b = 0; b < batches.size(); ++b) {
          const Batch& batch = batches[b];
          EXPECT_EQ(batch.index, static_cast<int64_t>(b));
          ASSERT_EQ(batch.images.size(), batch.size * 12u);
          ASSERT_EQ(batch.labels.size(), static_cast<size_t>(batch.size));
          for (int64_t k = 0; k < batch.size; ++k, ++pos) {
            ASSERT_LT(pos, expected.size());
            const int64_t sample = expected[pos];
            EXPECT_EQ(batch.labels[k], data.labels[sample]);
            for (int p = 0; p < 12; ++p) {
              EXPECT_EQ(batch.images[k * 12 + p],
                        static_cast<float>(data.images[sample * 12 + p]) / 255.0f);
            }
          }
        }
        EXPECT_EQ(pos, expected.size());
      }
    }
  }
}

TEST(LoaderTest, BatchCounts) {
  const Dataset data = MakeDataset(103);
  struct Case {
    int64_t batch_size;
    int world_size;
    bool drop_last;
    int64_t batches;
    int64_t last_size;
  };
  for (const Case& c :
       {Case{10, 1, false, 11, 3}, Case{10, 1, true, 10, 10}, Case{10, 4, false, 3, 5},
        Case{10, 4, true, 2, 10}, Case{103, 1, false, 1, 103}, Case{1000, 2, false, 1, 51},
        Case{1, 8, true, 12, 1}}) {
    LoaderOptions options;
    options.batch_size = c.batch_size;
    options.world_size = c.world_size;
    options.rank = c.world_size - 1;
    options.drop_last = c.drop_last;
    std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
    ASSERT_NE(loader, nullptr);
    EXPECT_EQ(loader->batches_per_epoch(), c.batches);
    EXPECT_EQ(loader->samples_per_epoch(), 103 / c.world_size);
    const std::vector<Batch> batches = Epoch(loader.get(), 0);
    ASSERT_EQ(static_cast<int64_t>(batches.size()), c.batches);
    EXPECT_EQ(batches.back().size, c.last_size);
    for (size_t b = 0; b + 1 < batches.size(); ++b) EXPECT_EQ(batches[b].size, c.batch_size);
  }
}

TEST(LoaderTest, EverySampleExactlyOncePerEpoch) {
  const Dataset data = MakeDataset(1000);
  LoaderOptions options;
  options.batch_size = 64;
  options.seed = 5;
  std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
  ASSERT_NE(loader, nullptr);
  std::vector<int64_t> previous;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> seen(1000, 0);
    std::vector<int64_t> order;
    for (const Batch& batch : Epoch(loader.get(), epoch)) {
      for (int64_t k = 0; k < batch.size; ++k) {
        const int64_t id = SampleId(batch, k);
        ASSERT_GE(id, 0);
        ASSERT_LT(id, 1000);
        ++seen[id];
        order.push_back(id);
      }
    }
    EXPECT_EQ(seen, std::vector<int>(1000, 1)) << "epoch " << epoch;
    EXPECT_NE(order, previous) << "epoch " << epoch << " repeats the previous order";
    previous = order;
  }
}

TEST(LoaderTest, RanksPartitionTheEpoch) {
  const Dataset data = MakeDataset(1001);
  std::set<int64_t> all;
  for (int rank = 0; rank < 4; ++rank) {
    LoaderOptions options;
    options.batch_size = 32;
    options.seed = 17;
    options.rank = rank;
    options.world_size = 4;
    std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
    ASSERT_NE(loader, nullptr);
    int64_t count = 0;
    for (const Batch& batch : Epoch(loader.get(), 3)) {
      for (int64_t k = 0; k < batch.size; ++k, ++count) {
        EXPECT_TRUE(all.insert(SampleId(batch, k)).second) << "sample on two ranks";
      }
    }
    EXPECT_EQ(count, 250);
  }
  EXPECT_EQ(all.size(), 1000u);
}

TEST(LoaderTest, PrefetchDoesNotChangeTheBatches) {
  const Dataset data = MakeDataset(257);
  for (bool shuffle : {false, true}) {
    for (bool drop_last : {false, true}) {
      LoaderOptions options;
      options.batch_size = 16;
      options.shuffle = shuffle;
      options.drop_last = drop_last;
      options.seed = 3;
      options.rank = 1;
      options.world_size = 2;
      options.prefetch = 0;
      std::unique_ptr<DataLoader> sync = MakeLoader(&data, options);
      options.prefetch = 2;
      std::unique_ptr<DataLoader> async = MakeLoader(&data, options);
      ASSERT_NE(sync, nullptr);
      ASSERT_NE(async, nullptr);
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        const std::vector<Batch> a = Epoch(sync.get(), epoch);
        const std::vector<Batch> b = Epoch(async.get(), epoch);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_EQ(a[i].size, b[i].size);
          EXPECT_EQ(a[i].index, b[i].index);
          EXPECT_EQ(a[i].images, b[i].images);
          EXPECT_EQ(a[i].labels, b[i].labels);
        }
      }
    }
  }
}

TEST(LoaderTest, NextOutsideAnEpochReturnsFalse) {
  const Dataset data = MakeDataset(20);
  for (int prefetch : {0, 2}) {
    LoaderOptions options;
    options.batch_size = 8;
    options.prefetch = prefetch;
    std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
    ASSERT_NE(loader, nullptr);
    Batch batch;
    batch.size = -7;
    EXPECT_FALSE(loader->Next(&batch));  // no epoch started
    EXPECT_EQ(batch.size, -7);
    loader->StartEpoch(0);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(loader->Next(&batch));
    EXPECT_FALSE(loader->Next(&batch));
    EXPECT_FALSE(loader->Next(&batch));
    EXPECT_EQ(batch.index, 2);
  }
}

TEST(LoaderTest, RestartingAnEpochMidwayReplaysIt) {
  const Dataset data = MakeDataset(500);
  LoaderOptions options;
  options.batch_size = 7;
  options.seed = 11;
  std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
  ASSERT_NE(loader, nullptr);
  const std::vector<Batch> full = Epoch(loader.get(), 4);
  loader->StartEpoch(9);
  Batch batch;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(loader->Next(&batch));
  const std::vector<Batch> again = Epoch(loader.get(), 4);
  ASSERT_EQ(full.size(), again.size());
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(full[i].index, again[i].index);
    EXPECT_EQ(full[i].images, again[i].images);
    EXPECT_EQ(full[i].labels, again[i].labels);
  }
}

// A job resumed at batch 30 of an epoch sees exactly the rest of that
// epoch's batches, with or without prefetch, on every rank.
TEST(LoaderTest, StartingAnEpochAtABatchSkipsExactlyTheOnesBefore) {
  const Dataset data = MakeDataset(500);
  for (int prefetch : {0, 2}) {
    for (int rank : {0, 1}) {
      LoaderOptions options;
      options.batch_size = 7;
      options.seed = 11;
      options.rank = rank;
      options.world_size = 2;
      options.prefetch = prefetch;
      std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
      ASSERT_NE(loader, nullptr);
      const std::vector<Batch> full = Epoch(loader.get(), 4);
      ASSERT_EQ(static_cast<int64_t>(full.size()), loader->batches_per_epoch());
      loader->StartEpoch(4, 30);
      Batch batch;
      for (size_t i = 30; i < full.size(); ++i) {
        ASSERT_TRUE(loader->Next(&batch)) << i;
        EXPECT_EQ(batch.index, full[i].index);
        EXPECT_EQ(batch.images, full[i].images);
        EXPECT_EQ(batch.labels, full[i].labels);
      }
      EXPECT_FALSE(loader->Next(&batch));
      loader->StartEpoch(4, loader->batches_per_epoch() + 5);  // past the end: empty
      EXPECT_FALSE(loader->Next(&batch));
    }
  }
}

TEST(LoaderTest, DestroyingMidEpochDoesNotHang) {
  const Dataset data = MakeDataset(2000);
  WithDeadline(60, [&] {
    for (int prefetch : {0, 1, 2, 8}) {
      LoaderOptions options;
      options.batch_size = 3;
      options.prefetch = prefetch;
      // Never started.
      MakeLoader(&data, options).reset();
      // Started, nothing consumed: the producer is filling its queue.
      std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
      loader->StartEpoch(0);
      loader.reset();
      // Partly consumed.
      loader = MakeLoader(&data, options);
      loader->StartEpoch(1);
      Batch batch;
      for (int i = 0; i < 10; ++i) ASSERT_TRUE(loader->Next(&batch));
      loader.reset();
    }
  });
}

TEST(LoaderTest, WaitSecondsAccumulates) {
  const Dataset data = MakeDataset(300);
  LoaderOptions options;
  options.batch_size = 10;
  options.prefetch = 0;
  std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->wait_seconds(), 0.0);
  Epoch(loader.get(), 0);
  const double after_one = loader->wait_seconds();
  EXPECT_GT(after_one, 0.0);
  Epoch(loader.get(), 1);
  EXPECT_GE(loader->wait_seconds(), after_one);
}

// Meant to run under --config=tsan as well: the consumer restarts epochs
// mid-way, reuses one Batch, and another thread polls wait_seconds() while
// the producer fills batches.
TEST(LoaderTest, ConcurrentUseIsRaceFree) {
  const Dataset data = MakeDataset(600);
  for (int prefetch : {1, 3}) {
    LoaderOptions options;
    options.batch_size = 5;
    options.prefetch = prefetch;
    options.seed = 1;
    std::unique_ptr<DataLoader> loader = MakeLoader(&data, options);
    ASSERT_NE(loader, nullptr);
    std::atomic<bool> stop{false};
    std::thread poller([&] {
      double last = 0;
      while (!stop.load()) {
        const double now = loader->wait_seconds();
        EXPECT_GE(now, last);
        last = now;
        std::this_thread::yield();
      }
    });
    Batch batch;
    for (int64_t epoch = 0; epoch < 20; ++epoch) {
      const std::vector<int64_t> expected = EpochOrder(600, 1, epoch, true);
      loader->StartEpoch(epoch);
      const int64_t stop_after = epoch % 3 == 0 ? 7 : loader->batches_per_epoch();
      for (int64_t b = 0; b < stop_after; ++b) {
        ASSERT_TRUE(loader->Next(&batch));
        ASSERT_EQ(batch.index, b);
        for (int64_t k = 0; k < batch.size; ++k) {
          ASSERT_EQ(SampleId(batch, k), expected[b * 5 + k]);
        }
      }
    }
    stop.store(true);
    poller.join();
  }
}

TEST(LoaderTest, RejectsInvalidOptions) {
  const Dataset data = MakeDataset(10);
  struct Case {
    LoaderOptions options;
    const char* message;
  };
  auto with = [](auto set) {
    LoaderOptions o;
    set(o);
    return o;
  };
  const Case cases[] = {
      {with([](LoaderOptions& o) { o.batch_size = 0; }), "batch_size must be positive"},
      {with([](LoaderOptions& o) { o.batch_size = -4; }), "batch_size must be positive"},
      {with([](LoaderOptions& o) { o.world_size = 0; }), "world_size must be at least 1"},
      {with([](LoaderOptions& o) { o.rank = 2, o.world_size = 2; }), "rank must be in"},
      {with([](LoaderOptions& o) { o.rank = -1; }), "rank must be in"},
      {with([](LoaderOptions& o) { o.prefetch = -1; }), "prefetch must be >= 0"},
      {with([](LoaderOptions& o) { o.world_size = 11, o.rank = 3; }), "too few"},
      {with([](LoaderOptions& o) { o.batch_size = 11, o.drop_last = true; }), "no batches"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<DataLoader>> loader = DataLoader::Create(&data, c.options);
    EXPECT_EQ(loader.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(loader.status().message()), HasSubstr(c.message));
  }
  EXPECT_EQ(DataLoader::Create(nullptr, LoaderOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
  Dataset broken = data;
  broken.labels.pop_back();
  EXPECT_THAT(std::string(DataLoader::Create(&broken, LoaderOptions()).status().message()),
              HasSubstr("inconsistent dataset"));
  broken = data;
  broken.images.push_back(0);
  EXPECT_THAT(std::string(DataLoader::Create(&broken, LoaderOptions()).status().message()),
              HasSubstr("inconsistent dataset"));
}

TEST(LoaderTest, FashionMnistEpoch) {
  absl::StatusOr<Dataset> train = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  LoaderOptions options;  // defaults: batch 256, shuffle, seed 0
  std::unique_ptr<DataLoader> loader = MakeLoader(&*train, options);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->batches_per_epoch(), 235);  // 234 full + 96
  const std::vector<int64_t> order = EpochOrder(60000, 0, 0, true);
  loader->StartEpoch(0);
  Batch batch;
  int64_t batches = 0, samples = 0;
  std::vector<int> histogram(10, 0);
  while (loader->Next(&batch)) {
    ASSERT_EQ(batch.images.size(), batch.size * 784u);
    for (int64_t k = 0; k < batch.size; ++k) ++histogram.at(batch.labels[k]);
    if (batches == 0) {
      for (int64_t k = 0; k < batch.size; ++k) {
        EXPECT_EQ(batch.labels[k], train->labels[order[k]]);
        EXPECT_EQ(batch.images[k * 784 + 400],
                  static_cast<float>(train->images[order[k] * 784 + 400]) / 255.0f);
      }
    }
    ++batches;
    samples += batch.size;
  }
  EXPECT_EQ(batches, 235);
  EXPECT_EQ(batch.size, 96);
  EXPECT_EQ(samples, 60000);
  EXPECT_EQ(histogram, std::vector<int>(10, 6000));
}

}  // namespace
}  // namespace dtrain::data
