// cuDNN kernels of conv2d, conv2d_backward_data and conv2d_backward_weights
// (libs/ops/ops.h) for f32, f16 and bf16 tensors in NCHW, accumulating in f32.
//
// Algorithm choice. The first call of each shape (per device, pass, dtype and
// TF32 setting) chooses an algorithm and caches it: by timing the candidates
// on the call's own buffers (cudnnFind*AlgorithmEx, with as much workspace as
// the hungriest candidate wants, up to 1 GiB) or by cuDNN's heuristics (see
// config.h). Later calls of the shape only look the choice up. The workspace
// of the chosen algorithm comes from the caching allocator on every call
// (the same size each step, so a cache hit).
//
// Math modes. f32 without TF32 runs only FMA algorithms (CUDNN_FMA_MATH); with
// TF32 (config.h), tensor-core algorithms are allowed; f16 and bf16 use
// tensor cores. Algorithms that would convert f32 data to f16
// (..._ALLOW_CONVERSION) are never taken.
//
// Bias and relu follow the convolution in one elementwise pass; the bias
// gradient is a per-channel sum of dy.
#include "libs/cuda/dnn/conv.h"

#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/base/logging.h"
#include "libs/cuda/config.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/dnn/cudnn_status.h"
#include "libs/cuda/dnn/cudnn_util.h"
#include "libs/cuda/kernels.h"
#include "libs/cuda/op_util.h"
#include "libs/cuda/stream.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"

namespace dtrain {
namespace ops {
namespace cuda_kernels {
namespace {

using ::dtrain::cuda::dnn::ConvDesc;
using ::dtrain::cuda::dnn::CudnnHandle;
using ::dtrain::cuda::dnn::FilterDesc;
using ::dtrain::cuda::dnn::TensorDesc;

constexpr size_t kMaxFindWorkspace = size_t{1} << 30;

enum class Pass : int { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };

struct Geom {
  int64_t n, c, h, w, o, kh, kw, ho, wo;
  int stride, pad;
};

Geom MakeGeom(const char* op, const Shape& x, const Shape& w, const Conv2dParams& p) {
  DT_CHECK(x.size() == 4 && w.size() == 4 && x[1] == w[1])
      << op << ": x " << ShapeToString(x) << ", w " << ShapeToString(w)
      << " (want x [N,C,H,W] and w [O,C,kh,kw])";
  DT_CHECK(p.stride >= 1 && p.padding >= 0)
      << op << ": stride " << p.stride << ", padding " << p.padding;
  Geom g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], 0, 0, p.stride, p.padding};
  g.ho = ConvOutSize(g.h, static_cast<int>(g.kh), p.stride, p.padding);
  g.wo = ConvOutSize(g.w, static_cast<int>(g.kw), p.stride, p.padding);
  DT_CHECK(g.ho > 0 && g.wo > 0) << op << ": x " << ShapeToString(x) << ", w " << ShapeToString(w)
                                 << ", stride " << p.stride << ", padding " << p.padding
                                 << " give an empty output";
  return g;
}

void CheckShape(const char* op, const char* name, const Tensor& t, const Shape& want) {
  DT_CHECK(t.shape() == want) << op << ": " << name << " is " << ShapeToString(t.shape())
                              << ", want " << ShapeToString(want);
}

// Descriptors of one convolution: x = input (or dx), w = filter (or dw),
// y = output (or dy).
struct Descs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  Descs(DType dt, const Geom& g) {
    x.Set(dt, g.n, g.c, g.h, g.w);
    y.Set(dt, g.n, g.o, g.ho, g.wo);
    w.Set(dt, g.o, g.c, g.kh, g.kw);
    conv.Set(g.pad, g.stride);
  }
};

struct Ptrs {
  void* x;
  void* w;
  void* y;
};

template <Pass P>
struct PassOps;

template <>
struct PassOps<Pass::kForward> {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static constexpr const char* kName = "forward";
  static cudnnStatus_t WorkspaceSize(cudnnHandle_t h, const Descs& d, int algo, size_t* s) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                   static_cast<cudnnConvolutionFwdAlgo_t>(algo), s);
  }
  static cudnnStatus_t Find(cudnnHandle_t h, const Descs& d, const Ptrs& p, int* n, Perf* perf,
                            void* ws, size_t bytes) {
    return cudnnFindConvolutionForwardAlgorithmEx(h, d.x.get(), p.x, d.w.get(), p.w, d.conv.get(),
                                                  d.y.get(), p.y, kCount, n, perf, ws, bytes);
  }
  static cudnnStatus_t Heuristic(cudnnHandle_t h, const Descs& d, int* n, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                  kCount, n, perf);
  }
  static cudnnStatus_t Run(cudnnHandle_t h, const Descs& d, const Ptrs& p, int algo, void* ws,
                           size_t bytes) {
    const float one = 1.0f, zero = 0.0f;
    return cudnnConvolutionForward(h, &one, d.x.get(), p.x, d.w.get(), p.w, d.conv.get(),
                                   static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, bytes, &zero,
                                   d.y.get(), p.y);
  }
};

template <>
struct PassOps<Pass::kBackwardData> {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static constexpr const char* kName = "backward data";
  static cudnnStatus_t WorkspaceSize(cudnnHandle_t h, const Descs& d, int algo, size_t* s) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), s);
  }
  static cudnnStatus_t Find(cudnnHandle_t h, const Descs& d, const Ptrs& p, int* n, Perf* perf,
                            void* ws, size_t bytes) {
    return cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w.get(), p.w, d.y.get(), p.y,
                                                       d.conv.get(), d.x.get(), p.x, kCount, n,
                                                       perf, ws, bytes);
  }
  static cudnnStatus_t Heuristic(cudnnHandle_t h, const Descs& d, int* n, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.get(), d.y.get(), d.conv.get(),
                                                       d.x.get(), kCount, n, perf);
  }
  static cudnnStatus_t Run(cudnnHandle_t h, const Descs& d, const Ptrs& p, int algo, void* ws,
                           size_t bytes) {
    const float one = 1.0f, zero = 0.0f;
    return cudnnConvolutionBackwardData(h, &one, d.w.get(), p.w, d.y.get(), p.y, d.conv.get(),
                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, bytes,
                                        &zero, d.x.get(), p.x);
  }
};

template <>
struct PassOps<Pass::kBackwardFilter> {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static constexpr const char* kName = "backward filter";
  static cudnnStatus_t WorkspaceSize(cudnnHandle_t h, const Descs& d, int algo, size_t* s) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), s);
  }
  static cudnnStatus_t Find(cudnnHandle_t h, const Descs& d, const Ptrs& p, int* n, Perf* perf,
                            void* ws, size_t bytes) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x.get(), p.x, d.y.get(), p.y,
                                                         d.conv.get(), d.w.get(), p.w, kCount, n,
                                                         perf, ws, bytes);
  }
  static cudnnStatus_t Heuristic(cudnnHandle_t h, const Descs& d, int* n, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.get(), d.y.get(), d.conv.get(),
                                                         d.w.get(), kCount, n, perf);
  }
  static cudnnStatus_t Run(cudnnHandle_t h, const Descs& d, const Ptrs& p, int algo, void* ws,
                           size_t bytes) {
    const float one = 1.0f, zero = 0.0f;
    return cudnnConvolutionBackwardFilter(h, &one, d.x.get(), p.x, d.y.get(), p.y, d.conv.get(),
                                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws,
                                          bytes, &zero, d.w.get(), p.w);
  }
};

// ---- the algorithm cache ----

// (device, pass, dtype, tf32, search, exact, n, c, h, w, o, kh, kw, stride,
// pad): the search mode and the f32-exact setting (config.h) are part of the
// key so that a test can compare the choices for the same shape.
using Key = std::tuple<int, int, int, bool, int, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int, int>;

struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

struct Cache {
  absl::Mutex mu;
  absl::flat_hash_map<Key, Choice> choices ABSL_GUARDED_BY(mu);
};

Cache& GetCache() {
  static Cache* c = new Cache();
  return *c;
}

// Math modes a result may use (see the file comment). For f32 without TF32
// the search ran under CUDNN_FMA_MATH, so its results are FMA algorithms
// whatever math type they report; they also run under CUDNN_FMA_MATH
// (ExecutionMath), so that no default-math TF32 path can sneak in.
bool MathAllowed(cudnnMathType_t m, DType dt, bool tf32) {
  if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  if (dt == DType::kF32 && !tf32) return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
  return true;
}

cudnnMathType_t ExecutionMath(cudnnMathType_t found, DType dt, bool tf32) {
  return dt == DType::kF32 && !tf32 ? CUDNN_FMA_MATH : found;
}

// Device memory for cudnnFind*: the largest workspace any candidate wants (up
// to kMaxFindWorkspace), halved until it fits; taken straight from the device
// (not the cache) so that one-off sizes do not stay cached.
struct FindWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~FindWorkspace() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

// The calling thread's last choice per pass, for LastConvChoiceForTesting.
std::string& LastChoice(Pass p) {
  thread_local std::string last[3];
  return last[static_cast<int>(p)];
}

const char* AlgoName(Pass p, int algo) {
  static const char* const kFwd[] = {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
      "WINOGRAD",      "WINOGRAD_NONFUSED"};
  static const char* const kData[] = {"ALGO_0",     "ALGO_1",   "FFT",
                                      "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const kFilter[] = {
      "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  switch (p) {
    case Pass::kForward:
      if (algo >= 0 && algo < 8) return kFwd[algo];
      break;
    case Pass::kBackwardData:
      if (algo >= 0 && algo < 6) return kData[algo];
      break;
    case Pass::kBackwardFilter:
      if (algo >= 0 && algo < 7) return kFilter[algo];
      break;
  }
  return "UNKNOWN";
}

// FFT and Winograd algorithms (see config.h ConvF32Exact).
bool Transforms(Pass p, int algo) {
  const std::string name = AlgoName(p, algo);
  return name.find("FFT") != std::string::npos || name.find("WINOGRAD") != std::string::npos;
}

const char* MathName(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "DEFAULT";
    case CUDNN_TENSOR_OP_MATH:
      return "TENSOR_OP";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "TENSOR_OP_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH:
      return "FMA";
  }
  return "UNKNOWN";
}

template <Pass P>
Choice Choose(const char* op, int device, cudaStream_t stream, cudnnHandle_t h, Descs& d,
              const Ptrs& p, const Key& key, DType dt, bool tf32, bool exact) {
  Cache& cache = GetCache();
  {
    absl::MutexLock lock(&cache.mu);
    auto it = cache.choices.find(key);
    if (it != cache.choices.end()) return it->second;
  }
  using Ops = PassOps<P>;
  const cudnnMathType_t request =
      dt == DType::kF32 ? (tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH) : CUDNN_TENSOR_OP_MATH;
  d.conv.SetMath(request);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    capture = cudaStreamCaptureStatusNone;
  }
  const bool benchmark =
      ::dtrain::cuda::GetConvAlgoSearch() == ::dtrain::cuda::ConvAlgoSearch::kBenchmark &&
      capture == cudaStreamCaptureStatusNone;
  typename Ops::Perf perf[Ops::kCount];
  int returned = 0;
  size_t limit = SIZE_MAX;
  if (benchmark) {
    size_t want = 0;
    for (int a = 0; a < Ops::kCount; ++a) {
      size_t s = 0;
      if (Ops::WorkspaceSize(h, d, a, &s) == CUDNN_STATUS_SUCCESS) want = std::max(want, s);
    }
    FindWorkspace ws;
    want = std::min(want, kMaxFindWorkspace);
    while (want > 0) {
      ::dtrain::cuda::DeviceGuard guard(device);
      if (cudaMalloc(&ws.ptr, want) == cudaSuccess) {
        ws.bytes = want;
        break;
      }
      cudaGetLastError();
      ws.ptr = nullptr;
      want = want > (size_t{1} << 20) ? want / 2 : 0;
    }
    DT_CUDNN_CHECK(Ops::Find(h, d, p, &returned, perf, ws.ptr, ws.bytes));
    limit = ws.bytes;
  } else {
    DT_CUDNN_CHECK(Ops::Heuristic(h, d, &returned, perf));
  }
  const typename Ops::Perf* best = nullptr;
  for (int i = 0; i < returned && best == nullptr; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit &&
        MathAllowed(perf[i].mathType, dt, tf32) &&
        (!exact || !Transforms(P, static_cast<int>(perf[i].algo)))) {
      best = &perf[i];
    }
  }
  DT_CHECK(best != nullptr) << op << ": cuDNN offers no usable " << Ops::kName << " algorithm ("
                            << returned << " candidates, dtype " << DTypeName(dt) << ")";
  Choice c;
  c.algo = static_cast<int>(best->algo);
  c.math = ExecutionMath(best->mathType, dt, tf32);
  c.workspace = best->memory;
  absl::MutexLock lock(&cache.mu);
  cache.choices.emplace(key, c);
  return c;
}

// Runs pass P of a convolution of geometry g on the current stream.
template <Pass P>
void RunConv(const char* op, int device, DType dt, const Geom& g, const Ptrs& p) {
  DeviceGuard guard(device);
  cudaStream_t s = CurrentCudaStream(device);
  cudnnHandle_t h = CudnnHandle(device, s);
  Descs d(dt, g);
  const bool tf32 = dt == DType::kF32 && ::dtrain::cuda::AllowTf32();
  const int search = static_cast<int>(::dtrain::cuda::GetConvAlgoSearch());
  const bool exact = dt == DType::kF32 && !tf32 && ::dtrain::cuda::ConvF32Exact();
  const Key key(device, static_cast<int>(P), static_cast<int>(dt), tf32, search, exact, g.n, g.c,
                g.h, g.w, g.o, g.kh, g.kw, g.stride, g.pad);
  const Choice c = Choose<P>(op, device, s, h, d, p, key, dt, tf32, exact);
  LastChoice(P) =
      absl::StrCat(AlgoName(P, c.algo), " math=", MathName(c.math), " workspace=", c.workspace);
  d.conv.SetMath(c.math);
  Tensor ws;
  if (c.workspace > 0) ws = Scratch(device, c.workspace);
  DT_CUDNN_CHECK(
      PassOps<P>::Run(h, d, p, c.algo, ws.defined() ? ws.raw_data() : nullptr, c.workspace));
}

void Conv2d(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dParams& p, bool relu,
            Tensor* y) {
  const char* op = "conv2d";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "w", w);
  CheckLike(op, "x", x, "y", *y);
  const Geom g = MakeGeom(op, x.shape(), w.shape(), p);
  CheckShape(op, "y", *y, {g.n, g.o, g.ho, g.wo});
  if (b != nullptr) {
    CheckFloat(op, "b", *b);
    DT_CHECK(b->device() == x.device())
        << op << ": b " << b->DebugString() << " for x " << x.DebugString();
    CheckShape(op, "b", *b, {g.o});
  }
  if (x.numel() == 0 || y->numel() == 0) return;
  const int d = x.device().index;
  RunConv<Pass::kForward>(op, d, x.dtype(), g, Ptrs{x.raw_data(), w.raw_data(), y->raw_data()});
  if (b != nullptr || relu) {
    DeviceGuard guard(d);
    CheckLaunch(op, k::BiasAct(Dt(y->dtype()), y->raw_data(),
                               b != nullptr ? Dt(b->dtype()) : Dt(y->dtype()),
                               b != nullptr ? b->raw_data() : nullptr, g.n, g.o, g.ho * g.wo, relu,
                               CurrentCudaStream(d)));
  }
}

void Conv2dBackwardData(const Tensor& dy, const Tensor& w, const Conv2dParams& p, Tensor* dx) {
  const char* op = "conv2d_backward_data";
  CheckFloat(op, "dy", dy);
  CheckLike(op, "dy", dy, "w", w);
  CheckLike(op, "dy", dy, "dx", *dx);
  const Geom g = MakeGeom(op, dx->shape(), w.shape(), p);
  CheckShape(op, "dy", dy, {g.n, g.o, g.ho, g.wo});
  if (dx->numel() == 0) return;
  RunConv<Pass::kBackwardData>(op, dy.device().index, dy.dtype(), g,
                               Ptrs{dx->raw_data(), w.raw_data(), dy.raw_data()});
}

void Conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p, Tensor* dw,
                           Tensor* db) {
  const char* op = "conv2d_backward_weights";
  CheckFloat(op, "x", x);
  CheckLike(op, "x", x, "dy", dy);
  CheckLike(op, "x", x, "dw", *dw);
  const Geom g = MakeGeom(op, x.shape(), dw->shape(), p);
  CheckShape(op, "dy", dy, {g.n, g.o, g.ho, g.wo});
  if (db != nullptr) {
    CheckFloat(op, "db", *db);
    DT_CHECK(db->device() == x.device())
        << op << ": db " << db->DebugString() << " for x " << x.DebugString();
    CheckShape(op, "db", *db, {g.o});
  }
  const int d = x.device().index;
  if (g.n == 0) {
    DeviceGuard guard(d);
    cudaStream_t s = CurrentCudaStream(d);
    CheckLaunch(op, cudaMemsetAsync(dw->raw_data(), 0, dw->nbytes(), s));
    if (db != nullptr) CheckLaunch(op, cudaMemsetAsync(db->raw_data(), 0, db->nbytes(), s));
    return;
  }
  RunConv<Pass::kBackwardFilter>(op, d, x.dtype(), g,
                                 Ptrs{x.raw_data(), dw->raw_data(), dy.raw_data()});
  if (db != nullptr) {
    DeviceGuard guard(d);
    CheckLaunch(op, k::ChannelSum(Dt(dy.dtype()), dy.raw_data(), g.n, g.o, g.ho * g.wo,
                                  Dt(db->dtype()), db->raw_data(), CurrentCudaStream(d)));
  }
}

}  // namespace

std::string LastChoiceOfPass(int pass) {
  DT_CHECK(pass >= 0 && pass < 3) << "conv pass " << pass;
  return LastChoice(static_cast<Pass>(pass));
}

}  // namespace cuda_kernels

DT_REGISTER_KERNEL(conv2d, DeviceType::kCUDA, Conv2dFn, cuda_kernels::Conv2d);
DT_REGISTER_KERNEL(conv2d_backward_data, DeviceType::kCUDA, Conv2dBackwardDataFn,
                   cuda_kernels::Conv2dBackwardData);
DT_REGISTER_KERNEL(conv2d_backward_weights, DeviceType::kCUDA, Conv2dBackwardWeightsFn,
                   cuda_kernels::Conv2dBackwardWeights);

}  // namespace ops

namespace cuda {
namespace dnn {

std::string LastConvChoiceForTesting(ConvPass pass) {
  return ::dtrain::ops::cuda_kernels::LastChoiceOfPass(static_cast<int>(pass));
}

}  // namespace dnn
}  // namespace cuda
}  // namespace dtrain
