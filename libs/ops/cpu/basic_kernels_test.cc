// Tests of the CPU kernels in basic_kernels.cc: each op against a naive
// reference written here, backward ops against finite differences, Philox
// against the Random123 known answers.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "libs/ops/cpu/philox.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"
#include "libs/ops/testing/gradcheck.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace ops {
namespace {

using ::dtrain::ops::testing::NumericGradient;
using ::dtrain::ops::testing::RandomTensor;
using ::dtrain::ops::testing::TensorsNear;

// Sizes around the kernels' parallel threshold (32768) and vector widths.
const int64_t kSizes[] = {0, 1, 7, 8, 1000, 32767, 32768, 33333, 100003};

template <typename Fn>
Fn* Kernel(const char* op) {
  void* fn = KernelRegistry::Global().Find(op, DeviceType::kCPU);
  EXPECT_NE(fn, nullptr) << op;
  return reinterpret_cast<Fn*>(fn);
}

std::vector<float> Vec(const Tensor& t) { return t.ToVector<float>(); }

Tensor FromVec(const std::vector<float>& v, const Shape& shape) {
  return Tensor::FromVector<float>(v, shape);
}

class BasicKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuThreads(2); }
};

// ---- elementwise ----

TEST_F(BasicKernelsTest, ReluMatchesReference) {
  for (int64_t n : kSizes) {
    Tensor x = RandomTensor({n}, 1 + n);
    std::vector<float> xv = Vec(x), ref(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) ref[i] = xv[i] > 0 ? xv[i] : 0.0f;
    EXPECT_TRUE(TensorsNear(Relu(x), FromVec(ref, {n}), 0, 0, "relu n=" + std::to_string(n)));
  }
  Tensor nan = FromVec({std::nanf(""), -1.0f, 2.0f}, {3});
  std::vector<float> y = Vec(Relu(nan));
  EXPECT_TRUE(std::isnan(y[0]));  // as torch.relu
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 2.0f);
}

TEST_F(BasicKernelsTest, ReluInPlace) {
  Tensor x = RandomTensor({50001}, 3);
  std::vector<float> xv = Vec(x);
  Kernel<ReluFn>("relu")(x, &x);
  std::vector<float> y = Vec(x);
  for (size_t i = 0; i < xv.size(); ++i) ASSERT_EQ(y[i], std::max(xv[i], 0.0f)) << i;
}

TEST_F(BasicKernelsTest, ReluBackwardMatchesReferenceAndNumericGradient) {
  for (int64_t n : kSizes) {
    Tensor y = Relu(RandomTensor({n}, 10 + n));
    Tensor dy = RandomTensor({n}, 20 + n);
    std::vector<float> yv = Vec(y), dyv = Vec(dy), ref(yv.size());
    for (size_t i = 0; i < yv.size(); ++i) ref[i] = yv[i] > 0 ? dyv[i] : 0.0f;
    EXPECT_TRUE(TensorsNear(ReluBackward(y, dy), FromVec(ref, {n}), 0, 0, "relu_backward"));
  }
  // Finite differences, away from the kink at 0.
  Tensor x = RandomTensor({3, 37}, 5);
  for (int64_t i = 0; i < x.numel(); ++i) {
    float& v = x.data<float>()[i];
    if (std::fabs(v) < 0.05f) v += v < 0 ? -0.05f : 0.05f;
  }
  Tensor dy = RandomTensor({3, 37}, 6);
  Tensor num = NumericGradient([](const Tensor& t) { return Relu(t); }, x, dy);
  EXPECT_TRUE(TensorsNear(ReluBackward(Relu(x), dy), num, 1e-3, 1e-3, "relu grad"));
}

TEST_F(BasicKernelsTest, AddAxpyScaleMatchReference) {
  for (int64_t n : kSizes) {
    Tensor a = RandomTensor({n}, 100 + n), b = RandomTensor({n}, 200 + n);
    std::vector<float> av = Vec(a), bv = Vec(b), sum(av.size()), axpy(av.size()), scale(av.size());
    for (size_t i = 0; i < av.size(); ++i) {
      sum[i] = av[i] + bv[i];
      axpy[i] = bv[i] + 0.37f * av[i];
      scale[i] = -2.5f * av[i];
    }
    std::string what = " n=" + std::to_string(n);
    EXPECT_TRUE(TensorsNear(Add(a, b), FromVec(sum, {n}), 0, 0, "add" + what));
    Tensor y = b.Clone();
    Axpy(0.37f, a, &y);
    EXPECT_TRUE(TensorsNear(y, FromVec(axpy, {n}), 1e-6, 1e-7, "axpy" + what));
    EXPECT_TRUE(TensorsNear(Scale(a, -2.5f), FromVec(scale, {n}), 0, 0, "scale" + what));

    // Outputs aliasing inputs, as ops.h allows.
    Tensor c = a.Clone();
    Kernel<AddFn>("add")(c, b, &c);
    EXPECT_TRUE(TensorsNear(c, FromVec(sum, {n}), 0, 0, "add c=a" + what));
    c = b.Clone();
    Kernel<AddFn>("add")(a, c, &c);
    EXPECT_TRUE(TensorsNear(c, FromVec(sum, {n}), 0, 0, "add c=b" + what));
    c = a.Clone();
    Kernel<ScaleFn>("scale")(c, -2.5f, &c);
    EXPECT_TRUE(TensorsNear(c, FromVec(scale, {n}), 0, 0, "scale y=x" + what));
  }
}

TEST_F(BasicKernelsTest, AddShapeMismatchIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor a = Tensor::Zeros({2, 3}), b = Tensor::Zeros({3, 2}), c = Tensor::Zeros({2, 3});
  EXPECT_DEATH(Kernel<AddFn>("add")(a, b, &c), "add: a f32\\[2, 3\\].*differ in shape");
}

// ---- max pooling ----

struct PoolCase {
  Shape x;
  int kernel, stride, padding;
};

// Naive max pooling: scans the padded window, skipping padded cells; strict
// '>' keeps the first maximum.
void NaiveMaxPool(const Tensor& x, const Pool2dParams& p, std::vector<float>* y,
                  std::vector<int32_t>* idx) {
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  int64_t Ho = ConvOutSize(H, p.kernel, p.stride, p.padding);
  int64_t Wo = ConvOutSize(W, p.kernel, p.stride, p.padding);
  std::vector<float> xv = Vec(x);
  y->assign(N * C * Ho * Wo, 0);
  idx->assign(N * C * Ho * Wo, -1);
  for (int64_t nc = 0; nc < N * C; ++nc) {
    for (int64_t oh = 0; oh < Ho; ++oh) {
      for (int64_t ow = 0; ow < Wo; ++ow) {
        bool found = false;
        float best = 0;
        int32_t bi = -1;
        for (int kh = 0; kh < p.kernel; ++kh) {
          for (int kw = 0; kw < p.kernel; ++kw) {
            int64_t h = oh * p.stride - p.padding + kh, w = ow * p.stride - p.padding + kw;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            float v = xv[nc * H * W + h * W + w];
            if (!found || v > best) {
              found = true;
              best = v;
              bi = static_cast<int32_t>(h * W + w);
            }
          }
        }
        (*y)[nc * Ho * Wo + oh * Wo + ow] = best;
        (*idx)[nc * Ho * Wo + oh * Wo + ow] = bi;
      }
    }
  }
}

// Covers the specialized (kernel, stride) pairs (2,2), (3,2), (3,1), (2,1),
// the generic path, tiled backward (stride == kernel, no padding) with rows
// and columns left over, padding, and an empty batch.
const PoolCase kPoolCases[] = {
    {{2, 3, 8, 8}, 2, 2, 0},    {{2, 3, 7, 9}, 2, 2, 0},   {{2, 3, 9, 7}, 3, 2, 1},
    {{3, 4, 11, 13}, 3, 2, 0},  {{1, 2, 6, 5}, 3, 1, 1},   {{2, 2, 7, 7}, 2, 1, 0},
    {{1, 1, 5, 5}, 5, 1, 2},    {{2, 2, 10, 11}, 3, 3, 0}, {{2, 2, 9, 9}, 4, 3, 1},
    {{1, 2, 9, 9}, 4, 4, 2},    {{2, 2, 3, 40}, 2, 2, 1},  {{64, 6, 24, 24}, 2, 2, 0},
    {{8, 16, 17, 15}, 3, 2, 1}, {{0, 3, 8, 8}, 2, 2, 0},   {{2, 2, 4, 1}, 3, 2, 1},
    {{1, 1, 1, 1}, 2, 1, 1},    {{1, 2, 2, 2}, 4, 2, 2},
};

TEST_F(BasicKernelsTest, MaxPool2dMatchesReference) {
  int seed = 0;
  for (const PoolCase& c : kPoolCases) {
    Pool2dParams p{c.kernel, c.stride, c.padding};
    Tensor x = RandomTensor(c.x, ++seed);
    // Coarse values: plenty of ties inside windows.
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data<float>()[i] = std::round(x.data<float>()[i] * 3.0f);
    }
    std::vector<float> ref;
    std::vector<int32_t> ref_idx;
    NaiveMaxPool(x, p, &ref, &ref_idx);
    Tensor idx;
    Tensor y = MaxPool2d(x, p, &idx);
    std::string what = "max_pool2d " + ShapeToString(c.x) + " k" + std::to_string(c.kernel) + " s" +
                       std::to_string(c.stride) + " p" + std::to_string(c.padding);
    EXPECT_TRUE(TensorsNear(y, FromVec(ref, y.shape()), 0, 0, what));
    EXPECT_EQ(idx.ToVector<int32_t>(), ref_idx) << what;
  }
}

TEST_F(BasicKernelsTest, MaxPool2dPaddingNeverWinsAndTiesPickFirst) {
  // All inputs negative: a padded cell counted as 0 would win.
  Tensor x = Tensor::Full({1, 1, 4, 4}, -3.0f);
  Tensor idx;
  Tensor y = MaxPool2d(x, Pool2dParams{3, 2, 1}, &idx);
  for (float v : Vec(y)) EXPECT_EQ(v, -3.0f);
  // All equal: the first valid cell of each window (row-major).
  EXPECT_EQ(idx.ToVector<int32_t>(), (std::vector<int32_t>{0, 1, 4, 5}));
  Tensor y2 = MaxPool2d(x, Pool2dParams{2, 2, 0}, &idx);
  EXPECT_EQ(idx.ToVector<int32_t>(), (std::vector<int32_t>{0, 2, 8, 10}));
}

TEST_F(BasicKernelsTest, MaxPool2dWindowLargerThanInputIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor x = Tensor::Zeros({1, 1, 4, 1}), y = Tensor::Empty({1, 1, 2, 1}),
         idx = Tensor::Empty({1, 1, 2, 1}, DType::kI32);
  EXPECT_DEATH(Kernel<MaxPool2dFn>("max_pool2d")(x, Pool2dParams{2, 2, 0}, &y, &idx),
               "max_pool2d: x f32\\[1, 1, 4, 1\\] cpu is smaller than the window");
}

TEST_F(BasicKernelsTest, MaxPool2dBackwardMatchesNumericGradient) {
  const PoolCase cases[] = {{{2, 2, 6, 6}, 2, 2, 0},  {{1, 2, 7, 5}, 3, 2, 1},
                            {{1, 1, 6, 6}, 3, 1, 1},  {{1, 2, 7, 9}, 2, 2, 0},
                            {{1, 1, 9, 10}, 3, 3, 0}, {{1, 1, 7, 7}, 4, 3, 1}};
  int seed = 40;
  for (const PoolCase& c : cases) {
    Pool2dParams p{c.kernel, c.stride, c.padding};
    // Distinct values 0.1 apart (no near-ties for the finite differences).
    int64_t n = NumElements(c.x);
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), 0.0f);
    std::shuffle(v.begin(), v.end(), std::mt19937(++seed));
    for (float& f : v) f = f * 0.1f - 1.0f;
    Tensor x = FromVec(v, c.x);
    Tensor idx;
    Tensor y = MaxPool2d(x, p, &idx);
    Tensor dy = RandomTensor(y.shape(), ++seed);
    Tensor dx = MaxPool2dBackward(dy, idx, c.x, p);
    Tensor num = NumericGradient(
        [&](const Tensor& t) {
          Tensor i;
          return MaxPool2d(t, p, &i);
        },
        x, dy);
    EXPECT_TRUE(TensorsNear(dx, num, 1e-3, 1e-3, "max_pool2d grad " + ShapeToString(c.x)));
  }
}

TEST_F(BasicKernelsTest, MaxPool2dBackwardScatterMatchesReference) {
  for (const PoolCase& c : kPoolCases) {
    Pool2dParams p{c.kernel, c.stride, c.padding};
    Tensor x = RandomTensor(c.x, 77);
    Tensor idx;
    Tensor y = MaxPool2d(x, p, &idx);
    Tensor dy = RandomTensor(y.shape(), 78);
    std::vector<float> dyv = Vec(dy), ref(x.numel(), 0.0f);
    std::vector<int32_t> iv = idx.ToVector<int32_t>();
    int64_t HW = c.x[2] * c.x[3], HWo = y.dim(2) * y.dim(3);
    for (int64_t o = 0; o < y.numel(); ++o) ref[o / HWo * HW + iv[o]] += dyv[o];
    EXPECT_TRUE(TensorsNear(MaxPool2dBackward(dy, idx, c.x, p), FromVec(ref, c.x), 1e-6, 1e-6,
                            "max_pool2d_backward " + ShapeToString(c.x)));
  }
}

// ---- global average pooling ----

TEST_F(BasicKernelsTest, GlobalAvgPoolForwardAndBackward) {
  const Shape shapes[] = {{2, 3, 4, 5}, {1, 1, 1, 1}, {32, 64, 7, 7}, {0, 4, 3, 3}, {3, 2, 17, 13}};
  int seed = 90;
  for (const Shape& s : shapes) {
    Tensor x = RandomTensor(s, ++seed);
    std::vector<float> xv = Vec(x), ref(s[0] * s[1]);
    int64_t HW = s[2] * s[3];
    for (size_t p = 0; p < ref.size(); ++p) {
      double acc = 0;
      for (int64_t i = 0; i < HW; ++i) acc += xv[p * HW + i];
      ref[p] = static_cast<float>(acc / HW);
    }
    EXPECT_TRUE(TensorsNear(GlobalAvgPool(x), FromVec(ref, {s[0], s[1], 1, 1}), 1e-6, 1e-7,
                            "global_avg_pool " + ShapeToString(s)));
    Tensor dy = RandomTensor({s[0], s[1], 1, 1}, ++seed);
    std::vector<float> dyv = Vec(dy), dref(x.numel());
    for (int64_t i = 0; i < x.numel(); ++i) dref[i] = dyv[i / HW] / static_cast<float>(HW);
    EXPECT_TRUE(TensorsNear(GlobalAvgPoolBackward(dy, s), FromVec(dref, s), 1e-6, 0,
                            "global_avg_pool_backward " + ShapeToString(s)));
  }
  Tensor x = RandomTensor({2, 3, 3, 4}, 7);
  Tensor dy = RandomTensor({2, 3, 1, 1}, 8);
  Tensor num = NumericGradient([](const Tensor& t) { return GlobalAvgPool(t); }, x, dy);
  EXPECT_TRUE(
      TensorsNear(GlobalAvgPoolBackward(dy, x.shape()), num, 1e-3, 1e-4, "global_avg_pool grad"));
}

// ---- softmax cross-entropy ----

Tensor Labels(int64_t n, int64_t c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& l : v) l = static_cast<int32_t>(rng() % c);
  return Tensor::FromVector<int32_t>(v, {n});
}

// Reference loss and gradient in double.
double NaiveCrossEntropy(const Tensor& logits, const Tensor& labels, std::vector<float>* grad) {
  int64_t N = logits.dim(0), C = logits.dim(1);
  std::vector<float> x = Vec(logits);
  std::vector<int32_t> l = labels.ToVector<int32_t>();
  grad->assign(N * C, 0);
  double total = 0;
  for (int64_t r = 0; r < N; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < C; ++j) m = std::max(m, static_cast<double>(x[r * C + j]));
    double z = 0;
    for (int64_t j = 0; j < C; ++j) z += std::exp(x[r * C + j] - m);
    total += m + std::log(z) - x[r * C + l[r]];
    for (int64_t j = 0; j < C; ++j) {
      double p = std::exp(x[r * C + j] - m) / z;
      (*grad)[r * C + j] = static_cast<float>((p - (j == l[r] ? 1.0 : 0.0)) / N);
    }
  }
  return total / N;
}

TEST_F(BasicKernelsTest, SoftmaxCrossEntropyMatchesReference) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {4, 10},    {64, 10},
                                                {7, 3}, {5000, 13}, {300, 1000}};
  uint32_t seed = 300;
  for (auto [n, c] : shapes) {
    Tensor logits = RandomTensor({n, c}, ++seed, -5.0f, 5.0f);
    Tensor labels = Labels(n, c, ++seed);
    std::vector<float> ref_grad;
    double ref = NaiveCrossEntropy(logits, labels, &ref_grad);
    Tensor dlogits;
    float loss = ScalarValue(SoftmaxCrossEntropy(logits, labels, &dlogits));
    std::string what =
        "softmax_cross_entropy [" + std::to_string(n) + ", " + std::to_string(c) + "]";
    EXPECT_NEAR(loss, ref, 1e-5 * std::fabs(ref) + 1e-6) << what;
    EXPECT_TRUE(TensorsNear(dlogits, FromVec(ref_grad, {n, c}), 1e-5, 1e-7, what));
    // Without dlogits: same loss.
    EXPECT_EQ(ScalarValue(SoftmaxCrossEntropy(logits, labels, nullptr)), loss) << what;
  }
}

TEST_F(BasicKernelsTest, SoftmaxCrossEntropyGradientMatchesNumeric) {
  Tensor logits = RandomTensor({5, 7}, 11, -2.0f, 2.0f);
  Tensor labels = Labels(5, 7, 12);
  Tensor dlogits;
  SoftmaxCrossEntropy(logits, labels, &dlogits);
  Tensor one = Tensor::Full({}, 1.0f);
  Tensor num = NumericGradient(
      [&](const Tensor& t) { return SoftmaxCrossEntropy(t, labels, nullptr); }, logits, one, 1e-2);
  EXPECT_TRUE(TensorsNear(dlogits, num, 1e-2, 2e-4, "softmax_cross_entropy grad"));
}

TEST_F(BasicKernelsTest, SoftmaxCrossEntropyIsStableForHugeLogits) {
  Tensor small = RandomTensor({16, 10}, 21, -3.0f, 3.0f);
  Tensor labels = Labels(16, 10, 22);
  Tensor big = small.Clone();
  for (int64_t i = 0; i < big.numel(); ++i) big.data<float>()[i] += 1e4f;
  Tensor d_small, d_big;
  float l_small = ScalarValue(SoftmaxCrossEntropy(small, labels, &d_small));
  float l_big = ScalarValue(SoftmaxCrossEntropy(big, labels, &d_big));
  ASSERT_TRUE(std::isfinite(l_big));
  // Shift invariance, up to f32 spacing at 1e4 (~1e-3) in the inputs.
  EXPECT_NEAR(l_big, l_small, 5e-3);
  EXPECT_TRUE(TensorsNear(d_big, d_small, 1e-2, 1e-3, "dlogits at 1e4"));
  // A confidently right row: loss ~0, not NaN; a confidently wrong one: ~1e4.
  Tensor x = FromVec({1e4f, -1e4f, 0.0f, -1e4f, 1e4f, 0.0f}, {2, 3});
  Tensor l = Tensor::FromVector<int32_t>({0, 0}, {2});
  Tensor d;
  float loss = ScalarValue(SoftmaxCrossEntropy(x, l, &d));
  EXPECT_NEAR(loss, 0.5 * 2e4, 1.0);
  for (float g : Vec(d)) EXPECT_TRUE(std::isfinite(g));
}

TEST_F(BasicKernelsTest, SoftmaxCrossEntropyEmptyBatchIsNaN) {
  Tensor d;
  Tensor loss = SoftmaxCrossEntropy(Tensor::Zeros({0, 10}), Tensor::Zeros({0}, DType::kI32), &d);
  EXPECT_TRUE(std::isnan(ScalarValue(loss)));
  EXPECT_EQ(d.numel(), 0);
}

TEST_F(BasicKernelsTest, LabelOutOfRangeIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor logits = Tensor::Zeros({4, 10});
  Tensor bad = Tensor::FromVector<int32_t>({1, 2, 10, 3}, {4});
  EXPECT_DEATH(SoftmaxCrossEntropy(logits, bad, nullptr),
               "softmax_cross_entropy: label 10 of row 2 is outside \\[0, 10\\)");
  Tensor neg = Tensor::FromVector<int32_t>({1, -1, 0, 3}, {4});
  EXPECT_DEATH(SoftmaxCrossEntropy(logits, neg, nullptr), "label -1 of row 1");
  EXPECT_DEATH(CountCorrect(logits, bad), "count_correct: label 10 of row 2");
}

// ---- argmax / count_correct ----

TEST_F(BasicKernelsTest, ArgmaxAndCountCorrect) {
  Tensor x = FromVec({1, 3, 3, 0,  // tie: first
                      5, 5, 5, 5,  // all equal: 0
                      -1, -2, -3, -0.5f, 0, 0, 0, 1},
                     {4, 4});
  EXPECT_EQ(Argmax(x).ToVector<int32_t>(), (std::vector<int32_t>{1, 0, 3, 3}));
  EXPECT_EQ(CountCorrect(x, Tensor::FromVector<int32_t>({1, 0, 3, 2}, {4})), 3);
  EXPECT_EQ(CountCorrect(x, Tensor::FromVector<int32_t>({2, 1, 0, 2}, {4})), 0);

  for (auto [n, c] : {std::pair<int64_t, int64_t>{0, 10}, {1, 1}, {1000, 10}, {20001, 7}}) {
    Tensor logits = RandomTensor({n, c}, 5 + n);
    for (int64_t i = 0; i < logits.numel(); ++i) {  // coarse: many ties
      logits.data<float>()[i] = std::round(logits.data<float>()[i] * 4);
    }
    Tensor labels = Labels(n, c, 9);
    std::vector<float> xv = Vec(logits);
    std::vector<int32_t> lv = labels.ToVector<int32_t>(), ref(n);
    int64_t correct = 0;
    for (int64_t r = 0; r < n; ++r) {
      ref[r] = static_cast<int32_t>(std::max_element(xv.begin() + r * c, xv.begin() + (r + 1) * c) -
                                    (xv.begin() + r * c));
      correct += ref[r] == lv[r];
    }
    EXPECT_EQ(Argmax(logits).ToVector<int32_t>(), ref) << n << "x" << c;
    EXPECT_EQ(CountCorrect(logits, labels), correct) << n << "x" << c;
  }
}

// ---- sum ----

TEST_F(BasicKernelsTest, SumMatchesDoubleReference) {
  for (int64_t n : kSizes) {
    Tensor x = RandomTensor({n}, 400 + n);
    std::vector<float> xv = Vec(x);
    double ref = 0;
    for (float v : xv) ref += v;
    EXPECT_NEAR(ScalarValue(Sum(x)), ref, 1e-6 * std::fabs(ref) + 1e-6) << n;
  }
  // Millions of ones: a float accumulator would stall at 2^24.
  const int64_t n = 20000003;
  EXPECT_EQ(ScalarValue(Sum(Tensor::Full({n}, 1.0f))), static_cast<float>(n));
  // Millions of mixed values: matches the double sum to f32 rounding, and
  // does not depend on the thread count.
  Tensor x = RandomTensor({3000017}, 4, 0.0f, 1.0f);
  std::vector<float> xv = Vec(x);
  double ref = 0;
  for (float v : xv) ref += v;
  float s2 = ScalarValue(Sum(x));
  EXPECT_EQ(s2, static_cast<float>(ref));
  SetCpuThreads(1);
  EXPECT_EQ(ScalarValue(Sum(x)), s2);
  SetCpuThreads(3);
  EXPECT_EQ(ScalarValue(Sum(x)), s2);
}

// ---- SGD ----

// torch.optim.SGD.step (dampening 0), written out per element.
void ReferenceSgdStep(std::vector<float>* w, const std::vector<float>& grad,
                      std::vector<float>* buf, bool* first, const SgdParams& p) {
  for (size_t i = 0; i < w->size(); ++i) {
    float d = grad[i];
    if (p.weight_decay != 0) d = d + p.weight_decay * (*w)[i];
    if (p.momentum != 0) {
      (*buf)[i] = *first ? d : p.momentum * (*buf)[i] + d;
      d = p.nesterov ? d + p.momentum * (*buf)[i] : (*buf)[i];
    }
    (*w)[i] = (*w)[i] - p.lr * d;
  }
  *first = false;
}

TEST_F(BasicKernelsTest, SgdMatchesPyTorchFormulaOverThreeSteps) {
  const SgdParams cases[] = {
      {0.1f, 0.0f, 0.0f, false},  {0.05f, 0.0f, 1e-2f, false}, {0.1f, 0.9f, 0.0f, false},
      {0.1f, 0.9f, 5e-4f, false}, {0.02f, 0.9f, 1e-2f, true},  {0.1f, 0.5f, 0.0f, true},
  };
  for (const SgdParams& p : cases) {
    for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{100003}}) {
      Tensor w = RandomTensor({n}, 500 + n);
      Tensor buf = Tensor::Zeros({n});
      std::vector<float> rw = Vec(w), rbuf(n);
      bool first = true;
      for (int step = 0; step < 3; ++step) {
        Tensor g = RandomTensor({n}, 600 + step);
        SgdUpdate(&w, g, p.momentum != 0 ? &buf : nullptr, p);
        ReferenceSgdStep(&rw, Vec(g), &rbuf, &first, p);
      }
      std::string what = "sgd lr " + std::to_string(p.lr) + " momentum " +
                         std::to_string(p.momentum) + " wd " + std::to_string(p.weight_decay) +
                         (p.nesterov ? " nesterov" : "") + " n=" + std::to_string(n);
      EXPECT_TRUE(TensorsNear(w, FromVec(rw, {n}), 1e-6, 1e-7, what));
      if (p.momentum != 0) {
        EXPECT_TRUE(TensorsNear(buf, FromVec(rbuf, {n}), 1e-6, 1e-7, what + " buf"));
      }
    }
  }
}

TEST_F(BasicKernelsTest, SgdHandComputedValues) {
  // One element, momentum 0.9, weight decay 0.1, lr 0.5:
  // step 1: g = 1 + 0.1*2 = 1.2, buf = 1.2, w = 2 - 0.6 = 1.4
  // step 2: g = 1 + 0.14 = 1.14, buf = 1.08 + 1.14 = 2.22, w = 1.4 - 1.11 = 0.29
  Tensor w = FromVec({2.0f}, {1}), buf = Tensor::Zeros({1}), g = FromVec({1.0f}, {1});
  SgdParams p{0.5f, 0.9f, 0.1f, false};
  SgdUpdate(&w, g, &buf, p);
  EXPECT_NEAR(Vec(w)[0], 1.4f, 1e-6);
  SgdUpdate(&w, g, &buf, p);
  EXPECT_NEAR(Vec(buf)[0], 2.22f, 1e-6);
  EXPECT_NEAR(Vec(w)[0], 0.29f, 1e-6);
  // Nesterov, step 1: g = 1.2, buf = 1.2, d = 1.2 + 0.9*1.2 = 2.28, w = 2 - 1.14.
  w = FromVec({2.0f}, {1});
  buf = Tensor::Zeros({1});
  SgdUpdate(&w, g, &buf, SgdParams{0.5f, 0.9f, 0.1f, true});
  EXPECT_NEAR(Vec(w)[0], 0.86f, 1e-6);
}

TEST_F(BasicKernelsTest, SgdMomentumWithoutBufferIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor w = Tensor::Zeros({3}), g = Tensor::Zeros({3});
  EXPECT_DEATH(SgdUpdate(&w, g, nullptr, SgdParams{0.1f, 0.9f, 0.0f, false}),
               "sgd_update: momentum 0.9 without a momentum buffer");
}

// ---- fill ----

TEST_F(BasicKernelsTest, FillEveryDType) {
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{70001}}) {
    Tensor t = Tensor::Empty({n});
    Fill(&t, 2.5f);
    for (float v : Vec(t)) ASSERT_EQ(v, 2.5f);
    Tensor h = Tensor::Empty({n}, DType::kF16);
    Fill(&h, 0.1f);
    for (float v : h.ToVector<float>()) ASSERT_EQ(v, HalfToFloat(FloatToHalf(0.1f)));
    Tensor b = Tensor::Empty({n}, DType::kBF16);
    Fill(&b, -3.3f);
    for (float v : b.ToVector<float>()) ASSERT_EQ(v, BFloat16ToFloat(FloatToBFloat16(-3.3f)));
    Tensor i = Tensor::Empty({n}, DType::kI32);
    Fill(&i, -7.0f);
    for (int32_t v : i.ToVector<int32_t>()) ASSERT_EQ(v, -7);
    Tensor l = Tensor::Empty({n}, DType::kI64);
    Fill(&l, 3e9f);
    for (int64_t v : l.ToVector<int64_t>()) ASSERT_EQ(v, int64_t{3000000000});
    Tensor u = Tensor::Empty({n}, DType::kU8);
    Fill(&u, 200.0f);
    for (uint8_t v : u.ToVector<uint8_t>()) ASSERT_EQ(v, 200);
  }
}

// ---- Philox ----

TEST(PhiloxTest, Random123KnownAnswers) {
  using cpu::Philox4x32;
  using cpu::Philox4x32_10;
  struct Kat {
    Philox4x32 ctr;
    uint32_t k0, k1;
    Philox4x32 expect;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    Philox4x32 out = Philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], k.expect.v[i]) << std::hex << k.k0 << " " << i;
  }
  // PhiloxBlock: key from the seed, counter from the block number.
  Philox4x32 b = cpu::PhiloxBlock(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull);
  Philox4x32 e = Philox4x32_10({{0x243f6a88, 0x85a308d3, 0, 0}}, 0xa4093822, 0x299f31d0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.v[i], e.v[i]);
}

// The random ops' streams, recomputed from the documented layout.
float RefUniform(uint64_t seed, uint64_t j) {
  return cpu::BitsToUniform(cpu::PhiloxBlock(seed, j / 4).v[j % 4]);
}

double RefNormal(uint64_t seed, uint64_t j) {
  cpu::Philox4x32 o = cpu::PhiloxBlock(seed, j / 4);
  int pair = static_cast<int>(j % 4) / 2 * 2;
  double u1 = ((o.v[pair] >> 8) + 1.0) / 16777216.0;
  double u2 = (o.v[pair + 1] >> 8) / 16777216.0;
  double r = std::sqrt(-2.0 * std::log(u1));
  return j % 2 == 0 ? r * std::cos(2 * M_PI * u2) : r * std::sin(2 * M_PI * u2);
}

TEST_F(BasicKernelsTest, RandomUniformFollowsPhiloxStream) {
  // Seed 0, offset 0: the first Random123 known answer, top 24 bits.
  Tensor t = Tensor::Empty({4});
  RandomUniform(&t, 0.0f, 1.0f, 0, 0);
  const uint32_t kat[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Vec(t)[i], (kat[i] >> 8) / 16777216.0f) << i;

  for (uint64_t offset : {0ull, 1ull, 3ull, 4ull, 1001ull, (1ull << 34) + 2}) {
    const uint64_t seed = 0x123456789abcdefull;
    Tensor u = Tensor::Empty({2, 517});
    RandomUniform(&u, -2.0f, 3.0f, seed, offset);
    std::vector<float> uv = Vec(u);
    for (size_t i = 0; i < uv.size(); ++i) {
      ASSERT_EQ(uv[i], -2.0f + 5.0f * RefUniform(seed, offset + i)) << offset << " " << i;
    }
  }
}

TEST_F(BasicKernelsTest, RandomNormalFollowsDocumentedPairing) {
  const uint64_t seed = 42;
  for (uint64_t offset : {0ull, 1ull, 2ull, 3ull, 77ull}) {
    Tensor t = Tensor::Empty({101});
    RandomNormal(&t, 0.0f, 1.0f, seed, offset);
    std::vector<float> v = Vec(t);
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_NEAR(v[i], RefNormal(seed, offset + i), 2e-5) << offset << " " << i;
    }
  }
}

TEST_F(BasicKernelsTest, RandomNormalStatistics) {
  const int64_t n = 1000000;
  Tensor t = Tensor::Empty({n});
  RandomNormal(&t, 2.0f, 3.0f, 1234, 0);
  std::vector<float> v = Vec(t);
  double s = 0, s2 = 0, s3 = 0, s4 = 0;
  int64_t within1 = 0;
  for (float f : v) {
    double z = (f - 2.0) / 3.0;
    s += z;
    s2 += z * z;
    s3 += z * z * z;
    s4 += z * z * z * z;
    within1 += std::fabs(z) < 1.0;
  }
  double mean = s / n, var = s2 / n - mean * mean;
  // Standard errors: mean 1e-3, variance 1.4e-3, skew 2.4e-3, kurtosis 4.9e-3.
  EXPECT_NEAR(mean, 0.0, 5e-3);
  EXPECT_NEAR(std::sqrt(var), 1.0, 5e-3);
  EXPECT_NEAR(s3 / n, 0.0, 1.5e-2);
  EXPECT_NEAR(s4 / n, 3.0, 3e-2);
  EXPECT_NEAR(static_cast<double>(within1) / n, 0.682689, 3e-3);

  Tensor u = Tensor::Empty({n});
  RandomUniform(&u, -1.0f, 3.0f, 99, 5);
  double us = 0, umin = 10, umax = -10;
  for (float f : Vec(u)) {
    us += f;
    umin = std::min<double>(umin, f);
    umax = std::max<double>(umax, f);
  }
  EXPECT_NEAR(us / n, 1.0, 1e-2);  // sd of the mean: 4/sqrt(12e6) = 1.2e-3
  EXPECT_GE(umin, -1.0);
  EXPECT_LT(umax, 3.0);
  EXPECT_GT(umax, 2.99);
}

TEST_F(BasicKernelsTest, RandomIndependentOfThreadsAndSplit) {
  const int64_t n = 1000003;
  for (bool normal : {true, false}) {
    auto gen = [normal](Tensor* t, uint64_t offset) {
      if (normal) {
        RandomNormal(t, 0.5f, 2.0f, 7, offset);
      } else {
        RandomUniform(t, -1.0f, 1.0f, 7, offset);
      }
    };
    SetCpuThreads(1);
    Tensor one = Tensor::Empty({n});
    gen(&one, 0);
    SetCpuThreads(2);
    Tensor two = Tensor::Empty({n});
    gen(&two, 0);
    SetCpuThreads(3);
    Tensor three = Tensor::Empty({n});
    gen(&three, 0);
    std::vector<float> v1 = Vec(one);
    ASSERT_EQ(v1, Vec(two)) << (normal ? "normal" : "uniform");
    ASSERT_EQ(v1, Vec(three)) << (normal ? "normal" : "uniform");
    // A tensor filled at offset k is the tail of one filled at offset 0.
    for (int64_t k : {1, 2, 3, 4, 5, 37, 40000}) {
      Tensor tail = Tensor::Empty({n - k});
      gen(&tail, static_cast<uint64_t>(k));
      std::vector<float> tv = Vec(tail);
      ASSERT_TRUE(std::equal(tv.begin(), tv.end(), v1.begin() + k))
          << (normal ? "normal" : "uniform") << " offset " << k;
    }
    // Empty tensors are fine.
    Tensor empty = Tensor::Empty({0, 3});
    gen(&empty, 3);
  }
  // Different seeds give different streams.
  Tensor a = Tensor::Empty({16}), b = Tensor::Empty({16});
  RandomNormal(&a, 0, 1, 1, 0);
  RandomNormal(&b, 0, 1, 2, 0);
  EXPECT_NE(Vec(a), Vec(b));
}

// ---- cast ----

TEST_F(BasicKernelsTest, CastHalfAndBFloat16RoundToNearestEven) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -2.5f,
                          65504.0f,
                          70000.0f,
                          1e-8f,
                          3.14159265f,
                          1.0f + std::ldexp(1.0f, -11),      // f16 tie -> even (1.0)
                          1.0f + 3 * std::ldexp(1.0f, -11),  // f16 tie -> even (up)
                          1.0f + std::ldexp(1.0f, -8),       // bf16 tie -> even (1.0)
                          1.0f + 3 * std::ldexp(1.0f, -8),
                          INFINITY,
                          -INFINITY};
  Tensor x = FromVec(v, {static_cast<int64_t>(v.size())});
  std::vector<float> h = Cast(x, DType::kF16).ToVector<float>();
  std::vector<float> b = Cast(x, DType::kBF16).ToVector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(h[i], HalfToFloat(FloatToHalf(v[i]))) << v[i];
    EXPECT_EQ(b[i], BFloat16ToFloat(FloatToBFloat16(v[i]))) << v[i];
  }
  EXPECT_EQ(h[8], 1.0f);
  EXPECT_EQ(h[9], 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(b[10], 1.0f);
  EXPECT_EQ(b[11], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isinf(h[5]));
  // NaN stays NaN.
  Tensor nan = FromVec({std::nanf("")}, {1});
  EXPECT_TRUE(std::isnan(Cast(nan, DType::kF16).ToVector<float>()[0]));
  EXPECT_TRUE(std::isnan(Cast(nan, DType::kBF16).ToVector<float>()[0]));
}

TEST_F(BasicKernelsTest, CastRoundTrips) {
  for (int64_t n : kSizes) {
    Tensor x = RandomTensor({n}, 700 + n, -100.0f, 100.0f);
    // f32 -> f16 -> f32 -> f16 is stable; f16 -> f32 -> f16 exact.
    Tensor h = Cast(x, DType::kF16);
    Tensor hf = Cast(h, DType::kF32);
    std::vector<float> xv = Vec(x), hv = Vec(hf);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hv[i], HalfToFloat(FloatToHalf(xv[i]))) << i;
    EXPECT_TRUE(TensorsNear(Cast(Cast(hf, DType::kF16), DType::kF32), hf, 0, 0, "f16 trip"));
    Tensor b = Cast(x, DType::kBF16);
    Tensor bf = Cast(b, DType::kF32);
    std::vector<float> bv = Vec(bf);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bv[i], BFloat16ToFloat(FloatToBFloat16(xv[i]))) << i;
    // f16 <-> bf16 go through f32 (one rounding).
    std::vector<float> hb = Cast(h, DType::kBF16).ToVector<float>();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hb[i], BFloat16ToFloat(FloatToBFloat16(hv[i])));

    // Integers: i32 -> f32 -> i32 exact below 2^24; u8 and i64 likewise.
    std::vector<int32_t> iv(n);
    for (int64_t i = 0; i < n; ++i) {
      iv[i] = static_cast<int32_t>((i * 2654435761u) % 33554431) - 16777215;
    }
    Tensor it = Tensor::FromVector<int32_t>(iv, {n});
    EXPECT_EQ(Cast(Cast(it, DType::kF32), DType::kI32).ToVector<int32_t>(), iv);
    EXPECT_EQ(Cast(Cast(it, DType::kI64), DType::kI32).ToVector<int32_t>(), iv);
    std::vector<uint8_t> uv(n);
    for (int64_t i = 0; i < n; ++i) uv[i] = static_cast<uint8_t>(i * 37);
    Tensor ut = Tensor::FromVector<uint8_t>(uv, {n});
    Tensor uf = Cast(ut, DType::kF32);
    std::vector<float> ufv = Vec(uf);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ufv[i], static_cast<float>(uv[i]));
    EXPECT_EQ(Cast(uf, DType::kU8).ToVector<uint8_t>(), uv);
    EXPECT_EQ(Cast(Cast(ut, DType::kF16), DType::kU8).ToVector<uint8_t>(), uv);
    EXPECT_EQ(Cast(Cast(ut, DType::kI64), DType::kU8).ToVector<uint8_t>(), uv);
  }
}

TEST_F(BasicKernelsTest, CastFloatToIntTruncatesAndSaturates) {
  Tensor x = FromVec({-1.7f, 1.7f, 255.9f, 300.0f, -5.0f, 3e9f, -3e9f, std::nanf(""), 1e20f}, {9});
  EXPECT_EQ(
      Cast(x, DType::kI32).ToVector<int32_t>(),
      (std::vector<int32_t>{-1, 1, 255, 300, -5, 2147483647, -2147483647 - 1, 0, 2147483647}));
  EXPECT_EQ(Cast(x, DType::kU8).ToVector<uint8_t>(),
            (std::vector<uint8_t>{0, 1, 255, 255, 0, 255, 0, 0, 255}));
  std::vector<int64_t> l = Cast(x, DType::kI64).ToVector<int64_t>();
  EXPECT_EQ(l[5], 3000000000);
  EXPECT_EQ(l[8], std::numeric_limits<int64_t>::max());
  // Integer narrowing wraps.
  Tensor big = Tensor::FromVector<int64_t>({(int64_t{1} << 32) + 5, -1, 300}, {3});
  EXPECT_EQ(Cast(big, DType::kI32).ToVector<int32_t>(), (std::vector<int32_t>{5, -1, 300}));
  EXPECT_EQ(Cast(big, DType::kU8).ToVector<uint8_t>(), (std::vector<uint8_t>{5, 255, 44}));
}

TEST_F(BasicKernelsTest, CastIntToBFloat16RoundsOnce) {
  // 2^25 + 2^17 + 1: nearest bf16 is 2^25 + 2^18; rounding through f32 first
  // (to 2^25 + 2^17, a tie) would give 2^25.
  const int32_t v = (1 << 25) + (1 << 17) + 1;
  Tensor x = Tensor::FromVector<int32_t>({v, -v, 255, 257, 259, 0}, {6});
  std::vector<float> b = Cast(x, DType::kBF16).ToVector<float>();
  EXPECT_EQ(b, (std::vector<float>{33816576.0f, -33816576.0f, 255.0f, 256.0f, 260.0f, 0.0f}));
  Tensor l = Tensor::FromVector<int64_t>({int64_t{v}, std::numeric_limits<int64_t>::max()}, {2});
  std::vector<float> lb = Cast(l, DType::kBF16).ToVector<float>();
  EXPECT_EQ(lb[0], 33816576.0f);
  EXPECT_EQ(lb[1], std::ldexp(1.0f, 63));
}

// ---- timings (not run by default) ----

template <typename F>
double MedianSeconds(int reps, const F& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

TEST(BasicKernelsBench, DISABLED_LeNetShapes) {
  for (int threads : {1, 2}) {
    SetCpuThreads(threads);
    Pool2dParams p{2, 2, 0};
    for (const Shape& s : {Shape{64, 6, 24, 24}, Shape{64, 16, 8, 8}, Shape{256, 32, 32, 32}}) {
      Tensor x = RandomTensor(s, 1), idx;
      Tensor y = MaxPool2d(x, p, &idx);
      Tensor dx = Tensor::Empty(s);
      double f = MedianSeconds(50, [&] { Kernel<MaxPool2dFn>("max_pool2d")(x, p, &y, &idx); });
      double b = MedianSeconds(
          50, [&] { Kernel<MaxPool2dBackwardFn>("max_pool2d_backward")(y, idx, p, &dx); });
      double r = MedianSeconds(50, [&] { Kernel<ReluFn>("relu")(x, &dx); });
      std::printf("%-18s threads=%d  max_pool2d %8.1f us  backward %8.1f us  relu %8.1f us\n",
                  ShapeToString(s).c_str(), threads, f * 1e6, b * 1e6, r * 1e6);
    }
    for (auto [n, c] : {std::pair<int64_t, int64_t>{64, 10}, {256, 10}, {1024, 1000}}) {
      Tensor logits = RandomTensor({n, c}, 2), labels = Labels(n, c, 3);
      Tensor loss = Tensor::Empty({}), d = Tensor::Empty({n, c});
      double t = MedianSeconds(50, [&] {
        Kernel<SoftmaxCrossEntropyFn>("softmax_cross_entropy")(logits, labels, &loss, &d);
      });
      std::printf("softmax_xent [%lld, %lld] threads=%d  %8.1f us\n", static_cast<long long>(n),
                  static_cast<long long>(c), threads, t * 1e6);
    }
  }
}

// ---- throughput (not run by default) ----
//
// bazel run //libs/ops:basic_kernels_test -- --gtest_also_run_disabled_tests
//   --gtest_filter='*Bandwidth*'
TEST(BasicKernelsBench, DISABLED_Bandwidth) {
  for (int threads : {1, 2}) {
    SetCpuThreads(threads);
    for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24}) {
      Tensor a = RandomTensor({n}, 1), b = RandomTensor({n}, 2), c = Tensor::Empty({n});
      Tensor buf = Tensor::Zeros({n});
      auto time = [&](const char* name, double bytes_per_elem, auto&& fn) {
        double t = MedianSeconds(n > (1 << 22) ? 15 : 101, fn);
        std::printf("%-14s n=%-9lld threads=%d  %8.3f ms  %6.2f GB/s\n", name,
                    static_cast<long long>(n), threads, t * 1e3, bytes_per_elem * n / t / 1e9);
      };
      time("relu", 8, [&] { Kernel<ReluFn>("relu")(a, &c); });
      time("add", 12, [&] { Kernel<AddFn>("add")(a, b, &c); });
      time("axpy", 12, [&] { Axpy(0.5f, a, &c); });
      time("scale", 8, [&] { Kernel<ScaleFn>("scale")(a, 0.5f, &c); });
      time("sgd(mom,wd)", 20, [&] { SgdUpdate(&c, a, &buf, SgdParams{0.01f, 0.9f, 1e-4f}); });
      time("sum", 4, [&] { Sum(a); });
      time("uniform", 4, [&] { RandomUniform(&c, 0, 1, 1, 0); });
      time("normal", 4, [&] { RandomNormal(&c, 0, 1, 1, 0); });
      time("cast f32>bf16", 6, [&] { Cast(a, DType::kBF16); });
    }
  }
}

}  // namespace
}  // namespace ops
}  // namespace dtrain
