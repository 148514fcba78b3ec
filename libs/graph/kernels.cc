#include "libs/graph/kernels.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <memory>

#include "libs/base/logging.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace graph {
namespace kernels {
namespace {

// ---- fused elementwise ----

// Elements per block: a block's intermediate results stay in L1.
constexpr int64_t kBlock = 512;
// A call parallelizes from this many elements on (as libs/ops/cpu does for
// elementwise loops: below it a parallel region costs more than it saves).
constexpr int64_t kParallelElements = 32768;

// Compiled for AVX-512, AVX2 and the build's baseline; the loader picks one.
#define DT_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

DT_VECTOR_CLONES void RunBlock(const ElementwiseInstr* prog, int num_instrs,
                               const float* const* inputs, int num_inputs, float* y, int64_t begin,
                               int64_t len, float (*regs)[kBlock]) {
  auto operand = [&](int idx) -> const float* {
    return idx < num_inputs ? inputs[idx] + begin : regs[idx - num_inputs];
  };
  for (int k = 0; k < num_instrs; ++k) {
    const ElementwiseInstr& in = prog[k];
    // The last instruction writes the output directly. Every instruction
    // reads and writes element i only at index i, so an output aliasing an
    // input is safe.
    float* dst = k == num_instrs - 1 ? y + begin : regs[k];
    const float* a = operand(in.a);
    switch (in.op) {
      case ElementwiseOp::kAdd: {
        const float* b = operand(in.b);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) dst[i] = a[i] + b[i];
        break;
      }
      case ElementwiseOp::kMul: {
        const float* b = operand(in.b);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) dst[i] = a[i] * b[i];
        break;
      }
      case ElementwiseOp::kRelu:
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) dst[i] = a[i] < 0.0f ? 0.0f : a[i];  // NaN stays NaN
        break;
      case ElementwiseOp::kReluMask: {
        const float* b = operand(in.b);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) dst[i] = a[i] > 0.0f ? b[i] : 0.0f;
        break;
      }
      case ElementwiseOp::kScale: {
        const float s = in.imm;
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) dst[i] = s * a[i];
        break;
      }
    }
  }
}

// ---- small-batch linear ----

constexpr int64_t kMaxUnroll = 8;  // vectors of outputs kept in registers

template <int NV>
__attribute__((target("avx512f"))) void Block512(const float* wt, const float* bias, int64_t k,
                                                 int64_t mp, const float* x, bool relu, float* y,
                                                 int64_t valid) {
  __m512 acc[NV];
  for (int j = 0; j < NV; ++j) acc[j] = _mm512_loadu_ps(bias + 16 * j);
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m512 xv = _mm512_set1_ps(x[kk]);
    const float* row = wt + kk * mp;
    for (int j = 0; j < NV; ++j)
      acc[j] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(row + 16 * j), acc[j]);
  }
  const __m512 zero = _mm512_setzero_ps();
  for (int j = 0; j < NV; ++j) {
    // max(0, a) returns a when a is NaN (the second operand wins).
    __m512 v = relu ? _mm512_maskz_max_ps(0xFFFF, zero, acc[j]) : acc[j];
    int64_t rem = valid - 16 * j;
    if (rem >= 16) {
      _mm512_storeu_ps(y + 16 * j, v);
    } else if (rem > 0) {
      _mm512_mask_storeu_ps(y + 16 * j, static_cast<__mmask16>((1u << rem) - 1), v);
    }
  }
}

__attribute__((target("avx512f"))) void LinearAvx512(const float* wt, const float* bias, int64_t k,
                                                     int64_t mp, int64_t m, const float* x,
                                                     int64_t n, bool relu, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * k;
    float* yr = y + r * m;
    for (int64_t m0 = 0; m0 < mp; m0 += 16 * kMaxUnroll) {
      const int64_t nv = std::min<int64_t>(kMaxUnroll, (mp - m0) / 16);
      const float* w0 = wt + m0;
      const float* b0 = bias + m0;
      const int64_t valid = m - m0;
      switch (nv) {
        case 8:
          Block512<8>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 7:
          Block512<7>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 6:
          Block512<6>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 5:
          Block512<5>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 4:
          Block512<4>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 3:
          Block512<3>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 2:
          Block512<2>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        default:
          Block512<1>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
      }
    }
  }
}

template <int NV>
__attribute__((target("avx2,fma"))) void Block256(const float* wt, const float* bias, int64_t k,
                                                  int64_t mp, const float* x, bool relu, float* y,
                                                  int64_t valid) {
  __m256 acc[NV];
  for (int j = 0; j < NV; ++j) acc[j] = _mm256_loadu_ps(bias + 8 * j);
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m256 xv = _mm256_set1_ps(x[kk]);
    const float* row = wt + kk * mp;
    for (int j = 0; j < NV; ++j) acc[j] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(row + 8 * j), acc[j]);
  }
  const __m256 zero = _mm256_setzero_ps();
  for (int j = 0; j < NV; ++j) {
    __m256 v = relu ? _mm256_max_ps(zero, acc[j]) : acc[j];
    int64_t rem = valid - 8 * j;
    if (rem >= 8) {
      _mm256_storeu_ps(y + 8 * j, v);
    } else if (rem > 0) {
      alignas(32) int32_t mask[8];
      for (int i = 0; i < 8; ++i) mask[i] = i < rem ? -1 : 0;
      _mm256_maskstore_ps(y + 8 * j, _mm256_load_si256(reinterpret_cast<const __m256i*>(mask)), v);
    }
  }
}

__attribute__((target("avx2,fma"))) void LinearAvx2(const float* wt, const float* bias, int64_t k,
                                                    int64_t mp, int64_t m, const float* x,
                                                    int64_t n, bool relu, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * k;
    float* yr = y + r * m;
    for (int64_t m0 = 0; m0 < mp; m0 += 8 * kMaxUnroll) {
      const int64_t nv = std::min<int64_t>(kMaxUnroll, (mp - m0) / 8);
      const float* w0 = wt + m0;
      const float* b0 = bias + m0;
      const int64_t valid = m - m0;
      switch (nv) {
        case 8:
          Block256<8>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 7:
          Block256<7>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 6:
          Block256<6>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 5:
          Block256<5>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 4:
          Block256<4>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 3:
          Block256<3>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        case 2:
          Block256<2>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
        default:
          Block256<1>(w0, b0, k, mp, xr, relu, yr + m0, valid);
          break;
      }
    }
  }
}

// ---- avg-pool backward + relu backward ----

// Longest output row the row-buffered kernels handle (stack buffers).
constexpr int64_t kMaxRow = 4096;

DT_VECTOR_CLONES void PoolReluBackwardPlane(const float* g, const float* yp, float* d, int64_t H,
                                            int64_t W, int64_t Ho, int64_t Wo,
                                            const ops::Pool2dParams& p) {
  const int k = p.kernel, s = p.stride, pad = p.padding;
  if (k == s && pad == 0 && W <= kMaxRow) {
    // Windows tile the plane: each cell gets its window's average gradient
    // (or nothing, past the last window).
    const float count = static_cast<float>(k * k);
    float row[kMaxRow];
    for (int64_t ho = 0; ho * k < H; ++ho) {
      const int64_t covered = ho < Ho ? Wo * k : 0;
      if (ho < Ho) {
        for (int64_t wo = 0; wo < Wo; ++wo) {
          const float v = g[ho * Wo + wo] / count;
          for (int j = 0; j < k; ++j) row[wo * k + j] = v;
        }
      }
      for (int64_t w = covered; w < W; ++w) row[w] = 0.0f;
      const int64_t h_end = std::min<int64_t>(H, (ho + 1) * k);
      for (int64_t h = ho * k; h < h_end; ++h) {
        const float* yr = yp + h * W;
        float* dr = d + h * W;
#pragma omp simd
        for (int64_t w = 0; w < W; ++w) dr[w] = yr[w] > 0.0f ? row[w] : 0.0f;
      }
    }
    return;
  }
  // General windows: scatter the averaged gradient, then mask.
  std::fill_n(d, H * W, 0.0f);
  for (int64_t ho = 0; ho < Ho; ++ho) {
    const int64_t h0 = ho * s - pad;
    const int64_t hb = std::max<int64_t>(h0, 0), he = std::min<int64_t>(h0 + k, H);
    for (int64_t wo = 0; wo < Wo; ++wo) {
      const int64_t w0 = wo * s - pad;
      const int64_t wb = std::max<int64_t>(w0, 0), we = std::min<int64_t>(w0 + k, W);
      const float gv = g[ho * Wo + wo] / static_cast<float>((he - hb) * (we - wb));
      for (int64_t h = hb; h < he; ++h) {
        for (int64_t w = wb; w < we; ++w) d[h * W + w] += gv;
      }
    }
  }
#pragma omp simd
  for (int64_t i = 0; i < H * W; ++i) d[i] = yp[i] > 0.0f ? d[i] : 0.0f;
}

// ---- small-channel convolution (AVX-512) ----

// Samples per partial sum of the weight gradient.
constexpr int64_t kSamplesPerBlock = 8;
// Largest (padded) input sample the kernels copy to the stack, in floats
// (the IR's limit for the fused weight-gradient op).
constexpr int64_t kMaxPaddedSample = kFusedWeightsMaxInput;
static_assert(kSmallConvMaxTaps == kFusedWeightsMaxTaps, "one limit for the small-conv kernels");

struct ConvShape {
  int64_t n, c, h, w, o, kh, kw, ho, wo, pad;
  int64_t hp, wp;  // padded input
  int64_t taps() const { return c * kh * kw; }
};

ConvShape MakeConvShape(const Shape& x, const Shape& w, const ops::Conv2dParams& p) {
  ConvShape s;
  s.n = x[0];
  s.c = x[1];
  s.h = x[2];
  s.w = x[3];
  s.o = w[0];
  s.kh = w[2];
  s.kw = w[3];
  s.pad = p.padding;
  s.hp = s.h + 2 * s.pad;
  s.wp = s.w + 2 * s.pad;
  s.ho = s.hp - s.kh + 1;
  s.wo = s.wp - s.kw + 1;
  return s;
}

// The input sample as the kernels read it: itself when there is no
// padding, else a zero-padded copy in `buf` (C x hp x wp floats).
const float* PaddedSample(const ConvShape& s, const float* x, float* buf) {
  if (s.pad == 0) return x;
  std::fill_n(buf, s.c * s.hp * s.wp, 0.0f);
  for (int64_t c = 0; c < s.c; ++c) {
    for (int64_t h = 0; h < s.h; ++h) {
      std::copy_n(x + (c * s.h + h) * s.w, s.w, buf + (c * s.hp + h + s.pad) * s.wp + s.pad);
    }
  }
  return buf;
}

// Offset of each tap (c, kh, kw) in a padded sample.
void TapOffsets(const ConvShape& s, int64_t* off) {
  for (int64_t c = 0; c < s.c; ++c) {
    for (int64_t kh = 0; kh < s.kh; ++kh) {
      for (int64_t kw = 0; kw < s.kw; ++kw)
        off[(c * s.kh + kh) * s.kw + kw] = (c * s.hp + kh) * s.wp + kw;
    }
  }
}

inline __mmask16 __attribute__((target("avx512f"))) TailMask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// Sum of the lanes, in lane order.
inline float __attribute__((target("avx512f"))) LaneSum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float sum = 0.0f;
  for (int i = 0; i < 16; ++i) sum += t[i];
  return sum;
}

// Every output plane of one sample: for each 16-column strip of a row, the
// kT input vectors are loaded once and reused by all filters. kT > 0 fixes
// the tap count at compile time (the vectors then live in registers); 0
// reads it from `s`.
template <int kT>
__attribute__((target("avx512f"))) void ConvForwardSample(const ConvShape& s, const float* xp,
                                                          const float* w, const float* b, bool relu,
                                                          float* y) {
  const int64_t taps = kT > 0 ? kT : s.taps();
  int64_t off[kSmallConvMaxTaps];
  TapOffsets(s, off);
  __m512 xv[kT > 0 ? kT : kSmallConvMaxTaps];
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t ho = 0; ho < s.ho; ++ho) {
    for (int64_t w0 = 0; w0 < s.wo; w0 += 16) {
      const __mmask16 m = TailMask(s.wo - w0);
      const float* base = xp + ho * s.wp + w0;
#pragma GCC unroll 32
      for (int64_t t = 0; t < taps; ++t) xv[t] = _mm512_maskz_loadu_ps(m, base + off[t]);
      for (int64_t o = 0; o < s.o; ++o) {
        const float* wr = w + o * taps;
        // Taps in order, then the bias (as oneDNN's gemm-based kernels for
        // these shapes do: results match theirs in practice).
        __m512 acc = _mm512_mul_ps(_mm512_set1_ps(wr[0]), xv[0]);
#pragma GCC unroll 32
        for (int64_t t = 1; t < taps; ++t) acc = _mm512_fmadd_ps(_mm512_set1_ps(wr[t]), xv[t], acc);
        if (b != nullptr) acc = _mm512_add_ps(acc, _mm512_set1_ps(b[o]));
        if (relu) acc = _mm512_maskz_max_ps(0xFFFF, zero, acc);  // NaN stays NaN
        _mm512_mask_storeu_ps(y + (o * s.ho + ho) * s.wo + w0, m, acc);
      }
    }
  }
}

using ForwardSampleFn = void (*)(const ConvShape&, const float*, const float*, const float*, bool,
                                 float*);

ForwardSampleFn ForwardFor(int64_t taps) {
  switch (taps) {
    case 9:
      return &ConvForwardSample<9>;
    case 25:
      return &ConvForwardSample<25>;
    case 27:
      return &ConvForwardSample<27>;
    default:
      return &ConvForwardSample<0>;
  }
}

// Adds one sample's gradient plane `g` (ho x wo) of one filter to the
// weight-gradient lanes: lanes[t * 16 + l] for tap t, lanes[taps * 16 + l]
// for the bias.
template <int kT>
__attribute__((target("avx512f"))) void ConvWeightsPlaneAvx512(const ConvShape& s, const float* xp,
                                                               const float* g, float* lanes) {
  const int64_t taps = kT > 0 ? kT : s.taps();
  int64_t off[kSmallConvMaxTaps];
  TapOffsets(s, off);
  __m512 acc[kT > 0 ? kT : kSmallConvMaxTaps];
#pragma GCC unroll 32
  for (int64_t t = 0; t < taps; ++t) acc[t] = _mm512_loadu_ps(lanes + 16 * t);
  __m512 accb = _mm512_loadu_ps(lanes + 16 * taps);
  for (int64_t ho = 0; ho < s.ho; ++ho) {
    for (int64_t w0 = 0; w0 < s.wo; w0 += 16) {
      const __mmask16 m = TailMask(s.wo - w0);
      const __m512 gv = _mm512_maskz_loadu_ps(m, g + ho * s.wo + w0);
      accb = _mm512_add_ps(accb, gv);
      const float* base = xp + ho * s.wp + w0;
#pragma GCC unroll 32
      for (int64_t t = 0; t < taps; ++t) {
        acc[t] = _mm512_fmadd_ps(gv, _mm512_maskz_loadu_ps(m, base + off[t]), acc[t]);
      }
    }
  }
#pragma GCC unroll 32
  for (int64_t t = 0; t < taps; ++t) _mm512_storeu_ps(lanes + 16 * t, acc[t]);
  _mm512_storeu_ps(lanes + 16 * taps, accb);
}

// The same without vector instructions (CPUs without AVX-512).
void ConvWeightsPlaneGeneric(const ConvShape& s, const float* xp, const float* g, float* lanes) {
  const int64_t taps = s.taps();
  int64_t off[kSmallConvMaxTaps];
  TapOffsets(s, off);
  for (int64_t ho = 0; ho < s.ho; ++ho) {
    for (int64_t wo = 0; wo < s.wo; ++wo) {
      const float gv = g[ho * s.wo + wo];
      const float* base = xp + ho * s.wp + wo;
      const int64_t l = wo % 16;
      for (int64_t t = 0; t < taps; ++t) lanes[16 * t + l] += gv * base[off[t]];
      lanes[16 * taps + l] += gv;
    }
  }
}

using WeightsPlaneFn = void (*)(const ConvShape&, const float*, const float*, float*);

WeightsPlaneFn WeightsPlaneFor(int64_t taps) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) return &ConvWeightsPlaneGeneric;
  switch (taps) {
    case 9:
      return &ConvWeightsPlaneAvx512<9>;
    case 25:
      return &ConvWeightsPlaneAvx512<25>;
    case 27:
      return &ConvWeightsPlaneAvx512<27>;
    default:
      return &ConvWeightsPlaneAvx512<0>;
  }
}

// Where the weight gradient's output gradient comes from: stored planes, or
// computed per plane as avg_pool2d_relu_backward(dy_pooled, y) (fused).
struct GradSource {
  const float* dy = nullptr;
  const float* dy_pooled = nullptr;
  const float* y = nullptr;
  int pool = 0;  // tiled pooling window (kernel = stride, no padding)
};

// dw, db from x and the gradient source; `scratch` as
// SmallConvBackwardWeightsScratch. Partial sums over fixed blocks of
// samples, added in block order: independent of the thread count.
void WeightsGradient(const ConvShape& s, const float* x, const GradSource& src, Tensor* dw,
                     Tensor* db, float* scratch) {
  const WeightsPlaneFn fn = WeightsPlaneFor(s.taps());
  const int64_t taps = s.taps(), stride = taps + 1;
  const int64_t blocks = (s.n + kSamplesPerBlock - 1) / kSamplesPerBlock;
  const int64_t pho = src.pool > 0 ? s.ho / src.pool : 0;
  const int64_t pwo = src.pool > 0 ? s.wo / src.pool : 0;
  const ops::Pool2dParams pool{src.pool, src.pool, 0};
  // scratch[(block * O + o) * stride + tap]: one block's sums, the bias last.
  auto task = [&](int64_t t) {
    const int64_t blk = t / s.o, o = t % s.o;
    alignas(64) float lanes[(kSmallConvMaxTaps + 1) * 16];
    alignas(64) float xbuf[kMaxPaddedSample];
    alignas(64) float gbuf[kMaxPaddedSample];
    std::fill_n(lanes, stride * 16, 0.0f);
    const int64_t n_end = std::min(s.n, (blk + 1) * kSamplesPerBlock);
    for (int64_t n = blk * kSamplesPerBlock; n < n_end; ++n) {
      const float* xp = PaddedSample(s, x + n * s.c * s.h * s.w, xbuf);
      const int64_t plane = n * s.o + o;
      const float* g;
      if (src.dy != nullptr) {
        g = src.dy + plane * s.ho * s.wo;
      } else {
        PoolReluBackwardPlane(src.dy_pooled + plane * pho * pwo, src.y + plane * s.ho * s.wo, gbuf,
                              s.ho, s.wo, pho, pwo, pool);
        g = gbuf;
      }
      fn(s, xp, g, lanes);
    }
    float* part = scratch + t * stride;
    for (int64_t i = 0; i < stride; ++i) {
      float sum = 0.0f;
      for (int l = 0; l < 16; ++l) sum += lanes[16 * i + l];
      part[i] = sum;
    }
  };
  const int64_t tasks = blocks * s.o;
  const int threads = ops::CpuThreads();
  if (threads <= 1 || tasks < 2 || omp_in_parallel()) {
    for (int64_t t = 0; t < tasks; ++t) task(t);
  } else {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tasks; ++t) task(t);
  }
  float* pdw = dw->data<float>();
  float* pdb = db != nullptr ? db->data<float>() : nullptr;
  for (int64_t o = 0; o < s.o; ++o) {
    for (int64_t i = 0; i < stride; ++i) {
      float sum = 0.0f;
      for (int64_t blk = 0; blk < blocks; ++blk) sum += scratch[(blk * s.o + o) * stride + i];
      if (i < taps) {
        pdw[o * taps + i] = sum;
      } else if (pdb != nullptr) {
        pdb[o] = sum;
      }
    }
  }
}

}  // namespace

void FusedElementwise(const ElementwiseInstr* program, int num_instrs, const float* const* inputs,
                      int num_inputs, float* y, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const int threads = ops::CpuThreads();
  if (threads <= 1 || n < kParallelElements || omp_in_parallel()) {
    float regs[kMaxElementwiseInstrs][kBlock];
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kBlock;
      RunBlock(program, num_instrs, inputs, num_inputs, y, begin, std::min(kBlock, n - begin),
               regs);
    }
    return;
  }
  // Static schedule over blocks: every element is computed by the same code
  // whatever the thread count.
#pragma omp parallel num_threads(threads)
  {
    float regs[kMaxElementwiseInstrs][kBlock];
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kBlock;
      RunBlock(program, num_instrs, inputs, num_inputs, y, begin, std::min(kBlock, n - begin),
               regs);
    }
  }
}

void AvgPool2dReluBackward(const Tensor& dy, const Tensor& y, const ops::Pool2dParams& p,
                           Tensor* dx) {
  const int64_t N = dx->dim(0), C = dx->dim(1), H = dx->dim(2), W = dx->dim(3);
  const int64_t Ho = dy.dim(2), Wo = dy.dim(3);
  const float* pdy = dy.data<float>();
  const float* py = y.data<float>();
  float* pdx = dx->data<float>();
  const int64_t planes = N * C;
  const int threads = ops::CpuThreads();
  if (threads <= 1 || planes * H * W < kParallelElements || omp_in_parallel()) {
    for (int64_t c = 0; c < planes; ++c) {
      PoolReluBackwardPlane(pdy + c * Ho * Wo, py + c * H * W, pdx + c * H * W, H, W, Ho, Wo, p);
    }
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t c = 0; c < planes; ++c) {
    PoolReluBackwardPlane(pdy + c * Ho * Wo, py + c * H * W, pdx + c * H * W, H, W, Ho, Wo, p);
  }
}

bool SmallConvSupported(const Shape& x, const Shape& w, const ops::Conv2dParams& p) {
  if (x.size() != 4 || w.size() != 4 || p.stride != 1 || p.padding < 0) return false;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) return false;
  const ConvShape s = MakeConvShape(x, w, p);
  return s.taps() <= kSmallConvMaxTaps && s.ho > 0 && s.wo > 0 &&
         s.c * s.hp * s.wp <= kMaxPaddedSample;
}

void SmallConv2d(const Tensor& x, const Tensor& w, const Tensor* b, const ops::Conv2dParams& p,
                 bool relu, Tensor* y) {
  const ConvShape s = MakeConvShape(x.shape(), w.shape(), p);
  const ForwardSampleFn fn = ForwardFor(s.taps());
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pb = b != nullptr ? b->data<float>() : nullptr;
  float* py = y->data<float>();
  auto sample = [&](int64_t n) {
    alignas(64) float buf[kMaxPaddedSample];
    const float* xp = PaddedSample(s, px + n * s.c * s.h * s.w, buf);
    fn(s, xp, pw, pb, relu, py + n * s.o * s.ho * s.wo);
  };
  const int threads = ops::CpuThreads();
  if (threads <= 1 || s.n < 2 || omp_in_parallel()) {
    for (int64_t n = 0; n < s.n; ++n) sample(n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < s.n; ++n) sample(n);
}

int64_t SmallConvBackwardWeightsScratch(const Shape& x, const Shape& w) {
  const int64_t blocks = (x[0] + kSamplesPerBlock - 1) / kSamplesPerBlock;
  return blocks * w[0] * (w[1] * w[2] * w[3] + 1);
}

void SmallConv2dBackwardWeights(const Tensor& x, const Tensor& dy, const ops::Conv2dParams& p,
                                Tensor* dw, Tensor* db, float* scratch) {
  GradSource src;
  src.dy = dy.data<float>();
  WeightsGradient(MakeConvShape(x.shape(), dw->shape(), p), x.data<float>(), src, dw, db, scratch);
}

void ConvWeightsPoolRelu(const Tensor& x, const Tensor& dy_pooled, const Tensor& y,
                         const ops::Conv2dParams& p, int pool, Tensor* dw, Tensor* db,
                         float* scratch) {
  GradSource src;
  src.dy_pooled = dy_pooled.data<float>();
  src.y = y.data<float>();
  src.pool = pool;
  WeightsGradient(MakeConvShape(x.shape(), dw->shape(), p), x.data<float>(), src, dw, db, scratch);
}

std::unique_ptr<PackedLinear> PackedLinear::Create(const Tensor& w, const Tensor* b) {
  Fn fn = nullptr;
  const char* isa = "";
  int64_t width = 0;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    fn = &LinearAvx512;
    isa = "avx512";
    width = 16;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    fn = &LinearAvx2;
    isa = "avx2";
    width = 8;
  } else {
    return nullptr;
  }
  std::unique_ptr<PackedLinear> p(new PackedLinear());
  p->m_ = w.dim(0);
  p->k_ = w.dim(1);
  p->mp_ = (p->m_ + width - 1) / width * width;
  p->fn_ = fn;
  p->isa_ = isa;
  p->wt_ = Tensor::Zeros({p->k_, p->mp_});
  p->bias_ = Tensor::Zeros({p->mp_});
  const float* src = w.data<float>();
  float* dst = p->wt_.data<float>();
  for (int64_t m = 0; m < p->m_; ++m) {
    for (int64_t k = 0; k < p->k_; ++k) dst[k * p->mp_ + m] = src[m * p->k_ + k];
  }
  if (b != nullptr) std::copy_n(b->data<float>(), p->m_, p->bias_.data<float>());
  return p;
}

void PackedLinear::Run(const Tensor& x, bool relu, Tensor* y) const {
  fn_(wt_.data<float>(), bias_.data<float>(), k_, mp_, m_, x.data<float>(), x.dim(0), relu,
      y->data<float>());
}

}  // namespace kernels
}  // namespace graph
}  // namespace dtrain
