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
  // HostGemmPeakFlops keeps a figure for later callers only if its product
  // ran on the CPU for at least this share of its wall time (times
  // `threads`): below it, other work took the cores (a busy host) and the
  // figure reads low. 0: always keep it.
  double min_cpu_share = 0.9;
};

// CPU only. Errors: InvalidArgument for a non-positive option. `cpu_share`,
// if set: the CPU time this process got during the best product over its
// wall time times `threads` (about 1 with the cores to itself, lower when
// other processes competed for them).
absl::StatusOr<double> MeasureGemmPeakFlops(const GemmPeakOptions& options,
                                            double* cpu_share = nullptr);

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
// usable). A figure measured while other processes held the cores (its
// cpu_share below options.min_cpu_share) is returned but not written, so
// the next caller measures again instead of every later one reading a low
// figure until the next boot. `from_cache`, if set, says whether the
// figure was read.
absl::StatusOr<double> HostGemmPeakFlops(const GemmPeakOptions& options,
                                         const std::string& cache_dir = "",
                                         bool* from_cache = nullptr);

}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_OPS_PEAK_H_
