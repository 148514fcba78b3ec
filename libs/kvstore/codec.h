// Conversions between f32 values and their bytes on the wire (f32, f16 or
// bf16, little-endian), for values that arrive in pieces.
//
// Values received from the network come as a list of byte pieces (gRPC
// slices) whose boundaries need not fall between elements; these functions
// read across them without first gathering the bytes.
//
//   std::vector<absl::string_view> pieces = ...;        // 4096 bytes in all
//   std::vector<float> sum(1024, 0.0f);
//   DT_RETURN_IF_ERROR(DecodeValue(pieces, DType::kF32, 1024, sum.data(), /*accumulate=*/true));
//
// Thread-safety: the functions are thread-safe (they touch only their
// arguments).
#ifndef DTRAIN_LIBS_KVSTORE_CODEC_H_
#define DTRAIN_LIBS_KVSTORE_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/tensor/dtype.h"

namespace dtrain {
namespace kvstore {

// Total bytes of `pieces`.
size_t TotalBytes(absl::Span<const absl::string_view> pieces);

// Decodes `count` elements of `encoding` (f32, f16 or bf16) from the
// concatenation of `pieces` into `dst`, adding them to dst's values when
// `accumulate`, overwriting them otherwise. kInvalidArgument when the pieces
// do not hold exactly count * DTypeSize(encoding) bytes or `encoding` is not
// a float type; `dst` is untouched then.
absl::Status DecodeValue(absl::Span<const absl::string_view> pieces, DType encoding, int64_t count,
                         float* dst, bool accumulate);

// Writes `count` values as `dtype` (f32, f16 or bf16; rounding to nearest
// even) to `dst`, which must hold count * DTypeSize(dtype) bytes.
void EncodeValue(const float* src, int64_t count, DType dtype, char* dst);

// EncodeValue into a new string.
std::string EncodeToString(const float* src, int64_t count, DType dtype);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_CODEC_H_
