#include "libs/collective/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace collective {
namespace {

#ifdef DTRAIN_REDUCE_TEST_PORTABLE
// Before any reduction picks its kernels.
const bool kPortable = setenv("DTRAIN_REDUCE_KERNELS", "portable", 1) == 0;

TEST(ReducePortableTest, ThePortableKernelsAreInUse) {
  ASSERT_TRUE(kPortable);
  EXPECT_FALSE(UsingVectorKernels());
}
#endif

float Get(DType dtype, const std::vector<uint8_t>& buf, size_t i) {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, buf.data() + 4 * i, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + 2 * i, 2);
      return HalfToFloat(h);
    }
    default: {
      uint16_t b;
      std::memcpy(&b, buf.data() + 2 * i, 2);
      return BFloat16ToFloat(b);
    }
  }
}

void Set(DType dtype, std::vector<uint8_t>& buf, size_t i, float v) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(buf.data() + 4 * i, &v, 4);
      return;
    case DType::kF16: {
      uint16_t h = FloatToHalf(v);
      std::memcpy(buf.data() + 2 * i, &h, 2);
      return;
    }
    default: {
      uint16_t b = FloatToBFloat16(v);
      std::memcpy(buf.data() + 2 * i, &b, 2);
      return;
    }
  }
}

// The reference: widen, add (and divide) in float, round once.
float Reference(DType dtype, float a, float b, bool divide, float divisor) {
  float v = a + b;
  if (divide) v = v / divisor;
  switch (dtype) {
    case DType::kF32:
      return v;
    case DType::kF16:
      return HalfToFloat(FloatToHalf(v));
    default:
      return BFloat16ToFloat(FloatToBFloat16(v));
  }
}

class ReduceTest : public ::testing::TestWithParam<DType> {};

TEST_P(ReduceTest, MatchesScalarReferenceOnRandomData) {
  const DType dtype = GetParam();
  const size_t es = DTypeSize(dtype);
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  // Odd sizes exercise the vector tails.
  for (size_t n : {0, 1, 3, 8, 15, 16, 17, 1000, 4099}) {
    for (int mode = 0; mode < 3; ++mode) {  // sum, sum+divide, divide only
      std::vector<uint8_t> a(n * es), b(n * es);
      for (size_t i = 0; i < n; ++i) {
        Set(dtype, a, i, dist(gen));
        Set(dtype, b, i, dist(gen));
      }
      std::vector<uint8_t> dst = a;
      const float divisor = 3.0f;
      if (mode == 0) ReduceSum(dtype, dst.data(), b.data(), n);
      if (mode == 1) ReduceSumDivide(dtype, dst.data(), b.data(), n, divisor);
      if (mode == 2) DivideInPlace(dtype, dst.data(), n, divisor);
      for (size_t i = 0; i < n; ++i) {
        float want = mode == 2
                         ? Reference(dtype, Get(dtype, a, i), 0.0f, true, divisor)
                         : Reference(dtype, Get(dtype, a, i), Get(dtype, b, i), mode == 1, divisor);
        ASSERT_EQ(Get(dtype, dst, i), want) << "n=" << n << " mode=" << mode << " i=" << i;
      }
    }
  }
}

TEST_P(ReduceTest, SpecialValues) {
  const DType dtype = GetParam();
  const size_t es = DTypeSize(dtype);
  const float inf = INFINITY;
  std::vector<float> xs = {0.0f, -0.0f, inf, -inf, 1e-8f, 65504.0f, 3e38f, 1.0f};
  std::vector<float> ys = {-0.0f, -0.0f, 1.0f, inf, 1e-8f, 65504.0f, 3e38f, NAN};
  size_t n = xs.size();
  std::vector<uint8_t> a(n * es), b(n * es);
  for (size_t i = 0; i < n; ++i) {
    Set(dtype, a, i, xs[i]);
    Set(dtype, b, i, ys[i]);
  }
  ReduceSum(dtype, a.data(), b.data(), n);
  EXPECT_TRUE(std::signbit(Get(dtype, a, 1)));  // -0 + -0 = -0
  EXPECT_EQ(Get(dtype, a, 2), inf);
  EXPECT_TRUE(std::isnan(Get(dtype, a, 3)));  // -inf + inf
  EXPECT_TRUE(std::isnan(Get(dtype, a, 7)));
  if (dtype == DType::kF16) {
    EXPECT_EQ(Get(dtype, a, 5), inf);  // 65504 + 65504 overflows f16
  }
}

TEST_P(ReduceTest, InPlaceDoubling) {
  const DType dtype = GetParam();
  const size_t es = DTypeSize(dtype);
  const size_t n = 37;
  std::vector<uint8_t> a(n * es);
  for (size_t i = 0; i < n; ++i) Set(dtype, a, i, static_cast<float>(i));
  ReduceSum(dtype, a.data(), a.data(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(Get(dtype, a, i), 2.0f * i);
}

INSTANTIATE_TEST_SUITE_P(All, ReduceTest, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(ReduceTest, OnlyFloatingTypesReduce) {
  EXPECT_TRUE(CheckReducible(DType::kF32).ok());
  EXPECT_TRUE(CheckReducible(DType::kF16).ok());
  EXPECT_TRUE(CheckReducible(DType::kBF16).ok());
  EXPECT_EQ(CheckReducible(DType::kI32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckReducible(DType::kU8).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace collective
}  // namespace dtrain
