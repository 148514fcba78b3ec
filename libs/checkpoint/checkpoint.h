// Checkpoint files: model and optimizer state in one versioned, checksummed
// container, written atomically.
//
//   checkpoint::Checkpoint ckpt;
//   ckpt.metadata["model"] = "lenet";
//   ckpt.metadata["step"] = "1200";
//   ckpt.tensors.push_back({"conv1.weight", /*dtype=*/0, {6, 1, 5, 5}, std::move(bytes)});
//   DT_RETURN_IF_ERROR(checkpoint::WriteCheckpoint("/ckpt/lenet.dtckpt", ckpt));
//
//   DT_ASSIGN_OR_RETURN(checkpoint::Checkpoint loaded,
//                       checkpoint::ReadCheckpoint("/ckpt/lenet.dtckpt"));
//   const checkpoint::TensorRecord* w = loaded.Find("conv1.weight");
//
// The container knows nothing about tensor libraries. A record carries the
// caller's dtype code, a shape and raw little-endian element bytes; the
// container checks structure and checksums, not whether the byte count fits
// the shape (it does not know element sizes). Callers check that with
// ValidateRecord, passing the element size of their dtype.
//
// File format, version 1.0
// ------------------------
// All integers are little-endian and fixed width (u32/u64 unsigned, i32/i64
// two's complement). CRCs are CRC-32C (see crc32c.h), stored as u32. There is
// no padding or alignment. A file is a header, `metadata_count` metadata
// entries, `tensor_count` tensor records and a footer, in this order:
//
//   Header (48 bytes in version 1.0; offsets from the start of the file)
//   offset  size  field
//        0    16  magic: 89 'D' 'T' 'R' 'A' 'I' 'N' '-' 'C' 'K' 'P' 'T' 0D 0A 1A 0A
//       16     4  major_version (u32) = 1
//       20     4  minor_version (u32) = 0
//       24     4  header_size (u32): bytes in the header, header_crc included
//       28     4  metadata_count (u32)
//       32     4  tensor_count (u32)
//       36     8  file_size (u64): bytes in the whole file, footer included
//       44     4  header_crc: CRC of bytes [0, header_size - 4)
//
//   Metadata entry (repeated metadata_count times; keys are unique)
//        4  key_length (u32, <= kMaxKeyLength)
//        k  key bytes
//        4  value_length (u32, <= kMaxValueLength)
//        v  value bytes
//        4  entry_crc: CRC of the entry's preceding 8 + k + v bytes
//
//   Tensor record (repeated tensor_count times; names are unique)
//        4  name_length (u32, 1 ..= kMaxNameLength)
//        n  name bytes
//        4  dtype (i32): the caller's code, stored as given
//        4  rank (u32, <= kMaxRank)
//   8*rank  dims (i64 each, >= 0; their product fits in an i64)
//        8  data_length (u64)
//        4  record_header_crc: CRC of the record's preceding bytes
//        d  data (data_length bytes)
//        4  data_crc: CRC of the data
//
//   Footer (12 bytes)
//        8  file_size (u64), equal to the header's
//        4  file_crc: CRC of every byte of the file before this field
//
// The magic's first byte has the high bit set (caught by 7-bit transfers),
// and "\r\n", "\x1a", "\n" are mangled by text-mode / line-ending conversion.
// Every byte but file_crc itself lies under at least one CRC, and file_size
// appears in the header and the footer, so truncation, appended data and bit
// flips are all detected. Metadata and tensors keep the order they were written
// in: metadata in key order (std::map), tensors in vector order.
//
// Versions. A reader accepts every minor version of the major versions it
// knows. Minor revisions may only append new fields to the header, before
// header_crc (growing header_size, at most kMaxHeaderSize); older readers
// skip them. (A 1.0 header is exactly 48 bytes.) Anything else needs a new major version, which
// older readers reject with an error naming both versions. Every version, present and future, keeps
// bytes 0-27 (magic, versions, header_size) as above, a header of at most kMaxHeaderSize bytes and
// header_crc as its last four bytes, so that a reader can tell a newer file (valid header CRC) from
// a corrupt one.
//
// A reader checks, in order: the magic, the major version, the header size
// and CRC (then rejects a newer major version), file_size against the real
// size, the counts against the bytes available, each metadata entry and
// tensor record (limits, then CRC), and the footer.
//
// Sanity limits. Lengths and counts are checked against the limits below and
// against the bytes left in the file before anything is allocated, so a
// corrupt (or malicious) length field yields an error, never a huge
// allocation or a crash. A reader allocates the file's size plus per-record
// bookkeeping (a few hundred bytes per tensor or metadata entry).
//
// Thread-safety: the functions are thread-safe. Concurrent writers of one
// path each use their own temporary file and the last rename wins; a reader
// sees either the previous or the new file, never a mix.
#ifndef DTRAIN_LIBS_CHECKPOINT_CHECKPOINT_H_
#define DTRAIN_LIBS_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace checkpoint {

// The version this build writes. It reads every 1.x file.
inline constexpr uint32_t kMajorVersion = 1;
inline constexpr uint32_t kMinorVersion = 0;

// Limits enforced by both the writer (kInvalidArgument) and the reader
// (kDataLoss).
inline constexpr uint32_t kMaxRank = 8;
inline constexpr uint32_t kMaxNameLength = 4096;        // tensor names
inline constexpr uint32_t kMaxKeyLength = 4096;         // metadata keys
inline constexpr uint32_t kMaxValueLength = 64u << 20;  // metadata values
inline constexpr uint32_t kMaxHeaderSize = 4096;        // any version's header

// One named tensor, as plain data.
struct TensorRecord {
  // Unique within a checkpoint; 1 to kMaxNameLength bytes (any bytes).
  std::string name;
  // The caller's element-type code (for example dtrain::DType's value),
  // stored and returned as is.
  int32_t dtype = 0;
  // Dimensions, outermost first; empty for a scalar. At most kMaxRank
  // entries, none negative.
  std::vector<int64_t> shape;
  // Raw element bytes, little-endian, row-major. For dense tensors
  // data.size() == product(shape) * element size; see ValidateRecord.
  std::string data;
};

struct Checkpoint {
  // Free-form string pairs, e.g. model=lenet, step=1200, optimizer=sgd.
  std::map<std::string, std::string> metadata;
  // Model and optimizer state, in the order they are written and read.
  std::vector<TensorRecord> tensors;

  // Returns the tensor named `name`, or nullptr. Linear in the number of
  // tensors; the pointer is invalidated when `tensors` changes.
  const TensorRecord* Find(absl::string_view name) const;
};

// Writes `ckpt` to `path`, atomically: the data goes to a temporary file in
// the same directory (`path` + ".tmp.<pid>.<n>", n counting writes in this
// process), which is fsync'ed, renamed over `path`, and then the directory
// is fsync'ed. On success `path` holds the new checkpoint durably. On
// failure the temporary file is removed and an existing file at `path` is
// left untouched; the one exception is a failed fsync of the directory after
// the rename, reported as an error although `path` already holds the new
// file (which may not survive a crash).
//
// Errors name `path` and the step that failed. kInvalidArgument: `ckpt`
// breaks a rule above (empty, long or duplicate tensor name, rank above
// kMaxRank, negative dimension, element count overflowing int64, long key
// or value). I/O failures carry the errno's code (see ErrnoToStatus), e.g.
// kNotFound when the directory does not exist.
//
// Temporary files left by a process that crashed mid-write are not cleaned
// up here.
absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt);

// Reads and verifies the whole checkpoint at `path`. Each error message
// starts with "checkpoint <path>: " and says what is wrong:
//   kNotFound            `path` does not exist (other open/read failures
//                        carry the errno's code)
//   kInvalidArgument     not a dtrain checkpoint (bad magic bytes, or
//                        `path` is not a regular file)
//   kFailedPrecondition  a major format version newer than this build reads
//   kDataLoss            truncated (expected vs actual size), trailing bytes,
//                        checksum mismatch (naming the entry or tensor), a
//                        field out of range, duplicate keys or tensor names
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// Checks that `record` is a dense tensor of elements `dtype_size` bytes
// wide: no negative dimension, rank at most kMaxRank, and
// data.size() == product(shape) * dtype_size (a scalar has one element, a
// shape with a zero dimension none). Returns kInvalidArgument naming the
// tensor otherwise, or when dtype_size <= 0 or the byte count overflows.
absl::Status ValidateRecord(const TensorRecord& record, int64_t dtype_size);

}  // namespace checkpoint
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CHECKPOINT_CHECKPOINT_H_
