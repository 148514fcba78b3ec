#include "libs/kvstore/codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace kvstore {
namespace {

// Elements [index, index + n) start at `src` (possibly unaligned).
template <bool kAccumulate>
void DecodeRun(const char* src, int64_t n, DType encoding, float* dst) {
  switch (encoding) {
    case DType::kF32:
      if (!kAccumulate) {
        std::memcpy(dst, src, static_cast<size_t>(n) * 4);
        break;
      }
      for (int64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, src + 4 * i, 4);
        if (kAccumulate) {
          dst[i] += v;
        } else {
          dst[i] = v;
        }
      }
      break;
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        float v = encoding == DType::kF16 ? HalfToFloat(h) : BFloat16ToFloat(h);
        if (kAccumulate) {
          dst[i] += v;
        } else {
          dst[i] = v;
        }
      }
      break;
    default:
      break;
  }
}

}  // namespace

size_t TotalBytes(absl::Span<const absl::string_view> pieces) {
  size_t total = 0;
  for (absl::string_view p : pieces) total += p.size();
  return total;
}

absl::Status DecodeValue(absl::Span<const absl::string_view> pieces, DType encoding, int64_t count,
                         float* dst, bool accumulate) {
  if (encoding != DType::kF32 && encoding != DType::kF16 && encoding != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("values cannot be encoded as ", DTypeName(encoding)));
  }
  const size_t esize = DTypeSize(encoding);
  const size_t total = TotalBytes(pieces);
  if (total != static_cast<size_t>(count) * esize) {
    return absl::InvalidArgumentError(absl::StrCat("value has ", total, " bytes, expected ", count,
                                                   " ", DTypeName(encoding), " elements (",
                                                   static_cast<size_t>(count) * esize, " bytes)"));
  }
  auto run = accumulate ? &DecodeRun<true> : &DecodeRun<false>;
  int64_t index = 0;
  char carry[8];
  size_t carry_len = 0;
  for (absl::string_view piece : pieces) {
    const char* p = piece.data();
    size_t n = piece.size();
    if (carry_len > 0) {  // finish an element split across pieces
      size_t take = std::min(esize - carry_len, n);
      std::memcpy(carry + carry_len, p, take);
      carry_len += take;
      p += take;
      n -= take;
      if (carry_len < esize) continue;
      run(carry, 1, encoding, dst + index);
      ++index;
      carry_len = 0;
    }
    size_t whole = n / esize;
    if (whole > 0) {
      run(p, static_cast<int64_t>(whole), encoding, dst + index);
      index += static_cast<int64_t>(whole);
      p += whole * esize;
      n -= whole * esize;
    }
    if (n > 0) {
      std::memcpy(carry, p, n);
      carry_len = n;
    }
  }
  return absl::OkStatus();
}

void EncodeValue(const float* src, int64_t count, DType dtype, char* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * 4);
      break;
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h = dtype == DType::kF16 ? FloatToHalf(src[i]) : FloatToBFloat16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      break;
    default:
      break;
  }
}

std::string EncodeToString(const float* src, int64_t count, DType dtype) {
  std::string out(static_cast<size_t>(count) * DTypeSize(dtype), '\0');
  EncodeValue(src, count, dtype, out.data());
  return out;
}

}  // namespace kvstore
}  // namespace dtrain
