// The measured peak of a device for MFU: an f32 GEMM roofline
// micro-benchmark (the best of several n x n x n products through
// ops::MatMul, oneDNN's sgemm on CPU), in FLOP/s (2 n^3 per product).
//
//   DT_ASSIGN_OR_RETURN(double peak, ops::MeasureGemmPeakFlops({.threads = 1}));
//
// Large square products reach the highest rate the kernels get from the
// hardware; the figure is what a model could at best get, measured on this
// machine (with whatever else runs on it: measure on a quiet one).
#ifndef DTRAIN_LIBS_OPS_PEAK_H_
#define DTRAIN_LIBS_OPS_PEAK_H_

#include "absl/status/statusor.h"

namespace dtrain {
namespace ops {

struct GemmPeakOptions {
  int n = 1024;     // matrix size
  int reps = 10;    // timed products (after one untimed); the best counts
  int threads = 1;  // CPU kernel threads (SetCpuThreads)
};

// CPU only. Errors: InvalidArgument for a non-positive option.
absl::StatusOr<double> MeasureGemmPeakFlops(const GemmPeakOptions& options);

}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_OPS_PEAK_H_
