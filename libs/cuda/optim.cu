// Multi-tensor optimizer kernels: one launch updates many parameters (as
// NVIDIA Apex's multi_tensor_apply does), so a ResNet's 60-odd parameter
// tensors cost a couple of launches per step instead of 60.
#include <cmath>
#include <vector>

#include "libs/cuda/kernel_util.cuh"
#include "libs/cuda/kernels.h"
#include "libs/cuda/loss_scale_rule.h"

namespace dtrain {
namespace cuda {
namespace kernels {
namespace {

// Work of one launch, passed by value as the kernel's argument (under 4 KB).
// Block b handles chunk chunk_of_block[b] of tensor tensor_of_block[b].
constexpr int kMaxTensors = 36;
constexpr int kMaxBlocks = 320;
constexpr int64_t kChunk = 16384;
constexpr int kOptimThreads = 512;

struct SgdLaunch {
  float* param[kMaxTensors];
  const void* grad[kMaxTensors];
  float* momentum[kMaxTensors];
  void* copy[kMaxTensors];
  int64_t n[kMaxTensors];
  unsigned char tensor_of_block[kMaxBlocks];
  int32_t chunk_of_block[kMaxBlocks];
};

struct UnscaleLaunch {
  void* grad[kMaxTensors * 3];
  int64_t n[kMaxTensors * 3];
  unsigned char tensor_of_block[kMaxBlocks];
  int32_t chunk_of_block[kMaxBlocks];
};

static_assert(sizeof(SgdLaunch) + 64 <= 4096, "kernel argument too large");
static_assert(sizeof(UnscaleLaunch) + 64 <= 4096, "kernel argument too large");

template <typename G, typename C>
__global__ void __launch_bounds__(kOptimThreads)
    SgdKernel(SgdLaunch L, SgdHyper h, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const int t = L.tensor_of_block[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(L.chunk_of_block[blockIdx.x]) * kChunk;
  const int64_t end = min(begin + kChunk, L.n[t]);
  float* p = L.param[t];
  const G* g = static_cast<const G*>(L.grad[t]);
  float* buf = L.momentum[t];
  C* copy = static_cast<C*>(L.copy[t]);
  const bool mom = h.momentum != 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float w = p[i];
    float grad = ToF<G>(g[i]);
    if (h.weight_decay != 0.0f) grad = grad + h.weight_decay * w;
    float d = grad;
    if (mom) {
      const float v = h.momentum * buf[i] + grad;
      buf[i] = v;
      d = h.nesterov ? grad + h.momentum * v : v;
    }
    w = w - h.lr * d;
    p[i] = w;
    if (copy != nullptr) copy[i] = FromF<C>(w);
  }
}

template <typename G>
__global__ void __launch_bounds__(kOptimThreads)
    UnscaleKernel(UnscaleLaunch L, const float* scale, float* found_inf) {
  const int t = L.tensor_of_block[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(L.chunk_of_block[blockIdx.x]) * kChunk;
  const int64_t end = min(begin + kChunk, L.n[t]);
  G* g = static_cast<G*>(L.grad[t]);
  const float inv = 1.0f / *scale;
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = ToF<G>(g[i]) * inv;
    bad = bad || !isfinite(v);
    g[i] = FromF<G>(v);
  }
  if (bad) *found_inf = 1.0f;  // every writer stores the same value
}

__global__ void UpdateScaleKernel(float* scale, int32_t* growth_tracker, float* found_inf,
                                  float growth, float backoff, int32_t interval) {
  UpdateLossScaleRule(*found_inf != 0.0f, growth, backoff, interval, scale, growth_tracker);
  *found_inf = 0.0f;
}

// Packs (tensor, chunk) work items into launches and calls launch(L, blocks)
// for each full one. `add(L, slot, i)` stores tensor i's pointers in slot.
template <typename L, typename Add, typename Launch>
cudaError_t Schedule(int count, const int64_t* sizes, int max_tensors, Add add, Launch launch) {
  L l{};
  int tensors = 0, blocks = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t n = sizes[i];
    if (n <= 0) continue;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || blocks == 0) {
        // Start (or restart, after a launch) tensor i in a new slot.
        if (tensors == max_tensors) {
          cudaError_t err = launch(l, blocks);
          if (err != cudaSuccess) return err;
          tensors = 0;
          blocks = 0;
        }
        add(&l, tensors, i);
        l.n[tensors] = n;
        ++tensors;
      }
      l.tensor_of_block[blocks] = static_cast<unsigned char>(tensors - 1);
      l.chunk_of_block[blocks] = static_cast<int32_t>(c);
      ++blocks;
      if (blocks == kMaxBlocks) {
        cudaError_t err = launch(l, blocks);
        if (err != cudaSuccess) return err;
        blocks = 0;
        tensors = 0;
      }
    }
  }
  if (blocks > 0) return launch(l, blocks);
  return cudaSuccess;
}

template <typename G, typename C>
cudaError_t LaunchSgd(const SgdTensor* ts, int count, const SgdHyper& h, const float* found_inf,
                      cudaStream_t s) {
  std::vector<int64_t> sizes(count);
  for (int i = 0; i < count; ++i) sizes[i] = ts[i].n;
  return Schedule<SgdLaunch>(
      count, sizes.data(), kMaxTensors,
      [&](SgdLaunch* l, int slot, int i) {
        l->param[slot] = ts[i].param;
        l->grad[slot] = ts[i].grad;
        l->momentum[slot] = ts[i].momentum;
        l->copy[slot] = ts[i].copy;
      },
      [&](const SgdLaunch& l, int blocks) {
        SgdKernel<G, C><<<blocks, kOptimThreads, 0, s>>>(l, h, found_inf);
        return cudaGetLastError();
      });
}

template <typename G>
cudaError_t SgdWithCopy(const SgdTensor* ts, int count, DT copy_dt, const SgdHyper& h,
                        const float* found_inf, cudaStream_t s) {
  // copy_dt only matters when some tensor has a copy; f32 stands for none.
  DT_DISPATCH_FLOAT(copy_dt, C, return LaunchSgd<G, C>(ts, count, h, found_inf, s));
  return cudaSuccess;
}

}  // namespace

cudaError_t MultiTensorSgd(const SgdTensor* tensors, int count, DT grad_dt, DT copy_dt,
                           const SgdHyper& hyper, const float* found_inf, cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(grad_dt, G,
                    return SgdWithCopy<G>(tensors, count, copy_dt, hyper, found_inf, s));
  return cudaSuccess;
}

cudaError_t MultiTensorUnscale(void* const* grads, const int64_t* sizes, int count, DT dt,
                               const float* scale, float* found_inf, cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  DT_DISPATCH_FLOAT(dt, G, {
    return Schedule<UnscaleLaunch>(
        count, sizes, kMaxTensors * 3,
        [&](UnscaleLaunch* l, int slot, int i) { l->grad[slot] = grads[i]; },
        [&](const UnscaleLaunch& l, int blocks) {
          UnscaleKernel<G><<<blocks, kOptimThreads, 0, s>>>(l, scale, found_inf);
          return cudaGetLastError();
        });
  });
  return cudaSuccess;
}

cudaError_t UpdateLossScale(float* scale, int32_t* growth_tracker, float* found_inf,
                            float growth_factor, float backoff_factor, int32_t growth_interval,
                            cudaStream_t s) {
  UpdateScaleKernel<<<1, 1, 0, s>>>(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                                    growth_interval);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace dtrain
