// Reductions and pooling: sum, softmax cross-entropy, argmax, accuracy
// counts, global average pooling, max and average pooling, per-channel sums
// and the batch-norm kernels. Accumulation is in f64 where the CPU kernels
// accumulate in f64; every reduction adds in a fixed order, so results do not
// vary from run to run.
#include <cmath>

#include "libs/cuda/kernel_util.cuh"
#include "libs/cuda/kernels.h"

namespace dtrain {
namespace cuda {
namespace kernels {
namespace {

// ---- sum ----

constexpr int kSumThreads = 256;
constexpr int64_t kSumPerBlock = kSumThreads * 16;
constexpr int64_t kSumMaxBlocks = 1024;

int64_t SumBlocks(int64_t n) {
  int64_t b = (n + kSumPerBlock - 1) / kSumPerBlock;
  if (b < 1) b = 1;
  return b > kSumMaxBlocks ? kSumMaxBlocks : b;
}

template <typename T>
__global__ void SumPartial(const T* x, int64_t n, double* partial) {
  double acc = 0;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) acc += ToF<T>(x[i]);
  acc = BlockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out = scale * sum(partial[0, count)), by one block in a fixed order.
__global__ void SumFinal(const double* partial, int64_t count, double scale, float* out) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = BlockSum(acc);
  if (threadIdx.x == 0) *out = static_cast<float>(acc * scale);
}

// ---- rows of [N, C] (one warp per row) ----

constexpr int kRowsPerBlock = 4;

template <typename T>
__global__ void SoftmaxXentRows(const T* logits, const int32_t* labels, int64_t N, int64_t C,
                                T* dlogits, double* row_loss) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const T* x = logits + row * C;
  const int32_t label = labels[row];
  const bool valid = label >= 0 && label < C;
  float m = -INFINITY;
  for (int64_t j = lane; j < C; j += 32) m = fmaxf(m, ToF<T>(x[j]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  // fmaxf drops NaN; a NaN anywhere in the row makes the loss NaN as on the
  // CPU through exp(NaN) below.
  double z = 0;
  for (int64_t j = lane; j < C; j += 32) z += static_cast<double>(expf(ToF<T>(x[j]) - m));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
  const float x_label = valid ? ToF<T>(x[label]) : NAN;
  __syncwarp();  // every lane has read x before dlogits (which may alias it) is written
  if (dlogits != nullptr) {
    T* d = dlogits + row * C;
    const float inv_z = static_cast<float>(1.0 / z);
    const float inv_n = 1.0f / static_cast<float>(N);
    for (int64_t j = lane; j < C; j += 32) {
      float e = expf(ToF<T>(x[j]) - m);
      float g = (e * inv_z) * inv_n;
      if (j == label) g = (e * inv_z - 1.0f) * inv_n;
      if (!valid) g = NAN;
      d[j] = FromF<T>(g);
    }
  }
  if (lane == 0) {
    row_loss[row] = static_cast<double>(m) + log(z) - static_cast<double>(x_label);
  }
}

// True when (v, i) beats (best, bi): NaN first (lowest index), then the
// larger value, then the lower index.
__device__ __forceinline__ bool ArgBetter(float v, int64_t i, float best, int64_t bi) {
  const bool vn = v != v, bn = best != best;
  if (vn || bn) return vn && (!bn || i < bi);
  return v > best || (v == best && i < bi);
}

template <typename T>
__device__ __forceinline__ int64_t RowArgmax(const T* x, int64_t C) {
  const int lane = threadIdx.x & 31;
  float best = -INFINITY;
  int64_t bi = C;  // no candidate yet
  for (int64_t j = lane; j < C; j += 32) {
    const float v = ToF<T>(x[j]);
    if (bi == C || ArgBetter(v, j, best, bi)) {
      best = v;
      bi = j;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi != C && (bi == C || ArgBetter(ov, oi, best, bi))) {
      best = ov;
      bi = oi;
    }
  }
  return bi;
}

template <typename T>
__global__ void ArgmaxRows(const T* logits, int64_t N, int64_t C, int32_t* out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t bi = RowArgmax(logits + row * C, C);
  if ((threadIdx.x & 31) == 0) out[row] = static_cast<int32_t>(bi);
}

template <typename T>
__global__ void CountCorrectRows(const T* logits, const int32_t* labels, int64_t N, int64_t C,
                                 unsigned long long* correct) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t bi = RowArgmax(logits + row * C, C);
  if ((threadIdx.x & 31) == 0 && bi == labels[row]) atomicAdd(correct, 1ull);
}

unsigned RowBlocks(int64_t n) {
  return static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
}

// ---- global average pooling (one warp per plane) ----

template <typename T>
__global__ void GlobalAvgPoolKernel(const T* x, int64_t planes, int64_t hw, T* y) {
  const int lane = threadIdx.x & 31;
  const int64_t plane = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (plane >= planes) return;
  const T* p = x + plane * hw;
  double acc = 0;
  for (int64_t j = lane; j < hw; j += 32) acc += ToF<T>(p[j]);
  acc = WarpSum(acc);
  if (lane == 0) y[plane] = FromF<T>(static_cast<float>(acc / static_cast<double>(hw)));
}

template <typename T>
__global__ void GlobalAvgPoolBackwardKernel(const T* dy, int64_t planes, int64_t hw, T* dx) {
  const int64_t n = planes * hw;
  const float fhw = static_cast<float>(hw);
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    dx[i] = FromF<T>(ToF<T>(dy[i / hw]) / fhw);
  }
}

// ---- max and average pooling ----

__device__ __forceinline__ bool PoolTakes(float v, float best) {
  return v > best || (v != v && best == best);
}

template <typename T>
__global__ void MaxPoolKernel(const T* x, PoolGeom g, T* y, int32_t* indices) {
  const int64_t n = g.planes * g.ho * g.wo;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t ow = i % g.wo, oh = (i / g.wo) % g.ho, plane = i / (g.wo * g.ho);
    int64_t h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
    const int64_t h1 = min(h0 + g.kernel, g.h), w1 = min(w0 + g.kernel, g.w);
    h0 = max(h0, int64_t{0});
    w0 = max(w0, int64_t{0});
    const T* p = x + plane * g.h * g.w;
    float best = -INFINITY;
    int64_t best_i = h0 * g.w + w0;
    for (int64_t hh = h0; hh < h1; ++hh) {
      for (int64_t ww = w0; ww < w1; ++ww) {
        const float v = ToF<T>(p[hh * g.w + ww]);
        if (PoolTakes(v, best)) {
          best = v;
          best_i = hh * g.w + ww;
        }
      }
    }
    y[i] = FromF<T>(best);
    indices[i] = static_cast<int32_t>(best_i);
  }
}

// Output rows (or columns) whose windows contain input row h: [lo, hi].
__device__ __forceinline__ void WindowsOf(int64_t h, int k, int s, int pad, int64_t out,
                                          int64_t* lo, int64_t* hi) {
  const int64_t num = h + pad - k + 1;
  *lo = num <= 0 ? 0 : (num + s - 1) / s;
  *hi = min((h + pad) / s, out - 1);
}

// Gathers instead of scattering: each input cell adds the gradients of the
// windows whose maximum it was, in a fixed order, with no atomics.
template <typename T>
__global__ void MaxPoolBackwardKernel(const T* dy, const int32_t* indices, PoolGeom g, T* dx) {
  const int64_t n = g.planes * g.h * g.w;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t w = i % g.w, h = (i / g.w) % g.h, plane = i / (g.w * g.h);
    int64_t oh0, oh1, ow0, ow1;
    WindowsOf(h, g.kernel, g.stride, g.pad, g.ho, &oh0, &oh1);
    WindowsOf(w, g.kernel, g.stride, g.pad, g.wo, &ow0, &ow1);
    const int64_t base = plane * g.ho * g.wo;
    const int32_t me = static_cast<int32_t>(h * g.w + w);
    float acc = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t o = base + oh * g.wo + ow;
        if (indices[o] == me) acc += ToF<T>(dy[o]);
      }
    }
    dx[i] = FromF<T>(acc);
  }
}

__device__ __forceinline__ int64_t WindowCount(int64_t oh, int64_t ow, const PoolGeom& g) {
  int64_t h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
  const int64_t h1 = min(h0 + g.kernel, g.h), w1 = min(w0 + g.kernel, g.w);
  h0 = max(h0, int64_t{0});
  w0 = max(w0, int64_t{0});
  return (h1 - h0) * (w1 - w0);
}

template <typename T>
__global__ void AvgPoolKernel(const T* x, PoolGeom g, T* y) {
  const int64_t n = g.planes * g.ho * g.wo;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t ow = i % g.wo, oh = (i / g.wo) % g.ho, plane = i / (g.wo * g.ho);
    int64_t h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
    const int64_t h1 = min(h0 + g.kernel, g.h), w1 = min(w0 + g.kernel, g.w);
    h0 = max(h0, int64_t{0});
    w0 = max(w0, int64_t{0});
    const T* p = x + plane * g.h * g.w;
    float acc = 0.0f;
    for (int64_t hh = h0; hh < h1; ++hh) {
      for (int64_t ww = w0; ww < w1; ++ww) acc += ToF<T>(p[hh * g.w + ww]);
    }
    y[i] = FromF<T>(acc / static_cast<float>((h1 - h0) * (w1 - w0)));
  }
}

template <typename T>
__global__ void AvgPoolBackwardKernel(const T* dy, PoolGeom g, T* dx) {
  const int64_t n = g.planes * g.h * g.w;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t w = i % g.w, h = (i / g.w) % g.h, plane = i / (g.w * g.h);
    int64_t oh0, oh1, ow0, ow1;
    WindowsOf(h, g.kernel, g.stride, g.pad, g.ho, &oh0, &oh1);
    WindowsOf(w, g.kernel, g.stride, g.pad, g.wo, &ow0, &ow1);
    const int64_t base = plane * g.ho * g.wo;
    float acc = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        acc += ToF<T>(dy[base + oh * g.wo + ow]) / static_cast<float>(WindowCount(oh, ow, g));
      }
    }
    dx[i] = FromF<T>(acc);
  }
}

// ---- per-channel reductions over [outer, C, inner] (one block per channel) ----

constexpr int kChannelThreads = 512;

template <typename T>
__device__ __forceinline__ const T* ChannelElem(const T* x, int64_t k, int64_t c, int64_t C,
                                                int64_t inner) {
  return x + ((k / inner) * C + c) * inner + (k % inner);
}

template <typename T, typename O>
__global__ void ChannelSumKernel(const T* x, int64_t outer, int64_t C, int64_t inner, O* out) {
  const int64_t c = blockIdx.x;
  const int64_t count = outer * inner;
  double acc = 0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    acc += ToF<T>(*ChannelElem(x, k, c, C, inner));
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) out[c] = FromF<O>(static_cast<float>(acc));
}

template <typename T>
__global__ void BnStatsKernel(const T* x, int64_t outer, int64_t C, int64_t inner, float eps,
                              float* mean, float* inv_std) {
  const int64_t c = blockIdx.x;
  const int64_t count = outer * inner;
  double s = 0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x)
    s += ToF<T>(*ChannelElem(x, k, c, C, inner));
  const double mu = BlockSum(s) / static_cast<double>(count);
  double q = 0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const double d = static_cast<double>(ToF<T>(*ChannelElem(x, k, c, C, inner))) - mu;
    q += d * d;
  }
  const double var = BlockSum(q) / static_cast<double>(count);
  if (threadIdx.x == 0) {
    mean[c] = static_cast<float>(mu);
    inv_std[c] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  }
}

template <typename T, typename P>
__global__ void BnApplyKernel(const T* x, int64_t n, int64_t C, int64_t inner, const float* mean,
                              const float* inv_std, const P* gamma, const P* beta, T* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t c = (i / inner) % C;
    const float xhat = (ToF<T>(x[i]) - mean[c]) * inv_std[c];
    y[i] = FromF<T>(xhat * ToF<P>(gamma[c]) + ToF<P>(beta[c]));
  }
}

template <typename T, typename P>
__global__ void BnInferenceKernel(const T* x, int64_t n, int64_t C, int64_t inner, const P* gamma,
                                  const P* beta, const float* rmean, const float* rvar, float eps,
                                  T* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t c = (i / inner) % C;
    const float inv = 1.0f / sqrtf(rvar[c] + eps);
    y[i] = FromF<T>((ToF<T>(x[i]) - rmean[c]) * inv * ToF<P>(gamma[c]) + ToF<P>(beta[c]));
  }
}

template <typename T, typename G>
__global__ void BnBackwardReduceKernel(const T* x, const T* dy, int64_t outer, int64_t C,
                                       int64_t inner, const float* mean, const float* inv_std,
                                       float* sum_dy, float* sum_dy_xhat, G* dgamma, G* dbeta) {
  const int64_t c = blockIdx.x;
  const int64_t count = outer * inner;
  const float mu = mean[c], is = inv_std[c];
  double a = 0, b = 0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const float g = ToF<T>(*ChannelElem(dy, k, c, C, inner));
    const float xhat = (ToF<T>(*ChannelElem(x, k, c, C, inner)) - mu) * is;
    a += g;
    b += static_cast<double>(g) * xhat;
  }
  a = BlockSum(a);
  b = BlockSum(b);
  if (threadIdx.x == 0) {
    sum_dy[c] = static_cast<float>(a);
    sum_dy_xhat[c] = static_cast<float>(b);
    if (dbeta != nullptr) dbeta[c] = FromF<G>(static_cast<float>(a));
    if (dgamma != nullptr) dgamma[c] = FromF<G>(static_cast<float>(b));
  }
}

template <typename T, typename P>
__global__ void BnBackwardDataKernel(const T* x, const T* dy, int64_t n, int64_t C, int64_t inner,
                                     float inv_count, const float* mean, const float* inv_std,
                                     const P* gamma, const float* sum_dy, const float* sum_dy_xhat,
                                     T* dx) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t c = (i / inner) % C;
    const float is = inv_std[c];
    const float xhat = (ToF<T>(x[i]) - mean[c]) * is;
    const float g = ToF<T>(dy[i]) - sum_dy[c] * inv_count - xhat * sum_dy_xhat[c] * inv_count;
    dx[i] = FromF<T>(ToF<P>(gamma[c]) * is * g);
  }
}

__global__ void BnUpdateRunningKernel(const float* mean, const float* inv_std, int64_t C, float eps,
                                      float momentum, double count, float* rmean, float* rvar) {
  for (int64_t c = GlobalThread(); c < C; c += GridStride()) {
    const double is = inv_std[c];
    const double var = 1.0 / (is * is) - static_cast<double>(eps);
    const double unbiased = var * count / (count - 1.0);
    if (rmean != nullptr) rmean[c] = (1.0f - momentum) * rmean[c] + momentum * mean[c];
    if (rvar != nullptr) {
      rvar[c] = (1.0f - momentum) * rvar[c] + momentum * static_cast<float>(unbiased);
    }
  }
}

unsigned ChannelThreads(int64_t count) {
  // Fewer threads for small channels (linear layers' bias gradients).
  int64_t t = 32;
  while (t < kChannelThreads && t < count) t *= 2;
  return static_cast<unsigned>(t);
}

}  // namespace

int64_t SumScratch(int64_t n) { return SumBlocks(n); }

cudaError_t Sum(DT dt, const void* x, int64_t n, float* y, double* scratch, cudaStream_t s) {
  const int64_t blocks = SumBlocks(n);
  DT_DISPATCH_FLOAT(dt, T, {
    SumPartial<T><<<static_cast<unsigned>(blocks), kSumThreads, 0, s>>>(static_cast<const T*>(x), n,
                                                                        scratch);
  });
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SumFinal<<<1, kSumThreads, 0, s>>>(scratch, blocks, 1.0, y);
  return cudaGetLastError();
}

cudaError_t SoftmaxCrossEntropy(DT dt, const void* logits, const int32_t* labels, int64_t N,
                                int64_t C, float* loss, void* dlogits, double* scratch,
                                cudaStream_t s) {
  if (N > 0) {
    DT_DISPATCH_FLOAT(dt, T, {
      SoftmaxXentRows<T><<<RowBlocks(N), 32 * kRowsPerBlock, 0, s>>>(
          static_cast<const T*>(logits), labels, N, C, static_cast<T*>(dlogits), scratch);
    });
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  // Mean over the batch; NaN for an empty batch (0 / 0), as on the CPU.
  SumFinal<<<1, kSumThreads, 0, s>>>(scratch, N, N > 0 ? 1.0 / static_cast<double>(N) : NAN, loss);
  return cudaGetLastError();
}

cudaError_t Argmax(DT dt, const void* logits, int64_t N, int64_t C, int32_t* out, cudaStream_t s) {
  if (N <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    ArgmaxRows<T>
        <<<RowBlocks(N), 32 * kRowsPerBlock, 0, s>>>(static_cast<const T*>(logits), N, C, out);
  });
  return cudaGetLastError();
}

cudaError_t CountCorrect(DT dt, const void* logits, const int32_t* labels, int64_t N, int64_t C,
                         int64_t* correct, cudaStream_t s) {
  cudaError_t err = cudaMemsetAsync(correct, 0, sizeof(int64_t), s);
  if (err != cudaSuccess || N <= 0) return err;
  DT_DISPATCH_FLOAT(dt, T, {
    CountCorrectRows<T><<<RowBlocks(N), 32 * kRowsPerBlock, 0, s>>>(
        static_cast<const T*>(logits), labels, N, C,
        reinterpret_cast<unsigned long long*>(correct));
  });
  return cudaGetLastError();
}

cudaError_t GlobalAvgPool(DT dt, const void* x, int64_t planes, int64_t hw, void* y,
                          cudaStream_t s) {
  if (planes <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    GlobalAvgPoolKernel<T><<<RowBlocks(planes), 32 * kRowsPerBlock, 0, s>>>(
        static_cast<const T*>(x), planes, hw, static_cast<T*>(y));
  });
  return cudaGetLastError();
}

cudaError_t GlobalAvgPoolBackward(DT dt, const void* dy, int64_t planes, int64_t hw, void* dx,
                                  cudaStream_t s) {
  if (planes * hw <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    GlobalAvgPoolBackwardKernel<T><<<GridFor(planes * hw), kThreads, 0, s>>>(
        static_cast<const T*>(dy), planes, hw, static_cast<T*>(dx));
  });
  return cudaGetLastError();
}

cudaError_t MaxPool(DT dt, const void* x, const PoolGeom& g, void* y, int32_t* indices,
                    cudaStream_t s) {
  const int64_t n = g.planes * g.ho * g.wo;
  if (n <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    MaxPoolKernel<T>
        <<<GridFor(n), kThreads, 0, s>>>(static_cast<const T*>(x), g, static_cast<T*>(y), indices);
  });
  return cudaGetLastError();
}

cudaError_t MaxPoolBackward(DT dt, const void* dy, const int32_t* indices, const PoolGeom& g,
                            void* dx, cudaStream_t s) {
  const int64_t n = g.planes * g.h * g.w;
  if (n <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    MaxPoolBackwardKernel<T><<<GridFor(n), kThreads, 0, s>>>(static_cast<const T*>(dy), indices, g,
                                                             static_cast<T*>(dx));
  });
  return cudaGetLastError();
}

cudaError_t AvgPool(DT dt, const void* x, const PoolGeom& g, void* y, cudaStream_t s) {
  const int64_t n = g.planes * g.ho * g.wo;
  if (n <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    AvgPoolKernel<T>
        <<<GridFor(n), kThreads, 0, s>>>(static_cast<const T*>(x), g, static_cast<T*>(y));
  });
  return cudaGetLastError();
}

cudaError_t AvgPoolBackward(DT dt, const void* dy, const PoolGeom& g, void* dx, cudaStream_t s) {
  const int64_t n = g.planes * g.h * g.w;
  if (n <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    AvgPoolBackwardKernel<T>
        <<<GridFor(n), kThreads, 0, s>>>(static_cast<const T*>(dy), g, static_cast<T*>(dx));
  });
  return cudaGetLastError();
}

cudaError_t ChannelSum(DT dt, const void* x, int64_t outer, int64_t channels, int64_t inner,
                       DT out_dt, void* out, cudaStream_t s) {
  if (channels <= 0) return cudaSuccess;
  if (outer * inner == 0) return cudaErrorInvalidValue;  // callers fill zeros themselves
  DT_DISPATCH_FLOAT(dt, T, {
    DT_DISPATCH_FLOAT(out_dt, O, {
      ChannelSumKernel<T, O>
          <<<static_cast<unsigned>(channels), ChannelThreads(outer * inner), 0, s>>>(
              static_cast<const T*>(x), outer, channels, inner, static_cast<O*>(out));
    });
  });
  return cudaGetLastError();
}

cudaError_t BatchNormStats(DT dt, const void* x, int64_t outer, int64_t C, int64_t inner, float eps,
                           float* mean, float* inv_std, cudaStream_t s) {
  if (C <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    BnStatsKernel<T><<<static_cast<unsigned>(C), ChannelThreads(outer * inner), 0, s>>>(
        static_cast<const T*>(x), outer, C, inner, eps, mean, inv_std);
  });
  return cudaGetLastError();
}

cudaError_t BatchNormApply(DT dt, const void* x, int64_t outer, int64_t C, int64_t inner,
                           const float* mean, const float* inv_std, DT pdt, const void* gamma,
                           const void* beta, void* y, cudaStream_t s) {
  const int64_t n = outer * C * inner;
  if (n <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    DT_DISPATCH_FLOAT(pdt, P, {
      BnApplyKernel<T, P><<<GridFor(n), kThreads, 0, s>>>(
          static_cast<const T*>(x), n, C, inner, mean, inv_std, static_cast<const P*>(gamma),
          static_cast<const P*>(beta), static_cast<T*>(y));
    });
  });
  return cudaGetLastError();
}

cudaError_t BatchNormInference(DT dt, const void* x, int64_t outer, int64_t C, int64_t inner,
                               DT pdt, const void* gamma, const void* beta,
                               const float* running_mean, const float* running_var, float eps,
                               void* y, cudaStream_t s) {
  const int64_t n = outer * C * inner;
  if (n <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    DT_DISPATCH_FLOAT(pdt, P, {
      BnInferenceKernel<T, P><<<GridFor(n), kThreads, 0, s>>>(
          static_cast<const T*>(x), n, C, inner, static_cast<const P*>(gamma),
          static_cast<const P*>(beta), running_mean, running_var, eps, static_cast<T*>(y));
    });
  });
  return cudaGetLastError();
}

cudaError_t BatchNormBackwardReduce(DT dt, const void* x, const void* dy, int64_t outer, int64_t C,
                                    int64_t inner, const float* mean, const float* inv_std,
                                    float* sum_dy, float* sum_dy_xhat, DT gdt, void* dgamma,
                                    void* dbeta, cudaStream_t s) {
  if (C <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, T, {
    DT_DISPATCH_FLOAT(gdt, G, {
      BnBackwardReduceKernel<T, G>
          <<<static_cast<unsigned>(C), ChannelThreads(outer * inner), 0, s>>>(
              static_cast<const T*>(x), static_cast<const T*>(dy), outer, C, inner, mean, inv_std,
              sum_dy, sum_dy_xhat, static_cast<G*>(dgamma), static_cast<G*>(dbeta));
    });
  });
  return cudaGetLastError();
}

cudaError_t BatchNormBackwardData(DT dt, const void* x, const void* dy, int64_t outer, int64_t C,
                                  int64_t inner, const float* mean, const float* inv_std, DT pdt,
                                  const void* gamma, const float* sum_dy, const float* sum_dy_xhat,
                                  void* dx, cudaStream_t s) {
  const int64_t n = outer * C * inner;
  if (n <= 0) return cudaSuccess;
  const float inv_count = 1.0f / static_cast<float>(outer * inner);
  DT_DISPATCH_FLOAT(dt, T, {
    DT_DISPATCH_FLOAT(pdt, P, {
      BnBackwardDataKernel<T, P><<<GridFor(n), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(dy), n, C, inner, inv_count, mean,
          inv_std, static_cast<const P*>(gamma), sum_dy, sum_dy_xhat, static_cast<T*>(dx));
    });
  });
  return cudaGetLastError();
}

cudaError_t BatchNormUpdateRunning(const float* mean, const float* inv_std, int64_t C, float eps,
                                   float momentum, double count, float* running_mean,
                                   float* running_var, cudaStream_t s) {
  if (C <= 0 || (running_mean == nullptr && running_var == nullptr)) return cudaSuccess;
  BnUpdateRunningKernel<<<GridFor(C), kThreads, 0, s>>>(mean, inv_std, C, eps, momentum, count,
                                                        running_mean, running_var);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace dtrain
