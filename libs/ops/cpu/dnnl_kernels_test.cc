// Tests of the oneDNN CPU kernels (dnnl_kernels.cc): forward results against
// naive reference loops, backward results against reference loops and finite
// differences, fused relu, batch-norm statistics, the primitive cache and
// concurrent use. Per-layer timings are a benchmark, not a test:
// dnnl_layer_bench.cc.
#include "libs/ops/cpu/dnnl_kernels.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
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
using testing::NumericGradient;
using testing::RandomTensor;
using testing::TensorsNear;

// ---- reference implementations (double accumulation, plain loops) ----

float At4(const Tensor& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return t.data<float>()[((a * t.dim(1) + b) * t.dim(2) + c) * t.dim(3) + d];
}

Tensor ReluRef(const Tensor& x) {
  Tensor y = x.Clone();
  float* p = y.data<float>();
  for (int64_t i = 0; i < y.numel(); ++i) p[i] = std::max(p[i], 0.0f);
  return y;
}

Tensor RefConv(const Tensor& x, const Tensor& w, const Tensor* b, int stride, int pad) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const int64_t o = w.dim(0), kh = w.dim(2), kw = w.dim(3);
  const int64_t ho = (h + 2 * pad - kh) / stride + 1, wo = (wd + 2 * pad - kw) / stride + 1;
  Tensor y = Tensor::Empty({n, o, ho, wo});
  float* out = y.data<float>();
  for (int64_t in = 0; in < n; ++in)
    for (int64_t io = 0; io < o; ++io)
      for (int64_t oy = 0; oy < ho; ++oy)
        for (int64_t ox = 0; ox < wo; ++ox) {
          double s = b != nullptr ? b->data<float>()[io] : 0.0;
          for (int64_t ic = 0; ic < c; ++ic)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                s += static_cast<double>(At4(x, in, ic, iy, ix)) * At4(w, io, ic, ky, kx);
              }
          *out++ = static_cast<float>(s);
        }
  return y;
}

// The adjoint of RefConv with respect to x and w (and the bias).
void RefConvBackward(const Tensor& x, const Tensor& w, const Tensor& dy, int stride, int pad,
                     Tensor* dx, Tensor* dw, Tensor* db) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const int64_t o = w.dim(0), kh = w.dim(2), kw = w.dim(3);
  const int64_t ho = dy.dim(2), wo = dy.dim(3);
  std::vector<double> gx(x.numel(), 0.0), gw(w.numel(), 0.0), gb(o, 0.0);
  for (int64_t in = 0; in < n; ++in)
    for (int64_t io = 0; io < o; ++io)
      for (int64_t oy = 0; oy < ho; ++oy)
        for (int64_t ox = 0; ox < wo; ++ox) {
          const double g = At4(dy, in, io, oy, ox);
          gb[io] += g;
          for (int64_t ic = 0; ic < c; ++ic)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                gx[((in * c + ic) * h + iy) * wd + ix] += g * At4(w, io, ic, ky, kx);
                gw[((io * c + ic) * kh + ky) * kw + kx] += g * At4(x, in, ic, iy, ix);
              }
        }
  *dx = Tensor::Empty(x.shape());
  *dw = Tensor::Empty(w.shape());
  *db = Tensor::Empty({o});
  for (int64_t i = 0; i < x.numel(); ++i) dx->data<float>()[i] = static_cast<float>(gx[i]);
  for (int64_t i = 0; i < w.numel(); ++i) dw->data<float>()[i] = static_cast<float>(gw[i]);
  for (int64_t i = 0; i < o; ++i) db->data<float>()[i] = static_cast<float>(gb[i]);
}

// Average pooling that excludes padding from the divisor.
Tensor RefAvgPool(const Tensor& x, int k, int s, int p) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  const int64_t ho = (h + 2 * p - k) / s + 1, wo = (w + 2 * p - k) / s + 1;
  Tensor y = Tensor::Empty({n, c, ho, wo});
  float* out = y.data<float>();
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t oy = 0; oy < ho; ++oy)
        for (int64_t ox = 0; ox < wo; ++ox) {
          double sum = 0;
          int count = 0;
          for (int64_t ky = 0; ky < k; ++ky)
            for (int64_t kx = 0; kx < k; ++kx) {
              const int64_t iy = oy * s - p + ky, ix = ox * s - p + kx;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              sum += At4(x, in, ic, iy, ix);
              ++count;
            }
          *out++ = static_cast<float>(sum / count);
        }
  return y;
}

Tensor RefAvgPoolBackward(const Tensor& dy, const Shape& x_shape, int k, int s, int p) {
  const int64_t n = x_shape[0], c = x_shape[1], h = x_shape[2], w = x_shape[3];
  const int64_t ho = dy.dim(2), wo = dy.dim(3);
  std::vector<double> g(NumElements(x_shape), 0.0);
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t oy = 0; oy < ho; ++oy)
        for (int64_t ox = 0; ox < wo; ++ox) {
          int count = 0;
          for (int64_t ky = 0; ky < k; ++ky)
            for (int64_t kx = 0; kx < k; ++kx) {
              const int64_t iy = oy * s - p + ky, ix = ox * s - p + kx;
              if (iy >= 0 && iy < h && ix >= 0 && ix < w) ++count;
            }
          const double v = At4(dy, in, ic, oy, ox) / count;
          for (int64_t ky = 0; ky < k; ++ky)
            for (int64_t kx = 0; kx < k; ++kx) {
              const int64_t iy = oy * s - p + ky, ix = ox * s - p + kx;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              g[((in * c + ic) * h + iy) * w + ix] += v;
            }
        }
  Tensor dx = Tensor::Empty(x_shape);
  for (size_t i = 0; i < g.size(); ++i) dx.data<float>()[i] = static_cast<float>(g[i]);
  return dx;
}

// c = op(a) * op(b).
Tensor RefMatMul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const int64_t n = tb ? b.dim(0) : b.dim(1);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  Tensor c = Tensor::Empty({m, n});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) {
        const float av = ta ? pa[l * m + i] : pa[i * k + l];
        const float bv = tb ? pb[j * k + l] : pb[l * n + j];
        s += static_cast<double>(av) * bv;
      }
      c.data<float>()[i * n + j] = static_cast<float>(s);
    }
  return c;
}

// y = x w^T + b.
Tensor RefLinear(const Tensor& x, const Tensor& w, const Tensor* b) {
  Tensor y = RefMatMul(x, w, false, true);
  if (b != nullptr) {
    const int64_t m = w.dim(0);
    for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] += b->data<float>()[i % m];
  }
  return y;
}

// Batch statistics per channel of x ([N,C,H,W] or [N,C]): mean and biased
// variance.
void RefBatchStats(const Tensor& x, std::vector<double>* mean, std::vector<double>* var) {
  const int64_t n = x.dim(0), c = x.dim(1);
  const int64_t hw = x.numel() / (n * c);
  mean->assign(c, 0.0);
  var->assign(c, 0.0);
  const float* p = x.data<float>();
  for (int64_t ic = 0; ic < c; ++ic) {
    double s = 0;
    for (int64_t in = 0; in < n; ++in)
      for (int64_t i = 0; i < hw; ++i) s += p[(in * c + ic) * hw + i];
    const double m = s / (n * hw);
    double v = 0;
    for (int64_t in = 0; in < n; ++in)
      for (int64_t i = 0; i < hw; ++i) {
        const double d = p[(in * c + ic) * hw + i] - m;
        v += d * d;
      }
    (*mean)[ic] = m;
    (*var)[ic] = v / (n * hw);
  }
}

// y = (x - mean) / sqrt(var + eps) * gamma + beta with per-channel mean, var.
Tensor RefNormalize(const Tensor& x, const std::vector<double>& mean,
                    const std::vector<double>& var, const Tensor& gamma, const Tensor& beta,
                    double eps) {
  const int64_t n = x.dim(0), c = x.dim(1);
  const int64_t hw = x.numel() / (n * c);
  Tensor y = Tensor::Empty(x.shape());
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t i = 0; i < hw; ++i) {
        const int64_t idx = (in * c + ic) * hw + i;
        y.data<float>()[idx] = static_cast<float>(
            (x.data<float>()[idx] - mean[ic]) / std::sqrt(var[ic] + eps) * gamma.data<float>()[ic] +
            beta.data<float>()[ic]);
      }
  return y;
}

Tensor Vec(const std::vector<double>& v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = static_cast<float>(v[i]);
  return t;
}

// ---- convolution ----

std::string CaseName(const ConvCase& cc) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "x[%ld,%ld,%ld,%ld] w[%ld,%ld,%ld,%ld] s%d p%d",
                static_cast<long>(cc.n), static_cast<long>(cc.c), static_cast<long>(cc.h),
                static_cast<long>(cc.w), static_cast<long>(cc.o), static_cast<long>(cc.c),
                static_cast<long>(cc.k), static_cast<long>(cc.k), cc.stride, cc.pad);
  return buf;
}

const std::vector<ConvCase>& ConvCases() {
  static const std::vector<ConvCase> cases = {
      {2, 3, 8, 8, 4, 3, 1, 1},      // small, padding 1
      {1, 1, 28, 28, 20, 3, 1, 0},   // LeNet conv1, batch 1
      {2, 20, 13, 13, 50, 5, 1, 0},  // LeNet conv2
      {2, 5, 7, 9, 6, 3, 2, 1},      // non-square, stride 2
      {3, 10, 6, 5, 7, 1, 1, 0},     // 1x1
      {2, 16, 9, 9, 32, 1, 2, 0},    // 1x1 stride 2 (ResNet shortcut)
      {2, 17, 11, 7, 13, 3, 2, 1},   // channels not multiple of 8
      {1, 32, 7, 7, 24, 3, 1, 1},    // batch 1, blocked-sized channels
      {2, 64, 8, 8, 64, 3, 1, 1},    // ResNet-like 3x3
      {2, 24, 10, 6, 40, 3, 2, 1},   // non-square, stride 2, blocked-sized
      {1, 3, 5, 4, 2, 5, 1, 2},      // kernel 5, padding 2 on a tiny image
      {2, 4, 9, 9, 3, 4, 3, 1},      // even kernel, stride 3
      {1, 1, 1, 1, 1, 1, 1, 0},      // degenerate
  };
  return cases;
}

class ConvLayoutTest : public ::testing::TestWithParam<ConvLayout> {
 protected:
  void SetUp() override { cpu::SetConvLayoutForTesting(GetParam()); }
  void TearDown() override { cpu::SetConvLayoutForTesting(ConvLayout::kAuto); }
};

TEST_P(ConvLayoutTest, ForwardMatchesReference) {
  uint64_t seed = 1;
  for (const ConvCase& cc : ConvCases()) {
    SCOPED_TRACE(CaseName(cc));
    Tensor x = RandomTensor({cc.n, cc.c, cc.h, cc.w}, seed++);
    Tensor w = RandomTensor({cc.o, cc.c, cc.k, cc.k}, seed++);
    Tensor b = RandomTensor({cc.o}, seed++);
    Conv2dParams p{cc.stride, cc.pad};
    Tensor ref_b = RefConv(x, w, &b, cc.stride, cc.pad);
    Tensor ref = RefConv(x, w, nullptr, cc.stride, cc.pad);
    EXPECT_TRUE(TensorsNear(Conv2d(x, w, &b, p), ref_b, 1e-4, 1e-4, "bias"));
    EXPECT_TRUE(TensorsNear(Conv2d(x, w, nullptr, p), ref, 1e-4, 1e-4, "no bias"));
    EXPECT_TRUE(TensorsNear(Conv2d(x, w, &b, p, true), ReluRef(ref_b), 1e-4, 1e-4, "bias+relu"));
    EXPECT_TRUE(TensorsNear(Conv2d(x, w, nullptr, p, true), ReluRef(ref), 1e-4, 1e-4, "relu"));
  }
}

TEST_P(ConvLayoutTest, FusedReluEqualsReluOfUnfused) {
  for (const ConvCase& cc : ConvCases()) {
    SCOPED_TRACE(CaseName(cc));
    Tensor x = RandomTensor({cc.n, cc.c, cc.h, cc.w}, 11);
    Tensor w = RandomTensor({cc.o, cc.c, cc.k, cc.k}, 12);
    Tensor b = RandomTensor({cc.o}, 13);
    Conv2dParams p{cc.stride, cc.pad};
    Tensor fused = Conv2d(x, w, &b, p, true);
    Tensor unfused = Conv2d(x, w, &b, p, false);
    EXPECT_TRUE(TensorsNear(fused, ReluRef(unfused), 0, 0, "fused relu"));
  }
}

TEST_P(ConvLayoutTest, BackwardMatchesReference) {
  uint64_t seed = 100;
  for (const ConvCase& cc : ConvCases()) {
    SCOPED_TRACE(CaseName(cc));
    Tensor x = RandomTensor({cc.n, cc.c, cc.h, cc.w}, seed++);
    Tensor w = RandomTensor({cc.o, cc.c, cc.k, cc.k}, seed++);
    Conv2dParams p{cc.stride, cc.pad};
    Tensor y = RefConv(x, w, nullptr, cc.stride, cc.pad);
    Tensor dy = RandomTensor(y.shape(), seed++);
    Tensor rdx, rdw, rdb;
    RefConvBackward(x, w, dy, cc.stride, cc.pad, &rdx, &rdw, &rdb);
    EXPECT_TRUE(TensorsNear(Conv2dBackwardData(dy, w, x.shape(), p), rdx, 1e-4, 1e-4, "dx"));
    Tensor dw = Tensor::Empty(w.shape());
    Tensor db = Tensor::Empty({cc.o});
    Conv2dBackwardWeights(x, dy, p, &dw, &db);
    EXPECT_TRUE(TensorsNear(dw, rdw, 1e-4, 1e-3, "dw"));
    EXPECT_TRUE(TensorsNear(db, rdb, 1e-4, 1e-3, "db"));
    Tensor dw2 = Tensor::Full(w.shape(), 7.0f);
    Conv2dBackwardWeights(x, dy, p, &dw2, nullptr);
    EXPECT_TRUE(TensorsNear(dw2, rdw, 1e-4, 1e-3, "dw without db"));
  }
}

TEST_P(ConvLayoutTest, BackwardMatchesFiniteDifferences) {
  const std::vector<ConvCase> cases = {
      {2, 3, 5, 5, 4, 3, 1, 1},   {1, 2, 6, 5, 3, 3, 2, 1}, {2, 3, 4, 4, 2, 1, 1, 0},
      {1, 16, 4, 3, 16, 3, 1, 1}, {1, 5, 7, 6, 3, 2, 2, 0},
  };
  uint64_t seed = 200;
  for (const ConvCase& cc : cases) {
    SCOPED_TRACE(CaseName(cc));
    Tensor x = RandomTensor({cc.n, cc.c, cc.h, cc.w}, seed++);
    Tensor w = RandomTensor({cc.o, cc.c, cc.k, cc.k}, seed++);
    Tensor b = RandomTensor({cc.o}, seed++);
    Conv2dParams p{cc.stride, cc.pad};
    Tensor y = Conv2d(x, w, &b, p);
    Tensor dy = RandomTensor(y.shape(), seed++);
    Tensor ndx = NumericGradient([&](const Tensor& xx) { return Conv2d(xx, w, &b, p); }, x, dy);
    Tensor ndw = NumericGradient([&](const Tensor& ww) { return Conv2d(x, ww, &b, p); }, w, dy);
    Tensor ndb = NumericGradient([&](const Tensor& bb) { return Conv2d(x, w, &bb, p); }, b, dy);
    EXPECT_TRUE(TensorsNear(Conv2dBackwardData(dy, w, x.shape(), p), ndx, 1e-2, 1e-3, "dx"));
    Tensor dw = Tensor::Empty(w.shape());
    Tensor db = Tensor::Empty(b.shape());
    Conv2dBackwardWeights(x, dy, p, &dw, &db);
    EXPECT_TRUE(TensorsNear(dw, ndw, 1e-2, 1e-3, "dw"));
    EXPECT_TRUE(TensorsNear(db, ndb, 1e-2, 1e-3, "db"));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ConvLayoutTest,
                         ::testing::Values(ConvLayout::kAuto, ConvLayout::kPlain,
                                           ConvLayout::kBlocked, ConvLayout::kChannelsLast),
                         [](const ::testing::TestParamInfo<ConvLayout>& info) {
                           return std::string(LayoutName(info.param));
                         });

TEST(DnnlConvTest, LayoutsAgree) {
  // The same convolution and its gradients through every layout.
  Tensor x = RandomTensor({4, 64, 14, 14}, 300);
  Tensor w = RandomTensor({128, 64, 3, 3}, 301);
  Conv2dParams p{2, 1};
  Tensor dy = RandomTensor({4, 128, 7, 7}, 302);
  Tensor y[4], dx[4], dw[4], db[4];
  const ConvLayout layouts[] = {ConvLayout::kPlain, ConvLayout::kBlocked, ConvLayout::kChannelsLast,
                                ConvLayout::kAuto};
  for (int l = 0; l < 4; ++l) {
    LayoutGuard g(layouts[l]);
    y[l] = Conv2d(x, w, nullptr, p);
    dx[l] = Conv2dBackwardData(dy, w, x.shape(), p);
    dw[l] = Tensor::Empty(w.shape());
    db[l] = Tensor::Empty({128});
    Conv2dBackwardWeights(x, dy, p, &dw[l], &db[l]);
  }
  for (int l = 1; l < 4; ++l) {
    SCOPED_TRACE(LayoutName(layouts[l]));
    EXPECT_TRUE(TensorsNear(y[l], y[0], 1e-4, 1e-4, "y"));
    EXPECT_TRUE(TensorsNear(dx[l], dx[0], 1e-4, 1e-4, "dx"));
    EXPECT_TRUE(TensorsNear(dw[l], dw[0], 1e-4, 1e-3, "dw"));
    EXPECT_TRUE(TensorsNear(db[l], db[0], 1e-4, 1e-3, "db"));
  }
}

TEST(DnnlConvTest, EmptyBatch) {
  Tensor x = Tensor::Empty({0, 3, 5, 5});
  Tensor w = RandomTensor({4, 3, 3, 3}, 310);
  Tensor b = RandomTensor({4}, 311);
  Conv2dParams p{1, 1};
  Tensor y = Conv2d(x, w, &b, p, true);
  EXPECT_EQ(y.shape(), Shape({0, 4, 5, 5}));
  EXPECT_EQ(Conv2dBackwardData(y, w, x.shape(), p).shape(), x.shape());
  Tensor dw = Tensor::Full(w.shape(), 1.0f), db = Tensor::Full({4}, 1.0f);
  Conv2dBackwardWeights(x, y, p, &dw, &db);
  EXPECT_TRUE(TensorsNear(dw, Tensor::Zeros(w.shape()), 0, 0, "dw"));
  EXPECT_TRUE(TensorsNear(db, Tensor::Zeros({4}), 0, 0, "db"));
}

TEST(DnnlConvTest, AutoLayoutChoices) {
  using cpu::ChooseConvLayout;
  using cpu::ConvPass;
  // LeNet conv1 and the ResNet stem (one input channel).
  EXPECT_EQ(ChooseConvLayout(ConvPass::kForward, 256, 1, 28, 28, 20, 3, 1), ConvLayout::kPlain);
  EXPECT_EQ(ChooseConvLayout(ConvPass::kBackwardWeights, 256, 1, 28, 28, 20, 3, 1),
            ConvLayout::kBlocked);
  // LeNet conv2.
  EXPECT_EQ(ChooseConvLayout(ConvPass::kForward, 256, 20, 13, 13, 50, 5, 1),
            ConvLayout::kChannelsLast);
  // ResNet-18 3x3 and 1x1 convolutions.
  EXPECT_EQ(ChooseConvLayout(ConvPass::kBackwardData, 32, 64, 28, 28, 64, 3, 1),
            ConvLayout::kBlocked);
  EXPECT_EQ(ChooseConvLayout(ConvPass::kForward, 32, 64, 28, 28, 128, 1, 2), ConvLayout::kPlain);
}

// ---- pooling ----

struct PoolCase {
  int64_t n, c, h, w;
  int k, s, p;
};

TEST(DnnlAvgPoolTest, ForwardAndBackwardMatchReference) {
  const std::vector<PoolCase> cases = {
      {2, 3, 8, 8, 2, 2, 0},   {1, 20, 26, 26, 2, 2, 0}, {2, 50, 9, 9, 2, 2, 0},
      {2, 3, 7, 9, 3, 2, 1},   {1, 4, 5, 5, 3, 1, 1},    {2, 5, 6, 7, 3, 3, 0},
      {1, 17, 4, 4, 4, 4, 0},  {2, 3, 6, 6, 2, 1, 1},    {1, 1, 1, 1, 1, 1, 0},
      {3, 9, 10, 5, 4, 2, 2},  {4, 20, 26, 26, 2, 2, 0}, {16, 50, 9, 9, 2, 2, 0},
      {8, 6, 33, 31, 3, 3, 0}, {4, 32, 16, 16, 3, 2, 1},
  };
  uint64_t seed = 400;
  for (const PoolCase& pc : cases) {
    SCOPED_TRACE(::testing::Message() << "x [" << pc.n << "," << pc.c << "," << pc.h << "," << pc.w
                                      << "] k" << pc.k << " s" << pc.s << " p" << pc.p);
    Tensor x = RandomTensor({pc.n, pc.c, pc.h, pc.w}, seed++);
    Pool2dParams p{pc.k, pc.s, pc.p};
    Tensor y = AvgPool2d(x, p);
    EXPECT_TRUE(TensorsNear(y, RefAvgPool(x, pc.k, pc.s, pc.p), 1e-5, 1e-6, "y"));
    Tensor dy = RandomTensor(y.shape(), seed++);
    EXPECT_TRUE(TensorsNear(AvgPool2dBackward(dy, x.shape(), p),
                            RefAvgPoolBackward(dy, x.shape(), pc.k, pc.s, pc.p), 1e-5, 1e-6, "dx"));
  }
}

TEST(DnnlAvgPoolTest, BackwardMatchesFiniteDifferences) {
  const std::vector<PoolCase> cases = {
      {2, 3, 4, 4, 2, 2, 0}, {1, 2, 5, 6, 3, 2, 1}, {1, 3, 5, 5, 3, 1, 1}, {2, 2, 5, 5, 2, 2, 0}};
  uint64_t seed = 500;
  for (const PoolCase& pc : cases) {
    Tensor x = RandomTensor({pc.n, pc.c, pc.h, pc.w}, seed++);
    Pool2dParams p{pc.k, pc.s, pc.p};
    Tensor y = AvgPool2d(x, p);
    Tensor dy = RandomTensor(y.shape(), seed++);
    Tensor ndx = NumericGradient([&](const Tensor& xx) { return AvgPool2d(xx, p); }, x, dy);
    EXPECT_TRUE(TensorsNear(AvgPool2dBackward(dy, x.shape(), p), ndx, 1e-2, 1e-3, "dx"));
  }
}

// ---- matrix products ----

TEST(DnnlMatMulTest, AllTransposesMatchReference) {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {3, 5, 4}, {17, 33, 9}, {64, 128, 32}, {1, 20, 7}, {30, 1, 11}, {128, 300, 65}};
  uint64_t seed = 600;
  for (const auto& s : shapes) {
    const int64_t m = s[0], k = s[1], n = s[2];
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(::testing::Message()
                     << "m" << m << " k" << k << " n" << n << " ta" << ta << " tb" << tb);
        Tensor a = ta ? RandomTensor({k, m}, seed++) : RandomTensor({m, k}, seed++);
        Tensor b = tb ? RandomTensor({n, k}, seed++) : RandomTensor({k, n}, seed++);
        EXPECT_TRUE(TensorsNear(MatMul(a, b, ta, tb), RefMatMul(a, b, ta, tb), 1e-4, 1e-4, "c"));
      }
    }
  }
}

TEST(DnnlLinearTest, ForwardMatchesReference) {
  const std::vector<std::array<int64_t, 3>> shapes = {{4, 7, 5},    {1, 800, 128}, {256, 784, 256},
                                                      {33, 17, 10}, {2, 1, 3},     {5, 128, 1}};
  uint64_t seed = 700;
  for (const auto& s : shapes) {
    const int64_t n = s[0], k = s[1], m = s[2];
    SCOPED_TRACE(::testing::Message() << "x [" << n << "," << k << "] w [" << m << "," << k << "]");
    Tensor x = RandomTensor({n, k}, seed++);
    Tensor w = RandomTensor({m, k}, seed++);
    Tensor b = RandomTensor({m}, seed++);
    Tensor ref_b = RefLinear(x, w, &b);
    Tensor ref = RefLinear(x, w, nullptr);
    EXPECT_TRUE(TensorsNear(Linear(x, w, &b), ref_b, 1e-4, 1e-4, "bias"));
    EXPECT_TRUE(TensorsNear(Linear(x, w, nullptr), ref, 1e-4, 1e-4, "no bias"));
    EXPECT_TRUE(TensorsNear(Linear(x, w, &b, true), ReluRef(ref_b), 1e-4, 1e-4, "bias+relu"));
    EXPECT_TRUE(TensorsNear(Linear(x, w, nullptr, true), ReluRef(ref), 1e-4, 1e-4, "relu"));
    EXPECT_TRUE(TensorsNear(Linear(x, w, &b, true), ReluRef(Linear(x, w, &b)), 0, 0,
                            "fused relu vs relu of unfused"));
  }
}

TEST(DnnlLinearTest, BackwardMatchesReference) {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {4, 7, 5}, {256, 784, 256}, {33, 17, 10}, {1, 9, 4}, {7, 1, 1}};
  uint64_t seed = 800;
  for (const auto& s : shapes) {
    const int64_t n = s[0], k = s[1], m = s[2];
    SCOPED_TRACE(::testing::Message() << "x [" << n << "," << k << "] w [" << m << "," << k << "]");
    Tensor x = RandomTensor({n, k}, seed++);
    Tensor w = RandomTensor({m, k}, seed++);
    Tensor dy = RandomTensor({n, m}, seed++);
    Tensor rdx = RefMatMul(dy, w, false, false);
    Tensor rdw = RefMatMul(dy, x, true, false);
    Tensor rdb = Tensor::Empty({m});
    for (int64_t j = 0; j < m; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += dy.data<float>()[i * m + j];
      rdb.data<float>()[j] = static_cast<float>(sum);
    }
    Tensor dx = Tensor::Empty({n, k}), dw = Tensor::Empty({m, k}), db = Tensor::Empty({m});
    LinearBackward(x, w, dy, &dx, &dw, &db);
    EXPECT_TRUE(TensorsNear(dx, rdx, 1e-4, 1e-4, "dx"));
    EXPECT_TRUE(TensorsNear(dw, rdw, 1e-4, 1e-4, "dw"));
    EXPECT_TRUE(TensorsNear(db, rdb, 1e-4, 1e-4, "db"));
    // Outputs not asked for are skipped; the others are unchanged.
    Tensor dx2 = Tensor::Full({n, k}, 3.0f), dw2 = Tensor::Full({m, k}, 3.0f);
    Tensor db2 = Tensor::Full({m}, 3.0f);
    LinearBackward(x, w, dy, nullptr, &dw2, nullptr);
    EXPECT_TRUE(TensorsNear(dw2, rdw, 1e-4, 1e-4, "dw only"));
    LinearBackward(x, w, dy, &dx2, nullptr, &db2);
    EXPECT_TRUE(TensorsNear(dx2, rdx, 1e-4, 1e-4, "dx only"));
    EXPECT_TRUE(TensorsNear(db2, rdb, 1e-4, 1e-4, "db with dx"));
  }
}

TEST(DnnlLinearTest, BackwardMatchesFiniteDifferences) {
  Tensor x = RandomTensor({5, 7}, 900);
  Tensor w = RandomTensor({4, 7}, 901);
  Tensor b = RandomTensor({4}, 902);
  Tensor dy = RandomTensor({5, 4}, 903);
  Tensor ndx = NumericGradient([&](const Tensor& xx) { return Linear(xx, w, &b); }, x, dy);
  Tensor ndw = NumericGradient([&](const Tensor& ww) { return Linear(x, ww, &b); }, w, dy);
  Tensor ndb = NumericGradient([&](const Tensor& bb) { return Linear(x, w, &bb); }, b, dy);
  Tensor dx = Tensor::Empty(x.shape()), dw = Tensor::Empty(w.shape()), db = Tensor::Empty({4});
  LinearBackward(x, w, dy, &dx, &dw, &db);
  EXPECT_TRUE(TensorsNear(dx, ndx, 1e-2, 1e-3, "dx"));
  EXPECT_TRUE(TensorsNear(dw, ndw, 1e-2, 1e-3, "dw"));
  EXPECT_TRUE(TensorsNear(db, ndb, 1e-2, 1e-3, "db"));
}

// ---- batch norm ----

TEST(DnnlBatchNormTest, TrainingForwardMatchesFormula) {
  const std::vector<Shape> shapes = {
      {4, 3, 5, 6}, {16, 7}, {2, 17, 3, 4}, {1, 2, 3, 1}, {8, 64, 7, 7}};
  uint64_t seed = 1000;
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(ShapeToString(shape));
    const int64_t c = shape[1];
    const float eps = 1e-5f;
    Tensor x = BatchNormInput(shape, seed++);
    Tensor gamma = RandomTensor({c}, seed++, 0.5f, 1.5f);
    Tensor beta = RandomTensor({c}, seed++);
    Tensor rm = Tensor::Zeros({c}), rv = Tensor::Full({c}, 1.0f);
    Tensor saved_mean, saved_inv_std;
    Tensor y = BatchNormTrain(x, gamma, beta, 0.1f, eps, &rm, &rv, &saved_mean, &saved_inv_std);
    std::vector<double> mean, var;
    RefBatchStats(x, &mean, &var);
    std::vector<double> inv_std(c);
    for (int64_t i = 0; i < c; ++i) inv_std[i] = 1.0 / std::sqrt(var[i] + eps);
    EXPECT_TRUE(TensorsNear(y, RefNormalize(x, mean, var, gamma, beta, eps), 1e-4, 1e-4, "y"));
    EXPECT_TRUE(TensorsNear(saved_mean, Vec(mean), 1e-5, 1e-5, "saved_mean"));
    EXPECT_TRUE(TensorsNear(saved_inv_std, Vec(inv_std), 1e-4, 1e-5, "saved_inv_std"));
  }
}

TEST(DnnlBatchNormTest, RunningStatisticsAfterTwoCalls) {
  for (const Shape& shape : {Shape{4, 3, 5, 6}, Shape{10, 6}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const int64_t c = shape[1];
    const int64_t count = NumElements(shape) / c;
    const float momentum = 0.1f, eps = 1e-5f;
    Tensor gamma = RandomTensor({c}, 1100, 0.5f, 1.5f);
    Tensor beta = RandomTensor({c}, 1101);
    Tensor rm = RandomTensor({c}, 1102);
    Tensor rv = RandomTensor({c}, 1103, 0.5f, 2.0f);
    std::vector<double> erm(c), erv(c);
    for (int64_t i = 0; i < c; ++i) {
      erm[i] = rm.data<float>()[i];
      erv[i] = rv.data<float>()[i];
    }
    for (int call = 0; call < 2; ++call) {
      Tensor x = BatchNormInput(shape, 1110 + call);
      Tensor saved_mean, saved_inv_std;
      BatchNormTrain(x, gamma, beta, momentum, eps, &rm, &rv, &saved_mean, &saved_inv_std);
      std::vector<double> mean, var;
      RefBatchStats(x, &mean, &var);
      for (int64_t i = 0; i < c; ++i) {
        erm[i] = (1 - momentum) * erm[i] + momentum * mean[i];
        erv[i] = (1 - momentum) * erv[i] + momentum * var[i] * count / (count - 1);
      }
    }
    EXPECT_TRUE(TensorsNear(rm, Vec(erm), 1e-5, 1e-6, "running_mean"));
    EXPECT_TRUE(TensorsNear(rv, Vec(erv), 1e-5, 1e-6, "running_var"));
  }
}

TEST(DnnlBatchNormTest, InferenceUsesRunningStatistics) {
  for (const Shape& shape : {Shape{4, 3, 5, 6}, Shape{10, 6}, Shape{1, 19, 2, 3}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const int64_t c = shape[1];
    for (float eps : {1e-5f, 1e-3f}) {
      Tensor x = BatchNormInput(shape, 1200);
      Tensor gamma = RandomTensor({c}, 1201, 0.5f, 1.5f);
      Tensor beta = RandomTensor({c}, 1202);
      Tensor rm = RandomTensor({c}, 1203);
      Tensor rv = RandomTensor({c}, 1204, 0.5f, 2.0f);
      std::vector<double> mean(c), var(c);
      for (int64_t i = 0; i < c; ++i) {
        mean[i] = rm.data<float>()[i];
        var[i] = rv.data<float>()[i];
      }
      Tensor y = BatchNormInference(x, gamma, beta, rm, rv, eps);
      EXPECT_TRUE(TensorsNear(y, RefNormalize(x, mean, var, gamma, beta, eps), 1e-5, 1e-5, "y"));
    }
  }
}

TEST(DnnlBatchNormTest, BackwardMatchesFiniteDifferences) {
  const std::vector<Shape> shapes = {{3, 2, 3, 3}, {6, 4}, {2, 3, 2, 5}};
  uint64_t seed = 1300;
  for (const Shape& shape : shapes) {
    for (float eps : {1e-5f, 1e-2f}) {
      SCOPED_TRACE(::testing::Message() << ShapeToString(shape) << " eps " << eps);
      const int64_t c = shape[1];
      Tensor x = BatchNormInput(shape, seed++);
      Tensor gamma = RandomTensor({c}, seed++, 0.5f, 1.5f);
      Tensor beta = RandomTensor({c}, seed++);
      Tensor dy = RandomTensor(x.shape(), seed++);
      auto f = [&](const Tensor& xx, const Tensor& g, const Tensor& b) {
        Tensor rm = Tensor::Zeros({c}), rv = Tensor::Full({c}, 1.0f), sm, si;
        return BatchNormTrain(xx, g, b, 0.1f, eps, &rm, &rv, &sm, &si);
      };
      Tensor ndx = NumericGradient([&](const Tensor& xx) { return f(xx, gamma, beta); }, x, dy);
      Tensor ndg = NumericGradient([&](const Tensor& g) { return f(x, g, beta); }, gamma, dy);
      Tensor ndb = NumericGradient([&](const Tensor& b) { return f(x, gamma, b); }, beta, dy);
      Tensor rm = Tensor::Zeros({c}), rv = Tensor::Full({c}, 1.0f), sm, si;
      BatchNormTrain(x, gamma, beta, 0.1f, eps, &rm, &rv, &sm, &si);
      Tensor dx = Tensor::Empty(x.shape()), dg = Tensor::Empty({c}), db = Tensor::Empty({c});
      BatchNormBackward(x, dy, gamma, sm, si, &dx, &dg, &db);
      EXPECT_TRUE(TensorsNear(dx, ndx, 1e-2, 1e-3, "dx"));
      EXPECT_TRUE(TensorsNear(dg, ndg, 1e-2, 1e-3, "dgamma"));
      EXPECT_TRUE(TensorsNear(db, ndb, 1e-2, 1e-3, "dbeta"));
      // Null outputs are skipped; the others do not change.
      Tensor dx2 = Tensor::Empty(x.shape());
      BatchNormBackward(x, dy, gamma, sm, si, &dx2, nullptr, nullptr);
      EXPECT_TRUE(TensorsNear(dx2, dx, 0, 0, "dx alone"));
      Tensor dg2 = Tensor::Empty({c}), db2 = Tensor::Empty({c});
      BatchNormBackward(x, dy, gamma, sm, si, nullptr, &dg2, &db2);
      EXPECT_TRUE(TensorsNear(dg2, dg, 0, 0, "dgamma without dx"));
      EXPECT_TRUE(TensorsNear(db2, db, 0, 0, "dbeta without dx"));
    }
  }
}

TEST(DnnlBatchNormTest, BackwardMatchesFormulaAtResNetShape) {
  // dx = gamma * inv_std / M * (M * dy - sum(dy) - xhat * sum(dy * xhat)).
  const Shape shape = {8, 64, 7, 7};
  const int64_t c = 64, hw = 49, n = 8, count = n * hw;
  Tensor x = BatchNormInput(shape, 1400);
  Tensor gamma = RandomTensor({c}, 1401, 0.5f, 1.5f);
  Tensor beta = RandomTensor({c}, 1402);
  Tensor dy = RandomTensor(shape, 1403);
  Tensor rm = Tensor::Zeros({c}), rv = Tensor::Full({c}, 1.0f), sm, si;
  BatchNormTrain(x, gamma, beta, 0.1f, 1e-5f, &rm, &rv, &sm, &si);
  Tensor dx = Tensor::Empty(shape), dg = Tensor::Empty({c}), db = Tensor::Empty({c});
  BatchNormBackward(x, dy, gamma, sm, si, &dx, &dg, &db);
  std::vector<double> mean, var;
  RefBatchStats(x, &mean, &var);
  Tensor rdx = Tensor::Empty(shape);
  std::vector<double> rdg(c), rdb(c);
  for (int64_t ic = 0; ic < c; ++ic) {
    const double inv = 1.0 / std::sqrt(var[ic] + 1e-5);
    double sdy = 0, sdyx = 0;
    for (int64_t in = 0; in < n; ++in)
      for (int64_t i = 0; i < hw; ++i) {
        const int64_t idx = (in * c + ic) * hw + i;
        sdy += dy.data<float>()[idx];
        sdyx += dy.data<float>()[idx] * (x.data<float>()[idx] - mean[ic]) * inv;
      }
    rdg[ic] = sdyx;
    rdb[ic] = sdy;
    for (int64_t in = 0; in < n; ++in)
      for (int64_t i = 0; i < hw; ++i) {
        const int64_t idx = (in * c + ic) * hw + i;
        const double xhat = (x.data<float>()[idx] - mean[ic]) * inv;
        rdx.data<float>()[idx] =
            static_cast<float>(gamma.data<float>()[ic] * inv / count *
                               (count * dy.data<float>()[idx] - sdy - xhat * sdyx));
      }
  }
  EXPECT_TRUE(TensorsNear(dx, rdx, 1e-3, 1e-4, "dx"));
  EXPECT_TRUE(TensorsNear(dg, Vec(rdg), 1e-4, 1e-3, "dgamma"));
  EXPECT_TRUE(TensorsNear(db, Vec(rdb), 1e-4, 1e-3, "dbeta"));
}

// ---- cache, threads, errors ----

TEST(DnnlCacheTest, SecondCallReusesPrimitives) {
  Tensor x = RandomTensor({8, 20, 13, 13}, 1500);
  Tensor w = RandomTensor({50, 20, 5, 5}, 1501);
  Tensor b = RandomTensor({50}, 1502);
  Conv2dParams p;
  Tensor y = Conv2d(x, w, &b, p, true);
  Tensor dy = RandomTensor(y.shape(), 1503);
  Tensor dw = Tensor::Empty(w.shape()), db = Tensor::Empty({50});
  Tensor lx = RandomTensor({8, 30}, 1504), lw = RandomTensor({9, 30}, 1505);
  Tensor ldx = Tensor::Empty(lx.shape()), ldw = Tensor::Empty(lw.shape());
  auto step = [&] {
    Conv2d(x, w, &b, p, true);
    Conv2dBackwardData(dy, w, x.shape(), p);
    Conv2dBackwardWeights(x, dy, p, &dw, &db);
    Linear(lx, lw, nullptr, true);
    LinearBackward(lx, lw, Linear(lx, lw, nullptr, true), &ldx, &ldw, nullptr);
    // Overlapping windows with padding: the oneDNN pooling path.
    Tensor py = AvgPool2d(x, Pool2dParams{3, 2, 1});
    AvgPool2dBackward(py, x.shape(), Pool2dParams{3, 2, 1});
    Tensor rm = Tensor::Zeros({20}), rv = Tensor::Full({20}, 1.0f), sm, si;
    Tensor gamma = Tensor::Full({20}, 1.0f), beta = Tensor::Zeros({20});
    Tensor bn = BatchNormTrain(x, gamma, beta, 0.1f, 1e-5f, &rm, &rv, &sm, &si);
    Tensor bdx = Tensor::Empty(x.shape());
    BatchNormBackward(x, bn, gamma, sm, si, &bdx, nullptr, nullptr);
    BatchNormInference(x, gamma, beta, rm, rv, 1e-5f);
  };
  step();
  const cpu::DnnlCacheStats before = cpu::GetDnnlCacheStats();
  const int64_t size_before = cpu::DnnlThreadCacheSize();
  for (int i = 0; i < 3; ++i) step();
  const cpu::DnnlCacheStats after = cpu::GetDnnlCacheStats();
  EXPECT_EQ(cpu::DnnlThreadCacheSize(), size_before);
  EXPECT_EQ(after.created, before.created);
  EXPECT_EQ(after.reused - before.reused, 3 * 12);
  // A new shape is a new entry.
  Conv2d(RandomTensor({7, 20, 13, 13}, 1506), w, &b, p, true);
  EXPECT_EQ(cpu::DnnlThreadCacheSize(), size_before + 1);
  EXPECT_EQ(cpu::GetDnnlCacheStats().created, after.created + 1);
}

TEST(DnnlCacheTest, SecondCallIsFaster) {
  // The first call builds (JIT-compiles) the primitive; later calls only
  // execute it.
  Tensor x = RandomTensor({2, 13, 11, 9}, 1600);
  Tensor w = RandomTensor({21, 13, 3, 3}, 1601);
  Conv2dParams p{1, 1};
  auto time = [&] {
    auto t0 = std::chrono::steady_clock::now();
    Conv2d(x, w, nullptr, p);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double first = time();
  double best = 1e9;
  for (int i = 0; i < 5; ++i) best = std::min(best, time());
  EXPECT_LT(best, first) << "first " << first << " s, best later " << best << " s";
}

TEST(DnnlThreadTest, ConcurrentCallsWithDifferentShapes) {
  struct Work {
    Tensor x, w, b, ref, lx, lw, lref;
    Conv2dParams p;
  };
  auto make = [](ConvCase cc, int64_t ln, int64_t lk, int64_t lm, uint64_t seed) {
    Work wk;
    wk.x = RandomTensor({cc.n, cc.c, cc.h, cc.w}, seed);
    wk.w = RandomTensor({cc.o, cc.c, cc.k, cc.k}, seed + 1);
    wk.b = RandomTensor({cc.o}, seed + 2);
    wk.p = Conv2dParams{cc.stride, cc.pad};
    wk.ref = ReluRef(RefConv(wk.x, wk.w, &wk.b, cc.stride, cc.pad));
    wk.lx = RandomTensor({ln, lk}, seed + 3);
    wk.lw = RandomTensor({lm, lk}, seed + 4);
    wk.lref = RefLinear(wk.lx, wk.lw, nullptr);
    return wk;
  };
  std::vector<Work> work = {make({4, 20, 13, 13, 50, 5, 1, 0}, 64, 100, 30, 1700),
                            make({3, 32, 10, 12, 40, 3, 2, 1}, 17, 50, 70, 1710)};
  std::vector<int> failures(work.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < work.size(); ++t) {
    threads.emplace_back([&, t] {
      SetCpuThreads(1 + static_cast<int>(t));
      const Work& wk = work[t];
      for (int i = 0; i < 20; ++i) {
        Tensor y = Conv2d(wk.x, wk.w, &wk.b, wk.p, true);
        Tensor ly = Linear(wk.lx, wk.lw, nullptr);
        if (!TensorsNear(y, wk.ref, 1e-4, 1e-4)) ++failures[t];
        if (!TensorsNear(ly, wk.lref, 1e-4, 1e-4)) ++failures[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (size_t t = 0; t < work.size(); ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST(DnnlKernelsDeathTest, RejectsNonF32AndBadShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor x16 = Tensor::Zeros({1, 2, 4, 4}, DType::kF16);
  Tensor w16 = Tensor::Zeros({3, 2, 3, 3}, DType::kF16);
  EXPECT_DEATH(Conv2d(x16, w16, nullptr, Conv2dParams{}), "conv2d: x is f16.*f32 only");
  Tensor x = RandomTensor({4, 5}, 1);
  Tensor w = RandomTensor({3, 5}, 2);
  Tensor dy = RandomTensor({4, 2}, 3);
  Tensor dx = Tensor::Empty({4, 5});
  EXPECT_DEATH(LinearBackward(x, w, dy, &dx, nullptr, nullptr), "linear_backward: x");
  Tensor cx = RandomTensor({1, 2, 4, 4}, 4);
  Tensor cw = RandomTensor({3, 2, 3, 3}, 5);
  Tensor bad_dy = RandomTensor({1, 3, 3, 3}, 6);
  EXPECT_DEATH(Conv2dBackwardData(bad_dy, cw, cx.shape(), Conv2dParams{}),
               "conv2d_backward_data: dy is \\[1, 3, 3, 3\\], want \\[1, 3, 2, 2\\]");
}

}  // namespace
}  // namespace ops
}  // namespace dtrain
