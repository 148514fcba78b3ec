#include "libs/tensor/tensor.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "libs/tensor/stream.h"

namespace dtrain {
namespace {

TEST(DeviceTest, ParseAndPrint) {
  EXPECT_EQ(Device::Parse("cpu")->ToString(), "cpu");
  EXPECT_EQ(Device::Parse("cpu:3")->index, 3);
  EXPECT_EQ(*Device::Parse("cuda:1"), Device::Cuda(1));
  EXPECT_EQ(Device::Cuda(0).ToString(), "cuda:0");
  EXPECT_FALSE(Device::Parse("gpu:0").ok());
  EXPECT_FALSE(Device::Parse("cuda:x").ok());
  EXPECT_FALSE(Device::Parse("cuda:-1").ok());
  EXPECT_NE(Device::Parse("tpu").status().message().find("expected cpu"), std::string::npos);
}

TEST(DTypeTest, SizesNamesAndCodes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    EXPECT_EQ(*ParseDType(DTypeName(d)), d);
    EXPECT_EQ(*DTypeFromCode(i), d);
  }
  EXPECT_FALSE(ParseDType("f64").ok());
  EXPECT_FALSE(DTypeFromCode(17).ok());
}

TEST(DTypeTest, HalfAndBFloat16RoundTrip) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1000.f, 1000.f);
  for (int i = 0; i < 10000; ++i) {
    float f = u(rng);
    EXPECT_NEAR(HalfToFloat(FloatToHalf(f)), f, std::fabs(f) * 1e-3f + 1e-4f);
    EXPECT_NEAR(BFloat16ToFloat(FloatToBFloat16(f)), f, std::fabs(f) * 8e-3f);
  }
  // Exact values and specials.
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);                   // overflow to inf
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  // Round to nearest even: 1 + 2^-8 is halfway between two bf16 values.
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
}

TEST(TensorTest, CreateReshapeSliceClone) {
  Tensor t = Tensor::FromVector<float>({0, 1, 2, 3, 4, 5}, {3, 2});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dim(-1), 2);
  EXPECT_EQ(t.DebugString(), "f32[3, 2] cpu");
  Tensor r = t.Reshape({2, -1});
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_TRUE(r.SharesStorageWith(t));
  Tensor s = t.Slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.ToVector<float>(), (std::vector<float>{2, 3, 4, 5}));
  Tensor c = t.Clone();
  c.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[0], 0);
  s.data<float>()[0] = 7;  // views write through
  EXPECT_EQ(t.data<float>()[2], 7);
}

TEST(TensorTest, FullAndZerosForEveryDType) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    Tensor t = Tensor::Full({5}, 3.0f, d);
    EXPECT_EQ(t.nbytes(), 5 * DTypeSize(d));
    Tensor z = Tensor::Zeros({5}, d);
    for (size_t b = 0; b < z.nbytes(); ++b) EXPECT_EQ(static_cast<uint8_t*>(z.raw_data())[b], 0);
  }
  EXPECT_EQ(Tensor::Full({2}, 3.0f, DType::kBF16).ToVector<float>(), (std::vector<float>{3, 3}));
  EXPECT_EQ(Tensor::Full({2}, 3.0f, DType::kI64).ToVector<int64_t>(), (std::vector<int64_t>{3, 3}));
}

TEST(TensorTest, CopyBetweenCpuDevicesAndErrors) {
  Tensor a = Tensor::FromVector<float>({1, 2, 3}, {3});
  absl::StatusOr<Tensor> b = a.To(Device::Cpu(1));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->device(), Device::Cpu(1));
  EXPECT_EQ(b->ToVector<float>(), (std::vector<float>{1, 2, 3}));
  Tensor wrong = Tensor::Empty({4});
  EXPECT_EQ(wrong.CopyFrom(a).code(), absl::StatusCode::kInvalidArgument);
  // No CUDA backend is linked into this test: a clear error, no crash.
  absl::StatusOr<Tensor> g = a.To(Device::Cuda(0));
  EXPECT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("cuda:0"), std::string::npos);
  EXPECT_FALSE(Tensor::TryEmpty({-1, 2}).ok());
}

TEST(AllocatorTest, AlignedPooledAndCounted) {
  Allocator* a = *GetAllocator(Device::Cpu(7));  // a fresh device: clean counters
  a->ResetPeak();
  AllocatorStats s0 = a->stats();
  EXPECT_EQ(s0.bytes_in_use, 0);
  {
    Tensor t = Tensor::Empty({1000}, DType::kF32, Device::Cpu(7));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
    EXPECT_GE(a->stats().bytes_in_use, 4000);
  }
  AllocatorStats s1 = a->stats();
  EXPECT_EQ(s1.bytes_in_use, 0);
  EXPECT_GE(s1.peak_bytes_in_use, 4000);
  EXPECT_GE(s1.bytes_cached, 4000);
  // Same size again: served from the cache, no new memory.
  { Tensor t = Tensor::Empty({1000}, DType::kF32, Device::Cpu(7)); }
  EXPECT_EQ(a->stats().num_cache_hits, s1.num_cache_hits + 1);
  a->EmptyCache();
  EXPECT_EQ(a->stats().bytes_cached, 0);
}

TEST(AllocatorTest, ConcurrentUseKeepsCountsExact) {
  Allocator* a = *GetAllocator(Device::Cpu(8));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 2000; ++i) {
        Tensor x = Tensor::Empty({(i % 37) + 1}, DType::kF32, Device::Cpu(8));
        x.data<float>()[0] = 1;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(a->stats().bytes_in_use, 0);
  EXPECT_EQ(a->stats().num_allocs, 8000);
}

}  // namespace
}  // namespace dtrain
