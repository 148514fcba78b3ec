// Reader for IDX files, the format of MNIST and Fashion-MNIST.
//
//   DT_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(dir + "/t10k-labels-idx1-ubyte.gz"));
//   // labels.dims == {10000}, labels.data.size() == 10000
//
// An IDX file is a big-endian header followed by the elements in row-major
// order:
//
//   bytes 0-1   zero
//   byte  2     element type (0x08 = unsigned byte, the only type supported)
//   byte  3     number of dimensions
//   then        one uint32 per dimension
//   then        the elements, product(dims) of them
//
// Only the two layouts of (Fashion-)MNIST are accepted: magic 0x00000801
// (1-D unsigned bytes: labels) and 0x00000803 (3-D unsigned bytes: images).
//
// The file may be gzip-compressed (as distributed) or plain; zlib detects
// which. Any defect is reported as a Status whose message names the file and
// what is wrong, never a crash: a missing file (NotFound and the like, from
// errno), a bad magic number, an unsupported element type or dimension count
// (InvalidArgument), a payload shorter or longer than the dimensions say, or
// a damaged gzip stream (DataLoss). One limitation: zlib silently ignores
// non-gzip bytes after the end of a complete gzip stream, so such trailing
// garbage in a compressed file is not detected (the decompressed payload
// itself is checked exactly).
//
// Thread-safe: ReadIdxFile has no shared state.
#ifndef DTRAIN_LIBS_DATA_IDX_H_
#define DTRAIN_LIBS_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain::data {

// The magic numbers accepted by ReadIdxFile.
inline constexpr uint32_t kIdxMagicU8Vector = 0x00000801;  // 1-D, e.g. labels
inline constexpr uint32_t kIdxMagicU8Images = 0x00000803;  // 3-D, e.g. N x rows x cols

// The contents of an IDX file of unsigned bytes.
struct IdxArray {
  std::vector<int64_t> dims;  // outermost first, e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // row-major; data.size() == product of dims
};

// Reads and validates the IDX file at `path` (gzip-compressed or plain).
//
// `max_items` > 0 reads only the first `max_items` items along the first
// dimension (images or labels), and dims[0] says how many were read: a job
// with a train_limit decompresses only what it uses (the 60,000 Fashion-MNIST
// training images take about 0.23 s of zlib, on every job start). The rest
// of the file is then left unread, so a defect past those items, a wrong
// length or a bad gzip trailer, goes unnoticed; with 0 (all items), or a
// limit at or above the count, the whole file is checked as above.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, int64_t max_items = 0);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_IDX_H_
