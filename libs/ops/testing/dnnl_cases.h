// What the oneDNN kernel tests and the per-layer benchmark share: the
// convolution shapes they describe, the layout override, and inputs with a
// realistic batch-norm spread.
#ifndef DTRAIN_LIBS_OPS_TESTING_DNNL_CASES_H_
#define DTRAIN_LIBS_OPS_TESTING_DNNL_CASES_H_

#include <cstdint>

#include "libs/ops/cpu/dnnl_kernels.h"
#include "libs/ops/testing/gradcheck.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace ops {
namespace testing {

// A convolution: x [n, c, h, w], w [o, c, k, k], stride and padding.
struct ConvCase {
  int64_t n, c, h, w, o, k;
  int stride, pad;
};

// Forces a convolution layout while alive, then restores the automatic
// choice.
class LayoutGuard {
 public:
  explicit LayoutGuard(cpu::ConvLayout layout) { cpu::SetConvLayoutForTesting(layout); }
  ~LayoutGuard() { cpu::SetConvLayoutForTesting(cpu::ConvLayout::kAuto); }
  LayoutGuard(const LayoutGuard&) = delete;
  LayoutGuard& operator=(const LayoutGuard&) = delete;
};

inline const char* LayoutName(cpu::ConvLayout l) {
  switch (l) {
    case cpu::ConvLayout::kAuto:
      return "auto";
    case cpu::ConvLayout::kPlain:
      return "plain";
    case cpu::ConvLayout::kBlocked:
      return "blocked";
    case cpu::ConvLayout::kChannelsLast:
      return "nhwc";
  }
  return "?";
}

// Input with a clearly non-zero variance and a per-channel offset.
inline Tensor BatchNormInput(const Shape& shape, uint64_t seed) {
  Tensor x = RandomTensor(shape, seed, -2.0f, 2.0f);
  const int64_t c = shape[1];
  const int64_t hw = x.numel() / (shape[0] * c);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += 0.5f * ((i / hw) % c);
  return x;
}

}  // namespace testing
}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_OPS_TESTING_DNNL_CASES_H_
