#include "libs/collective/reduce.h"

#include <immintrin.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace collective {
namespace {

// ------------------------------------------------------------------ portable
// Plain loops over restrict pointers; the compiler vectorizes the f32 and bf16
// ones. Half precision falls back to the scalar converters of dtype.h.

inline float Bits2Float(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline uint32_t Float2Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

// Branch-free float -> bf16, round to nearest even, NaN stays a quiet NaN
// (the same results as FloatToBFloat16 in dtype.h).
inline uint16_t ToBF16(float f) {
  uint32_t x = Float2Bits(f);
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float FromBF16(uint16_t b) { return Bits2Float(static_cast<uint32_t>(b) << 16); }

template <bool kDivide>
inline __attribute__((always_inline)) void F32Loop(float* __restrict dst,
                                                   const float* __restrict src, size_t n,
                                                   float divisor) {
  for (size_t i = 0; i < n; ++i) {
    float v = dst[i] + src[i];
    dst[i] = kDivide ? v / divisor : v;
  }
}

template <bool kDivide>
inline __attribute__((always_inline)) void BF16Loop(uint16_t* __restrict dst,
                                                    const uint16_t* __restrict src, size_t n,
                                                    float divisor) {
  for (size_t i = 0; i < n; ++i) {
    float v = FromBF16(dst[i]) + FromBF16(src[i]);
    dst[i] = ToBF16(kDivide ? v / divisor : v);
  }
}

template <bool kDivide>
void F16LoopScalar(uint16_t* dst, const uint16_t* src, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) {
    float v = HalfToFloat(dst[i]) + HalfToFloat(src[i]);
    dst[i] = FloatToHalf(kDivide ? v / divisor : v);
  }
}

// The f32 and bf16 cases of both kernels below, inlined into each so that
// its loops are compiled (and vectorized) for that kernel's target; false
// for another dtype. `src` == nullptr means "divide dst in place" (adds
// nothing).
inline __attribute__((always_inline)) bool F32OrBF16Kernel(DType dtype, void* dst, const void* src,
                                                           size_t n, bool divide, float divisor) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      if (src == nullptr) {
        for (size_t i = 0; i < n; ++i) d[i] = d[i] / divisor;
      } else if (src == dst) {
        for (size_t i = 0; i < n; ++i) d[i] = divide ? (d[i] + d[i]) / divisor : d[i] + d[i];
      } else if (divide) {
        F32Loop<true>(d, static_cast<const float*>(src), n, divisor);
      } else {
        F32Loop<false>(d, static_cast<const float*>(src), n, divisor);
      }
      return true;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      if (src == nullptr) {
        for (size_t i = 0; i < n; ++i) d[i] = ToBF16(FromBF16(d[i]) / divisor);
      } else if (src == dst) {
        for (size_t i = 0; i < n; ++i) {
          float v = FromBF16(d[i]) * 2.0f;
          d[i] = ToBF16(divide ? v / divisor : v);
        }
      } else if (divide) {
        BF16Loop<true>(d, static_cast<const uint16_t*>(src), n, divisor);
      } else {
        BF16Loop<false>(d, static_cast<const uint16_t*>(src), n, divisor);
      }
      return true;
    }
    default:
      return false;
  }
}

void PortableKernel(DType dtype, void* dst, const void* src, size_t n, bool divide, float divisor) {
  if (F32OrBF16Kernel(dtype, dst, src, n, divide, divisor) || dtype != DType::kF16) return;
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (src == nullptr) {
    for (size_t i = 0; i < n; ++i) d[i] = FloatToHalf(HalfToFloat(d[i]) / divisor);
  } else if (divide) {
    F16LoopScalar<true>(d, static_cast<const uint16_t*>(src), n, divisor);
  } else {
    F16LoopScalar<false>(d, static_cast<const uint16_t*>(src), n, divisor);
  }
}

// ---------------------------------------------------------------- AVX2 + F16C
// The same loops compiled for AVX2 (the compiler widens them to 8 lanes), plus
// explicit F16C conversions for half precision.

#define DT_AVX2 __attribute__((target("avx2,fma,f16c")))

DT_AVX2 void F16Avx2(uint16_t* dst, const uint16_t* src, size_t n, bool divide, float divisor) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256 div = _mm256_set1_ps(divisor);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dst + i)));
    if (src != nullptr) {
      __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      a = _mm256_add_ps(a, b);
    }
    if (divide) a = _mm256_div_ps(a, div);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(a, kRound));
  }
  if (i < n) {  // tail: widen into a zero-padded block of 8
    uint16_t a16[8] = {0}, b16[8] = {0};
    std::memcpy(a16, dst + i, (n - i) * 2);
    if (src != nullptr) std::memcpy(b16, src + i, (n - i) * 2);
    __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a16)));
    if (src != nullptr) {
      a = _mm256_add_ps(a, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b16))));
    }
    if (divide) a = _mm256_div_ps(a, div);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a16), _mm256_cvtps_ph(a, kRound));
    std::memcpy(dst + i, a16, (n - i) * 2);
  }
}

DT_AVX2 void Avx2Kernel(DType dtype, void* dst, const void* src, size_t n, bool divide,
                        float divisor) {
  if (F32OrBF16Kernel(dtype, dst, src, n, divide, divisor) || dtype != DType::kF16) return;
  // src == dst is fine here: each block of 8 is loaded before it is stored.
  F16Avx2(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, divide, divisor);
}

#undef DT_AVX2

bool DetectVectorKernels() {
  const char* choice = std::getenv("DTRAIN_REDUCE_KERNELS");
  if (choice != nullptr && std::strcmp(choice, "portable") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

bool UseAvx2() {
  static const bool use = DetectVectorKernels();
  return use;
}

inline void Dispatch(DType dtype, void* dst, const void* src, size_t n, bool divide,
                     float divisor) {
  if (n == 0) return;
  if (UseAvx2()) {
    Avx2Kernel(dtype, dst, src, n, divide, divisor);
  } else {
    PortableKernel(dtype, dst, src, n, divide, divisor);
  }
}

}  // namespace

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
  }
  return "?";
}

absl::Status CheckReducible(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("collective reductions support f32, f16 and bf16, not ", DTypeName(dtype)));
  }
}

void ReduceSum(DType dtype, void* dst, const void* src, size_t count) {
  Dispatch(dtype, dst, src, count, /*divide=*/false, 1.0f);
}

void ReduceSumDivide(DType dtype, void* dst, const void* src, size_t count, float divisor) {
  Dispatch(dtype, dst, src, count, /*divide=*/true, divisor);
}

void DivideInPlace(DType dtype, void* buf, size_t count, float divisor) {
  Dispatch(dtype, buf, nullptr, count, /*divide=*/true, divisor);
}

bool UsingVectorKernels() { return UseAvx2(); }

}  // namespace collective
}  // namespace dtrain
