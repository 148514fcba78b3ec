// The per-op harness of issue 34: every op the LeNet and ResNet-18 training
// steps use, forward and backward, on cuda:0 against the CPU kernels
// (libs/ops/cpu), in f32 with TF32 off, at the layer shapes of both models
// (LeNet at the data-parallel tests' batch 32, ResNet-18 at the mixed-precision
// test's batch 8). Then whole training steps of both models, GPU against CPU,
// gradient by gradient and step by step. Skips without a GPU, naming why.
//
// What "beyond f32 rounding" means here. Every output element is a sum of
// K terms (K, the reduction length, is printed; 1 for elementwise ops). Two
// correct implementations that add in different orders differ by at most
// about 2 K u times the sum of the terms' magnitudes (u = 2^-24), whatever
// the order. So each output element's difference is divided by `mag`, the
// same op run on the CPU on |inputs| (conv(|x|, |w|) for a convolution,
// sum |dy| for a bias gradient ...; per op below), plus 1e-3 of mag's mean
// (so that elements whose terms all vanish do not divide by zero), and
//   max_rel_diff = max over elements |gpu - cpu| / (mag + 1e-3 mean(mag))
// is compared with tol = 2 K u. A wrong kernel (a wrong index, a missing
// term, a biased variance) differs by O(1) in these units; TF32 (10
// mantissa bits) by about 1e-3; reduction order by well under tol.
//
// Output, one line per check (grep '^op='):
//   op=conv2d_backward_weights model=resnet18 layer=block2.0.conv1(s2) K=...
//     max_rel_diff=... tol=... ratio=... status=ok|BEYOND worst=... gpu=... cpu=... algo=...
// (one line each; algo: the cuDNN algorithm and math mode that ran)
// then per model the step checks (grep '^grad=' and '^trajectory'):
//   grad=<parameter> model=... rel_l2=... tol=... status=...   (step 0's gradients)
//   trajectory model=... step=... gpu_vs_cpu=... cpu_threads_control=...
//     conv_layout_control=... (see CheckSteps)
// and at the end one summary line:
//   op_harness checks=N beyond_tolerance=M first_op_beyond_tolerance=<op@model/layer|none>
// The test fails when any op is beyond tolerance or a step-0 gradient differs
// by more than 1e-3 (relative L2).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/autograd/variable.h"
#include "libs/cuda/config.h"
#include "libs/cuda/dnn/batch_norm.h"
#include "libs/cuda/dnn/conv.h"
#include "libs/cuda/gpu_test_util.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/ops/cpu/dnnl_kernels.h"
#include "libs/ops/ops.h"
#include "libs/ops/testing/gradcheck.h"

namespace dtrain {
namespace cuda {
namespace {

using ops::testing::RandomTensor;

// The device under test: cuda:0, or cpu:1 when DTRAIN_OP_HARNESS_DEVICE=cpu
// (a dry run of the harness itself on a machine without a GPU: the same CPU
// kernels on both sides, so every difference must be 0).
Device DeviceUnderTest() {
  const char* d = std::getenv("DTRAIN_OP_HARNESS_DEVICE");
  return d != nullptr && std::string(d) == "cpu" ? Device::Cpu(1) : Device::Cuda(0);
}
const Device kGpu = DeviceUnderTest();
constexpr double kU = 5.9604644775390625e-08;  // 2^-24, f32's unit roundoff
constexpr double kStepGradTol = 1e-3;

Tensor Gpu(const Tensor& t) { return *t.To(kGpu); }
Tensor Host(const Tensor& t) { return *t.To(Device::Cpu()); }

Tensor Abs(const Tensor& t) {
  std::vector<float> v = t.ToVector<float>();
  for (float& f : v) f = std::fabs(f);
  return Tensor::FromVector(v, t.shape());
}

// ---- the report ----

struct Summary {
  int checks = 0;
  int beyond = 0;
  std::string first;
  bool ran = false;
};

Summary& Totals() {
  static Summary* s = new Summary();
  return *s;
}

// Compares one op's GPU output with the CPU's (see the file comment) and
// prints its line. Returns whether it is within tolerance.
bool Check(const std::string& op, const std::string& model, const std::string& layer, int64_t k,
           const Tensor& gpu, const Tensor& cpu, const Tensor& mag, const std::string& algo = "") {
  Summary& sum = Totals();
  sum.ran = true;
  ++sum.checks;
  std::vector<float> g = Host(gpu).ToVector<float>();
  std::vector<float> c = cpu.ToVector<float>();
  std::vector<float> m = mag.ToVector<float>();
  EXPECT_EQ(g.size(), c.size()) << op << " " << layer;
  EXPECT_EQ(m.size(), c.size()) << op << " " << layer;
  double mean = 0;
  for (float v : m) mean += v;
  mean = m.empty() ? 0 : mean / static_cast<double>(m.size());
  const double floor = 1e-3 * mean + 1e-30;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < std::min({g.size(), c.size(), m.size()}); ++i) {
    double d = std::fabs(static_cast<double>(g[i]) - c[i]);
    if (!std::isfinite(g[i]) && std::isfinite(c[i])) d = INFINITY;
    const double r = d / (m[i] + floor);
    if (r > worst || (std::isnan(r) && !std::isnan(worst))) {
      worst = std::isnan(r) ? INFINITY : r;
      at = i;
    }
  }
  if (g.size() != c.size() || m.size() != c.size()) worst = INFINITY;
  const double tol = 2.0 * static_cast<double>(std::max<int64_t>(k, 1)) * kU;
  const bool ok = worst <= tol;
  std::printf(
      "op=%s model=%s layer=%s K=%lld max_rel_diff=%.3g tol=%.3g ratio=%.3g status=%s worst=%zu "
      "gpu=%.9g cpu=%.9g%s%s\n",
      op.c_str(), model.c_str(), layer.c_str(), static_cast<long long>(k), worst, tol, worst / tol,
      ok ? "ok" : "BEYOND", at, at < g.size() ? g[at] : NAN, at < c.size() ? c[at] : NAN,
      algo.empty() ? "" : " algo=", algo.c_str());
  std::fflush(stdout);
  if (!ok) {
    ++sum.beyond;
    if (sum.first.empty()) sum.first = absl::StrCat(op, "@", model, "/", layer);
  }
  EXPECT_TRUE(ok) << op << " " << model << "/" << layer << ": max_rel_diff " << worst << " > tol "
                  << tol;
  return ok;
}

// ---- ops ----

// conv2d (bias, fused relu as the model has it), conv2d_backward_data and
// conv2d_backward_weights (with the bias gradient), with the timed
// (benchmark) cuDNN algorithm choice the trainers use, with the heuristic
// one ("[heuristic]"), and timed among the algorithms that are exact to f32
// rounding ("[exact]": no FFT or Winograd, config.h ConvF32Exact).
void CheckConv(const std::string& model, const std::string& layer, const Shape& xs, int64_t o,
               int k, int stride, int pad, bool relu, uint64_t seed) {
  const int64_t n = xs[0], c = xs[1];
  Tensor x = RandomTensor(xs, seed, -1.0f, 1.0f);
  Tensor w = RandomTensor({o, c, k, k}, seed + 1, -1.0f, 1.0f);
  Tensor b = RandomTensor({o}, seed + 2, -1.0f, 1.0f);
  const ops::Conv2dParams p{stride, pad};
  Tensor gx = Gpu(x), gw = Gpu(w), gb = Gpu(b);
  Tensor ax = Abs(x), aw = Abs(w), ab = Abs(b);
  Tensor cy = ops::Conv2d(x, w, &b, p, relu);
  Tensor ymag = ops::Conv2d(ax, aw, &ab, p, false);
  const Shape ys = cy.shape();
  const int64_t ho = ys[2], wo = ys[3];
  Tensor dy = RandomTensor(ys, seed + 3, -1.0f, 1.0f);
  Tensor gdy = Gpu(dy), ady = Abs(dy);
  Tensor cdx = ops::Conv2dBackwardData(dy, w, xs, p);
  Tensor dxmag = ops::Conv2dBackwardData(ady, aw, xs, p);
  Tensor cdw = Tensor::Empty(w.shape()), cdb = Tensor::Empty({o});
  ops::Conv2dBackwardWeights(x, dy, p, &cdw, &cdb);
  Tensor dwmag = Tensor::Empty(w.shape()), dbmag = Tensor::Empty({o});
  ops::Conv2dBackwardWeights(ax, ady, p, &dwmag, &dbmag);
  struct Variant {
    const char* suffix;
    ConvAlgoSearch search;
    bool exact;
  };
  const bool exact_default = ConvF32Exact();
  for (const Variant& v : {Variant{"", ConvAlgoSearch::kBenchmark, exact_default},
                           Variant{"[heuristic]", ConvAlgoSearch::kHeuristic, exact_default},
                           Variant{"[exact]", ConvAlgoSearch::kBenchmark, true}}) {
    if (exact_default && std::string(v.suffix) == "[exact]") continue;  // the default already is
    SetConvAlgoSearch(v.search);
    SetConvF32Exact(v.exact);
    const std::string suffix = v.suffix;
    Tensor gy = ops::Conv2d(gx, gw, &gb, p, relu);
    Check("conv2d" + suffix, model, layer, c * k * k + 1, gy, cy, ymag,
          dnn::LastConvChoiceForTesting(dnn::ConvPass::kForward));
    Tensor gdx = ops::Conv2dBackwardData(gdy, gw, xs, p);
    Check("conv2d_backward_data" + suffix, model, layer, o * k * k, gdx, cdx, dxmag,
          dnn::LastConvChoiceForTesting(dnn::ConvPass::kBackwardData));
    Tensor gdw = Tensor::Empty(w.shape(), DType::kF32, kGpu);
    Tensor gdb = Tensor::Empty({o}, DType::kF32, kGpu);
    ops::Conv2dBackwardWeights(gx, gdy, p, &gdw, &gdb);
    Check("conv2d_backward_weights" + suffix, model, layer, n * ho * wo, gdw, cdw, dwmag,
          dnn::LastConvChoiceForTesting(dnn::ConvPass::kBackwardFilter));
    if (suffix.empty()) {
      Check("conv2d_backward_bias", model, layer, n * ho * wo, gdb, cdb, dbmag);
    }
  }
  SetConvF32Exact(exact_default);
  SetConvAlgoSearch(ConvAlgoSearch::kBenchmark);
  if (relu) {
    Tensor cdr = ops::ReluBackward(cy, dy);
    Check("relu_backward", model, layer, 1, ops::ReluBackward(Gpu(cy), gdy), cdr, ady);
  }
}

// batch_norm_train (y and the saved statistics), batch_norm_backward (dx,
// dgamma, dbeta) with cuDNN (what f32 uses) and with the own kernels.
void CheckBatchNorm(const std::string& model, const std::string& layer, const Shape& xs,
                    uint64_t seed) {
  const int64_t c = xs[1];
  const int64_t count = xs[0] * xs[2] * xs[3];
  const int64_t inner = xs[2] * xs[3];
  // Activations with a per-channel offset, as conv outputs have.
  std::vector<float> xv = RandomTensor(xs, seed, -1.0f, 1.0f).ToVector<float>();
  std::vector<float> off = RandomTensor({c}, seed + 1, -0.5f, 0.5f).ToVector<float>();
  for (size_t i = 0; i < xv.size(); ++i) xv[i] += off[(i / inner) % c];
  Tensor x = Tensor::FromVector(xv, xs);
  Tensor gamma = RandomTensor({c}, seed + 2, 0.5f, 1.5f);
  Tensor beta = RandomTensor({c}, seed + 3, -0.5f, 0.5f);
  Tensor dy = RandomTensor(xs, seed + 4, -1.0f, 1.0f);
  Tensor rm = Tensor::Zeros({c}), rv = Tensor::Full({c}, 1.0f);
  Tensor cmean, cinv;
  Tensor cy = ops::BatchNormTrain(x, gamma, beta, 0.1f, 1e-5f, &rm, &rv, &cmean, &cinv);
  Tensor cdx = Tensor::Empty(xs), cdg = Tensor::Empty({c}), cdb = Tensor::Empty({c});
  ops::BatchNormBackward(x, dy, gamma, cmean, cinv, &cdx, &cdg, &cdb);
  // Magnitudes (the file comment's rule, per term of each formula).
  std::vector<float> mean = cmean.ToVector<float>(), inv = cinv.ToVector<float>();
  std::vector<float> g = gamma.ToVector<float>(), bt = beta.ToVector<float>();
  std::vector<float> dv = dy.ToVector<float>();
  std::vector<double> rms(c, 0), mean_abs_dy(c, 0), mean_abs_dy_xhat(c, 0), sum_abs_dy(c, 0),
      sum_abs_dy_xhat(c, 0), mean_abs_x(c, 0);
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t ch = (i / inner) % c;
    const double xhat = (xv[i] - mean[ch]) * inv[ch];
    rms[ch] += static_cast<double>(xv[i]) * xv[i];
    mean_abs_x[ch] += std::fabs(xv[i]);
    sum_abs_dy[ch] += std::fabs(dv[i]);
    sum_abs_dy_xhat[ch] += std::fabs(dv[i] * xhat);
  }
  for (int64_t ch = 0; ch < c; ++ch) {
    rms[ch] = std::sqrt(rms[ch] / count);
    mean_abs_x[ch] /= count;
    mean_abs_dy[ch] = sum_abs_dy[ch] / count;
    mean_abs_dy_xhat[ch] = sum_abs_dy_xhat[ch] / count;
  }
  std::vector<float> ymag(xv.size()), dxmag(xv.size()), dgmag(c), dbmag(c), meanmag(c), invmag(c);
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t ch = (i / inner) % c;
    const double xhat = std::fabs((xv[i] - mean[ch]) * inv[ch]);
    const double scale = std::fabs(g[ch]) * inv[ch];
    ymag[i] = static_cast<float>(std::fabs(g[ch]) * xhat * (1 + rms[ch] * inv[ch]) +
                                 scale * (std::fabs(xv[i]) + rms[ch]) + std::fabs(bt[ch]));
    dxmag[i] = static_cast<float>(scale * (std::fabs(dv[i]) + mean_abs_dy[ch] +
                                           (xhat + rms[ch] * inv[ch]) * mean_abs_dy_xhat[ch]));
  }
  for (int64_t ch = 0; ch < c; ++ch) {
    dgmag[ch] = static_cast<float>(sum_abs_dy_xhat[ch] + sum_abs_dy[ch] * rms[ch] * inv[ch]);
    dbmag[ch] = static_cast<float>(sum_abs_dy[ch]);
    meanmag[ch] = static_cast<float>(mean_abs_x[ch]);
    invmag[ch] = static_cast<float>(inv[ch] * (1 + rms[ch] * rms[ch] * inv[ch] * inv[ch]));
  }
  const Tensor ym = Tensor::FromVector(ymag, xs), dxm = Tensor::FromVector(dxmag, xs);
  const Tensor dgm = Tensor::FromVector(dgmag, {c}), dbm = Tensor::FromVector(dbmag, {c});
  const Tensor mm = Tensor::FromVector(meanmag, {c}), im = Tensor::FromVector(invmag, {c});
  for (dnn::BatchNormImpl impl : {dnn::BatchNormImpl::kCudnn, dnn::BatchNormImpl::kOwn}) {
    dnn::SetBatchNormImplForTesting(impl);
    const std::string suffix = impl == dnn::BatchNormImpl::kCudnn ? "[cudnn]" : "[own]";
    Tensor grm = Gpu(Tensor::Zeros({c})), grv = Gpu(Tensor::Full({c}, 1.0f));
    Tensor gmean, ginv;
    Tensor gx = Gpu(x), gg = Gpu(gamma);
    Tensor gy = ops::BatchNormTrain(gx, gg, Gpu(beta), 0.1f, 1e-5f, &grm, &grv, &gmean, &ginv);
    Check("batch_norm_train" + suffix, model, layer, count, gy, cy, ym);
    Check("batch_norm_saved_mean" + suffix, model, layer, count, gmean, cmean, mm);
    Check("batch_norm_saved_inv_std" + suffix, model, layer, count, ginv, cinv, im);
    Check("batch_norm_running_var" + suffix, model, layer, count, grv, rv,
          Tensor::FromVector(std::vector<float>(c, 1.0f), {c}));
    // The backward pass from the CPU's saved statistics, so that it is
    // compared alone.
    Tensor gdx = Tensor::Empty(xs, DType::kF32, kGpu);
    Tensor gdg = Tensor::Empty({c}, DType::kF32, kGpu), gdb = Tensor::Empty({c}, DType::kF32, kGpu);
    ops::BatchNormBackward(gx, Gpu(dy), gg, Gpu(cmean), Gpu(cinv), &gdx, &gdg, &gdb);
    Check("batch_norm_backward_dx" + suffix, model, layer, count, gdx, cdx, dxm);
    Check("batch_norm_backward_dgamma" + suffix, model, layer, count, gdg, cdg, dgm);
    Check("batch_norm_backward_dbeta" + suffix, model, layer, count, gdb, cdb, dbm);
  }
  dnn::SetBatchNormImplForTesting(dnn::BatchNormImpl::kAuto);
}

void CheckAvgPool(const std::string& model, const std::string& layer, const Shape& xs, int k, int s,
                  int pad, uint64_t seed) {
  const ops::Pool2dParams p{k, s, pad};
  Tensor x = RandomTensor(xs, seed, -1.0f, 1.0f);
  Tensor cy = ops::AvgPool2d(x, p);
  Check("avg_pool2d", model, layer, k * k, ops::AvgPool2d(Gpu(x), p), cy,
        ops::AvgPool2d(Abs(x), p));
  Tensor dy = RandomTensor(cy.shape(), seed + 1, -1.0f, 1.0f);
  const int64_t windows = ((k + s - 1) / s) * ((k + s - 1) / s);
  Check("avg_pool2d_backward", model, layer, windows, ops::AvgPool2dBackward(Gpu(dy), xs, p),
        ops::AvgPool2dBackward(dy, xs, p), ops::AvgPool2dBackward(Abs(dy), xs, p));
}

void CheckMaxPool(const std::string& model, const std::string& layer, const Shape& xs, int k, int s,
                  int pad, uint64_t seed) {
  const ops::Pool2dParams p{k, s, pad};
  Tensor x = RandomTensor(xs, seed, -1.0f, 1.0f);
  Tensor ci, gi;
  Tensor cy = ops::MaxPool2d(x, p, &ci);
  Tensor gy = ops::MaxPool2d(Gpu(x), p, &gi);
  Check("max_pool2d", model, layer, 1, gy, cy, Abs(cy));
  std::vector<int32_t> a = ci.ToVector<int32_t>(), b = Host(gi).ToVector<int32_t>();
  int64_t differ = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) differ += a[i] != b[i];
  std::printf("op=max_pool2d_indices model=%s layer=%s differing=%lld of=%zu status=%s\n",
              model.c_str(), layer.c_str(), static_cast<long long>(differ), a.size(),
              differ == 0 && a.size() == b.size() ? "ok" : "BEYOND");
  EXPECT_EQ(differ, 0) << layer;
  Tensor dy = RandomTensor(cy.shape(), seed + 1, -1.0f, 1.0f);
  const int64_t windows = ((k + s - 1) / s) * ((k + s - 1) / s);
  Check("max_pool2d_backward", model, layer, windows, ops::MaxPool2dBackward(Gpu(dy), gi, xs, p),
        ops::MaxPool2dBackward(dy, ci, xs, p), ops::MaxPool2dBackward(Abs(dy), ci, xs, p));
}

void CheckGlobalAvgPool(const std::string& model, const Shape& xs, uint64_t seed) {
  Tensor x = RandomTensor(xs, seed, -1.0f, 1.0f);
  Check("global_avg_pool", model, "global_avg_pool", xs[2] * xs[3], ops::GlobalAvgPool(Gpu(x)),
        ops::GlobalAvgPool(x), ops::GlobalAvgPool(Abs(x)));
  Tensor dy = RandomTensor({xs[0], xs[1], 1, 1}, seed + 1, -1.0f, 1.0f);
  Check("global_avg_pool_backward", model, "global_avg_pool", 1,
        ops::GlobalAvgPoolBackward(Gpu(dy), xs), ops::GlobalAvgPoolBackward(dy, xs),
        ops::GlobalAvgPoolBackward(Abs(dy), xs));
}

// linear (bias, fused relu as the model has it) and linear_backward.
void CheckLinear(const std::string& model, const std::string& layer, int64_t n, int64_t in,
                 int64_t out, bool relu, uint64_t seed) {
  Tensor x = RandomTensor({n, in}, seed, -1.0f, 1.0f);
  Tensor w = RandomTensor({out, in}, seed + 1, -1.0f, 1.0f);
  Tensor b = RandomTensor({out}, seed + 2, -1.0f, 1.0f);
  Tensor gx = Gpu(x), gw = Gpu(w), gb = Gpu(b);
  Tensor ax = Abs(x), aw = Abs(w), ab = Abs(b);
  Tensor cy = ops::Linear(x, w, &b, relu);
  Check("linear", model, layer, in + 1, ops::Linear(gx, gw, &gb, relu), cy,
        ops::Linear(ax, aw, &ab, false));
  Tensor dy = RandomTensor({n, out}, seed + 3, -1.0f, 1.0f);
  Tensor ady = Abs(dy);
  Tensor cdx = Tensor::Empty({n, in}), cdw = Tensor::Empty({out, in}), cdb = Tensor::Empty({out});
  ops::LinearBackward(x, w, dy, &cdx, &cdw, &cdb);
  Tensor mdx = Tensor::Empty({n, in}), mdw = Tensor::Empty({out, in}), mdb = Tensor::Empty({out});
  ops::LinearBackward(ax, aw, ady, &mdx, &mdw, &mdb);
  Tensor gdx = Tensor::Empty({n, in}, DType::kF32, kGpu);
  Tensor gdw = Tensor::Empty({out, in}, DType::kF32, kGpu);
  Tensor gdb = Tensor::Empty({out}, DType::kF32, kGpu);
  ops::LinearBackward(gx, gw, Gpu(dy), &gdx, &gdw, &gdb);
  Check("linear_backward_dx", model, layer, out, gdx, cdx, mdx);
  Check("linear_backward_dw", model, layer, n, gdw, cdw, mdw);
  Check("linear_backward_db", model, layer, n, gdb, cdb, mdb);
  if (relu) {
    Check("relu_backward", model, layer, 1, ops::ReluBackward(Gpu(cy), Gpu(dy)),
          ops::ReluBackward(cy, dy), ady);
  }
}

void CheckSoftmaxCrossEntropy(const std::string& model, int64_t n, int64_t classes, uint64_t seed) {
  Tensor logits = RandomTensor({n, classes}, seed, -3.0f, 3.0f);
  std::vector<int32_t> l(n);
  for (int64_t i = 0; i < n; ++i) l[i] = static_cast<int32_t>((i * 7 + 3) % classes);
  Tensor labels = Tensor::FromVector(l, {n});
  Tensor cd, gd;
  Tensor closs = ops::SoftmaxCrossEntropy(logits, labels, &cd);
  Tensor gloss = ops::SoftmaxCrossEntropy(Gpu(logits), Gpu(labels), &gd);
  // The loss: each row's max, log-sum-exp and label logit, averaged.
  std::vector<float> lv = logits.ToVector<float>();
  double mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    double mx = 0;
    for (int64_t j = 0; j < classes; ++j)
      mx = std::max(mx, static_cast<double>(std::fabs(lv[i * classes + j])));
    mag += 2 * mx + std::log(static_cast<double>(classes)) + std::fabs(lv[i * classes + l[i]]);
  }
  Check("softmax_cross_entropy_loss", model, "loss", classes + n, gloss.Reshape({1}),
        closs.Reshape({1}),
        Tensor::FromVector(std::vector<float>{static_cast<float>(mag / n)}, {1}));
  // dlogits = (softmax - onehot) / N: terms of size softmax / N and 1 / N.
  std::vector<float> dm(lv.size(), 1.0f / static_cast<float>(n));
  Check("softmax_cross_entropy_dlogits", model, "loss", classes, gd, cd,
        Tensor::FromVector(dm, {n, classes}));
}

void CheckAddRelu(const std::string& model, const std::string& layer, const Shape& s,
                  uint64_t seed) {
  Tensor a = RandomTensor(s, seed, -1.0f, 1.0f), b = RandomTensor(s, seed + 1, -1.0f, 1.0f);
  Tensor mag = ops::Add(Abs(a), Abs(b));
  Check("add", model, layer, 2, ops::Add(Gpu(a), Gpu(b)), ops::Add(a, b), mag);
  Check("relu", model, layer, 1, ops::Relu(Gpu(a)), ops::Relu(a), Abs(a));
  Tensor dy = RandomTensor(s, seed + 2, -1.0f, 1.0f);
  Tensor y = ops::Relu(a);
  Check("relu_backward", model, layer, 1, ops::ReluBackward(Gpu(y), Gpu(dy)),
        ops::ReluBackward(y, dy), Abs(dy));
  // Gradient accumulation (autograd's Axpy).
  Tensor acc = a.Clone(), gacc = Gpu(a);
  ops::Axpy(1.0f, b, &acc);
  ops::Axpy(1.0f, Gpu(b), &gacc);
  Check("axpy", model, layer, 2, gacc, acc, mag);
}

void CheckSgd(const std::string& model, const std::string& name, const Shape& s, float lr,
              float momentum, uint64_t seed) {
  const ops::SgdParams p{lr, momentum, 0.0f, false};
  Tensor w = RandomTensor(s, seed, -1.0f, 1.0f), g = RandomTensor(s, seed + 1, -1.0f, 1.0f);
  Tensor buf = RandomTensor(s, seed + 2, -1.0f, 1.0f);
  Tensor gw = Gpu(w), gbuf = Gpu(buf);
  // |w| + lr (|g| + momentum |buf|): the terms of the update.
  std::vector<float> wv = w.ToVector<float>(), gv = g.ToVector<float>(), bv = buf.ToVector<float>();
  std::vector<float> mag(wv.size());
  for (size_t i = 0; i < wv.size(); ++i) {
    mag[i] = std::fabs(wv[i]) + lr * (std::fabs(gv[i]) + momentum * std::fabs(bv[i]));
  }
  ops::SgdUpdate(&w, g, momentum != 0 ? &buf : nullptr, p);
  ops::SgdUpdate(&gw, Gpu(g), momentum != 0 ? &gbuf : nullptr, p);
  Check(momentum != 0 ? "sgd_update_momentum" : "sgd_update", model, name, 3, gw, w,
        Tensor::FromVector(mag, s));
}

// ---- whole training steps ----

struct StepSetup {
  std::string model;
  nn::Init init;
  int64_t batch;
  int steps;
  ops::SgdParams sgd;
  bool fixed_batch = false;  // amp_graph_test's one batch, every step
};

void Batch(int64_t n, int step, Tensor* x, Tensor* y) {
  *x = Tensor::Empty({n, 1, 28, 28});
  ops::RandomUniform(x, 0.0f, 1.0f, 1234, static_cast<uint64_t>(step) << 32);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 7 + step * 3) % 10);
  *y = Tensor::FromVector(labels, {n});
}

struct Run {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<nn::Sgd> opt;
  Device device;
  int threads = 0;          // CPU threads (0: the default)
  bool plain_conv = false;  // oneDNN's plain-layout (gemm) convolutions
};

// Runs f with r's CPU settings.
template <typename F>
void WithSettings(const Run& r, F f) {
  const int before = ops::CpuThreads();
  if (r.threads > 0) ops::SetCpuThreads(r.threads);
  if (r.plain_conv) ops::cpu::SetConvLayoutForTesting(ops::cpu::ConvLayout::kPlain);
  f();
  ops::cpu::SetConvLayoutForTesting(ops::cpu::ConvLayout::kAuto);
  ops::SetCpuThreads(before);
}

Run MakeRun(const StepSetup& s, const Device& device, int threads, bool plain_conv = false) {
  Run r;
  r.model = *nn::MakeModel(s.model);
  nn::InitParameters(r.model.get(), s.init, 5);
  if (device != Device::Cpu()) {
    EXPECT_TRUE(r.model->To(device).ok());
  }
  r.opt = std::make_unique<nn::Sgd>(r.model->NamedParameters(), s.sgd);
  r.device = device;
  r.threads = threads;
  r.plain_conv = plain_conv;
  return r;
}

// Forward and backward of one batch (gradients left in the parameters).
void ForwardBackward(Run* r, const Tensor& x, const Tensor& y) {
  WithSettings(*r, [&] {
    Tensor dx = *x.To(r->device), dy = *y.To(r->device);
    autograd::Variable loss =
        autograd::SoftmaxCrossEntropy(r->model->Forward(autograd::Variable(dx)), dy);
    r->opt->ZeroGrad();
    loss.Backward();
  });
}

std::vector<std::vector<float>> Values(nn::Module* m, bool grads) {
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : m->NamedParameters()) {
    out.push_back(Host(grads ? p.grad() : p.value()).ToVector<float>());
  }
  return out;
}

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

// Elements of `a` off `b` by more than atol + rtol |b| (amp_graph_test's
// criterion, rtol 5e-3 and atol 5e-4), over the parameters not in `skip`.
// `where` (when not null) gets "name:count" of each parameter with some.
int64_t ElementsOff(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b, const std::vector<bool>& skip,
                    const std::vector<std::string>& names, std::string* where) {
  int64_t off = 0;
  for (size_t p = 0; p < std::min(a.size(), b.size()); ++p) {
    if (skip[p]) continue;
    int64_t here = 0;
    for (size_t i = 0; i < std::min(a[p].size(), b[p].size()); ++i) {
      here += !(std::fabs(a[p][i] - b[p][i]) <= 5e-4 + 5e-3 * std::fabs(b[p][i]));
    }
    if (here > 0 && where != nullptr) {
      absl::StrAppend(where, where->empty() ? "" : ",", names[p], ":", here);
    }
    off += here;
  }
  return off;
}

// Step 0's gradients, parameter by parameter (deepest first, as backward
// computes them), then the parameters after each step: the GPU against the
// CPU, next to two controls, the CPU against itself with the same kernels
// summing in other orders: one thread against all (cpu_threads_control),
// and oneDNN's plain-layout (gemm) convolutions against its per-shape
// layout choice (conv_layout_control; another convolution implementation,
// as cuDNN is). They say how much the setting amplifies rounding. A
// gradient that a control alone moves by more than 10% is rounding noise (a conv bias before batch
// norm, whose exact gradient is 0): it is reported as such and left out of the trajectory's maxima.
void CheckSteps(const StepSetup& s) {
  Run cpu = MakeRun(s, Device::Cpu(), 0);
  Run cpu1 = MakeRun(s, Device::Cpu(), 1);
  Run gpu = MakeRun(s, kGpu, 0);
  Run plain = MakeRun(s, Device::Cpu(), 0, true);
  std::vector<std::string> names;
  for (auto& [name, p] : cpu.model->NamedParameters()) names.push_back(name);
  std::vector<bool> noise(names.size(), false);
  for (int step = 0; step < s.steps; ++step) {
    Tensor x, y;
    if (s.fixed_batch) {
      x = RandomTensor({s.batch, 1, 28, 28}, 7, 0.0f, 1.0f);
      std::vector<int32_t> l(s.batch);
      for (int64_t i = 0; i < s.batch; ++i) l[i] = static_cast<int32_t>(i % 10);
      y = Tensor::FromVector(l, {s.batch});
    } else {
      Batch(s.batch, step, &x, &y);
    }
    for (Run* r : {&cpu, &cpu1, &gpu, &plain}) ForwardBackward(r, x, y);
    if (step == 0) {
      auto cg = Values(cpu.model.get(), true), gg = Values(gpu.model.get(), true);
      auto c1 = Values(cpu1.model.get(), true), pg = Values(plain.model.get(), true);
      for (int i = static_cast<int>(cg.size()) - 1; i >= 0; --i) {
        const double control = RelL2(c1[i], cg[i]);
        const double conv_control = RelL2(pg[i], cg[i]);
        noise[i] = std::max(control, conv_control) > 0.1;
        const double tol = std::max(kStepGradTol, 10 * std::max(control, conv_control));
        const double d = RelL2(gg[i], cg[i]);
        const bool ok = noise[i] || d <= tol;
        std::printf(
            "grad=%s model=%s batch=%lld rel_l2=%.3g cpu_threads_control=%.3g "
            "conv_layout_control=%.3g tol=%.3g status=%s\n",
            names[i].c_str(), s.model.c_str(), static_cast<long long>(s.batch), d, control,
            conv_control, tol, noise[i] ? "noise" : (ok ? "ok" : "BEYOND"));
        EXPECT_TRUE(ok) << s.model << " step-0 gradient of " << names[i] << ": rel_l2 " << d;
      }
    }
    for (Run* r : {&cpu, &cpu1, &gpu, &plain}) WithSettings(*r, [&] { r->opt->Step(); });
    auto cv = Values(cpu.model.get(), false), gv = Values(gpu.model.get(), false);
    auto c1v = Values(cpu1.model.get(), false), pv = Values(plain.model.get(), false);
    double worst = 0, control = 0, conv_control = 0;
    std::string worst_name = "none", control_name = "none", conv_name = "none";
    for (size_t i = 0; i < cv.size(); ++i) {
      if (noise[i]) continue;
      const double dp = RelL2(pv[i], cv[i]);
      if (!(dp <= conv_control)) {
        conv_control = dp;
        conv_name = names[i];
      }
      const double d = RelL2(gv[i], cv[i]);
      if (!(d <= worst)) {
        worst = d;
        worst_name = names[i];
      }
      const double dc = RelL2(c1v[i], cv[i]);
      if (!(dc <= control)) {
        control = dc;
        control_name = names[i];
      }
    }
    std::string gpu_where, control_where;
    const int64_t gpu_off = ElementsOff(gv, cv, noise, names, &gpu_where);
    const int64_t control_off = ElementsOff(c1v, cv, noise, names, &control_where);
    const int64_t conv_off = ElementsOff(pv, cv, noise, names, nullptr);
    std::printf(
        "trajectory model=%s batch=%lld lr=%g momentum=%g step=%d gpu_vs_cpu=%.3g "
        "worst=%s cpu_threads_control=%.3g control_worst=%s conv_layout_control=%.3g "
        "conv_layout_worst=%s elements_off_5e-3_5e-4=%lld control_elements_off=%lld "
        "conv_layout_elements_off=%lld%s%s%s%s\n",
        s.model.c_str(), static_cast<long long>(s.batch), s.sgd.lr, s.sgd.momentum, step, worst,
        worst_name.c_str(), control, control_name.c_str(), conv_control, conv_name.c_str(),
        static_cast<long long>(gpu_off), static_cast<long long>(control_off),
        static_cast<long long>(conv_off), gpu_where.empty() ? "" : " off=", gpu_where.c_str(),
        control_where.empty() ? "" : " control_off=", control_where.c_str());
    std::fflush(stdout);
  }
}

// ---- the models ----

class OpHarnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kGpu.is_cuda()) DT_SKIP_WITHOUT_GPU();
    SetAllowTf32(false);
    SetConvAlgoSearch(ConvAlgoSearch::kBenchmark);
  }
};

// LeNet (libs/nn/models.cc) at batch 32 (data_parallel_cuda_test's).
TEST_F(OpHarnessTest, LeNetOps) {
  const std::string m = "lenet";
  const int64_t n = 32;
  CheckConv(m, "0.conv1", {n, 1, 28, 28}, 20, 3, 1, 0, true, 11);
  CheckAvgPool(m, "2.pool1", {n, 20, 26, 26}, 2, 2, 0, 21);
  CheckConv(m, "3.conv2", {n, 20, 13, 13}, 50, 5, 1, 0, true, 31);
  CheckAvgPool(m, "5.pool2", {n, 50, 9, 9}, 2, 2, 0, 41);
  CheckMaxPool(m, "max_pool(d2l variant)", {n, 20, 26, 26}, 2, 2, 0, 45);
  CheckLinear(m, "7.fc1", n, 800, 128, true, 51);
  CheckLinear(m, "9.fc2", n, 128, 10, false, 61);
  CheckSoftmaxCrossEntropy(m, n, 10, 71);
  CheckAddRelu(m, "grad accumulation", {n, 20, 26, 26}, 81);
  CheckSgd(m, "3.weight", {50, 20, 5, 5}, 0.2f, 0.0f, 91);
  CheckSgd(m, "7.weight", {128, 800}, 0.2f, 0.9f, 93);
}

// ResNet-18 (libs/nn/models.cc) at batch 8 (amp_graph_test's).
TEST_F(OpHarnessTest, ResNet18Ops) {
  const std::string m = "resnet18";
  const int64_t n = 8;
  uint64_t seed = 100;
  CheckConv(m, "0.stem", {n, 1, 28, 28}, 64, 3, 1, 1, false, seed += 10);
  CheckBatchNorm(m, "1.bn", {n, 64, 28, 28}, seed += 10);
  CheckAddRelu(m, "block1", {n, 64, 28, 28}, seed += 10);
  CheckConv(m, "block1.conv", {n, 64, 28, 28}, 64, 3, 1, 1, false, seed += 10);
  struct Stage {
    const char* name;
    int64_t in, out, hw_in, hw_out;
  };
  for (const Stage& st : {Stage{"block2", 64, 128, 28, 14}, Stage{"block3", 128, 256, 14, 7},
                          Stage{"block4", 256, 512, 7, 4}}) {
    const std::string b = st.name;
    CheckConv(m, b + ".0.conv1(s2)", {n, st.in, st.hw_in, st.hw_in}, st.out, 3, 2, 1, false,
              seed += 10);
    CheckConv(m, b + ".0.conv3(1x1,s2)", {n, st.in, st.hw_in, st.hw_in}, st.out, 1, 2, 0, false,
              seed += 10);
    CheckConv(m, b + ".conv", {n, st.out, st.hw_out, st.hw_out}, st.out, 3, 1, 1, false,
              seed += 10);
    CheckBatchNorm(m, b + ".bn", {n, st.out, st.hw_out, st.hw_out}, seed += 10);
    CheckAddRelu(m, b, {n, st.out, st.hw_out, st.hw_out}, seed += 10);
  }
  CheckMaxPool(m, "max_pool(d2l stem variant)", {n, 64, 28, 28}, 3, 2, 1, seed += 10);
  CheckGlobalAvgPool(m, {n, 512, 4, 4}, seed += 10);
  CheckLinear(m, "fc", n, 512, 10, false, seed += 10);
  CheckSoftmaxCrossEntropy(m, n, 10, seed += 10);
  CheckSgd(m, "block4.conv.weight", {512, 512, 3, 3}, 0.05f, 0.9f, seed += 10);
  CheckSgd(m, "bn.bias", {64}, 0.05f, 0.9f, seed += 10);
}

// The failing tests' settings: data_parallel_cuda_test (LeNet, normal
// init, lr 0.2, batch 32, 10 steps) and amp_graph_test (ResNet-18, kaiming,
// lr 0.05, momentum 0.9, batch 8, 3 steps).
TEST_F(OpHarnessTest, LeNetSteps) {
  CheckSteps({"lenet", nn::Init::kNormal, 32, 10, {0.2f, 0.0f, 0.0f, false}});
}

TEST_F(OpHarnessTest, ResNet18Steps) {
  CheckSteps({"resnet18", nn::Init::kKaiming, 8, 3, {0.05f, 0.9f, 0.0f, false}, true});
}

class SummaryPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    const Summary& s = Totals();
    if (!s.ran) return;  // skipped (no GPU): the tests said why
    std::printf("op_harness checks=%d beyond_tolerance=%d first_op_beyond_tolerance=%s\n", s.checks,
                s.beyond, s.first.empty() ? "none" : s.first.c_str());
  }
};

const auto* const kSummary = ::testing::AddGlobalTestEnvironment(new SummaryPrinter);

}  // namespace
}  // namespace cuda
}  // namespace dtrain
