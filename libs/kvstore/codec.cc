#include "libs/kvstore/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

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

int64_t PushValueBytes(const CompressionSpec& c, DType key_dtype, int64_t count) {
  if (c.method == Compression::kTopK) return TopKCount(c.topk_ratio, count) * kTopKPairBytes;
  return count * static_cast<int64_t>(DTypeSize(WireDType(key_dtype, c.method)));
}

std::string EncodeTopK(float* values, int64_t n, int64_t k) {
  k = std::max<int64_t>(0, std::min(k, n));
  std::string out(static_cast<size_t>(k * kTopKPairBytes), '\0');
  if (k == 0) return out;
  auto magnitude = [](float v) {
    const float m = std::fabs(v);
    return std::isnan(m) ? HUGE_VALF : m;
  };
  // The k-th largest magnitude (a selection over a copy: direct float
  // comparisons, no index indirection), then one pass in index order takes
  // every entry above it and the first ones equal to it.
  float threshold = 0;
  int64_t ties = 0;  // entries equal to the threshold still to take
  if (k < n) {
    std::vector<float> mags(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mags[static_cast<size_t>(i)] = magnitude(values[i]);
    std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
    threshold = mags[static_cast<size_t>(k - 1)];
    int64_t above = 0;
    for (int64_t i = 0; i < k - 1; ++i) above += mags[static_cast<size_t>(i)] > threshold;
    ties = k - above;
  }
  char* p = out.data();
  for (int64_t i = 0, taken = 0; i < n && taken < k; ++i) {
    if (k < n) {
      const float m = magnitude(values[i]);
      if (m < threshold) continue;
      if (m == threshold) {
        if (ties == 0) continue;
        --ties;
      }
    }
    const uint32_t index = static_cast<uint32_t>(i);  // little-endian hosts (as DecodeValue)
    std::memcpy(p, &index, 4);
    std::memcpy(p + 4, &values[i], 4);
    values[i] = 0;
    p += kTopKPairBytes;
    ++taken;
  }
  return out;
}

namespace {

// The pushed bytes in one piece: `pieces`' only one, or a copy in `storage`.
absl::string_view Contiguous(absl::Span<const absl::string_view> pieces, std::string* storage) {
  if (pieces.size() == 1) return pieces[0];
  for (absl::string_view p : pieces) storage->append(p.data(), p.size());
  return *storage;
}

}  // namespace

absl::Status CheckPushValue(absl::Span<const absl::string_view> pieces, const CompressionSpec& c,
                            DType key_dtype, int64_t count) {
  const size_t got = TotalBytes(pieces);
  const int64_t want = PushValueBytes(c, key_dtype, count);
  if (c.method != Compression::kTopK) {
    if (got != static_cast<size_t>(want)) {
      const DType wire = WireDType(key_dtype, c.method);
      return absl::InvalidArgumentError(absl::StrCat("push carries ", got, " bytes, expected ",
                                                     want, " (", count, " elements as ",
                                                     DTypeName(wire), ")"));
    }
    return absl::OkStatus();
  }
  if (count > kMaxTopKSliceElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a top-k push addresses at most ", kMaxTopKSliceElements, " elements, the slice has ",
        count, " (use more slices or another compression)"));
  }
  if (got != static_cast<size_t>(want)) {
    return absl::InvalidArgumentError(
        absl::StrCat("push carries ", got, " bytes, expected ", want, " (", want / kTopKPairBytes,
                     " top-k pairs of ", DescribeCompression(c), " of ", count, " elements)"));
  }
  std::string storage;
  absl::string_view bytes = Contiguous(pieces, &storage);
  for (size_t at = 0, pair = 0; at < bytes.size(); at += kTopKPairBytes, ++pair) {
    uint32_t index;
    std::memcpy(&index, bytes.data() + at, 4);
    if (static_cast<int64_t>(index) >= count) {
      return absl::InvalidArgumentError(absl::StrCat("top-k pair ", pair, " names index ", index,
                                                     ", outside the slice's ", count, " elements"));
    }
  }
  return absl::OkStatus();
}

void DecodePush(absl::Span<const absl::string_view> pieces, const CompressionSpec& c,
                DType key_dtype, int64_t count, float* dst, bool accumulate) {
  if (c.method != Compression::kTopK) {
    absl::Status decoded =
        DecodeValue(pieces, WireDType(key_dtype, c.method), count, dst, accumulate);
    (void)decoded;  // checked by CheckPushValue
    return;
  }
  if (!accumulate) std::fill(dst, dst + count, 0.0f);
  std::string storage;
  absl::string_view bytes = Contiguous(pieces, &storage);
  for (size_t at = 0; at + kTopKPairBytes <= bytes.size(); at += kTopKPairBytes) {
    uint32_t index;
    float v;
    std::memcpy(&index, bytes.data() + at, 4);
    std::memcpy(&v, bytes.data() + at + 4, 4);
    if (static_cast<int64_t>(index) < count) dst[index] += v;
  }
}

}  // namespace kvstore
}  // namespace dtrain
