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
// Thread-compatible: the owner serializes calls (the scheduler holds its
// mutex around Append).
#ifndef DTRAIN_LIBS_SCHEDULER_WAL_H_
#define DTRAIN_LIBS_SCHEDULER_WAL_H_

#include <cstdint>
#include <memory>
#include <string>
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

  // Replaces the log at `path` with exactly `records` (compaction), atomically:
  // a temporary file is written and fsync'ed, renamed over the log, and the
  // directory fsync'ed; a crash leaves either the old or the new log. Then
  // opens it for appending.
  static absl::StatusOr<std::unique_ptr<Wal>> Rewrite(const std::string& path,
                                                      const std::vector<std::string>& records);

  // Appends one record and fsyncs. On error the log may hold a torn record,
  // which the next Open cuts off.
  absl::Status Append(absl::string_view record);

  // Bytes in the log.
  int64_t size() const { return size_; }

  // Largest record Open accepts (a larger length field means damage).
  static constexpr uint32_t kMaxRecordBytes = 64 << 20;

 private:
  Wal(int fd, int64_t size) : fd_(fd), size_(size) {}
  int fd_;
  int64_t size_;
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_WAL_H_
