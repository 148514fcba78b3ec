// ModelStore: the scheduler's content-addressed store of users' model files
// (ONNX; docs/models.md), under the same durability rules as the job log.
//
//   ModelStoreOptions o;
//   o.dir = "/var/lib/dtrain-scheduler/models";
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<ModelStore> store, ModelStore::Open(o));
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<ModelStore::Upload> up,
//                       store->BeginUpload("sha256:9f86...", total_bytes));
//   DT_RETURN_IF_ERROR(up->Append(chunk));          // as chunks arrive
//   DT_ASSIGN_OR_RETURN(ModelStore::Stored s, up->Commit());
//   DT_ASSIGN_OR_RETURN(std::string path, store->Find("sha256:9f86..."));
//
// Layout: <dir>/sha256/<hex> holds the file whose SHA-256 is <hex>;
// uploads go to <dir>/tmp/<random> first. An upload never holds the file
// in memory: each chunk is written to its temporary file at once, and
// Append refuses (RESOURCE_EXHAUSTED naming the cap) as soon as the bytes
// announced or received exceed max_model_bytes. Commit checks the size and
// the digest, fsyncs the file, renames it into sha256/ and fsyncs that
// directory: only then is the digest Find-able, so a job that names it
// (its log record is written after) survives a crash with its model.
// Uploading a digest the store holds writes nothing (Commit says existed).
//
// Garbage collection (CollectGarbage, after the scheduler's retention
// sweep): files no retained job refers to are deleted once they are older
// than unreferenced_grace (their mtime, which BeginUpload and Find of an
// existing file refresh: a model uploaded or looked up for a Submit is
// kept that long even before a job refers to it), and temporary files
// older than temp_max_age (uploads a crash or a dropped stream left
// behind). The store keeps no index: a restart finds the files.
//
// Errors: INVALID_ARGUMENT for a malformed digest or an upload whose size
// or digest is not what its header said; RESOURCE_EXHAUSTED over the cap;
// NOT_FOUND from Find; I/O errors follow errno (ErrnoToStatus) and name
// the path. Thread-safe; an Upload is used by one thread.
#ifndef DTRAIN_LIBS_SCHEDULER_MODEL_STORE_H_
#define DTRAIN_LIBS_SCHEDULER_MODEL_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/base/sha256.h"

namespace dtrain {
namespace scheduler {

inline constexpr char kModelDigestPrefix[] = "sha256:";
inline constexpr int64_t kDefaultMaxModelBytes = int64_t{512} << 20;

// "sha256:" followed by 64 lowercase hex digits; INVALID_ARGUMENT naming
// `field` otherwise.
absl::Status ValidateModelDigest(absl::string_view digest, absl::string_view field = "digest");

// "sha256:<hex of bytes>".
std::string ModelDigestOf(absl::string_view bytes);

struct ModelStoreOptions {
  std::string dir;  // required; created if missing
  int64_t max_model_bytes = kDefaultMaxModelBytes;
  absl::Duration unreferenced_grace = absl::Hours(1);
  absl::Duration temp_max_age = absl::Hours(1);
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

class ModelStore {
 public:
  // Creates <dir>, <dir>/sha256 and <dir>/tmp as needed.
  static absl::StatusOr<std::unique_ptr<ModelStore>> Open(ModelStoreOptions options);

  struct Stored {
    std::string digest;
    int64_t bytes = 0;
    bool existed = false;  // the store held it already
  };

  // One upload in progress; its temporary file is removed unless Commit
  // succeeded.
  class Upload {
   public:
    ~Upload();
    Upload(const Upload&) = delete;
    Upload& operator=(const Upload&) = delete;
    // Writes `data` to the temporary file. RESOURCE_EXHAUSTED once more than
    // the cap has arrived, INVALID_ARGUMENT beyond the announced size.
    absl::Status Append(absl::string_view data);
    // Checks the size and digest, then makes the file durable and
    // Find-able (see the file comment). Call once.
    absl::StatusOr<Stored> Commit();
    int64_t received() const { return received_; }

   private:
    friend class ModelStore;
    Upload() = default;
    ModelStore* store_ = nullptr;
    std::string digest_, tmp_path_;
    int64_t total_ = 0, received_ = 0;
    int fd_ = -1;
    bool existed_ = false;
    Sha256 sha_;
  };

  // Starts an upload of `total_bytes` bytes whose digest is `digest`.
  // RESOURCE_EXHAUSTED when total_bytes is over the cap (nothing written).
  absl::StatusOr<std::unique_ptr<Upload>> BeginUpload(const std::string& digest,
                                                      int64_t total_bytes);

  // The path of the stored file with `digest` (NOT_FOUND if the store does
  // not hold it); refreshes its mtime (see "Garbage collection").
  absl::StatusOr<std::string> Find(const std::string& digest);

  // Deletes stored files whose digest is not in `referenced` and older than
  // unreferenced_grace, and stale temporary files. Returns how many files
  // it deleted.
  int CollectGarbage(const std::set<std::string>& referenced);

  int64_t max_model_bytes() const { return options_.max_model_bytes; }
  const std::string& dir() const { return options_.dir; }

 private:
  explicit ModelStore(ModelStoreOptions options) : options_(std::move(options)) {}
  std::string PathOf(absl::string_view digest) const;
  // Sets the file's mtime to now(); utimensat's result (errno set).
  int Touch(const std::string& path) const;

  const ModelStoreOptions options_;
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_MODEL_STORE_H_
