// Snapshots of a Store in its data directory, and a background snapshotter.
//
//   DT_ASSIGN_OR_RETURN(bool resumed, LoadSnapshot(data_dir, &store));  // at startup
//   Snapshotter snapshotter(&store, data_dir, absl::Seconds(30));        // periodic
//   ...
//   DT_RETURN_IF_ERROR(snapshotter.SnapshotNow().status());              // at shutdown
//
// A snapshot holds every job of the shard: configurations, each slice's
// spec, value, optimizer state, round accumulator and round counters, so a
// server restarted from it resumes exactly where the snapshot left it
// (pushes applied after it are lost; workers learn the shard's rounds from
// GetJob). It is one file, <data_dir>/kvstore-shard-<index>.dtckpt, in the
// checkpoint container (libs/checkpoint): written atomically (a crash leaves
// the previous snapshot) and checksummed (a damaged file is refused, not
// half-loaded). Each slice is captured under its lock; values are shared
// copy-on-write buffers, so taking the picture is quick and the file is
// written without holding any store lock.
//
// Thread-safety: WriteSnapshot and LoadSnapshot are thread-safe; a
// Snapshotter's methods may be called from any thread.
#ifndef DTRAIN_LIBS_KVSTORE_SNAPSHOT_H_
#define DTRAIN_LIBS_KVSTORE_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/checkpoint/checkpoint.h"
#include "libs/kvstore/store.h"

namespace dtrain {
namespace kvstore {

// A store's jobs (Store::Export) as a checkpoint in the snapshot format, and
// back: what snapshots write and read, and what a replica transfers to a
// joining one (libs/kvstore/replicator.h). DecodeState's errors start with
// `what`: kFailedPrecondition for another shard or format version,
// kDataLoss for missing or malformed entries.
checkpoint::Checkpoint EncodeState(const std::vector<JobState>& jobs, int shard_index);
absl::StatusOr<std::vector<JobState>> DecodeState(const checkpoint::Checkpoint& ckpt,
                                                  int shard_index, const std::string& what);

// <data_dir>/kvstore-shard-<shard_index>.dtckpt
std::string SnapshotPath(const std::string& data_dir, int shard_index);

struct SnapshotInfo {
  std::string path;
  int64_t bytes = 0;     // file size
  uint64_t version = 0;  // Store::version() when the state was captured
  int64_t slices = 0;
};

// Writes the whole store to SnapshotPath(data_dir, shard index). Errors name
// the path (see checkpoint::WriteCheckpoint); the previous snapshot is kept
// on failure.
absl::StatusOr<SnapshotInfo> WriteSnapshot(const Store& store, const std::string& data_dir);

// Loads SnapshotPath(data_dir, store's shard index) into `store`, which must
// have none of its jobs. Returns false when there is no snapshot file.
// Errors: the checkpoint reader's (kDataLoss for a damaged file, ...),
// kFailedPrecondition for a snapshot of another shard or format version,
// kDataLoss for a state that does not add up; the store is unchanged then.
absl::StatusOr<bool> LoadSnapshot(const std::string& data_dir, Store* store);

// Writes snapshots of `store` every `interval` (if it changed since the last
// one) on a background thread, and on request.
class Snapshotter {
 public:
  // `store` must outlive the Snapshotter. interval <= 0: no background
  // thread. An empty data_dir disables snapshots (SnapshotNow returns an
  // empty SnapshotInfo).
  Snapshotter(Store* store, std::string data_dir, absl::Duration interval);
  // Stops the background thread (see Stop).
  ~Snapshotter();
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  // Writes a snapshot now, even if nothing changed. Calls are serialized,
  // so a newer snapshot is never overwritten by an older one.
  absl::StatusOr<SnapshotInfo> SnapshotNow();

  // Writes a snapshot if the store changed since the last one written;
  // returns whether it wrote.
  absl::StatusOr<bool> SnapshotIfChanged();

  // Stops the background thread (waiting for a snapshot being written);
  // SnapshotNow still works. Idempotent.
  void Stop();

  // Snapshots written so far (by either path).
  int64_t snapshots_written() const;

 private:
  absl::StatusOr<SnapshotInfo> WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop(absl::Duration interval);

  Store* const store_;
  const std::string data_dir_;
  mutable absl::Mutex mu_;  // serializes writes
  bool written_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t last_version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex stop_mu_;  // serializes Stop
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_SNAPSHOT_H_
