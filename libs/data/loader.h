// Batches of Fashion-MNIST-style samples for a training loop, prepared ahead
// of time by a background thread.
//
//   LoaderOptions options;
//   options.batch_size = 256;
//   options.seed = flags.seed;
//   options.rank = rank;
//   options.world_size = world_size;
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<DataLoader> loader, DataLoader::Create(&train, options));
//   Batch batch;
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader->StartEpoch(epoch);
//     while (loader->Next(&batch)) Step(batch);
//   }
//
// Order. In epoch e, rank r visits
//   ShardOrder(EpochOrder(data.size, seed, e, shuffle), r, world_size)
// (see sampler.h; epoch_order.py reproduces it in Python) cut into
// consecutive batches of batch_size samples. The last batch may be smaller
// unless drop_last is set, in which case it is dropped. Every rank gets the
// same number of batches. The batches do not depend on `prefetch` or
// `threads`.
//
// Batches hold plain host buffers: images as floats laid out
// N x channels x rows x cols, and labels as int32. An in-memory dataset's
// pixels become pixel / 255 (so in [0, 1], no further normalization); a
// Source's samples are decoded and go through the dataset's transforms,
// whose random choices are seeded by SampleSeed(seed, epoch, sample index),
// so they too depend on nothing but the batch's place.
//
// Threads: `threads` background threads prepare whole batches (several at
// once when threads > 1), up to max(prefetch, threads) batches ahead.
// A sample that fails to read or decode (a file changed after the checks
// at open) ends the epoch early: Next() returns false and status() says
// which file. Next() swaps the loader's buffers with those of the Batch passed in,
// so a loop that reuses one Batch object does not allocate after warm-up.
//
// Thread-safety: a DataLoader is driven by one thread at a time (calls to
// StartEpoch and Next must not overlap); batches_per_epoch(), the
// statistics and status() may be called from any thread. The Dataset must outlive the
// DataLoader and must not change while it exists.
#ifndef DTRAIN_LIBS_DATA_LOADER_H_
#define DTRAIN_LIBS_DATA_LOADER_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/dataset.h"

namespace dtrain::data {

struct LoaderOptions {
  int64_t batch_size = 256;  // samples per batch, per rank; > 0
  bool shuffle = true;       // false: dataset order (then sharded)
  uint64_t seed = 0;         // shuffle seed; the same on every rank
  int rank = 0;              // this process's index, 0 <= rank < world_size
  int world_size = 1;        // number of data-parallel processes, >= 1
  bool drop_last = false;    // drop a final batch smaller than batch_size
  int prefetch = 2;          // batches prepared ahead by background threads;
                             // 0 = prepare each batch inside Next(), no thread
  int threads = 1;           // background threads (with prefetch > 0), >= 1
};

struct Batch {
  int64_t size = 0;             // samples in this batch (<= batch_size)
  int64_t index = 0;            // position of the batch within the epoch, from 0
  std::vector<float> images;    // size x channels x rows x cols
  std::vector<int32_t> labels;  // size class indices
};

class DataLoader {
 public:
  // Returns a loader over `data` (not owned), or InvalidArgument when the
  // options are out of range, `data` is null or inconsistent, or the options
  // leave this rank no batch at all (e.g. fewer samples per rank than
  // batch_size with drop_last).
  static absl::StatusOr<std::unique_ptr<DataLoader>> Create(const Dataset* data,
                                                            LoaderOptions options);

  // Stops the background thread; waits at most for the batch it is filling,
  // also when the epoch is not finished.
  ~DataLoader();

  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Begins `epoch` (any value; usually 0, 1, 2, ...): the next Next() returns
  // its first batch. Abandons what is left of the previous epoch, so it may
  // also be called mid-epoch, and calling it again with the same epoch
  // replays the same batches. `first_batch` > 0 starts the epoch at that
  // batch (a job resumed mid-epoch): the batches before it are skipped
  // without being prepared, and the rest are exactly those of the whole
  // epoch from that index on (clamped to batches_per_epoch()).
  void StartEpoch(int64_t epoch, int64_t first_batch = 0);

  // Moves the next batch of the epoch into `*out` and returns true, or
  // returns false (leaving `*out` alone) when the epoch is over or no epoch
  // has been started. May block until the background thread has the batch.
  bool Next(Batch* out);

  // Batches Next() yields per epoch; the same on every rank.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

  // Samples this rank visits per epoch: floor(data.size / world_size).
  int64_t samples_per_epoch() const { return samples_per_epoch_; }

  // Total seconds Next() has spent waiting for batches since Create: blocked
  // on the background thread, or with prefetch == 0 preparing them itself.
  // Compare with step time to see whether training is input-bound.
  double wait_seconds() const;

  // OK, or the first sample that failed to read or decode; once set, Next()
  // returns false until the loader is destroyed.
  absl::Status status() const;

  // Samples prepared so far, and the thread-seconds spent preparing them
  // (reading, decoding, transforming): their ratio is the decode rate per
  // thread. Batches ready and waiting for Next().
  int64_t samples_prepared() const;
  double prepare_seconds() const;
  int64_t queue_depth() const;

 private:
  DataLoader(const Dataset* data, const LoaderOptions& options, int64_t samples_per_epoch,
             int64_t batches_per_epoch);

  // Fills `*out` with batch `index` of `order` in `epoch`. Reads only
  // immutable state.
  absl::Status Fill(const std::vector<int64_t>& order, int64_t epoch, int64_t index,
                    Batch* out) const;
  void ProducerLoop();
  bool ProducerHasWork() const;  // requires mu_

  const Dataset* const data_;
  const LoaderOptions options_;
  const int64_t samples_per_epoch_;
  const int64_t batches_per_epoch_;
  const int64_t depth_;     // batches prepared ahead
  float pixel_value_[256];  // pixel_value_[p] = p / 255.0f

  // std::mutex rather than absl::Mutex: the system Abseil is not built with
  // ThreadSanitizer annotations, so TSan cannot see absl::Mutex's ordering.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // wakes the producer: work or shutdown
  std::condition_variable ready_cv_;  // wakes Next(): a batch is ready
  // Guarded by mu_:
  bool shutdown_ = false;
  bool started_ = false;
  uint64_t generation_ = 0;                            // incremented by StartEpoch
  std::shared_ptr<const std::vector<int64_t>> order_;  // this rank's samples this epoch
  int64_t epoch_ = 0;
  int64_t next_to_fill_ = 0;        // batch index the producers fill next
  int64_t next_to_return_ = 0;      // batch index Next() returns next
  std::map<int64_t, Batch> ready_;  // filled batches by index (>= next_to_return_)
  std::vector<Batch> spare_;        // buffers to reuse
  double wait_seconds_ = 0;
  absl::Status failure_;
  int64_t samples_prepared_ = 0;
  double prepare_seconds_ = 0;

  std::vector<std::thread> producers_;  // only when options_.prefetch > 0
};

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_LOADER_H_
