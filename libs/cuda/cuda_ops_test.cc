// Every CUDA op against the CPU op on random inputs, in f32 and, where the
// CUDA kernels accept them, f16 and bf16 (the CPU reference then computes in
// f32 from the same rounded inputs). Skips with the reason without a GPU.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/cuda/config.h"
#include "libs/cuda/dnn/batch_norm.h"
#include "libs/cuda/gpu_test_util.h"
#include "libs/ops/ops.h"
#include "libs/ops/testing/gradcheck.h"

namespace dtrain {
namespace cuda {
namespace {

using ops::testing::RandomTensor;
using ops::testing::TensorsNear;
using testing::RoundTo;
using testing::ToCpuF32;
using testing::ToCuda;
using testing::Tolerance;

const Device kGpu = Device::Cuda(0);

// A test fixture parameterized by the dtype the CUDA side computes in.
class CudaOpsTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { DT_SKIP_WITHOUT_GPU(); }
  DType dt() const { return GetParam(); }
  double tol() const { return Tolerance(dt()); }
  // Random CPU f32 input, already rounded to the test's dtype.
  Tensor Input(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    return RoundTo(RandomTensor(shape, seed, lo, hi), dt());
  }
  Tensor Gpu(const Tensor& cpu) { return ToCuda(cpu, dt()); }
  ::testing::AssertionResult Near(const Tensor& gpu, const Tensor& cpu, double scale = 1.0,
                                  const std::string& what = "") {
    return TensorsNear(ToCpuF32(gpu), cpu, tol() * scale, tol() * scale, what);
  }
};

std::string DTypeParamName(const ::testing::TestParamInfo<DType>& info) {
  return DTypeName(info.param);
}

INSTANTIATE_TEST_SUITE_P(AllFloatTypes, CudaOpsTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16), DTypeParamName);

// ---- elementwise ----

TEST_P(CudaOpsTest, Elementwise) {
  for (int64_t n : {1, 3, 17, 4096 + 5}) {
    SCOPED_TRACE(n);
    Tensor a = Input({n}, 1), b = Input({n}, 2);
    EXPECT_TRUE(Near(ops::Relu(Gpu(a)), ops::Relu(a), 1, "relu"));
    EXPECT_TRUE(Near(ops::ReluBackward(Gpu(a), Gpu(b)), ops::ReluBackward(a, b), 1, "relu_bwd"));
    EXPECT_TRUE(Near(ops::Add(Gpu(a), Gpu(b)), ops::Add(a, b), 1, "add"));
    EXPECT_TRUE(Near(ops::Scale(Gpu(a), -2.5f), ops::Scale(a, -2.5f), 1, "scale"));
    Tensor y = Gpu(b), yc = b.Clone();
    ops::Axpy(0.75f, Gpu(a), &y);
    ops::Axpy(0.75f, a, &yc);
    EXPECT_TRUE(Near(y, yc, 1, "axpy"));
  }
  // Unaligned views take the scalar path.
  Tensor a = Input({9, 3}, 3), b = Input({9, 3}, 4);
  EXPECT_TRUE(Near(ops::Add(Gpu(a).Slice(1, 8), Gpu(b).Slice(1, 8)),
                   ops::Add(a.Slice(1, 8), b.Slice(1, 8)), 1, "add on views"));
}

TEST_P(CudaOpsTest, ReluKeepsNaN) {
  Tensor x = Tensor::FromVector<float>({std::nanf(""), -1.0f, 0.0f, 2.0f}, {4});
  std::vector<float> y = ToCpuF32(ops::Relu(Gpu(x))).ToVector<float>();
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[3], 2.0f);
}

// ---- fill and cast (every dtype) ----

const DType kAllTypes[] = {DType::kF32, DType::kF16, DType::kBF16,
                           DType::kI32, DType::kI64, DType::kU8};

// Element i of `t` (CPU, any dtype) as a double; NaN stays NaN.
double At(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i];
    case DType::kF16:
      return HalfToFloat(t.data<uint16_t>()[i]);
    case DType::kBF16:
      return BFloat16ToFloat(t.data<uint16_t>()[i]);
    case DType::kI32:
      return t.data<int32_t>()[i];
    case DType::kI64:
      return static_cast<double>(t.data<int64_t>()[i]);
    case DType::kU8:
      return t.data<uint8_t>()[i];
  }
  return 0;
}

void ExpectSameElements(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  absl::StatusOr<Tensor> g = gpu.To(Device::Cpu());
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->dtype(), cpu.dtype());
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    double a = At(*g, i), b = At(cpu, i);
    if (std::isnan(a) && std::isnan(b)) continue;
    ASSERT_EQ(a, b) << what << " element " << i;
  }
}

TEST(CudaCastTest, EveryPairMatchesTheCpu) {
  DT_SKIP_WITHOUT_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,       -0.0f,   1.5f,   -2.5f,       0.3f,          255.0f,
                          256.7f,     -129.9f, 1e9f,   -1e9f,       65519.f,       65520.f,
                          7e-8f,      1e-40f,  inf,    -inf,        std::nanf(""), 3.0e38f,
                          16777217.f, -0.49f,  127.5f, 2147483648.f};
  Tensor base = Tensor::FromVector(v, {static_cast<int64_t>(v.size())});
  for (DType from : kAllTypes) {
    Tensor src = ops::Cast(base, from);
    Tensor src_gpu = *src.To(kGpu);
    for (DType to : kAllTypes) {
      const std::string what = absl::StrCat(DTypeName(from), " -> ", DTypeName(to));
      SCOPED_TRACE(what);
      ExpectSameElements(ops::Cast(src_gpu, to), ops::Cast(src, to), what);
    }
  }
  // Integers beyond f32's precision, to bf16 with one rounding.
  Tensor big = Tensor::FromVector<int64_t>({(int64_t{1} << 40) + 12345, -(int64_t{1} << 33) - 1,
                                            std::numeric_limits<int64_t>::min(), 257, -383},
                                           {5});
  ExpectSameElements(ops::Cast(*big.To(kGpu), DType::kBF16), ops::Cast(big, DType::kBF16),
                     "i64 -> bf16");
}

TEST(CudaFillTest, EveryDtype) {
  DT_SKIP_WITHOUT_GPU();
  for (DType dt : kAllTypes) {
    for (float value : {0.0f, -1.75f, 300.5f, 1e10f}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dt), " ", value));
      Tensor g = Tensor::Empty({1000}, dt, kGpu), c = Tensor::Empty({1000}, dt);
      ops::Fill(&g, value);
      ops::Fill(&c, value);
      ExpectSameElements(g, c, "fill");
    }
  }
}

// ---- random numbers ----

TEST(CudaRandomTest, SameStreamsAsTheCpu) {
  DT_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 5, 1000, 100003}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{5} << 32}) {
      SCOPED_TRACE(absl::StrCat("n ", n, " offset ", offset));
      Tensor gu = Tensor::Empty({n}, DType::kF32, kGpu), cu = Tensor::Empty({n});
      ops::RandomUniform(&gu, -2.0f, 3.0f, 42, offset);
      ops::RandomUniform(&cu, -2.0f, 3.0f, 42, offset);
      EXPECT_EQ(gu.ToVector<float>(), cu.ToVector<float>()) << "uniform is bit-exact";
      Tensor gn = Tensor::Empty({n}, DType::kF32, kGpu), cn = Tensor::Empty({n});
      ops::RandomNormal(&gn, 0.5f, 2.0f, 7, offset);
      ops::RandomNormal(&cn, 0.5f, 2.0f, 7, offset);
      EXPECT_TRUE(TensorsNear(*gn.To(Device::Cpu()), cn, 1e-5, 1e-5, "normal"));
    }
  }
}

// ---- pooling ----

TEST_P(CudaOpsTest, Pooling) {
  for (auto [k, s, p] :
       {std::make_tuple(2, 2, 0), std::make_tuple(3, 2, 1), std::make_tuple(3, 1, 1),
        std::make_tuple(2, 1, 0), std::make_tuple(3, 3, 0)}) {
    SCOPED_TRACE(absl::StrCat("kernel ", k, " stride ", s, " padding ", p));
    ops::Pool2dParams pp{k, s, p};
    Tensor x = Input({2, 3, 7, 9}, 11);
    Tensor ci, gi;
    Tensor cy = ops::MaxPool2d(x, pp, &ci);
    Tensor gy = ops::MaxPool2d(Gpu(x), pp, &gi);
    EXPECT_TRUE(Near(gy, cy, 1, "max_pool2d"));
    EXPECT_EQ(gi.ToVector<int32_t>(), ci.ToVector<int32_t>()) << "argmax positions";
    Tensor dy = Input(cy.shape(), 12);
    EXPECT_TRUE(Near(ops::MaxPool2dBackward(Gpu(dy), gi, x.shape(), pp),
                     ops::MaxPool2dBackward(dy, ci, x.shape(), pp), 2, "max_pool2d_backward"));
    EXPECT_TRUE(Near(ops::AvgPool2d(Gpu(x), pp), ops::AvgPool2d(x, pp), 1, "avg_pool2d"));
    EXPECT_TRUE(Near(ops::AvgPool2dBackward(Gpu(dy), x.shape(), pp),
                     ops::AvgPool2dBackward(dy, x.shape(), pp), 2, "avg_pool2d_backward"));
  }
}

TEST_P(CudaOpsTest, GlobalAvgPool) {
  Tensor x = Input({4, 5, 7, 7}, 21);
  Tensor cy = ops::GlobalAvgPool(x);
  EXPECT_TRUE(Near(ops::GlobalAvgPool(Gpu(x)), cy, 1, "global_avg_pool"));
  Tensor dy = Input(cy.shape(), 22);
  EXPECT_TRUE(Near(ops::GlobalAvgPoolBackward(Gpu(dy), x.shape()),
                   ops::GlobalAvgPoolBackward(dy, x.shape()), 1, "global_avg_pool_backward"));
}

// ---- classification ----

Tensor Labels(int64_t n, int64_t c, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng() % c);
  return Tensor::FromVector(v, {n});
}

TEST_P(CudaOpsTest, SoftmaxCrossEntropyArgmaxAndCounts) {
  for (auto [n, c] : {std::make_pair(256, 10), std::make_pair(5, 1000), std::make_pair(1, 1),
                      std::make_pair(33, 37)}) {
    SCOPED_TRACE(absl::StrCat(n, " x ", c));
    Tensor logits = Input({n, c}, 31, -4.0f, 4.0f);
    Tensor labels = Labels(n, c, 32);
    Tensor glabels = *labels.To(kGpu);
    Tensor cd, gd;
    Tensor closs = ops::SoftmaxCrossEntropy(logits, labels, &cd);
    Tensor gloss = ops::SoftmaxCrossEntropy(Gpu(logits), glabels, &gd);
    EXPECT_TRUE(TensorsNear(ToCpuF32(gloss), closs, 1e-5, 1e-5, "loss"));
    EXPECT_TRUE(Near(gd, cd, 1, "dlogits"));
    Tensor gloss2 = ops::SoftmaxCrossEntropy(Gpu(logits), glabels, nullptr);
    EXPECT_TRUE(TensorsNear(ToCpuF32(gloss2), closs, 1e-5, 1e-5, "loss without dlogits"));
    EXPECT_EQ(ops::Argmax(Gpu(logits)).ToVector<int32_t>(),
              ops::Argmax(logits).ToVector<int32_t>());
    EXPECT_EQ(ops::CountCorrect(Gpu(logits), glabels), ops::CountCorrect(logits, labels));
  }
}

TEST(CudaArgmaxTest, TiesAndNaNFollowTheCpu) {
  DT_SKIP_WITHOUT_GPU();
  const float nan = std::nanf("");
  std::vector<float> v(5 * 40, 0.0f);
  v[0 * 40 + 3] = 1.0f;
  v[0 * 40 + 35] = 1.0f;  // tie: first wins
  v[1 * 40 + 20] = nan;   // NaN wins
  v[1 * 40 + 30] = 5.0f;
  v[2 * 40 + 0] = nan;
  v[2 * 40 + 39] = nan;  // first NaN
  v[3 * 40 + 39] = 2.0f;
  Tensor x = Tensor::FromVector(v, {5, 40});
  EXPECT_EQ(ops::Argmax(*x.To(kGpu)).ToVector<int32_t>(), ops::Argmax(x).ToVector<int32_t>());
}

TEST(CudaLossTest, OutOfRangeLabelGivesNaN) {
  DT_SKIP_WITHOUT_GPU();
  Tensor logits = Tensor::Zeros({2, 3}, DType::kF32, kGpu);
  Tensor labels = Tensor::FromVector<int32_t>({0, 3}, {2}, kGpu);
  EXPECT_TRUE(std::isnan(ops::ScalarValue(ops::SoftmaxCrossEntropy(logits, labels, nullptr))));
}

TEST_P(CudaOpsTest, Sum) {
  for (int64_t n : {1, 1000, (1 << 20) + 3}) {
    SCOPED_TRACE(n);
    Tensor x = Input({n}, 41);
    EXPECT_TRUE(TensorsNear(ToCpuF32(ops::Sum(Gpu(x))), ops::Sum(x), 1e-5, 1e-4, "sum"));
  }
}

// ---- SGD ----

TEST(CudaSgdTest, MatchesTheCpuOverSteps) {
  DT_SKIP_WITHOUT_GPU();
  for (ops::SgdParams p :
       {ops::SgdParams{0.1f, 0.0f, 0.0f, false}, ops::SgdParams{0.05f, 0.9f, 0.0f, false},
        ops::SgdParams{0.05f, 0.9f, 1e-3f, true}, ops::SgdParams{0.2f, 0.0f, 5e-4f, false}}) {
    SCOPED_TRACE(absl::StrCat("momentum ", p.momentum, " nesterov ", p.nesterov));
    const Shape shape = {100003};
    Tensor cw = RandomTensor(shape, 51), gw = *cw.To(kGpu);
    Tensor cb = Tensor::Zeros(shape), gb = Tensor::Zeros(shape, DType::kF32, kGpu);
    for (int step = 0; step < 3; ++step) {
      Tensor g = RandomTensor(shape, 60 + step);
      ops::SgdUpdate(&cw, g, p.momentum != 0 ? &cb : nullptr, p);
      ops::SgdUpdate(&gw, *g.To(kGpu), p.momentum != 0 ? &gb : nullptr, p);
    }
    EXPECT_TRUE(TensorsNear(*gw.To(Device::Cpu()), cw, 1e-5, 1e-6, "param"));
    if (p.momentum != 0) {
      EXPECT_TRUE(TensorsNear(*gb.To(Device::Cpu()), cb, 1e-5, 1e-6, "buf"));
    }
  }
}

// ---- matrix products (cuBLAS) ----

TEST_P(CudaOpsTest, MatMul) {
  const int64_t m = 37, k = 65, n = 29;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(absl::StrCat("ta ", ta, " tb ", tb));
      Tensor a = Input(ta ? Shape{k, m} : Shape{m, k}, 71);
      Tensor b = Input(tb ? Shape{n, k} : Shape{k, n}, 72);
      EXPECT_TRUE(Near(ops::MatMul(Gpu(a), Gpu(b), ta, tb), ops::MatMul(a, b, ta, tb), 10));
    }
  }
  Tensor empty_k = ops::MatMul(Gpu(Input({3, 0}, 1)), Gpu(Input({0, 4}, 2)));
  EXPECT_EQ(ToCpuF32(empty_k).ToVector<float>(), std::vector<float>(12, 0.0f));
}

TEST_P(CudaOpsTest, LinearForwardAndBackward) {
  const int64_t n = 64, k = 100, m = 33;
  Tensor x = Input({n, k}, 81), w = Input({m, k}, 82), b = Input({m}, 83), dy = Input({n, m}, 84);
  for (bool relu : {false, true}) {
    SCOPED_TRACE(relu);
    Tensor bg = Gpu(b);
    EXPECT_TRUE(Near(ops::Linear(Gpu(x), Gpu(w), &bg, relu), ops::Linear(x, w, &b, relu), 10));
    EXPECT_TRUE(
        Near(ops::Linear(Gpu(x), Gpu(w), nullptr, relu), ops::Linear(x, w, nullptr, relu), 10));
  }
  Tensor cdx = Tensor::Empty(x.shape()), cdw = Tensor::Empty(w.shape()), cdb = Tensor::Empty({m});
  ops::LinearBackward(x, w, dy, &cdx, &cdw, &cdb);
  for (int mask = 0; mask < 8; ++mask) {
    SCOPED_TRACE(mask);
    Tensor gdx = Tensor::Empty(x.shape(), dt(), kGpu), gdw = Tensor::Empty(w.shape(), dt(), kGpu);
    Tensor gdb = Tensor::Empty({m}, dt(), kGpu);
    ops::LinearBackward(Gpu(x), Gpu(w), Gpu(dy), mask & 1 ? &gdx : nullptr,
                        mask & 2 ? &gdw : nullptr, mask & 4 ? &gdb : nullptr);
    if (mask & 1) {
      EXPECT_TRUE(Near(gdx, cdx, 10, "dx"));
    }
    if (mask & 2) {
      EXPECT_TRUE(Near(gdw, cdw, 20, "dw"));
    }
    if (mask & 4) {
      EXPECT_TRUE(Near(gdb, cdb, 20, "db"));
    }
  }
}

TEST(CudaTf32Test, MatMulAndConvWithTf32AreClose) {
  DT_SKIP_WITHOUT_GPU();
  SetAllowTf32(true);
  Tensor a = RandomTensor({128, 256}, 1), b = RandomTensor({256, 64}, 2);
  EXPECT_TRUE(TensorsNear(*ops::MatMul(*a.To(kGpu), *b.To(kGpu)).To(Device::Cpu()),
                          ops::MatMul(a, b), 1e-2, 1e-2, "tf32 matmul"));
  Tensor x = RandomTensor({4, 16, 12, 12}, 3), w = RandomTensor({32, 16, 3, 3}, 4);
  EXPECT_TRUE(TensorsNear(*ops::Conv2d(*x.To(kGpu), *w.To(kGpu), nullptr, {1, 1}).To(Device::Cpu()),
                          ops::Conv2d(x, w, nullptr, {1, 1}), 1e-2, 1e-2, "tf32 conv"));
  SetAllowTf32(false);
}

// ---- convolution (cuDNN) ----

struct ConvCase {
  Shape x, w;
  int stride, pad;
};

TEST_P(CudaOpsTest, Convolution) {
  for (const ConvCase& c :
       {ConvCase{{4, 3, 10, 10}, {8, 3, 3, 3}, 1, 1}, ConvCase{{4, 8, 9, 9}, {16, 8, 3, 3}, 2, 1},
        ConvCase{{4, 8, 9, 9}, {16, 8, 1, 1}, 2, 0}, ConvCase{{2, 1, 28, 28}, {20, 1, 3, 3}, 1, 0},
        ConvCase{{3, 20, 13, 13}, {50, 20, 5, 5}, 1, 0}}) {
    SCOPED_TRACE(absl::StrCat(ShapeToString(c.x), " * ", ShapeToString(c.w), " stride ", c.stride,
                              " pad ", c.pad));
    ops::Conv2dParams p{c.stride, c.pad};
    Tensor x = Input(c.x, 91), w = Input(c.w, 92), b = Input({c.w[0]}, 93);
    // Scale tolerances with the reduction length (sum of K products).
    const double red = std::sqrt(static_cast<double>(c.w[1] * c.w[2] * c.w[3]));
    for (bool relu : {false, true}) {
      Tensor bg = Gpu(b);
      EXPECT_TRUE(Near(ops::Conv2d(Gpu(x), Gpu(w), &bg, p, relu), ops::Conv2d(x, w, &b, p, relu),
                       red, "conv2d"));
    }
    EXPECT_TRUE(
        Near(ops::Conv2d(Gpu(x), Gpu(w), nullptr, p), ops::Conv2d(x, w, nullptr, p), red, "nb"));
    Tensor y = ops::Conv2d(x, w, nullptr, p);
    Tensor dy = Input(y.shape(), 94);
    EXPECT_TRUE(Near(ops::Conv2dBackwardData(Gpu(dy), Gpu(w), x.shape(), p),
                     ops::Conv2dBackwardData(dy, w, x.shape(), p), red * 2, "backward data"));
    Tensor cdw = Tensor::Empty(w.shape()), cdb = Tensor::Empty({c.w[0]});
    ops::Conv2dBackwardWeights(x, dy, p, &cdw, &cdb);
    Tensor gdw = Tensor::Empty(w.shape(), dt(), kGpu), gdb = Tensor::Empty({c.w[0]}, dt(), kGpu);
    ops::Conv2dBackwardWeights(Gpu(x), Gpu(dy), p, &gdw, &gdb);
    const double sp = std::sqrt(static_cast<double>(y.numel() / y.dim(1)));
    EXPECT_TRUE(Near(gdw, cdw, sp * 2, "backward weights"));
    EXPECT_TRUE(Near(gdb, cdb, sp * 2, "backward bias"));
    ops::Conv2dBackwardWeights(Gpu(x), Gpu(dy), p, &gdw, nullptr);
    EXPECT_TRUE(Near(gdw, cdw, sp * 2, "backward weights without bias"));
  }
}

TEST(CudaConvTest, HeuristicAlgorithmsAgreeToo) {
  DT_SKIP_WITHOUT_GPU();
  SetConvAlgoSearch(ConvAlgoSearch::kHeuristic);
  Tensor x = RandomTensor({3, 5, 11, 11}, 1), w = RandomTensor({7, 5, 3, 3}, 2);
  ops::Conv2dParams p{2, 1};
  EXPECT_TRUE(TensorsNear(*ops::Conv2d(*x.To(kGpu), *w.To(kGpu), nullptr, p).To(Device::Cpu()),
                          ops::Conv2d(x, w, nullptr, p), 1e-4, 1e-4));
  SetConvAlgoSearch(ConvAlgoSearch::kBenchmark);
}

// ---- batch norm (cuDNN and own kernels) ----

void CheckBatchNorm(DType dt, dnn::BatchNormImpl impl, const Shape& shape) {
  SCOPED_TRACE(
      absl::StrCat(DTypeName(dt), " impl ", static_cast<int>(impl), " ", ShapeToString(shape)));
  dnn::SetBatchNormImplForTesting(impl);
  const double tol = Tolerance(dt) * 4;
  const int64_t c = shape[1];
  Tensor x = RoundTo(RandomTensor(shape, 101, -2.0f, 3.0f), dt);
  Tensor gamma = RoundTo(RandomTensor({c}, 102, 0.5f, 1.5f), dt);
  Tensor beta = RoundTo(RandomTensor({c}, 103), dt);
  Tensor crm = RandomTensor({c}, 104), crv = RandomTensor({c}, 105, 0.5f, 2.0f);
  Tensor grm = *crm.To(kGpu), grv = *crv.To(kGpu);
  Tensor cmean, cinv, gmean, ginv;
  Tensor cy = ops::BatchNormTrain(x, gamma, beta, 0.1f, 1e-5f, &crm, &crv, &cmean, &cinv);
  Tensor gx = ToCuda(x, dt), ggamma = ToCuda(gamma, dt), gbeta = ToCuda(beta, dt);
  Tensor gy = ops::BatchNormTrain(gx, ggamma, gbeta, 0.1f, 1e-5f, &grm, &grv, &gmean, &ginv);
  EXPECT_TRUE(TensorsNear(ToCpuF32(gy), cy, tol, tol, "y"));
  EXPECT_TRUE(TensorsNear(ToCpuF32(gmean), cmean, 1e-5, 1e-5, "saved mean"));
  EXPECT_TRUE(TensorsNear(ToCpuF32(ginv), cinv, 1e-4, 1e-5, "saved inv std"));
  EXPECT_TRUE(TensorsNear(ToCpuF32(grm), crm, 1e-5, 1e-5, "running mean"));
  EXPECT_TRUE(TensorsNear(ToCpuF32(grv), crv, 1e-4, 1e-5, "running var"));

  Tensor dy = RoundTo(RandomTensor(shape, 106), dt);
  Tensor cdx = Tensor::Empty(shape), cdg = Tensor::Empty({c}), cdb = Tensor::Empty({c});
  ops::BatchNormBackward(x, dy, gamma, cmean, cinv, &cdx, &cdg, &cdb);
  Tensor gdx = Tensor::Empty(shape, dt, kGpu), gdg = Tensor::Empty({c}, dt, kGpu);
  Tensor gdb = Tensor::Empty({c}, dt, kGpu);
  ops::BatchNormBackward(gx, ToCuda(dy, dt), ggamma, gmean, ginv, &gdx, &gdg, &gdb);
  const double red = std::sqrt(static_cast<double>(x.numel() / c));
  EXPECT_TRUE(TensorsNear(ToCpuF32(gdx), cdx, tol * 2, tol * 2, "dx"));
  EXPECT_TRUE(TensorsNear(ToCpuF32(gdg), cdg, tol * red, tol * red, "dgamma"));
  EXPECT_TRUE(TensorsNear(ToCpuF32(gdb), cdb, tol * red, tol * red, "dbeta"));
  // Only some outputs.
  Tensor gdx2 = Tensor::Empty(shape, dt, kGpu);
  ops::BatchNormBackward(gx, ToCuda(dy, dt), ggamma, gmean, ginv, &gdx2, nullptr, nullptr);
  EXPECT_TRUE(TensorsNear(ToCpuF32(gdx2), cdx, tol * 2, tol * 2, "dx alone"));
  Tensor gdb2 = Tensor::Empty({c}, DType::kF32, kGpu);
  ops::BatchNormBackward(gx, ToCuda(dy, dt), ggamma, gmean, ginv, nullptr, nullptr, &gdb2);
  EXPECT_TRUE(TensorsNear(ToCpuF32(gdb2), cdb, tol * red, tol * red, "f32 dbeta alone"));

  Tensor ci = ops::BatchNormInference(x, gamma, beta, crm, crv, 1e-5f);
  Tensor gi = ops::BatchNormInference(gx, ggamma, gbeta, grm, grv, 1e-5f);
  EXPECT_TRUE(TensorsNear(ToCpuF32(gi), ci, tol, tol, "inference"));
  dnn::SetBatchNormImplForTesting(dnn::BatchNormImpl::kAuto);
}

TEST(CudaBatchNormTest, CudnnAndOwnKernelsMatchTheCpu) {
  DT_SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{8, 6, 5, 5}, Shape{16, 6}, Shape{256, 64, 4, 4}}) {
    CheckBatchNorm(DType::kF32, dnn::BatchNormImpl::kCudnn, shape);
    CheckBatchNorm(DType::kF32, dnn::BatchNormImpl::kOwn, shape);
    CheckBatchNorm(DType::kF16, dnn::BatchNormImpl::kAuto, shape);
    CheckBatchNorm(DType::kBF16, dnn::BatchNormImpl::kAuto, shape);
    CheckBatchNorm(DType::kBF16, dnn::BatchNormImpl::kOwn, shape);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
