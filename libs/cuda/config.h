// Process-wide numeric settings of the CUDA kernels.
#ifndef DTRAIN_LIBS_CUDA_CONFIG_H_
#define DTRAIN_LIBS_CUDA_CONFIG_H_

namespace dtrain {
namespace cuda {

// Whether f32 matrix products (cuBLAS) and convolutions (cuDNN) may use TF32
// tensor cores: inputs rounded to 10 mantissa bits, f32 accumulation, several
// times the f32 throughput on Ampere and Hopper. Off by default (as
// PyTorch's torch.backends.cuda.matmul.allow_tf32), or on when the
// environment sets DTRAIN_ALLOW_TF32=1. Takes effect for the next call of
// each kernel (cached convolution algorithms are kept per setting).
void SetAllowTf32(bool allow);
bool AllowTf32();

// How cuDNN convolution algorithms are chosen, once per shape:
//  kBenchmark  time the candidates (cudnnFind*AlgorithmEx) on the first call,
//              as torch.backends.cudnn.benchmark = True does; the default;
//  kHeuristic  take cuDNN's heuristic choice (cudnnGet*Algorithm_v7), no
//              timing runs. DTRAIN_CUDNN_BENCHMARK=0 selects it.
// A shape first seen while a CUDA graph is being captured always uses the
// heuristic (timing runs cannot be captured).
enum class ConvAlgoSearch { kBenchmark = 0, kHeuristic = 1 };
void SetConvAlgoSearch(ConvAlgoSearch search);
ConvAlgoSearch GetConvAlgoSearch();

// Whether f32 convolutions without TF32 leave out cuDNN's FFT and Winograd
// algorithms, whose results are not exact to f32 rounding (they transform
// the data; their error grows with the transform, not only with the
// reduction length), keeping the direct and GEMM-based ones. Off by default
// (as in PyTorch, which allows them too); on when the environment sets
// DTRAIN_CUDNN_F32_EXACT=1. op_harness_test compares both. Cached choices
// are kept per setting.
void SetConvF32Exact(bool exact);
bool ConvF32Exact();

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_CONFIG_H_
