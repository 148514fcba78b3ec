// CPU kernels of the hybridized executor that the op registry does not have:
// fused elementwise programs, avg-pool backward fused with relu backward,
// and a small-batch linear layer on prepacked weights. Internal to
// libs/graph (the executor chooses them when it compiles a plan).
//
// Like libs/ops/cpu, they use the calling thread's OpenMP thread count
// (ops::CpuThreads) and give results that do not depend on it.
#ifndef DTRAIN_LIBS_GRAPH_KERNELS_H_
#define DTRAIN_LIBS_GRAPH_KERNELS_H_

#include <cstdint>

#include "libs/graph/ir.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace graph {
namespace kernels {

// y[i] = program(x0[i], x1[i], ...) for i < n (see ElementwiseInstr). `y`
// may alias any input. REQUIRES: the program is valid for `num_inputs`
// inputs (InferOutputTypes checks it).
void FusedElementwise(const ElementwiseInstr* program, int num_instrs, const float* const* inputs,
                      int num_inputs, float* y, int64_t n);

// dx = y > 0 ? avg_pool2d_backward(dy) : 0, with dx and y [N,C,H,W] and dy
// the pooled gradient; average pooling excludes padding from the divisor.
void AvgPool2dReluBackward(const Tensor& dy, const Tensor& y, const ops::Pool2dParams& p,
                           Tensor* dx);

// Direct convolution for layers with few input channels (a network's first
// layer: C * kh * kw <= kSmallConvMaxTaps) and stride 1, where oneDNN has no
// blocked kernel and falls back to slower generic code. Chosen by the
// executor at compile time by shape (SmallConvSupported).
inline constexpr int64_t kSmallConvMaxTaps = 32;
bool SmallConvSupported(const Shape& x, const Shape& w, const ops::Conv2dParams& p);
// y = conv(x, w) + b (b may be null), relu when `relu`; as ops::Conv2dFn.
void SmallConv2d(const Tensor& x, const Tensor& w, const Tensor* b, const ops::Conv2dParams& p,
                 bool relu, Tensor* y);
// Floats of scratch SmallConv2dBackwardWeights needs for these shapes.
int64_t SmallConvBackwardWeightsScratch(const Shape& x, const Shape& w);
// dw (and db, may be null) from x and dy, as ops::Conv2dBackwardWeightsFn;
// `scratch` holds SmallConvBackwardWeightsScratch floats. Partial sums over
// fixed blocks of samples are added in order: the result does not depend on
// the thread count.
void SmallConv2dBackwardWeights(const Tensor& x, const Tensor& dy, const ops::Conv2dParams& p,
                                Tensor* dw, Tensor* db, float* scratch);

// conv2d_backward_weights_avg_pool_relu: the weight (and bias) gradient of a
// stride-1 convolution with few input channels whose output gradient is
// avg_pool2d_relu_backward(dy_pooled, y) for a tiled pooling window `pool`
// (kernel = stride, no padding), computed plane by plane in cache instead
// of being stored. REQUIRES: the shapes pass InferOutputTypes for the op
// (its limits are the kernel's). Scratch as SmallConvBackwardWeightsScratch.
// Any CPU (AVX-512 when present).
void ConvWeightsPoolRelu(const Tensor& x, const Tensor& dy_pooled, const Tensor& y,
                         const ops::Conv2dParams& p, int pool, Tensor* dw, Tensor* db,
                         float* scratch);

// A linear layer's weights repacked for small batches: w[M,K] transposed to
// [K, Mp] (Mp = M rounded up to the vector width, zero padded) and the bias
// padded to Mp. Built once when a plan is compiled.
class PackedLinear {
 public:
  // Returns null when this CPU has no vector unit the kernel supports (it
  // then falls back to the registered linear kernel).
  static std::unique_ptr<PackedLinear> Create(const Tensor& w, const Tensor* b);

  // y[N,M] = x[N,K] * w^T + b, relu when `relu`. REQUIRES: x is f32 [N,K]
  // on the CPU and y f32 [N,M].
  void Run(const Tensor& x, bool relu, Tensor* y) const;

  // Which instruction set Run uses: "avx512" or "avx2".
  const char* isa() const { return isa_; }

 private:
  using Fn = void (*)(const float* wt, const float* bias, int64_t k, int64_t mp, int64_t m,
                      const float* x, int64_t n, bool relu, float* y);
  PackedLinear() = default;
  Tensor wt_;    // [K, Mp]
  Tensor bias_;  // [Mp]
  int64_t k_ = 0, m_ = 0, mp_ = 0;
  Fn fn_ = nullptr;
  const char* isa_ = "";
};

}  // namespace kernels
}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_KERNELS_H_
