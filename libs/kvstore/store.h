// Store: one kvstore shard's state and rules, with no network code.
//
// A Store holds jobs; a job holds slices of keys (see types.h) with their
// values, optimizer state and round counters. Workers push gradients and
// pull values; the job's consistency mode decides when pushes are applied
// and what a pull waits for (protos/kvstore.proto states the contract).
//
//   StoreOptions options;
//   options.quota_bytes_per_job = int64_t{1} << 30;
//   Store store(options);
//   DT_RETURN_IF_ERROR(store.CreateJob(config).status());
//   InitItem init;
//   init.spec = spec;                       // key "w", f32, shape {256}, 1 slice
//   init.data = {initial_bytes};
//   DT_RETURN_IF_ERROR(store.Init("job", {init}).status());
//
//   PushItem push;
//   push.key = "w";
//   push.round = 1;
//   push.shape = {256};
//   push.data = {gradient_bytes};           // 1024 bytes of f32
//   DT_ASSIGN_OR_RETURN(PushResult pushed, store.Push("job", worker, Compression::kNone, {push}));
//   DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values,
//                       store.Pull("job", worker, {{"w", 0, 1}}, PullOptions()));
//
// Rounds. Per slice and worker, rounds count from 1; round 0 is the state
// after Init. A worker pushes rounds in order; a push of a round it already
// pushed is a duplicate (counted, not applied), so retrying a push whose
// reply was lost is safe. completed_round is the highest round every worker
// has pushed (SYNC: the highest round applied).
//   SYNC           a round is summed in an accumulator and applied when the
//                  last worker pushes it; a worker cannot push round r + 1
//                  before round r is complete; a pull of round r waits until
//                  round r is complete.
//   ASYNC          each push is applied on arrival; pulls do not wait.
//   BOUNDED_DELAY  each push is applied on arrival; a push of round r needs
//                  completed_round >= r - max_staleness - 1, and a pull of round r
//                  waits until completed_round >= r - max_staleness.
// A pull of round r > 0 needs the worker's own push of round r (it would
// otherwise wait for itself).
//
// Atomicity. Init and Push take a batch of items and apply all of them or
// none: every item is validated (job, worker, key, dtype, shape, bytes,
// round) with all the batch's slices locked, before any is changed. A
// rejected call leaves the store exactly as it was and returns a Status
// naming the job, key and problem:
//   kNotFound           unknown job or key
//   kInvalidArgument    bad name, spec, worker id, dtype or shape different
//                       from Init, value of the wrong size, round < 1,
//                       duplicate items in one batch
//   kOutOfRange         a round too far ahead (see Rounds)
//   kAlreadyExists      CreateJob/Init with a different config/spec
//   kResourceExhausted  Init over the job's memory quota
//   kDeadlineExceeded   a pull's round did not complete in time (naming the
//                       workers still missing)
//   kCancelled          a pull's cancellation callback returned true
//
// Memory. A job's held bytes are the f32 bytes of its slices' values,
// momentum buffers (SGD with momentum) and accumulators (SYNC, or SGD), all
// reserved at Init and counted against quota_bytes_per_job. Values handed
// out by Pull and Export are shared, immutable buffers (copy on write): they
// stay valid however long the caller keeps them, and a later update copies
// instead of changing them; such transient copies are not counted.
//
// Thread-safety: all methods are thread-safe. Pushes and pulls of different
// slices run in parallel; a slice's lock is held while a push sums into it.
#ifndef DTRAIN_LIBS_KVSTORE_STORE_H_
#define DTRAIN_LIBS_KVSTORE_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "libs/kvstore/types.h"

namespace dtrain {
namespace kvstore {

struct StoreOptions {
  // Named in error messages and snapshots.
  int shard_index = 0;
  // Bytes a job may hold on this shard; 0 = no limit.
  int64_t quota_bytes_per_job = 0;
  // Jobs this shard holds at once; CreateJob of one more is
  // RESOURCE_EXHAUSTED naming the limit. With quota_bytes_per_job it bounds
  // the shard's memory. 0 = no limit.
  int max_jobs = 0;
  // Largest slice (in f32 bytes of its value) Init accepts.
  int64_t max_slice_bytes = int64_t{1} << 32;
};

// An immutable byte range kept alive by `owner`.
struct SharedBytes {
  std::shared_ptr<const void> owner;
  const char* data = nullptr;
  size_t size = 0;
  absl::string_view view() const { return absl::string_view(data, size); }
};

struct InitItem {
  SliceSpec spec;
  // The initial value in spec.dtype, in pieces; no bytes at all means zeros.
  std::vector<absl::string_view> data;
};

struct InitResult {
  int created = 0;
  int existing = 0;
};

struct PushItem {
  std::string key;
  int32_t slice = 0;
  int64_t round = 0;
  // The key's dtype and shape as the pusher knows them; checked against Init.
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // The gradient as the push's compression encodes it (codec.h,
  // PushValueBytes), in pieces.
  std::vector<absl::string_view> data;
};

struct PushResult {
  int applied = 0;
  int duplicates = 0;
  // SYNC: items applied whose round still waits for other workers' pushes.
  int incomplete = 0;
};

struct PullRequestItem {
  std::string key;
  int32_t slice = 0;
  // 0: the current value, without waiting.
  int64_t round = 0;
};

struct PulledValue {
  // Every worker's pushes up to this round are in the value.
  int64_t round = 0;
  DType dtype = DType::kF32;
  // The slice's value in `dtype`.
  SharedBytes bytes;
};

struct PullOptions {
  // How long a pull may wait for its rounds.
  absl::Time deadline = absl::InfiniteFuture();
  // Polled while waiting (every few milliseconds); true ends the wait with
  // kCancelled. May be empty.
  std::function<bool()> cancelled;
};

// A slice's whole state, as Export hands it out and Import takes it back.
struct SliceState {
  SliceSpec spec;
  int64_t completed_round = 0;
  std::vector<int64_t> pushed;  // last round pushed, per worker
  int pending = 0;              // SYNC: pushes summed into `accum` this round
  std::shared_ptr<const std::vector<float>> value;
  std::shared_ptr<const std::vector<float>> momentum;  // null unless SGD with momentum
  std::shared_ptr<const std::vector<float>> accum;     // null unless pending > 0
};

struct JobState {
  JobConfig config;
  std::vector<SliceState> slices;
};

class Store {
 public:
  explicit Store(StoreOptions options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const StoreOptions& options() const { return options_; }

  // Creates a job. Returns true if created, false if an identical job
  // existed; kAlreadyExists if it exists with another configuration.
  absl::StatusOr<bool> CreateJob(const JobConfig& config);

  // Drops a job and its slices (kNotFound if unknown). Calls in flight on
  // the job finish on the dropped state.
  absl::Status DeleteJob(absl::string_view job);

  // Worker `worker` is done with the job: once every worker of the job has
  // left, the job is dropped as by DeleteJob. Returns true if this call
  // dropped it. Leaving twice is harmless. kNotFound for an unknown job,
  // kInvalidArgument for a worker out of range. This is how a finished job
  // is cleaned up without cutting off a worker still reading its last round.
  absl::StatusOr<bool> LeaveJob(absl::string_view job, int worker);

  // Drops every job that no worker call (CreateJob, Init, Push, Pull,
  // LeaveJob; not GetJob, which monitoring makes) has named since
  // `idle_since`: the orphans of workers that died or never cleaned up.
  // Returns the dropped jobs' names, sorted.
  std::vector<std::string> DropIdleJobs(absl::Time idle_since);

  // Creates slices (see InitItem); all or none.
  absl::StatusOr<InitResult> Init(absl::string_view job, absl::Span<const InitItem> items);

  // The checks Init makes that do not need the values (job, specs, conflicts
  // with existing slices, quota), so a server can refuse an Init before
  // reading its values. Init checks again.
  absl::Status CheckInit(absl::string_view job, absl::Span<const SliceSpec> specs) const;

  // The bytes a push item must carry, for a push of slice (key, slice) of
  // `job` with `compression`; lets a server reject oversized streams before
  // reading them. Errors as for Push.
  absl::StatusOr<int64_t> ExpectedPushBytes(absl::string_view job, absl::string_view key,
                                            int32_t slice,
                                            const CompressionSpec& compression) const;

  // Applies a worker's gradients for a batch of slices (see the file
  // comment); all or none. A top-k push (codec.h) is scattered into the
  // round's sum; an index outside its slice is kInvalidArgument naming the
  // key, slice and index.
  absl::StatusOr<PushResult> Push(absl::string_view job, int worker,
                                  const CompressionSpec& compression,
                                  absl::Span<const PushItem> items);

  // Reads a batch of slices, waiting for their rounds as the job's
  // consistency mode says.
  absl::StatusOr<std::vector<PulledValue>> Pull(absl::string_view job, int worker,
                                                absl::Span<const PullRequestItem> items,
                                                const PullOptions& options);

  // Pull without waiting, for servers that answer from a continuation
  // instead of a blocked thread: true with `out` filled when every item's
  // round is ready; false when one is not, after registering `wake` with
  // that slice. `wake` is then called once, by the push that completes the
  // round (on its thread, with no store lock held); call TryPull again then.
  // A job dropped meanwhile never wakes its waiters: the caller keeps its
  // own deadline. Errors as for Pull (never kDeadlineExceeded/kCancelled).
  absl::StatusOr<bool> TryPull(absl::string_view job, int worker,
                               absl::Span<const PullRequestItem> items, std::function<void()> wake,
                               std::vector<PulledValue>* out);

  // Configuration, usage and (with include_slices) per-slice rounds, with
  // pushed_round reported for `worker` (ignored when out of range).
  absl::StatusOr<JobStatus> GetJob(absl::string_view job, int worker, bool include_slices) const;

  // Names of all jobs, sorted.
  std::vector<std::string> JobNames() const;

  // A copy of every job's state, consistent per slice (each slice is read
  // under its lock; different slices may be read at different moments).
  // Values are shared, not copied.
  std::vector<JobState> Export() const;

  // Adds jobs from an Export (typically read back from a snapshot).
  // kAlreadyExists if a job exists; kInvalidArgument (nothing added) if a
  // state is inconsistent: bad config or spec, buffer sizes that do not
  // match, rounds out of order, over quota.
  absl::Status Import(std::vector<JobState> jobs);

  // Drops every job, then imports `jobs`: how a replica takes over the
  // state its predecessor transferred. Errors as for Import (the store is
  // left empty then).
  absl::Status ReplaceAll(std::vector<JobState> jobs);

  // Increases on every change of state; lets a snapshotter skip unchanged
  // stores.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  struct Slice;
  struct Job;

  // What an Init of `specs` would do: which slices it creates, their bytes.
  struct InitPlan {
    std::vector<bool> create;
    std::vector<int64_t> bytes;
    int64_t new_bytes = 0;
    int existing = 0;
  };
  // REQUIRES: job.mu held.
  absl::StatusOr<InitPlan> PlanInit(const Job& job, absl::Span<const SliceSpec> specs) const;

  // `touch`: the call counts as use of the job (DropIdleJobs).
  absl::StatusOr<std::shared_ptr<Job>> FindJob(absl::string_view job, bool touch = true) const;
  absl::Status CheckWorker(const Job& job, int worker) const;
  absl::StatusOr<std::shared_ptr<Slice>> FindSlice(const Job& job, absl::string_view key,
                                                   int32_t slice) const;
  int64_t SliceBytes(const JobConfig& config, int64_t count) const;
  // Pull's and TryPull's checks; the slices of `items`.
  absl::StatusOr<std::vector<std::shared_ptr<Slice>>> PullSlices(
      absl::string_view job, int worker, absl::Span<const PullRequestItem> items,
      std::shared_ptr<Job>* found) const;
  // A slice's value as a pull hands it out. REQUIRES: s.mu held.
  static void ReadValue(const Slice& s, PulledValue* v);
  // One SGD step of `s`'s weights with gradient `g`. REQUIRES: s.mu held.
  static void ApplySgd(const JobConfig& config, Slice& s, const float* g);
  void Bump() { version_.fetch_add(1, std::memory_order_acq_rel); }

  const StoreOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> version_{0};
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_STORE_H_
