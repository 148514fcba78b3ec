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

#include <string>

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

// MeasureGemmPeakFlops once per host and boot for every process of this uid
// that asks: the first measures while it holds a lock on the figure's cache
// file and writes it there; the others wait for the lock and read it.
// Processes that start together (a host's trainers under `trainctl cluster
// up`) would otherwise measure at the same moment, share the cores, and
// each read about half the peak.
//
// The cache is the file gemm-peak-n<n>-t<threads> in `cache_dir` ("": in
// $XDG_RUNTIME_DIR/dtrain or /tmp/dtrain-<uid>, created 0700), holding the
// boot id and the figure. A directory that is not this uid's and private,
// or a file that does not parse or is from another boot, is not used: the
// figure is then measured here (and written, where the directory is
// usable). `from_cache`, if set, says whether the figure was read.
absl::StatusOr<double> HostGemmPeakFlops(const GemmPeakOptions& options,
                                         const std::string& cache_dir = "",
                                         bool* from_cache = nullptr);

}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_OPS_PEAK_H_
