// Conversions between f32 values and their bytes on the wire (f32, f16 or
// bf16, little-endian), for values that arrive in pieces, and the pushed
// forms of a gradient (types.h, Compression): dense in a wire dtype, or
// top-k (index, value) pairs.
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
#include "libs/kvstore/types.h"
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

// A top-k push of a slice (Compression::kTopK) is k pairs of 8 bytes, in
// increasing index order: the element's index within the slice (uint32,
// little-endian), then its value (f32, little-endian).
inline constexpr int64_t kTopKPairBytes = 8;
// The largest slice a top-k push can address (uint32 indices).
inline constexpr int64_t kMaxTopKSliceElements = 0xffffffffLL;

// Bytes of a push of `count` elements of a `key_dtype` key under `c`: count
// elements in WireDType, or TopKCount(c.topk_ratio, count) pairs.
int64_t PushValueBytes(const CompressionSpec& c, DType key_dtype, int64_t count);

// Picks the k largest-magnitude entries of values[0, n) (0 <= k <= n; on
// equal magnitudes the lower index wins; NaN counts as largest), returns
// their pairs in the top-k push format and zeroes them in `values`, which
// then holds what was not sent (the residual).
std::string EncodeTopK(float* values, int64_t n, int64_t k);

// kInvalidArgument (leaving nothing changed) unless `pieces` is a valid push
// of `count` elements of a `key_dtype` key under `c`: the size is
// PushValueBytes, and a top-k push names only indices in [0, count) (the
// message names the pair and its index).
absl::Status CheckPushValue(absl::Span<const absl::string_view> pieces, const CompressionSpec& c,
                            DType key_dtype, int64_t count);

// Adds the pushed gradient to dst[0, count) (`accumulate`) or writes it
// there: dense values, or a top-k push's pairs scattered (zeros elsewhere
// when writing; an index named twice adds twice). `pieces` must have passed
// CheckPushValue.
void DecodePush(absl::Span<const absl::string_view> pieces, const CompressionSpec& c,
                DType key_dtype, int64_t count, float* dst, bool accumulate);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_CODEC_H_
