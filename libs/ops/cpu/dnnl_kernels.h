// Internal hooks of the oneDNN CPU kernels (dnnl_kernels.cc), for tests and
// benchmarks. Model code uses the ops in libs/ops/ops.h and never this header.
#ifndef DTRAIN_LIBS_OPS_CPU_DNNL_KERNELS_H_
#define DTRAIN_LIBS_OPS_CPU_DNNL_KERNELS_H_

#include <cstdint>

namespace dtrain {
namespace ops {
namespace cpu {

// Process-wide counters of the per-thread primitive caches.
struct DnnlCacheStats {
  int64_t created = 0;  // cache misses: primitive descriptors and primitives built
  int64_t reused = 0;   // cache hits: a cached primitive executed again
};
DnnlCacheStats GetDnnlCacheStats();

// Number of entries in the calling thread's primitive cache (all ops).
int64_t DnnlThreadCacheSize();

// Memory layout used by the convolution kernels.
enum class ConvLayout {
  kAuto = 0,          // per-shape choice from measurements (see dnnl_kernels.cc)
  kPlain = 1,         // nchw / oihw directly on the caller's buffers
  kBlocked = 2,       // oneDNN's preferred (blocked) layouts with cached reorders
  kChannelsLast = 3,  // nhwc activations, oneDNN's preferred weights, cached reorders
};

// Overrides the layout choice for all threads (tests and benchmarks only).
// Cached primitives are keyed by layout, so switching is safe at any time.
void SetConvLayoutForTesting(ConvLayout layout);

enum class ConvPass { kForward, kBackwardData, kBackwardWeights };

// The layout kAuto picks for one pass of a convolution of x[n,c,h,w] with o
// filters of size k x k and the given stride. Each pass reorders from and to
// the caller's plain buffers on its own, so the passes choose independently.
ConvLayout ChooseConvLayout(ConvPass pass, int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
                            int64_t k, int stride);

}  // namespace cpu
}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_OPS_CPU_DNNL_KERNELS_H_
