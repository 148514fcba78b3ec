// NumPy .npy files (format versions 1.0, 2.0 and 3.0): a strict header
// parser, and a writer for tests and tools.
//
//   DT_ASSIGN_OR_RETURN(NpyHeader h, ParseNpyHeader(first_bytes_of_file));
//   // h.dtype == NpyDtype::kU8, h.shape == {60000, 1, 28, 28},
//   // the array's bytes start at h.data_offset
//
// The header is the magic "\x93NUMPY", a version, a little-endian length and
// a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 1, 28, 28), }
// The parser accepts exactly that dict (the three keys, in any order, each
// once, with NumPy's spellings) and nothing else: no other keys, no
// Fortran order, no object arrays, no big-endian types. Accepted dtypes:
// |u1 (uint8), <f4 (float32) and the integer types labels use: |i1, <i2,
// <u2, <i4, <u4, <i8, <u8 ('=' and '<' alike). Errors say what is wrong
// (the caller adds the file).
//
// Thread-safe: the functions have no shared state.
#ifndef DTRAIN_LIBS_DATA_NPY_H_
#define DTRAIN_LIBS_DATA_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

enum class NpyDtype { kU8, kI8, kI16, kU16, kI32, kU32, kI64, kU64, kF32 };

// Bytes per element.
int NpyItemSize(NpyDtype dtype);
const char* NpyDtypeName(NpyDtype dtype);  // "uint8", "float32", ...

struct NpyHeader {
  NpyDtype dtype = NpyDtype::kU8;
  std::vector<int64_t> shape;  // () is a scalar: one element
  int64_t data_offset = 0;     // bytes before the array's data
  int64_t data_bytes = 0;      // product(shape) * item size
};

// Parses the header at the start of `bytes` (which may go on into the data;
// at most the header is read).
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes);

// A version 1.0 file of `data` (row-major) with `shape`.
std::string WriteNpy(NpyDtype dtype, const std::vector<int64_t>& shape, absl::string_view data);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_NPY_H_
