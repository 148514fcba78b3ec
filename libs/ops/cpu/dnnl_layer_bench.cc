// Per-layer timings of the oneDNN CPU kernels at the shapes of the chapter's
// models (tests/reference/models.py), as the executor calls them (outputs
// preallocated). A benchmark, not a test: it prints timings, best of a few
// runs on a shared machine; results from this machine are in the header
// comment of dnnl_kernels.cc. lenet and resnet18 end with one key=value
// line ("dnnl_layer_bench model=... layers_ms_per_step=...").
//
//   bazel run //libs/ops:dnnl_layer_bench -- lenet      # LeNet, batch 256, 2 threads
//   bazel run //libs/ops:dnnl_layer_bench -- resnet18   # ResNet-18, batch 32, 2 threads
//   bazel run //libs/ops:dnnl_layer_bench -- layouts    # conv layouts compared
//                                                       # (DTRAIN_BENCH_THREADS, default 2)
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "libs/base/logging.h"
#include "libs/ops/cpu/dnnl_kernels.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"
#include "libs/ops/testing/dnnl_cases.h"
#include "libs/ops/testing/gradcheck.h"

namespace dtrain {
namespace ops {
namespace {

using cpu::ConvLayout;
using testing::BatchNormInput;
using testing::ConvCase;
using testing::LayoutGuard;
using testing::LayoutName;
using testing::RandomTensor;

// Best-of-`iters` wall time in milliseconds after two warm-up calls (the
// machine is shared, so the minimum is the most repeatable statistic).
double BestMs(const std::function<void()>& f, int iters) {
  f();  // build / warm up
  f();
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The kernels themselves, writing into preallocated outputs (as the executor
// calls them), so that timings exclude the convenience functions' allocation.
template <typename Fn>
Fn* CpuKernel(const char* op) {
  void* fn = KernelRegistry::Global().Find(op, DeviceType::kCPU);
  DT_CHECK(fn != nullptr) << "no CPU kernel " << op;
  return reinterpret_cast<Fn*>(fn);
}

void ConvForwardInto(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dParams& p,
                     bool relu, Tensor* y) {
  static Conv2dFn* fn = CpuKernel<Conv2dFn>("conv2d");
  fn(x, w, b, p, relu, y);
}

void ConvBackwardDataInto(const Tensor& dy, const Tensor& w, const Conv2dParams& p, Tensor* dx) {
  static Conv2dBackwardDataFn* fn = CpuKernel<Conv2dBackwardDataFn>("conv2d_backward_data");
  fn(dy, w, p, dx);
}

struct ConvTiming {
  double fwd, bwd_data, bwd_weights;
};

ConvTiming TimeConv(const ConvCase& cc, bool relu, int iters) {
  Tensor x = RandomTensor({cc.n, cc.c, cc.h, cc.w}, 1);
  Tensor w = RandomTensor({cc.o, cc.c, cc.k, cc.k}, 2, -0.1f, 0.1f);
  Tensor b = RandomTensor({cc.o}, 3);
  Conv2dParams p{cc.stride, cc.pad};
  Tensor y = Conv2d(x, w, &b, p, relu);
  Tensor dy = RandomTensor(y.shape(), 4);
  Tensor dx = Tensor::Empty(x.shape()), dw = Tensor::Empty(w.shape()), db = Tensor::Empty({cc.o});
  ConvTiming t;
  t.fwd = BestMs([&] { ConvForwardInto(x, w, &b, p, relu, &y); }, iters);
  t.bwd_data = BestMs([&] { ConvBackwardDataInto(dy, w, p, &dx); }, iters);
  t.bwd_weights = BestMs([&] { Conv2dBackwardWeights(x, dy, p, &dw, &db); }, iters);
  return t;
}

// Prints per-op timings of LeNet's layers (tests/reference/models.py) at
// batch 256 with 2 threads. Results from this machine are in the header
// comment of dnnl_kernels.cc.
void LeNetBatch256TwoThreads() {
  SetCpuThreads(2);
  const int iters = 5;
  const int64_t n = 256;
  double total = 0;
  ConvTiming c1 = TimeConv({n, 1, 28, 28, 20, 3, 1, 0}, true, iters);
  ConvTiming c2 = TimeConv({n, 20, 13, 13, 50, 5, 1, 0}, true, iters);
  std::printf("LeNet, batch 256, 2 threads (best of 5, ms)\n");
  std::printf("  conv1 1->20 3x3 28x28 +relu   fwd %7.3f  bwd_data %7.3f  bwd_weights %7.3f\n",
              c1.fwd, c1.bwd_data, c1.bwd_weights);
  std::printf("  conv2 20->50 5x5 13x13 +relu  fwd %7.3f  bwd_data %7.3f  bwd_weights %7.3f\n",
              c2.fwd, c2.bwd_data, c2.bwd_weights);
  total += c1.fwd + c1.bwd_weights + c2.fwd + c2.bwd_data + c2.bwd_weights;  // no dx for conv1
  struct PoolShape {
    const char* name;
    Shape shape;
  };
  for (const PoolShape& ps :
       {PoolShape{"pool1 20x26x26", {n, 20, 26, 26}}, PoolShape{"pool2 50x9x9", {n, 50, 9, 9}}}) {
    Tensor x = RandomTensor(ps.shape, 5);
    Tensor y = AvgPool2d(x, Pool2dParams{});
    Tensor dy = RandomTensor(y.shape(), 6);
    Tensor dx = Tensor::Empty(x.shape());
    const double f =
        BestMs([&] { CpuKernel<AvgPool2dFn>("avg_pool2d")(x, Pool2dParams{}, &y); }, iters);
    const double bw = BestMs(
        [&] { CpuKernel<AvgPool2dBackwardFn>("avg_pool2d_backward")(dy, Pool2dParams{}, &dx); },
        iters);
    std::printf("  avg_pool2d %-18s fwd %7.3f  bwd %7.3f\n", ps.name, f, bw);
    total += f + bw;
  }
  for (const std::array<int64_t, 2>& km : {std::array<int64_t, 2>{800, 128}, {128, 10}}) {
    Tensor x = RandomTensor({n, km[0]}, 7);
    Tensor w = RandomTensor({km[1], km[0]}, 8);
    Tensor b = RandomTensor({km[1]}, 9);
    Tensor dy = RandomTensor({n, km[1]}, 10);
    Tensor dx = Tensor::Empty(x.shape()), dw = Tensor::Empty(w.shape()),
           db = Tensor::Empty({km[1]});
    Tensor y = Tensor::Empty({n, km[1]});
    const double f =
        BestMs([&] { CpuKernel<LinearFn>("linear")(x, w, &b, km[1] != 10, &y); }, iters);
    const double bw = BestMs([&] { LinearBackward(x, w, dy, &dx, &dw, &db); }, iters);
    std::printf("  linear %4ld->%-4ld             fwd %7.3f  bwd %7.3f\n", static_cast<long>(km[0]),
                static_cast<long>(km[1]), f, bw);
    total += f + bw;
  }
  std::printf("  sum over the layers above: %.3f ms per step\n", total);
  std::printf("dnnl_layer_bench model=lenet batch=256 threads=2 layers_ms_per_step=%.3f\n", total);
}

// Per-op timings of ResNet-18 (tests/reference/models.py, 1x28x28 input) at
// batch 32 with 2 threads, weighted by how often each shape occurs in one
// training step (the stem's input gradient is not needed).
void ResNet18Batch32TwoThreads() {
  SetCpuThreads(2);
  const int iters = 10;
  const int64_t n = 32;
  struct Layer {
    const char* name;
    ConvCase cc;
    int count;
    bool needs_dx;
  };
  const std::vector<Layer> layers = {
      {"stem 1->64 28x28", {n, 1, 28, 28, 64, 3, 1, 1}, 1, false},
      {"64->64 28x28", {n, 64, 28, 28, 64, 3, 1, 1}, 4, true},
      {"64->128 s2 28x28", {n, 64, 28, 28, 128, 3, 2, 1}, 1, true},
      {"1x1 64->128 s2", {n, 64, 28, 28, 128, 1, 2, 0}, 1, true},
      {"128->128 14x14", {n, 128, 14, 14, 128, 3, 1, 1}, 3, true},
      {"128->256 s2 14x14", {n, 128, 14, 14, 256, 3, 2, 1}, 1, true},
      {"1x1 128->256 s2", {n, 128, 14, 14, 256, 1, 2, 0}, 1, true},
      {"256->256 7x7", {n, 256, 7, 7, 256, 3, 1, 1}, 3, true},
      {"256->512 s2 7x7", {n, 256, 7, 7, 512, 3, 2, 1}, 1, true},
      {"1x1 256->512 s2", {n, 256, 7, 7, 512, 1, 2, 0}, 1, true},
      {"512->512 4x4", {n, 512, 4, 4, 512, 3, 1, 1}, 3, true},
  };
  std::printf("ResNet-18, batch 32, 2 threads (best of %d, ms)\n", iters);
  double total = 0;
  for (const Layer& l : layers) {
    ConvTiming t = TimeConv(l.cc, false, iters);
    std::printf("  conv %-18s x%d fwd %7.3f  bwd_data %7.3f  bwd_weights %7.3f\n", l.name, l.count,
                t.fwd, t.bwd_data, t.bwd_weights);
    total += l.count * (t.fwd + (l.needs_dx ? t.bwd_data : 0) + t.bwd_weights);
  }
  struct BnShape {
    Shape shape;
    int count;
  };
  for (const BnShape& bs : {BnShape{{n, 64, 28, 28}, 5}, BnShape{{n, 128, 14, 14}, 4},
                            BnShape{{n, 256, 7, 7}, 4}, BnShape{{n, 512, 4, 4}, 4}}) {
    const int64_t c = bs.shape[1];
    Tensor x = BatchNormInput(bs.shape, 1);
    Tensor dy = RandomTensor(bs.shape, 2);
    Tensor gamma = Tensor::Full({c}, 1.0f), beta = Tensor::Zeros({c});
    Tensor rm = Tensor::Zeros({c}), rv = Tensor::Full({c}, 1.0f);
    Tensor y = Tensor::Empty(bs.shape), dx = Tensor::Empty(bs.shape);
    Tensor sm = Tensor::Empty({c}), si = Tensor::Empty({c}), dg = Tensor::Empty({c}),
           db = Tensor::Empty({c});
    const double f = BestMs(
        [&] {
          CpuKernel<BatchNormTrainFn>("batch_norm_train")(x, gamma, beta, 0.1f, 1e-5f, &rm, &rv, &y,
                                                          &sm, &si);
        },
        iters);
    const double bw = BestMs(
        [&] {
          CpuKernel<BatchNormBackwardFn>("batch_norm_backward")(x, dy, gamma, sm, si, &dx, &dg,
                                                                &db);
        },
        iters);
    std::printf("  batch_norm %-16s x%d train %7.3f  bwd %7.3f\n", ShapeToString(bs.shape).c_str(),
                bs.count, f, bw);
    total += bs.count * (f + bw);
  }
  std::printf("  conv + batch norm per training step: %.1f ms (%.0f samples/s from these alone)\n",
              total, n * 1000.0 / total);
  std::printf(
      "dnnl_layer_bench model=resnet18 batch=32 threads=2 conv_bn_ms_per_step=%.3f "
      "samples_per_second=%.0f\n",
      total, n * 1000.0 / total);
}

// Compares convolution layouts at LeNet and ResNet-18 (28x28 input) shapes.
// The layouts take turns within each round, so that load from other
// processes on a shared machine hits all of them alike. Prints the best wall
// time and the best process CPU time of the rounds as "wall/cpu" ms; on a
// busy machine, run with OMP_WAIT_POLICY=passive and compare CPU times (cpu
// / threads approximates the wall time of a quiet machine). Threads:
// DTRAIN_BENCH_THREADS (default 2).
double ProcessCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

void ConvLayouts() {
  const char* env = std::getenv("DTRAIN_BENCH_THREADS");
  SetCpuThreads(env != nullptr ? std::atoi(env) : 2);
  const int rounds = 20;
  const int64_t rn = 32;  // ResNet batch
  struct Named {
    const char* name;
    ConvCase cc;
  };
  const std::vector<Named> cases = {
      {"lenet conv1 b256", {256, 1, 28, 28, 20, 3, 1, 0}},
      {"lenet conv2 b256", {256, 20, 13, 13, 50, 5, 1, 0}},
      {"resnet stem b32", {rn, 1, 28, 28, 64, 3, 1, 1}},
      {"resnet 64 28x28 b32", {rn, 64, 28, 28, 64, 3, 1, 1}},
      {"resnet 64->128 s2 b32", {rn, 64, 28, 28, 128, 3, 2, 1}},
      {"resnet 1x1 64->128 s2", {rn, 64, 28, 28, 128, 1, 2, 0}},
      {"resnet 128 14x14 b32", {rn, 128, 14, 14, 128, 3, 1, 1}},
      {"resnet 128->256 s2 b32", {rn, 128, 14, 14, 256, 3, 2, 1}},
      {"resnet 256 7x7 b32", {rn, 256, 7, 7, 256, 3, 1, 1}},
      {"resnet 256->512 s2 b32", {rn, 256, 7, 7, 512, 3, 2, 1}},
      {"resnet 512 4x4 b32", {rn, 512, 4, 4, 512, 3, 1, 1}},
  };
  const ConvLayout layouts[] = {ConvLayout::kPlain, ConvLayout::kBlocked, ConvLayout::kChannelsLast,
                                ConvLayout::kAuto};
  constexpr int kLayouts = 4;
  for (const Named& nc : cases) {
    const ConvCase& cc = nc.cc;
    Tensor x = RandomTensor({cc.n, cc.c, cc.h, cc.w}, 1);
    Tensor w = RandomTensor({cc.o, cc.c, cc.k, cc.k}, 2, -0.1f, 0.1f);
    Tensor b = RandomTensor({cc.o}, 3);
    Conv2dParams p{cc.stride, cc.pad};
    Tensor y = Conv2d(x, w, &b, p);
    Tensor dy = RandomTensor(y.shape(), 4);
    Tensor dx = Tensor::Empty(x.shape()), dw = Tensor::Empty(w.shape()), db = Tensor::Empty({cc.o});
    const std::function<void()> passes[3] = {[&] { ConvForwardInto(x, w, &b, p, false, &y); },
                                             [&] { ConvBackwardDataInto(dy, w, p, &dx); },
                                             [&] { Conv2dBackwardWeights(x, dy, p, &dw, &db); }};
    double best[kLayouts][3], best_cpu[kLayouts][3];
    for (int l = 0; l < kLayouts; ++l) {
      LayoutGuard g(layouts[l]);
      for (int ps = 0; ps < 3; ++ps) {
        passes[ps]();
        passes[ps]();
        best[l][ps] = best_cpu[l][ps] = 1e30;
      }
    }
    for (int r = 0; r < rounds; ++r) {
      for (int l = 0; l < kLayouts; ++l) {
        LayoutGuard g(layouts[l]);
        for (int ps = 0; ps < 3; ++ps) {
          const double c0 = ProcessCpuMs();
          auto t0 = std::chrono::steady_clock::now();
          passes[ps]();
          const double wall =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
          best[l][ps] = std::min(best[l][ps], wall);
          best_cpu[l][ps] = std::min(best_cpu[l][ps], ProcessCpuMs() - c0);
        }
      }
    }
    for (int l = 0; l < kLayouts; ++l) {
      std::printf(
          "%-24s %-7s fwd %6.2f/%6.2f  bwd_data %6.2f/%6.2f  bwd_weights %6.2f/%6.2f  "
          "total %6.2f/%6.2f\n",
          nc.name, LayoutName(layouts[l]), best[l][0], best_cpu[l][0], best[l][1], best_cpu[l][1],
          best[l][2], best_cpu[l][2], best[l][0] + best[l][1] + best[l][2],
          best_cpu[l][0] + best_cpu[l][1] + best_cpu[l][2]);
    }
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace ops
}  // namespace dtrain

int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "lenet";
  if (std::strcmp(which, "lenet") == 0) {
    dtrain::ops::LeNetBatch256TwoThreads();
  } else if (std::strcmp(which, "resnet18") == 0) {
    dtrain::ops::ResNet18Batch32TwoThreads();
  } else if (std::strcmp(which, "layouts") == 0) {
    dtrain::ops::ConvLayouts();
  } else {
    std::fprintf(stderr, "dnnl_layer_bench: unknown benchmark '%s' (lenet, resnet18 or layouts)\n",
                 which);
    return 2;
  }
  return 0;
}
