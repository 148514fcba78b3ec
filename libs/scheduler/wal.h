// Wal: an append-only write-ahead log of opaque records on local disk.
//
//   std::vector<std::string> records;
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<Wal> wal, Wal::Open("/var/lib/sched/wal", &records));
//   for (const std::string& r : records) Apply(r);      // replay
//   DT_RETURN_IF_ERROR(wal->Append(serialized));        // durable when OK
//
// Each record is framed as [u32 length][u32 crc32 of the payload][payload]
// (little endian) and fsync'ed before Append returns. Open replays every
// complete record. A torn last record (a crash during Append: too few bytes,
// or a checksum mismatch in the record that ends the file) is cut off and
// logged; damage followed by more data is kDataLoss, because dropping it
// would silently lose later records.
//
// A failed Append (a full disk, an I/O error) leaves the log as it was: the
// frame is written at the end of the last good frame (pwrite at size()), and
// whatever part of it reached the file is truncated away before Append
// returns. Should that truncation fail too, the next Append truncates first
// and fails if it still cannot, so no record is ever written after a torn
// one; a crash in between leaves a torn tail, which Open cuts off. So after
// any failed Append the log stays readable and holds exactly the records
// whose Append returned OK.
//
// Compact replaces the log's contents with a given set of records
// atomically while it is open (write a temporary file, fsync, rename over
// the log, fsync the directory); on failure the log is unchanged and usable.
//
// Thread-compatible: the owner serializes calls (the scheduler holds its
// mutex around Append).
#ifndef DTRAIN_LIBS_SCHEDULER_WAL_H_
#define DTRAIN_LIBS_SCHEDULER_WAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace scheduler {

// CRC-32 (IEEE 802.3, as zlib's crc32).
uint32_t Crc32(absl::string_view data);

class Wal {
 public:
  // Opens (creating if missing) the log at `path` and returns the records
  // it holds in `records`. Errors: the errno-derived status of open/read,
  // kDataLoss for damage before the last record.
  static absl::StatusOr<std::unique_ptr<Wal>> Open(const std::string& path,
                                                   std::vector<std::string>* records);
  ~Wal();
  Wal(const Wal&) = delete;
  Wal& operator=(const Wal&) = delete;

  // Appends one record and fsyncs. On error (the errno-derived status
  // naming the log's path and the OS error: kResourceExhausted for a full
  // disk) the log holds exactly what it held before.
  absl::Status Append(absl::string_view record);
  // Appends `records` with one write and one fsync, all or nothing.
  absl::Status AppendAll(const std::vector<std::string>& records);

  // Replaces the log with exactly `records`, atomically (see above). On
  // error the log, and this object, are as before.
  absl::Status Compact(const std::vector<std::string>& records);

  // Bytes in the log.
  int64_t size() const { return size_; }
  // Records in the log.
  int64_t records() const { return records_; }
  const std::string& path() const { return path_; }

  // Largest record Open accepts (a larger length field means damage).
  static constexpr uint32_t kMaxRecordBytes = 64 << 20;

 private:
  Wal(std::string path, int fd, int64_t size, int64_t records)
      : path_(std::move(path)), fd_(fd), size_(size), records_(records) {}
  // Writes `frames` at size_ and fsyncs; on failure cuts the file back.
  absl::Status WriteFrames(const std::string& frames, int64_t count);

  const std::string path_;
  int fd_;
  int64_t size_;
  int64_t records_;
  // The file may hold a torn frame after size_ (a failed truncation).
  bool dirty_tail_ = false;
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_WAL_H_
