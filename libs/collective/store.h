// Rendezvous stores: how the ranks of a communicator find each other.
//
// A Store is a small key-value table that every rank of a job can reach.
// Communicator::Create publishes addresses (TCP ports, shared-memory segment
// names) under keys and reads the peers' entries back, waiting until they
// appear. Three implementations are planned behind this one interface:
//
//   InMemoryStore  ranks are threads of one process (tests, in-process jobs);
//   FileStore      ranks are processes on one host sharing a directory;
//   (later)        the scheduler service, for jobs that span hosts.
//
//   dtrain::collective::FileStore store("/tmp/job42");
//   DT_RETURN_IF_ERROR(store.Set("addr/3", "10.0.0.7:40123"));
//   DT_ASSIGN_OR_RETURN(std::string addr, store.Get("addr/0", absl::Seconds(30)));
//   DT_ASSIGN_OR_RETURN(int64_t arrived, store.Add("arrived", 1));
//
// Keys are arbitrary byte strings; values are arbitrary byte strings. A store
// never forgets a key by itself, so a directory or table reused by a second
// job must be emptied first (or the second job must use a different key
// prefix, see PrefixStore).
#ifndef DTRAIN_LIBS_COLLECTIVE_STORE_H_
#define DTRAIN_LIBS_COLLECTIVE_STORE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dtrain {
namespace collective {

// The interface. Implementations are thread-safe: any number of threads (and,
// for FileStore, processes) may call any method concurrently.
class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing an earlier value. A concurrent Get sees
  // the old or the new value, never a mix of both.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Returns the value of `key`, waiting up to `timeout` for some rank to set
  // it. DEADLINE_EXCEEDED (naming the key) when it is still missing then.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;

  // Atomically adds `delta` to the decimal integer stored under `key` (a
  // missing key counts as 0) and returns the new value. Get on the same key
  // returns the number as decimal text. INVALID_ARGUMENT if the key holds
  // something that is not an integer.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
};

// Waits until `count` callers have arrived at the barrier named `key`: each
// caller adds 1 to the counter `key`, the one that brings it to `count` sets
// `key` + "/done", and all wait for that key. Usable once per key.
absl::Status StoreBarrier(Store& store, absl::string_view key, int64_t count,
                          absl::Duration timeout);

// A store in this process's memory. For ranks that are threads of one process.
class InMemoryStore : public Store {
 public:
  InMemoryStore() = default;
  InMemoryStore(const InMemoryStore&) = delete;
  InMemoryStore& operator=(const InMemoryStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> values_ ABSL_GUARDED_BY(mu_);
};

// A store kept as one file per key in a directory that all ranks can see (a
// local directory for ranks on one host; a shared file system would also do
// if it renames atomically and supports flock).
//
// Set writes a temporary file and renames it over the key's file, so readers
// never see a partial value. Add serializes writers with flock(2) on a lock
// file next to the key. Get polls (1 ms growing to 20 ms between looks).
// Key bytes other than [A-Za-z0-9._-] are escaped as %XX in file names.
class FileStore : public Store {
 public:
  // Uses `directory`, creating it (and missing parents) on first use.
  explicit FileStore(std::string directory);
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

  const std::string& directory() const { return directory_; }

 private:
  absl::Status EnsureDirectory();
  std::string PathFor(absl::string_view key) const;
  absl::Status WriteAtomically(const std::string& path, absl::string_view value);

  const std::string directory_;
};

// Prepends a fixed prefix to every key of an underlying store, so several
// communicators (or several attempts of a job) can share one store. Does not
// own `base`, which must outlive it.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, Store* base) : prefix_(std::move(prefix)), base_(base) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  std::string Key(absl::string_view key) const;
  const std::string prefix_;
  Store* const base_;
};

}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_STORE_H_
