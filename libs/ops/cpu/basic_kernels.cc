// CPU kernels that need no oneDNN: elementwise ops, max / global average
// pooling, softmax cross-entropy, reductions, SGD, fill, Philox random numbers
// and dtype casts.
//
// Parallelism: OpenMP with the calling thread's thread count (CpuThreads()),
// static schedule, only when a call does at least kParallelWork units of work
// (roughly elements touched); smaller calls run on the calling thread, where a
// parallel region would cost more than it saves. Hot loops are marked
// `omp simd`: at -O2 GCC's "very cheap" vectorizer cost model refuses loops
// that need a scalar epilogue or an alias check, and `omp simd` lifts that
// (every such loop is safe for outputs that alias inputs element for element,
// the only aliasing ops.h allows).
//
// Results never depend on the thread count: each element's value is computed
// by the same code whichever thread computes it, and reductions (sum, the
// cross-entropy loss) combine fixed-size blocks in a fixed order.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "libs/base/logging.h"
#include "libs/ops/cpu/philox.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace ops {
namespace cpu {
namespace {

// ---- parallel loops ----

// A call parallelizes from this much work on, and gives each thread at least
// kWorkPerThread of it.
constexpr int64_t kParallelWork = 32768;
constexpr int64_t kWorkPerThread = 16384;

// Number of chunks for `n` items of `cost` work each: 1 means run serially.
int NumChunks(int64_t n, int64_t cost) {
  int threads = CpuThreads();
  if (threads <= 1 || n < 2 || omp_in_parallel()) return 1;
  int64_t work = n * std::max<int64_t>(cost, 1);
  if (work < kParallelWork) return 1;
  int64_t chunks = std::min<int64_t>({static_cast<int64_t>(threads), n, work / kWorkPerThread});
  return static_cast<int>(std::max<int64_t>(chunks, 1));
}

// Calls f(begin, end) on contiguous ranges covering [0, n), one per thread,
// statically scheduled. Each item costs about `cost` units of work. With
// `align` > 1, range boundaries (but the last) are multiples of `align`.
template <typename F>
void ParallelFor(int64_t n, int64_t cost, int64_t align, const F& f) {
  if (n <= 0) return;
  int chunks = NumChunks(n, cost);
  if (chunks == 1) {
    f(int64_t{0}, n);
    return;
  }
  auto bound = [n, chunks, align](int64_t c) {
    if (c >= chunks) return n;
    int64_t b = n * c / chunks;
    return std::min(n, b / align * align);
  };
#pragma omp parallel for schedule(static) num_threads(chunks)
  for (int c = 0; c < chunks; ++c) {
    int64_t b = bound(c), e = bound(c + 1);
    if (b < e) f(b, e);
  }
}

// Elementwise loops: one unit of work per element, chunks aligned to 64 bytes
// of f32 so that threads never share a cache line.
template <typename F>
void ParallelElements(int64_t n, const F& f) {
  ParallelFor(n, 1, 16, f);
}

// Sum over i in [0, n) of f(begin, end) (a double) evaluated on blocks of
// `block` items: blocks are fixed by n, and their sums are added in order, so
// the result does not depend on the thread count.
template <typename F>
double BlockedSum(int64_t n, int64_t block, int64_t cost, const F& f) {
  if (n <= 0) return 0.0;
  block = std::max<int64_t>(block, 1);
  int64_t nb = (n + block - 1) / block;
  if (nb == 1) return f(int64_t{0}, n);
  std::vector<double> part(static_cast<size_t>(nb));
  ParallelFor(nb, block * cost, 1, [&](int64_t bb, int64_t be) {
    for (int64_t k = bb; k < be; ++k) part[k] = f(k * block, std::min(n, (k + 1) * block));
  });
  double s = 0;
  for (double p : part) s += p;
  return s;
}

// ---- argument checks ----

void CheckCpu(const char* op, const char* name, const Tensor& t) {
  DT_CHECK(t.defined()) << op << ": " << name << " is undefined";
  DT_CHECK(t.device().is_cpu()) << op << ": " << name << " " << t.DebugString()
                                << " is not on the CPU";
}

void CheckF32(const char* op, const char* name, const Tensor& t) {
  CheckCpu(op, name, t);
  DT_CHECK(t.dtype() == DType::kF32)
      << op << ": " << name << " must be f32, got " << t.DebugString();
}

void CheckSameShape(const char* op, const char* na, const Tensor& a, const char* nb,
                    const Tensor& b) {
  DT_CHECK(a.shape() == b.shape()) << op << ": " << na << " " << a.DebugString() << " and " << nb
                                   << " " << b.DebugString() << " differ in shape";
}

void CheckPool(const char* op, const Pool2dParams& p) {
  DT_CHECK(p.kernel > 0 && p.stride > 0 && p.padding >= 0 && 2 * p.padding <= p.kernel)
      << op << ": kernel " << p.kernel << ", stride " << p.stride << ", padding " << p.padding
      << " (need kernel > 0, stride > 0, 0 <= padding <= kernel / 2)";
}

// ---- elementwise ----

void Relu(const Tensor& x, Tensor* y) {
  CpuThreads();
  CheckF32("relu", "x", x);
  CheckF32("relu", "y", *y);
  CheckSameShape("relu", "x", x, "y", *y);
  const float* px = x.data<float>();
  float* py = y->data<float>();
  ParallelElements(x.numel(), [=](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) py[i] = px[i] < 0.0f ? 0.0f : px[i];  // NaN stays NaN
  });
}

void ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
  CpuThreads();
  CheckF32("relu_backward", "y", y);
  CheckF32("relu_backward", "dy", dy);
  CheckF32("relu_backward", "dx", *dx);
  CheckSameShape("relu_backward", "y", y, "dy", dy);
  CheckSameShape("relu_backward", "y", y, "dx", *dx);
  const float* py = y.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx->data<float>();
  ParallelElements(y.numel(), [=](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) pdx[i] = py[i] > 0.0f ? pdy[i] : 0.0f;
  });
}

void Add(const Tensor& a, const Tensor& b, Tensor* c) {
  CpuThreads();
  CheckF32("add", "a", a);
  CheckF32("add", "b", b);
  CheckF32("add", "c", *c);
  CheckSameShape("add", "a", a, "b", b);
  CheckSameShape("add", "a", a, "c", *c);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = c->data<float>();
  ParallelElements(a.numel(), [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) pc[i] = pa[i] + pb[i];
  });
}

void Axpy(float alpha, const Tensor& x, Tensor* y) {
  CpuThreads();
  CheckF32("axpy", "x", x);
  CheckF32("axpy", "y", *y);
  CheckSameShape("axpy", "x", x, "y", *y);
  const float* px = x.data<float>();
  float* py = y->data<float>();
  ParallelElements(x.numel(), [=](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) py[i] += alpha * px[i];
  });
}

void Scale(const Tensor& x, float alpha, Tensor* y) {
  CpuThreads();
  CheckF32("scale", "x", x);
  CheckF32("scale", "y", *y);
  CheckSameShape("scale", "x", x, "y", *y);
  const float* px = x.data<float>();
  float* py = y->data<float>();
  ParallelElements(x.numel(), [=](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) py[i] = alpha * px[i];
  });
}

// ---- sums ----

// Sum of x[b, e) in double, with 8 independent accumulators (GCC keeps them
// in four SSE registers: cvtps2pd + addpd).
double SumRange(const float* x, int64_t b, int64_t e) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    a0 += x[i];
    a1 += x[i + 1];
    a2 += x[i + 2];
    a3 += x[i + 3];
    a4 += x[i + 4];
    a5 += x[i + 5];
    a6 += x[i + 6];
    a7 += x[i + 7];
  }
  double s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
  for (; i < e; ++i) s += static_cast<double>(x[i]);
  return s;
}

// ---- pooling ----

// Max pooling of one H x W plane. Padded cells are skipped (never win), ties
// keep the first position in row-major order, and a NaN wins (the first one,
// as PyTorch propagates NaN). Windows that lie wholly inside the plane (all
// of them without padding) take a branch-free loop over output columns that
// GCC vectorizes; K and S are the window and stride when known at compile
// time (0: use k and s).
inline bool PoolTakes(float v, float best) { return v > best || (v != v && best == best); }

template <int K, int S>
void MaxPoolPlane(const float* xp, int64_t H, int64_t W, int k_rt, int s_rt, int pad, int64_t Ho,
                  int64_t Wo, float* yp, int32_t* ip) {
  const int k = K > 0 ? K : k_rt, s = S > 0 ? S : s_rt;
  // Output columns [ow_lo, ow_hi) have windows inside [0, W).
  const int64_t ow_lo = std::min<int64_t>(Wo, (pad + s - 1) / s);
  const int64_t span = W + pad - k;  // last start column of an inside window
  const int64_t ow_hi =
      span < 0 ? ow_lo : std::max<int64_t>(ow_lo, std::min<int64_t>(Wo, span / s + 1));
  for (int64_t oh = 0; oh < Ho; ++oh) {
    int64_t h0 = oh * s - pad, h1 = std::min(h0 + k, H);
    h0 = std::max<int64_t>(h0, 0);
    float* yr = yp + oh * Wo;
    int32_t* ir = ip + oh * Wo;
    auto generic = [&](int64_t ow) {
      int64_t w0 = ow * s - pad, w1 = std::min(w0 + k, W);
      w0 = std::max<int64_t>(w0, 0);
      float best = -std::numeric_limits<float>::infinity();
      int64_t best_i = h0 * W + w0;
      for (int64_t h = h0; h < h1; ++h) {
        for (int64_t w = w0; w < w1; ++w) {
          float v = xp[h * W + w];
          bool take = PoolTakes(v, best);
          best = take ? v : best;
          best_i = take ? h * W + w : best_i;
        }
      }
      yr[ow] = best;
      ir[ow] = static_cast<int32_t>(best_i);
    };
    for (int64_t ow = 0; ow < ow_lo; ++ow) generic(ow);
    if (h1 - h0 == k) {
      // Rows h0 .. h0 + k - 1 are all inside; window ow starts at column
      // ow * s - pad >= 0.
      const float* xr = xp + h0 * W;
      const int32_t base = static_cast<int32_t>(h0 * W - pad);
      if constexpr (K > 0) {
        // Window unrolled: one vectorized pass over the outputs.
#pragma omp simd
        for (int64_t ow = ow_lo; ow < ow_hi; ++ow) {
          const float* win = xr + (ow * s - pad);
          float best = win[0];
          int32_t off = 0;
#pragma GCC unroll 16
          for (int kh = 0; kh < K; ++kh) {
#pragma GCC unroll 16
            for (int kw = 0; kw < K; ++kw) {
              float v = win[kh * W + kw];
              bool take = PoolTakes(v, best);
              best = take ? v : best;
              off = take ? static_cast<int32_t>(kh * W + kw) : off;
            }
          }
          yr[ow] = best;
          ir[ow] = base + static_cast<int32_t>(ow * s) + off;
        }
      } else {
        // One pass over the outputs per window cell, in row-major order,
        // keeping the running maximum in yr and its window offset in ir.
#pragma omp simd
        for (int64_t ow = ow_lo; ow < ow_hi; ++ow) {
          yr[ow] = xr[ow * s - pad];
          ir[ow] = 0;
        }
        for (int kh = 0; kh < k; ++kh) {
          for (int kw = kh == 0 ? 1 : 0; kw < k; ++kw) {
            const int64_t c0 = kh * W + kw - pad;
            const int32_t off = static_cast<int32_t>(kh * W + kw);
#pragma omp simd
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) {
              float v = xr[c0 + ow * s], best = yr[ow];
              bool take = PoolTakes(v, best);
              yr[ow] = take ? v : best;
              ir[ow] = take ? off : ir[ow];
            }
          }
        }
#pragma omp simd
        for (int64_t ow = ow_lo; ow < ow_hi; ++ow) ir[ow] += base + static_cast<int32_t>(ow * s);
      }
    } else {
      for (int64_t ow = ow_lo; ow < ow_hi; ++ow) generic(ow);
    }
    for (int64_t ow = ow_hi; ow < Wo; ++ow) generic(ow);
  }
}

void MaxPool2d(const Tensor& x, const Pool2dParams& p, Tensor* y, Tensor* indices) {
  CpuThreads();
  const char* op = "max_pool2d";
  CheckF32(op, "x", x);
  CheckF32(op, "y", *y);
  CheckCpu(op, "indices", *indices);
  CheckPool(op, p);
  DT_CHECK(x.ndim() == 4) << op << ": x " << x.DebugString() << " is not NCHW";
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t Ho = ConvOutSize(H, p.kernel, p.stride, p.padding);
  const int64_t Wo = ConvOutSize(W, p.kernel, p.stride, p.padding);
  DT_CHECK(Ho >= 0 && Wo >= 0 && y->shape() == Shape({N, C, Ho, Wo}))
      << op << ": y " << y->DebugString() << " for x " << x.DebugString() << ", kernel " << p.kernel
      << ", stride " << p.stride << ", padding " << p.padding;
  DT_CHECK(indices->dtype() == DType::kI32 && indices->shape() == y->shape())
      << op << ": indices " << indices->DebugString() << " for y " << y->DebugString();
  DT_CHECK(H + 2 * int64_t{p.padding} >= p.kernel && W + 2 * int64_t{p.padding} >= p.kernel)
      << op << ": x " << x.DebugString() << " is smaller than the window (kernel " << p.kernel
      << ", padding " << p.padding << ")";
  DT_CHECK(H * W <= std::numeric_limits<int32_t>::max())
      << op << ": plane of " << x.DebugString() << " too large for i32 indices";
  const float* px = x.data<float>();
  float* py = y->data<float>();
  int32_t* pi = indices->data<int32_t>();
  const int k = p.kernel, s = p.stride, pad = p.padding;
  auto plane_fn = &MaxPoolPlane<0, 0>;
  if (k == 2 && s == 2) plane_fn = &MaxPoolPlane<2, 2>;
  if (k == 3 && s == 2) plane_fn = &MaxPoolPlane<3, 2>;
  if (k == 3 && s == 1) plane_fn = &MaxPoolPlane<3, 1>;
  if (k == 2 && s == 1) plane_fn = &MaxPoolPlane<2, 1>;
  ParallelFor(N * C, H * W + Ho * Wo * k * k, 1, [=](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      plane_fn(px + plane * H * W, H, W, k, s, pad, Ho, Wo, py + plane * Ho * Wo,
               pi + plane * Ho * Wo);
    }
  });
}

// max_pool2d_backward of one plane when windows tile it without overlap or
// padding (stride == kernel == K): each input cell receives its window's
// gradient if it holds the window's maximum, else 0, in one vectorized
// streaming pass (no zero fill, no scatter). `ip` are max_pool2d's indices.
template <int K>
void MaxPoolBackwardTiledPlane(const float* dyp, const int32_t* ip, int64_t H, int64_t W,
                               int64_t Ho, int64_t Wo, float* dxp) {
  for (int64_t h = 0; h < H; ++h) {
    float* dr = dxp + h * W;
    const int64_t oh = h / K;
    if (oh >= Ho) {
      std::fill(dr, dr + W, 0.0f);
      continue;
    }
    const float* dyr = dyp + oh * Wo;
    const int32_t* ir = ip + oh * Wo;
    const int32_t row = static_cast<int32_t>(h * W);
#pragma omp simd
    for (int64_t ow = 0; ow < Wo; ++ow) {
      const int32_t d = ir[ow] - row - static_cast<int32_t>(ow * K);  // column in the window
      const float g = dyr[ow];
#pragma GCC unroll 16
      for (int kw = 0; kw < K; ++kw) dr[ow * K + kw] = d == kw ? g : 0.0f;
    }
    std::fill(dr + Wo * K, dr + W, 0.0f);
  }
}

void MaxPool2dBackward(const Tensor& dy, const Tensor& indices, const Pool2dParams& p, Tensor* dx) {
  CpuThreads();
  const char* op = "max_pool2d_backward";
  CheckF32(op, "dy", dy);
  CheckF32(op, "dx", *dx);
  CheckCpu(op, "indices", indices);
  CheckPool(op, p);
  DT_CHECK(dx->ndim() == 4 && dy.ndim() == 4 && dy.dim(0) == dx->dim(0) &&
           dy.dim(1) == dx->dim(1) &&
           dy.dim(2) == ConvOutSize(dx->dim(2), p.kernel, p.stride, p.padding) &&
           dy.dim(3) == ConvOutSize(dx->dim(3), p.kernel, p.stride, p.padding))
      << op << ": dy " << dy.DebugString() << " for dx " << dx->DebugString() << ", kernel "
      << p.kernel << ", stride " << p.stride << ", padding " << p.padding;
  DT_CHECK(indices.dtype() == DType::kI32 && indices.shape() == dy.shape())
      << op << ": indices " << indices.DebugString() << " for dy " << dy.DebugString();
  const int64_t planes = dx->dim(0) * dx->dim(1);
  const int64_t HW = dx->dim(2) * dx->dim(3), HWo = dy.dim(2) * dy.dim(3);
  const float* pdy = dy.data<float>();
  const int32_t* pi = indices.data<int32_t>();
  float* pdx = dx->data<float>();
  const int64_t H = dx->dim(2), W = dx->dim(3), Ho = dy.dim(2), Wo = dy.dim(3);
  DT_CHECK(H + 2 * int64_t{p.padding} >= p.kernel && W + 2 * int64_t{p.padding} >= p.kernel)
      << op << ": dx " << dx->DebugString() << " is smaller than the window (kernel " << p.kernel
      << ", padding " << p.padding << ")";
  if (p.padding == 0 && p.stride == p.kernel && (p.kernel == 2 || p.kernel == 3)) {
    auto plane_fn = p.kernel == 2 ? &MaxPoolBackwardTiledPlane<2> : &MaxPoolBackwardTiledPlane<3>;
    ParallelFor(planes, HW + HWo, 1, [=](int64_t b, int64_t e) {
      for (int64_t plane = b; plane < e; ++plane) {
        plane_fn(pdy + plane * HWo, pi + plane * HWo, H, W, Ho, Wo, pdx + plane * HW);
      }
    });
    return;
  }
  ParallelFor(planes, HW + HWo, 1, [=](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      float* dxp = pdx + plane * HW;
      const float* dyp = pdy + plane * HWo;
      const int32_t* ip = pi + plane * HWo;
      std::fill(dxp, dxp + HW, 0.0f);
      for (int64_t o = 0; o < HWo; ++o) {
        int32_t idx = ip[o];
        DT_CHECK(idx >= 0 && idx < HW) << op << ": index " << idx << " outside a plane of " << HW;
        dxp[idx] += dyp[o];  // overlapping windows (stride < kernel) accumulate
      }
    }
  });
}

void GlobalAvgPool(const Tensor& x, Tensor* y) {
  CpuThreads();
  const char* op = "global_avg_pool";
  CheckF32(op, "x", x);
  CheckF32(op, "y", *y);
  DT_CHECK(x.ndim() == 4 && y->shape() == Shape({x.dim(0), x.dim(1), 1, 1}))
      << op << ": y " << y->DebugString() << " for x " << x.DebugString();
  const int64_t HW = x.dim(2) * x.dim(3);
  const float* px = x.data<float>();
  float* py = y->data<float>();
  ParallelFor(x.dim(0) * x.dim(1), HW, 1, [=](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      py[plane] = static_cast<float>(SumRange(px + plane * HW, 0, HW) / static_cast<double>(HW));
    }
  });
}

void GlobalAvgPoolBackward(const Tensor& dy, Tensor* dx) {
  CpuThreads();
  const char* op = "global_avg_pool_backward";
  CheckF32(op, "dy", dy);
  CheckF32(op, "dx", *dx);
  DT_CHECK(dx->ndim() == 4 && dy.shape() == Shape({dx->dim(0), dx->dim(1), 1, 1}))
      << op << ": dy " << dy.DebugString() << " for dx " << dx->DebugString();
  const int64_t HW = dx->dim(2) * dx->dim(3);
  const float* pdy = dy.data<float>();
  float* pdx = dx->data<float>();
  const float fhw = static_cast<float>(HW);
  ParallelFor(dx->dim(0) * dx->dim(1), HW, 1, [=](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      const float g = pdy[plane] / fhw;
      std::fill(pdx + plane * HW, pdx + (plane + 1) * HW, g);
    }
  });
}

// ---- classification ----

void CheckLabels(const char* op, const Tensor& logits, const Tensor& labels) {
  CheckCpu(op, "labels", labels);
  DT_CHECK(logits.ndim() == 2 && labels.ndim() == 1 && labels.dim(0) == logits.dim(0) &&
           labels.dtype() == DType::kI32)
      << op << ": logits " << logits.DebugString() << ", labels " << labels.DebugString()
      << " (need logits [N, C] and i32 labels [N])";
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const int32_t* pl = labels.data<int32_t>();
  for (int64_t i = 0; i < N; ++i) {
    DT_CHECK(pl[i] >= 0 && pl[i] < C)
        << op << ": label " << pl[i] << " of row " << i << " is outside [0, " << C << ")";
  }
}

// Numerically stable: with m the row maximum, log-sum-exp = m + log(sum
// exp(x - m)) never overflows. The loss is accumulated in double.
void SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, Tensor* loss,
                         Tensor* dlogits) {
  CpuThreads();
  const char* op = "softmax_cross_entropy";
  CheckF32(op, "logits", logits);
  CheckF32(op, "loss", *loss);
  CheckLabels(op, logits, labels);
  DT_CHECK(loss->numel() == 1) << op << ": loss " << loss->DebugString() << " is not a scalar";
  if (dlogits != nullptr) {
    CheckF32(op, "dlogits", *dlogits);
    CheckSameShape(op, "logits", logits, "dlogits", *dlogits);
  }
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const float* px = logits.data<float>();
  const int32_t* pl = labels.data<int32_t>();
  float* pd = dlogits != nullptr ? dlogits->data<float>() : nullptr;
  const float inv_n = N > 0 ? 1.0f / static_cast<float>(N) : 0.0f;
  const int64_t rows_per_block = std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1));
  double total = BlockedSum(N, rows_per_block, 4 * C, [=](int64_t b, int64_t e) {
    double s = 0;
    for (int64_t r = b; r < e; ++r) {
      const float* x = px + r * C;
      const float x_label = x[pl[r]];  // read first: dlogits may overwrite logits
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < C; ++j) m = x[j] > m ? x[j] : m;
      double z = 0;
      if (pd != nullptr) {
        float* d = pd + r * C;
        for (int64_t j = 0; j < C; ++j) {
          d[j] = std::exp(x[j] - m);
          z += d[j];
        }
        const float inv_z = static_cast<float>(1.0 / z);
        const float e_label = d[pl[r]];
        for (int64_t j = 0; j < C; ++j) d[j] = (d[j] * inv_z) * inv_n;
        d[pl[r]] = (e_label * inv_z - 1.0f) * inv_n;  // (softmax - onehot) / N
      } else {
        for (int64_t j = 0; j < C; ++j) z += std::exp(x[j] - m);
      }
      s += static_cast<double>(m) + std::log(z) - static_cast<double>(x_label);
    }
    return s;
  });
  // Mean over the batch (NaN for an empty batch, as in PyTorch).
  loss->data<float>()[0] = static_cast<float>(total / static_cast<double>(N));
}

// First maximum of a row; NaN counts as the maximum (as in PyTorch).
inline int32_t RowArgmax(const float* x, int64_t C) {
  int64_t best = 0;
  float bv = x[0];
  if (std::isnan(bv)) return 0;
  for (int64_t j = 1; j < C; ++j) {
    if (x[j] > bv) {
      bv = x[j];
      best = j;
    } else if (std::isnan(x[j])) {
      return static_cast<int32_t>(j);
    }
  }
  return static_cast<int32_t>(best);
}

void Argmax(const Tensor& logits, Tensor* out) {
  CpuThreads();
  const char* op = "argmax";
  CheckF32(op, "logits", logits);
  CheckCpu(op, "out", *out);
  DT_CHECK(logits.ndim() == 2 && out->dtype() == DType::kI32 && out->ndim() == 1 &&
           out->dim(0) == logits.dim(0))
      << op << ": logits " << logits.DebugString() << ", out " << out->DebugString()
      << " (need logits [N, C] and i32 out [N])";
  const int64_t N = logits.dim(0), C = logits.dim(1);
  DT_CHECK(C > 0 || N == 0) << op << ": no classes in " << logits.DebugString();
  const float* px = logits.data<float>();
  int32_t* po = out->data<int32_t>();
  ParallelFor(N, C, 1, [=](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) po[r] = RowArgmax(px + r * C, C);
  });
}

void CountCorrect(const Tensor& logits, const Tensor& labels, Tensor* correct) {
  CpuThreads();
  const char* op = "count_correct";
  CheckF32(op, "logits", logits);
  CheckCpu(op, "correct", *correct);
  CheckLabels(op, logits, labels);
  DT_CHECK(correct->dtype() == DType::kI64 && correct->numel() == 1)
      << op << ": correct " << correct->DebugString() << " is not an i64 scalar";
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const float* px = logits.data<float>();
  const int32_t* pl = labels.data<int32_t>();
  double n = BlockedSum(N, 4096, C, [=](int64_t b, int64_t e) {
    int64_t k = 0;
    for (int64_t r = b; r < e; ++r) k += RowArgmax(px + r * C, C) == pl[r];
    return static_cast<double>(k);
  });
  correct->data<int64_t>()[0] = static_cast<int64_t>(n);
}

// ---- reductions ----

void Sum(const Tensor& x, Tensor* y) {
  CpuThreads();
  CheckF32("sum", "x", x);
  CheckF32("sum", "y", *y);
  DT_CHECK(y->numel() == 1) << "sum: y " << y->DebugString() << " is not a scalar";
  const float* px = x.data<float>();
  double s =
      BlockedSum(x.numel(), 32768, 1, [=](int64_t b, int64_t e) { return SumRange(px, b, e); });
  y->data<float>()[0] = static_cast<float>(s);
}

// ---- optimizer ----

template <bool kDecay, bool kMomentum, bool kNesterov>
void SgdLoop(float* param, const float* grad, float* buf, float lr, float mom, float wd,
             int64_t n) {
  ParallelElements(n, [=](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      float g = grad[i];
      if (kDecay) g = g + wd * param[i];
      float d = g;
      if (kMomentum) {
        float v = mom * buf[i] + g;
        buf[i] = v;
        d = kNesterov ? g + mom * v : v;
      }
      param[i] = param[i] - lr * d;
    }
  });
}

void SgdUpdate(Tensor* param, const Tensor& grad, Tensor* momentum_buf, const SgdParams& p) {
  CpuThreads();
  const char* op = "sgd_update";
  CheckF32(op, "param", *param);
  CheckF32(op, "grad", grad);
  CheckSameShape(op, "param", *param, "grad", grad);
  DT_CHECK(!p.nesterov || p.momentum > 0.0f)
      << op << ": nesterov needs a positive momentum, got " << p.momentum;
  const bool mom = p.momentum != 0.0f;
  float* buf = nullptr;
  if (mom) {
    DT_CHECK(momentum_buf != nullptr) << op << ": momentum " << p.momentum
                                      << " without a momentum buffer for " << param->DebugString();
    CheckF32(op, "momentum_buf", *momentum_buf);
    CheckSameShape(op, "param", *param, "momentum_buf", *momentum_buf);
    buf = momentum_buf->data<float>();
  }
  float* w = param->data<float>();
  const float* g = grad.data<float>();
  const int64_t n = param->numel();
  const bool wd = p.weight_decay != 0.0f;
  const float lr = p.lr, m = p.momentum, d = p.weight_decay;
  if (!mom) {
    if (wd) {
      SgdLoop<true, false, false>(w, g, buf, lr, m, d, n);
    } else {
      SgdLoop<false, false, false>(w, g, buf, lr, m, d, n);
    }
  } else if (!p.nesterov) {
    if (wd) {
      SgdLoop<true, true, false>(w, g, buf, lr, m, d, n);
    } else {
      SgdLoop<false, true, false>(w, g, buf, lr, m, d, n);
    }
  } else {
    if (wd) {
      SgdLoop<true, true, true>(w, g, buf, lr, m, d, n);
    } else {
      SgdLoop<false, true, true>(w, g, buf, lr, m, d, n);
    }
  }
}

// ---- dtype conversion ----

// Float to integer: truncation toward zero, saturating at the type's range;
// NaN gives 0. (C++ and PyTorch leave out-of-range conversions undefined.)
template <typename I>
inline I FloatToInt(float f) {
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<I>::max());
  double d = static_cast<double>(f);
  if (!(d == d)) return 0;
  if (d <= lo) return std::numeric_limits<I>::min();
  if (d >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(d);
}

// Integer to bf16 with a single rounding to nearest even (going through f32
// would round twice above 2^24).
uint16_t IntToBFloat16(int64_t v) {
  if (v == 0) return 0;
  uint64_t m = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  int top = 63;
  while (!(m >> top)) --top;
  float f;
  if (top < 8) {
    f = static_cast<float>(m);  // exact in 8 significant bits
  } else {
    int shift = top - 7;
    uint64_t q = m >> shift, rem = m & ((uint64_t{1} << shift) - 1);
    uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    f = std::ldexp(static_cast<float>(q), shift);  // exact: q <= 256
  }
  return FloatToBFloat16(v < 0 ? -f : f);
}

// Element readers and writers. Floating types go through float (exact for f16
// and bf16), integer types through int64.
struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

template <typename T>
inline float LoadFloat(T v) {
  return static_cast<float>(v);
}
template <>
inline float LoadFloat<F16>(F16 v) {
  return HalfToFloat(v.bits);
}
template <>
inline float LoadFloat<BF16>(BF16 v) {
  return BFloat16ToFloat(v.bits);
}

template <typename T>
constexpr bool kFloating =
    std::is_same<T, float>::value || std::is_same<T, F16>::value || std::is_same<T, BF16>::value;

template <typename D>
inline D FromFloat(float f) {
  if constexpr (std::is_same<D, float>::value) {
    return f;
  } else if constexpr (std::is_same<D, F16>::value) {
    return F16{FloatToHalf(f)};
  } else if constexpr (std::is_same<D, BF16>::value) {
    return BF16{FloatToBFloat16(f)};
  } else {
    return FloatToInt<D>(f);
  }
}

template <typename D>
inline D FromInt(int64_t v) {
  if constexpr (std::is_same<D, float>::value) {
    return static_cast<float>(v);
  } else if constexpr (std::is_same<D, F16>::value) {
    // Exact through f32: |v| >= 2^24 is far beyond f16's range (inf anyway).
    return F16{FloatToHalf(static_cast<float>(v))};
  } else if constexpr (std::is_same<D, BF16>::value) {
    return BF16{IntToBFloat16(v)};
  } else {
    return static_cast<D>(v);  // integer narrowing wraps modulo 2^bits
  }
}

template <typename S, typename D>
inline D Convert(S v) {
  if constexpr (kFloating<S>) {
    return FromFloat<D>(LoadFloat<S>(v));
  } else {
    return FromInt<D>(static_cast<int64_t>(v));
  }
}

template <typename S, typename D>
void CastLoop(const void* src, void* dst, int64_t n) {
  static_assert(sizeof(F16) == 2 && sizeof(BF16) == 2, "16-bit wrappers");
  const S* s = static_cast<const S*>(src);
  D* d = static_cast<D*>(dst);
  ParallelElements(n, [=](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) d[i] = Convert<S, D>(s[i]);
  });
}

template <typename S>
void CastFrom(const void* src, DType to, void* dst, int64_t n) {
  switch (to) {
    case DType::kF32:
      return CastLoop<S, float>(src, dst, n);
    case DType::kF16:
      return CastLoop<S, F16>(src, dst, n);
    case DType::kBF16:
      return CastLoop<S, BF16>(src, dst, n);
    case DType::kI32:
      return CastLoop<S, int32_t>(src, dst, n);
    case DType::kI64:
      return CastLoop<S, int64_t>(src, dst, n);
    case DType::kU8:
      return CastLoop<S, uint8_t>(src, dst, n);
  }
  DT_CHECK(false) << "cast: unknown dtype " << static_cast<int>(to);
}

// Conversions between f32, f16, bf16, i32, i64 and u8, any direction:
// floating -> floating rounds to nearest even (f16/bf16 overflow gives inf);
// integer -> floating rounds to nearest even once; floating -> integer
// truncates toward zero and saturates (NaN -> 0); integer -> integer wraps.
void Cast(const Tensor& x, Tensor* y) {
  CpuThreads();
  CheckCpu("cast", "x", x);
  CheckCpu("cast", "y", *y);
  CheckSameShape("cast", "x", x, "y", *y);
  const int64_t n = x.numel();
  if (x.dtype() == y->dtype()) {
    if (n > 0 && x.raw_data() != y->raw_data()) {
      std::memcpy(y->raw_data(), x.raw_data(), x.nbytes());
    }
    return;
  }
  const void* s = x.raw_data();
  void* d = y->raw_data();
  switch (x.dtype()) {
    case DType::kF32:
      return CastFrom<float>(s, y->dtype(), d, n);
    case DType::kF16:
      return CastFrom<F16>(s, y->dtype(), d, n);
    case DType::kBF16:
      return CastFrom<BF16>(s, y->dtype(), d, n);
    case DType::kI32:
      return CastFrom<int32_t>(s, y->dtype(), d, n);
    case DType::kI64:
      return CastFrom<int64_t>(s, y->dtype(), d, n);
    case DType::kU8:
      return CastFrom<uint8_t>(s, y->dtype(), d, n);
  }
  DT_CHECK(false) << "cast: unknown dtype of " << x.DebugString();
}

// ---- fill ----

template <typename T>
void FillLoop(void* data, int64_t n, T v) {
  T* p = static_cast<T*>(data);
  ParallelElements(n, [=](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
}

// `value` is converted to the tensor's dtype as Cast converts f32.
void Fill(Tensor* t, float value) {
  CpuThreads();
  CheckCpu("fill", "t", *t);
  const int64_t n = t->numel();
  void* d = t->raw_data();
  switch (t->dtype()) {
    case DType::kF32:
      return FillLoop<float>(d, n, value);
    case DType::kF16:
      return FillLoop<uint16_t>(d, n, FloatToHalf(value));
    case DType::kBF16:
      return FillLoop<uint16_t>(d, n, FloatToBFloat16(value));
    case DType::kI32:
      return FillLoop<int32_t>(d, n, FloatToInt<int32_t>(value));
    case DType::kI64:
      return FillLoop<int64_t>(d, n, FloatToInt<int64_t>(value));
    case DType::kU8:
      return FillLoop<uint8_t>(d, n, FloatToInt<uint8_t>(value));
  }
  DT_CHECK(false) << "fill: unknown dtype of " << t->DebugString();
}

// ---- random numbers ----
//
// Stream layout (see philox.h): element j of the stream of `seed` is output
// j % 4 of Philox block j / 4 (counter {j/4 low, j/4 high, 0, 0}, key {seed
// low, seed high}); a tensor filled at `offset` takes stream elements
// offset .. offset + numel - 1.
//
// Uniform: element j = low + (high - low) * u, u = (output >> 8) * 2^-24.
// Normal: Box-Muller within each block on the pairs (output 0, output 1) and
// (output 2, output 3): for the pair (a, b), u1 = ((a >> 8) + 1) * 2^-24 in
// (0, 1], u2 = (b >> 8) * 2^-24, r = sqrt(-2 ln u1), and the pair's elements
// are r cos(2 pi u2) (first) and r sin(2 pi u2) (second), then mean + stddev *
// z. (With 24-bit u1, |z| <= 5.77: tails beyond ~5.8 sigma are cut.)

constexpr int kBatch = 8;  // Philox blocks generated together (vectorized)

// out[4 * k + lane] = output `lane` of block `block0 + k`, k < kBatch.
void PhiloxBatch(uint64_t seed, uint64_t block0, uint32_t out[4 * kBatch]) {
  uint32_t c0[kBatch], c1[kBatch], c2[kBatch], c3[kBatch];
  for (int k = 0; k < kBatch; ++k) {
    uint64_t b = block0 + static_cast<uint64_t>(k);
    c0[k] = static_cast<uint32_t>(b);
    c1[k] = static_cast<uint32_t>(b >> 32);
    c2[k] = 0;
    c3[k] = 0;
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
#pragma omp simd
    for (int k = 0; k < kBatch; ++k) {
      uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0[k];
      uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2[k];
      uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[k] ^ k0;
      uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[k] ^ k1;
      c1[k] = static_cast<uint32_t>(p1);
      c3[k] = static_cast<uint32_t>(p0);
      c0[k] = n0;
      c2[k] = n2;
    }
  }
  for (int k = 0; k < kBatch; ++k) {
    out[4 * k + 0] = c0[k];
    out[4 * k + 1] = c1[k];
    out[4 * k + 2] = c2[k];
    out[4 * k + 3] = c3[k];
  }
}

// Fills p[0, n) with stream elements offset .. offset + n - 1, where
// `transform(bits, vals)` maps the 4 * kBatch outputs of a batch to values.
template <typename T>
void FillFromStream(float* p, int64_t n, uint64_t seed, uint64_t offset, const T& transform) {
  if (n <= 0) return;
  const uint64_t first_block = offset / 4;
  const int64_t lead = static_cast<int64_t>(offset % 4);  // stream elements before p[0]
  const int64_t per_batch = int64_t{4} * kBatch;
  const int64_t batches = (lead + n + per_batch - 1) / per_batch;
  ParallelFor(batches, 8 * per_batch, 1, [=](int64_t bb, int64_t be) {
    uint32_t bits[4 * kBatch];
    float vals[4 * kBatch];
    for (int64_t batch = bb; batch < be; ++batch) {
      PhiloxBatch(seed, first_block + static_cast<uint64_t>(batch) * kBatch, bits);
      transform(bits, vals);
      const int64_t base = batch * per_batch - lead;  // index in p of vals[0]
      const int64_t lo = std::max<int64_t>(0, -base), hi = std::min<int64_t>(per_batch, n - base);
      for (int64_t k = lo; k < hi; ++k) p[base + k] = vals[k];
    }
  });
}

void RandomUniform(Tensor* t, float low, float high, uint64_t seed, uint64_t offset) {
  CpuThreads();
  CheckF32("random_uniform", "t", *t);
  DT_CHECK(low <= high) << "random_uniform: low " << low << " > high " << high;
  const float range = high - low;
  // low + range * u can round up to `high`; keep the result in [low, high).
  const float top = high > low ? std::nextafter(high, low) : high;
  FillFromStream(t->data<float>(), t->numel(), seed, offset,
                 [=](const uint32_t* bits, float* vals) {
#pragma omp simd
                   for (int k = 0; k < 4 * kBatch; ++k) {
                     float v = low + range * BitsToUniform(bits[k]);
                     vals[k] = v < top ? v : top;
                   }
                 });
}

void RandomNormal(Tensor* t, float mean, float stddev, uint64_t seed, uint64_t offset) {
  CpuThreads();
  CheckF32("random_normal", "t", *t);
  DT_CHECK(stddev >= 0) << "random_normal: stddev " << stddev << " < 0";
  constexpr float kTwoPi = 6.283185307179586f;
  FillFromStream(t->data<float>(), t->numel(), seed, offset,
                 [=](const uint32_t* bits, float* vals) {
                   for (int k = 0; k < 4 * kBatch; k += 2) {
                     float r = std::sqrt(-2.0f * std::log(BitsToUniformOpenZero(bits[k])));
                     float theta = kTwoPi * BitsToUniform(bits[k + 1]);
                     vals[k] = mean + stddev * (r * std::cos(theta));
                     vals[k + 1] = mean + stddev * (r * std::sin(theta));
                   }
                 });
}

}  // namespace
}  // namespace cpu

DT_REGISTER_KERNEL(relu, DeviceType::kCPU, ReluFn, cpu::Relu);
DT_REGISTER_KERNEL(relu_backward, DeviceType::kCPU, ReluBackwardFn, cpu::ReluBackward);
DT_REGISTER_KERNEL(add, DeviceType::kCPU, AddFn, cpu::Add);
DT_REGISTER_KERNEL(axpy, DeviceType::kCPU, AxpyFn, cpu::Axpy);
DT_REGISTER_KERNEL(scale, DeviceType::kCPU, ScaleFn, cpu::Scale);
DT_REGISTER_KERNEL(max_pool2d, DeviceType::kCPU, MaxPool2dFn, cpu::MaxPool2d);
DT_REGISTER_KERNEL(max_pool2d_backward, DeviceType::kCPU, MaxPool2dBackwardFn,
                   cpu::MaxPool2dBackward);
DT_REGISTER_KERNEL(global_avg_pool, DeviceType::kCPU, GlobalAvgPoolFn, cpu::GlobalAvgPool);
DT_REGISTER_KERNEL(global_avg_pool_backward, DeviceType::kCPU, GlobalAvgPoolBackwardFn,
                   cpu::GlobalAvgPoolBackward);
DT_REGISTER_KERNEL(softmax_cross_entropy, DeviceType::kCPU, SoftmaxCrossEntropyFn,
                   cpu::SoftmaxCrossEntropy);
DT_REGISTER_KERNEL(argmax, DeviceType::kCPU, ArgmaxFn, cpu::Argmax);
DT_REGISTER_KERNEL(count_correct, DeviceType::kCPU, CountCorrectFn, cpu::CountCorrect);
DT_REGISTER_KERNEL(sum, DeviceType::kCPU, SumFn, cpu::Sum);
DT_REGISTER_KERNEL(sgd_update, DeviceType::kCPU, SgdUpdateFn, cpu::SgdUpdate);
DT_REGISTER_KERNEL(fill, DeviceType::kCPU, FillFn, cpu::Fill);
DT_REGISTER_KERNEL(random_normal, DeviceType::kCPU, RandomNormalFn, cpu::RandomNormal);
DT_REGISTER_KERNEL(random_uniform, DeviceType::kCPU, RandomUniformFn, cpu::RandomUniform);
DT_REGISTER_KERNEL(cast, DeviceType::kCPU, CastFn, cpu::Cast);

}  // namespace ops
}  // namespace dtrain
