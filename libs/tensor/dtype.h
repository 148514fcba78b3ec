// Element types of tensors.
#ifndef DTRAIN_LIBS_TENSOR_DTYPE_H_
#define DTRAIN_LIBS_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// The numeric values are stable: checkpoints and the wire protocol store them.
enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kI32 = 3,
  kI64 = 4,
  kU8 = 5,
};

inline constexpr int kNumDTypes = 6;

// Bytes per element.
size_t DTypeSize(DType dtype);

// "f32", "f16", "bf16", "i32", "i64", "u8".
const char* DTypeName(DType dtype);

// Parses a name as printed by DTypeName, or a stored numeric code.
absl::StatusOr<DType> ParseDType(absl::string_view name);
absl::StatusOr<DType> DTypeFromCode(int32_t code);

// Maps a C++ element type to its DType (float -> kF32, ...).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};

// Half-precision conversions on the host (round to nearest even).
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t b);

}  // namespace dtrain

#endif  // DTRAIN_LIBS_TENSOR_DTYPE_H_
