// Elementwise kernels: relu, add, axpy, scale, fill, cast, bias + activation,
// Philox random numbers. Float types compute in f32; f32 data is read and
// written 16 bytes at a time when the pointers allow it.
#include <cmath>
#include <limits>
#include <type_traits>

#include "libs/cuda/kernel_util.cuh"
#include "libs/cuda/kernels.h"

namespace dtrain {
namespace cuda {
namespace kernels {
namespace {

// ---- map kernels over float types ----

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T>
constexpr int VecOf() {
  return 16 / static_cast<int>(sizeof(T));
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// out[i] = f(a[i]) or f(a[i], b[i]); out may alias a or b element for element.
template <typename T, int VEC, typename F>
__global__ void Map1(const T* a, T* out, int64_t n, F f) {
  const int64_t packs = VEC > 1 ? n / VEC : 0;
  const int64_t stride = GridStride();
  const Pack<T, VEC>* ap = reinterpret_cast<const Pack<T, VEC>*>(a);
  Pack<T, VEC>* op = reinterpret_cast<Pack<T, VEC>*>(out);
  for (int64_t i = GlobalThread(); i < packs; i += stride) {
    Pack<T, VEC> x = ap[i], r;
#pragma unroll
    for (int k = 0; k < VEC; ++k) r.v[k] = FromF<T>(f(ToF<T>(x.v[k])));
    op[i] = r;
  }
  for (int64_t i = packs * VEC + GlobalThread(); i < n; i += stride) {
    out[i] = FromF<T>(f(ToF<T>(a[i])));
  }
}

template <typename T, int VEC, typename F>
__global__ void Map2(const T* a, const T* b, T* out, int64_t n, F f) {
  const int64_t packs = VEC > 1 ? n / VEC : 0;
  const int64_t stride = GridStride();
  const Pack<T, VEC>* ap = reinterpret_cast<const Pack<T, VEC>*>(a);
  const Pack<T, VEC>* bp = reinterpret_cast<const Pack<T, VEC>*>(b);
  Pack<T, VEC>* op = reinterpret_cast<Pack<T, VEC>*>(out);
  for (int64_t i = GlobalThread(); i < packs; i += stride) {
    Pack<T, VEC> x = ap[i], y = bp[i], r;
#pragma unroll
    for (int k = 0; k < VEC; ++k) r.v[k] = FromF<T>(f(ToF<T>(x.v[k]), ToF<T>(y.v[k])));
    op[i] = r;
  }
  for (int64_t i = packs * VEC + GlobalThread(); i < n; i += stride) {
    out[i] = FromF<T>(f(ToF<T>(a[i]), ToF<T>(b[i])));
  }
}

template <typename T, typename F>
cudaError_t LaunchMap1(const void* a, void* out, int64_t n, F f, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  constexpr int V = VecOf<T>();
  if (Aligned16(a) && Aligned16(out)) {
    Map1<T, V, F>
        <<<GridFor(n, V), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<T*>(out), n, f);
  } else {
    Map1<T, 1, F>
        <<<GridFor(n), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<T*>(out), n, f);
  }
  return cudaGetLastError();
}

template <typename T, typename F>
cudaError_t LaunchMap2(const void* a, const void* b, void* out, int64_t n, F f, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  constexpr int V = VecOf<T>();
  if (Aligned16(a) && Aligned16(b) && Aligned16(out)) {
    Map2<T, V, F><<<GridFor(n, V), kThreads, 0, s>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, f);
  } else {
    Map2<T, 1, F><<<GridFor(n), kThreads, 0, s>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, f);
  }
  return cudaGetLastError();
}

struct ReluF {
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }  // NaN stays NaN
};
struct ReluBackwardF {
  __device__ float operator()(float y, float dy) const { return y > 0.0f ? dy : 0.0f; }
};
struct AddF {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AxpyF {  // (x, y) -> y + alpha * x
  float alpha;
  __device__ float operator()(float x, float y) const { return y + alpha * x; }
};
struct ScaleF {
  float alpha;
  __device__ float operator()(float x) const { return alpha * x; }
};

// ---- conversions (the CPU kernel's rules) ----

// Float to integer: truncation toward zero, saturating; NaN gives 0.
template <typename I>
__device__ __forceinline__ I FloatToInt(float f) {
  const double lo = static_cast<double>(std::numeric_limits<I>::min());
  const double hi = static_cast<double>(std::numeric_limits<I>::max());
  double d = static_cast<double>(f);
  if (!(d == d)) return 0;
  if (d <= lo) return std::numeric_limits<I>::min();
  if (d >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(d);
}

// Integer to bf16 with one rounding to nearest even.
__device__ __forceinline__ __nv_bfloat16 IntToBFloat16(int64_t v) {
  if (v == 0) return __float2bfloat16_rn(0.0f);
  uint64_t m = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  int top = 63 - __clzll(static_cast<long long>(m));
  float f;
  if (top < 8) {
    f = static_cast<float>(m);
  } else {
    int shift = top - 7;
    uint64_t q = m >> shift, rem = m & ((uint64_t{1} << shift) - 1);
    uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    f = ldexpf(static_cast<float>(q), shift);  // exact: q <= 256
  }
  return __float2bfloat16_rn(v < 0 ? -f : f);
}

template <typename T>
constexpr bool kIsFloat = std::is_same<T, float>::value || std::is_same<T, __half>::value ||
                          std::is_same<T, __nv_bfloat16>::value;

template <typename D>
__device__ __forceinline__ D ConvertFromFloat(float f) {
  if constexpr (kIsFloat<D>) {
    return FromF<D>(f);
  } else {
    return FloatToInt<D>(f);
  }
}

template <typename D>
__device__ __forceinline__ D ConvertFromInt(int64_t v) {
  if constexpr (std::is_same<D, float>::value) {
    return static_cast<float>(v);
  } else if constexpr (std::is_same<D, __half>::value) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same<D, __nv_bfloat16>::value) {
    return IntToBFloat16(v);
  } else {
    return static_cast<D>(v);  // integer narrowing wraps
  }
}

template <typename S, typename D>
__device__ __forceinline__ D Convert(S v) {
  if constexpr (kIsFloat<S>) {
    return ConvertFromFloat<D>(ToF<S>(v));
  } else {
    return ConvertFromInt<D>(static_cast<int64_t>(v));
  }
}

template <typename S, typename D>
__global__ void CastKernel(const S* x, D* y, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) y[i] = Convert<S, D>(x[i]);
}

template <typename S, typename D>
cudaError_t LaunchCast(const void* x, void* y, int64_t n, cudaStream_t s) {
  CastKernel<S, D><<<GridFor(n), kThreads, 0, s>>>(static_cast<const S*>(x), static_cast<D*>(y), n);
  return cudaGetLastError();
}

template <typename S>
cudaError_t CastFrom(const void* x, DT to, void* y, int64_t n, cudaStream_t s) {
  switch (to) {
    case kF32:
      return LaunchCast<S, float>(x, y, n, s);
    case kF16:
      return LaunchCast<S, __half>(x, y, n, s);
    case kBF16:
      return LaunchCast<S, __nv_bfloat16>(x, y, n, s);
    case kI32:
      return LaunchCast<S, int32_t>(x, y, n, s);
    case kI64:
      return LaunchCast<S, int64_t>(x, y, n, s);
    case kU8:
      return LaunchCast<S, uint8_t>(x, y, n, s);
  }
  return cudaErrorInvalidValue;
}

// Every thread converts `value` itself (with the device's conversion
// routines, as Cast does) and stores it.
template <typename D>
__global__ void FillKernel(D* p, float value, int64_t n) {
  const D v = ConvertFromFloat<D>(value);
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) p[i] = v;
}

template <typename D>
cudaError_t LaunchFill(void* p, float value, int64_t n, cudaStream_t s) {
  FillKernel<D><<<GridFor(n), kThreads, 0, s>>>(static_cast<D*>(p), value, n);
  return cudaGetLastError();
}

// ---- bias + activation ----

template <typename T, typename B>
__global__ void BiasActKernel(T* y, const B* bias, int64_t n, int64_t channels, int64_t inner,
                              bool relu) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    float v = ToF<T>(y[i]);
    if (bias != nullptr) v += ToF<B>(bias[(i / inner) % channels]);
    if (relu) v = v < 0.0f ? 0.0f : v;
    y[i] = FromF<T>(v);
  }
}

// ---- Philox (bit-compatible with libs/ops/cpu/philox.h) ----

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

__device__ __forceinline__ uint4 PhiloxBlock(uint64_t seed, uint64_t block) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0,
           c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
  }
  return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ float BitsToUniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}
__device__ __forceinline__ float BitsToUniformOpenZero(uint32_t bits) {
  return static_cast<float>((bits >> 8) + 1u) * (1.0f / 16777216.0f);
}

// Thread t computes Philox block first_block + t and writes the stream
// elements of that block that fall in [offset, offset + n).
template <bool kNormal>
__global__ void RandomKernel(float* p, int64_t n, uint64_t seed, uint64_t offset, uint64_t blocks,
                             float a, float b, float top) {
  const uint64_t first_block = offset / 4;
  for (uint64_t t = GlobalThread(); t < blocks; t += GridStride()) {
    const uint64_t block = first_block + t;
    const uint4 r = PhiloxBlock(seed, block);
    const uint32_t bits[4] = {r.x, r.y, r.z, r.w};
    float vals[4];
    if (kNormal) {
      constexpr float kTwoPi = 6.283185307179586f;
#pragma unroll
      for (int k = 0; k < 4; k += 2) {
        const float rr = sqrtf(-2.0f * logf(BitsToUniformOpenZero(bits[k])));
        const float theta = kTwoPi * BitsToUniform(bits[k + 1]);
        vals[k] = __fadd_rn(a, __fmul_rn(b, __fmul_rn(rr, cosf(theta))));
        vals[k + 1] = __fadd_rn(a, __fmul_rn(b, __fmul_rn(rr, sinf(theta))));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        // low + range * u, without contraction into an FMA (as on the CPU).
        const float v = __fadd_rn(a, __fmul_rn(b, BitsToUniform(bits[k])));
        vals[k] = v < top ? v : top;
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint64_t j = block * 4 + k;  // stream element
      if (j >= offset && j - offset < static_cast<uint64_t>(n)) p[j - offset] = vals[k];
    }
  }
}

template <bool kNormal>
cudaError_t LaunchRandom(float* p, int64_t n, uint64_t seed, uint64_t offset, float a, float b,
                         float top, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const uint64_t first = offset / 4;
  const uint64_t last = (offset + static_cast<uint64_t>(n) - 1) / 4;
  const uint64_t blocks = last - first + 1;
  RandomKernel<kNormal><<<GridFor(static_cast<int64_t>(blocks)), kThreads, 0, s>>>(
      p, n, seed, offset, blocks, a, b, top);
  return cudaGetLastError();
}

__global__ void SpinKernel(int64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<int64_t>(now - start) < ns);
}

}  // namespace

cudaError_t Relu(DT dt, const void* x, void* y, int64_t n, cudaStream_t s) {
  DT_DISPATCH_FLOAT(dt, T, return LaunchMap1<T>(x, y, n, ReluF{}, s));
  return cudaSuccess;
}

cudaError_t ReluBackward(DT dt, const void* y, const void* dy, void* dx, int64_t n,
                         cudaStream_t s) {
  DT_DISPATCH_FLOAT(dt, T, return LaunchMap2<T>(y, dy, dx, n, ReluBackwardF{}, s));
  return cudaSuccess;
}

cudaError_t Add(DT dt, const void* a, const void* b, void* c, int64_t n, cudaStream_t s) {
  DT_DISPATCH_FLOAT(dt, T, return LaunchMap2<T>(a, b, c, n, AddF{}, s));
  return cudaSuccess;
}

cudaError_t Axpy(DT dt, float alpha, const void* x, void* y, int64_t n, cudaStream_t s) {
  DT_DISPATCH_FLOAT(dt, T, return LaunchMap2<T>(x, y, y, n, AxpyF{alpha}, s));
  return cudaSuccess;
}

cudaError_t Scale(DT dt, const void* x, float alpha, void* y, int64_t n, cudaStream_t s) {
  DT_DISPATCH_FLOAT(dt, T, return LaunchMap1<T>(x, y, n, ScaleF{alpha}, s));
  return cudaSuccess;
}

cudaError_t Fill(DT dt, void* p, float value, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  switch (dt) {
    case kF32:
      return LaunchFill<float>(p, value, n, s);
    case kF16:
      return LaunchFill<__half>(p, value, n, s);
    case kBF16:
      return LaunchFill<__nv_bfloat16>(p, value, n, s);
    case kI32:
      return LaunchFill<int32_t>(p, value, n, s);
    case kI64:
      return LaunchFill<int64_t>(p, value, n, s);
    case kU8:
      return LaunchFill<uint8_t>(p, value, n, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t Cast(DT from, const void* x, DT to, void* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  switch (from) {
    case kF32:
      return CastFrom<float>(x, to, y, n, s);
    case kF16:
      return CastFrom<__half>(x, to, y, n, s);
    case kBF16:
      return CastFrom<__nv_bfloat16>(x, to, y, n, s);
    case kI32:
      return CastFrom<int32_t>(x, to, y, n, s);
    case kI64:
      return CastFrom<int64_t>(x, to, y, n, s);
    case kU8:
      return CastFrom<uint8_t>(x, to, y, n, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t BiasAct(DT dt, void* y, DT bias_dt, const void* bias, int64_t outer, int64_t channels,
                    int64_t inner, bool relu, cudaStream_t s) {
  const int64_t n = outer * channels * inner;
  if (n <= 0 || (bias == nullptr && !relu)) return cudaSuccess;
  if (channels <= 0 || inner <= 0) return cudaErrorInvalidValue;
  DT_DISPATCH_FLOAT(dt, T, {
    DT_DISPATCH_FLOAT(bias_dt, B, {
      BiasActKernel<T, B><<<GridFor(n), kThreads, 0, s>>>(
          static_cast<T*>(y), static_cast<const B*>(bias), n, channels, inner, relu);
      return cudaGetLastError();
    });
  });
  return cudaSuccess;
}

cudaError_t RandomUniform(float* p, int64_t n, float low, float high, float top, uint64_t seed,
                          uint64_t offset, cudaStream_t s) {
  return LaunchRandom<false>(p, n, seed, offset, low, high - low, top, s);
}

cudaError_t RandomNormal(float* p, int64_t n, float mean, float stddev, uint64_t seed,
                         uint64_t offset, cudaStream_t s) {
  return LaunchRandom<true>(p, n, seed, offset, mean, stddev, 0.0f, s);
}

cudaError_t Spin(int64_t nanoseconds, cudaStream_t s) {
  SpinKernel<<<1, 1, 0, s>>>(nanoseconds);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace dtrain
