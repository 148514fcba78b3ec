// The dynamic loss-scale rule of mixed-precision (f16) training, shared by the
// device kernel (optim.cu) and host code and tests. It is PyTorch's
// GradScaler rule:
//   - a step whose gradients hold an inf or NaN is skipped and the scale is
//     multiplied by backoff_factor (0.5), the streak of good steps reset;
//   - after growth_interval (2000) good steps in a row the scale is multiplied
//     by growth_factor (2), unless that would overflow f32.
#ifndef DTRAIN_LIBS_CUDA_LOSS_SCALE_RULE_H_
#define DTRAIN_LIBS_CUDA_LOSS_SCALE_RULE_H_

#include <cstdint>

#ifdef __CUDACC__
#define DT_HOST_DEVICE __host__ __device__
#else
#define DT_HOST_DEVICE
#endif

namespace dtrain {
namespace cuda {

DT_HOST_DEVICE inline void UpdateLossScaleRule(bool found_inf, float growth_factor,
                                               float backoff_factor, int32_t growth_interval,
                                               float* scale, int32_t* growth_tracker) {
  if (found_inf) {
    *scale *= backoff_factor;
    *growth_tracker = 0;
    return;
  }
  int32_t good = *growth_tracker + 1;
  if (good >= growth_interval) {
    float grown = *scale * growth_factor;
    // Keep the old scale if growing it would overflow (inf is not finite).
    if (grown - grown == 0.0f) *scale = grown;
    good = 0;
  }
  *growth_tracker = good;
}

}  // namespace cuda
}  // namespace dtrain

#undef DT_HOST_DEVICE

#endif  // DTRAIN_LIBS_CUDA_LOSS_SCALE_RULE_H_
