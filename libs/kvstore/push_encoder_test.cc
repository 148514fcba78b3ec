#include "libs/kvstore/push_encoder.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libs/kvstore/codec.h"
#include "libs/kvstore/types.h"

namespace dtrain {
namespace kvstore {
namespace {

// The (index, value) pairs of a top-k push.
std::map<uint32_t, float> Pairs(const std::string& bytes) {
  EXPECT_EQ(bytes.size() % kTopKPairBytes, 0u);
  std::map<uint32_t, float> out;
  uint32_t previous = 0;
  for (size_t at = 0; at + kTopKPairBytes <= bytes.size(); at += kTopKPairBytes) {
    uint32_t index;
    float value;
    std::memcpy(&index, bytes.data() + at, 4);
    std::memcpy(&value, bytes.data() + at + 4, 4);
    if (at > 0) EXPECT_GT(index, previous) << "pairs are in increasing index order";
    previous = index;
    out[index] = value;
  }
  return out;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

SliceSpec Spec(int64_t n, const std::string& key = "w") {
  SliceSpec s;
  s.key = key;
  s.shape = {n};
  s.count = n;
  return s;
}

TEST(TopKTest, CountIsCeilOfRatioAtLeastOneAtMostN) {
  EXPECT_EQ(TopKCount(0.01, 0), 0);
  EXPECT_EQ(TopKCount(0.01, 1), 1);
  EXPECT_EQ(TopKCount(0.01, 99), 1);
  EXPECT_EQ(TopKCount(0.01, 101), 2);
  EXPECT_EQ(TopKCount(0.25, 10), 3);
  EXPECT_EQ(TopKCount(1e-9, 1000), 1);
  EXPECT_EQ(TopKCount(1.0, 7), 7);
  EXPECT_EQ(PushValueBytes({Compression::kTopK, 0.25}, DType::kF32, 10), 3 * kTopKPairBytes);
}

TEST(TopKTest, SendsTheLargestMagnitudesAndKeepsTheRest) {
  std::vector<float> v = {0.5f, -4.0f, 1.0f, 3.0f, -0.25f, 2.0f};
  std::string bytes = EncodeTopK(v.data(), 6, 3);
  std::map<uint32_t, float> sent = Pairs(bytes);
  EXPECT_EQ(sent, (std::map<uint32_t, float>{{1, -4.0f}, {3, 3.0f}, {5, 2.0f}}));
  EXPECT_EQ(v, (std::vector<float>{0.5f, 0.0f, 1.0f, 0.0f, -0.25f, 0.0f}));
}

TEST(TopKTest, TiesGoToTheLowerIndexAndNaNCountsAsLargest) {
  std::vector<float> v = {1.0f, -2.0f, 2.0f, 2.0f, -2.0f};
  std::map<uint32_t, float> sent = Pairs(EncodeTopK(v.data(), 5, 2));
  EXPECT_EQ(sent, (std::map<uint32_t, float>{{1, -2.0f}, {2, 2.0f}}));
  std::vector<float> n = {1.0f, std::nanf(""), 5.0f};
  sent = Pairs(EncodeTopK(n.data(), 3, 1));
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent.begin()->first, 1u);
  EXPECT_TRUE(std::isnan(sent.begin()->second));
}

TEST(TopKTest, KBoundsSendNothingOrEverything) {
  std::vector<float> v = {1.0f, -2.0f, 3.0f};
  EXPECT_EQ(EncodeTopK(v.data(), 3, 0), "");
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.0f, 3.0f}));
  std::map<uint32_t, float> sent = Pairs(EncodeTopK(v.data(), 3, 3));
  EXPECT_EQ(sent, (std::map<uint32_t, float>{{0, 1.0f}, {1, -2.0f}, {2, 3.0f}}));
  EXPECT_EQ(v, (std::vector<float>{0.0f, 0.0f, 0.0f}));
  std::vector<float> w = {1.0f, -2.0f};
  EXPECT_EQ(Pairs(EncodeTopK(w.data(), 2, 5)).size(), 2u) << "k above n sends n";
}

TEST(PushEncoderTest, DenseCompressionsConvertOrPassThrough) {
  PushEncoder e;
  std::vector<float> g = {1.0f + 1.0f / 4096, -2.0f};
  auto none = e.Encode(CompressionSpec(), Spec(2), 1, Bytes(g).data());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr) << "f32 values travel as they are";
  std::string src = Bytes(g);
  auto half = e.Encode(Compression::kBF16, Spec(2), 1, src.data());
  ASSERT_TRUE(half.ok() && *half != nullptr);
  EXPECT_EQ(**half, EncodeToString(g.data(), 2, DType::kBF16));
}

TEST(PushEncoderTest, ResidualCarriesWhatWasNotSentIntoTheNextRound) {
  PushEncoder e;
  const CompressionSpec c(Compression::kTopK, 0.25);  // k = 1 of 4
  ASSERT_TRUE(e.SetCompression(c).ok());
  std::vector<float> g1 = {1.0f, 3.0f, -2.0f, 0.5f};
  std::string s1 = Bytes(g1);
  auto r1 = e.Encode(c, Spec(4), 1, s1.data());
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(Pairs(**r1), (std::map<uint32_t, float>{{1, 3.0f}}));
  EXPECT_EQ(e.Residual("w", 0), (std::vector<float>{1.0f, 0.0f, -2.0f, 0.5f}));

  // A retry of round 1 re-sends the same bytes and leaves the residual.
  auto again = e.Encode(c, Spec(4), 1, s1.data());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(**again, **r1);
  EXPECT_EQ(e.Residual("w", 0), (std::vector<float>{1.0f, 0.0f, -2.0f, 0.5f}));

  // Round 2: gradient + residual = {2, 1, -2.5, 0.5}; -2.5 goes.
  std::vector<float> g2 = {1.0f, 1.0f, -0.5f, 0.0f};
  std::string s2 = Bytes(g2);
  auto r2 = e.Encode(c, Spec(4), 2, s2.data());
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(Pairs(**r2), (std::map<uint32_t, float>{{2, -2.5f}}));
  EXPECT_EQ(e.Residual("w", 0), (std::vector<float>{2.0f, 1.0f, 0.0f, 0.5f}));

  // Sent so far plus the residual is every gradient pushed: nothing is lost.
  std::vector<float> total = e.Residual("w", 0);
  for (const std::string* b : {r1->get(), r2->get()}) {
    for (const auto& [i, v] : Pairs(*b)) total[i] += v;
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(total[i], g1[i] + g2[i]) << i;

  // Another slice has a residual of its own.
  std::vector<float> other = {0.0f, 0.0f, 0.0f, 9.0f};
  std::string so = Bytes(other);
  ASSERT_TRUE(e.Encode(c, Spec(4, "b"), 1, so.data()).ok());
  EXPECT_EQ(e.Residual("w", 0), (std::vector<float>{2.0f, 1.0f, 0.0f, 0.5f}));
  EXPECT_EQ(e.Residual("b", 0), (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));

  // A round that does not follow (a resynchronized worker) starts afresh.
  auto r9 = e.Encode(c, Spec(4), 9, s2.data());
  ASSERT_TRUE(r9.ok());
  EXPECT_EQ(Pairs(**r9), (std::map<uint32_t, float>{{0, 1.0f}}));
  EXPECT_EQ(e.Residual("w", 0), (std::vector<float>{0.0f, 1.0f, -0.5f, 0.0f}));
}

TEST(PushEncoderTest, TopKOfF16KeysWidensFirst) {
  PushEncoder e;
  const CompressionSpec c(Compression::kTopK, 0.5);
  std::vector<float> g = {0.5f, -3.0f};
  std::string half = EncodeToString(g.data(), 2, DType::kF16);
  SliceSpec spec = Spec(2);
  spec.dtype = DType::kF16;
  auto r = e.Encode(c, spec, 1, half.data());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Pairs(**r), (std::map<uint32_t, float>{{1, -3.0f}}));
}

TEST(PushEncoderTest, RefusesInvalidCompressions) {
  PushEncoder e;
  for (CompressionSpec bad :
       {CompressionSpec(Compression::kTopK, 0), CompressionSpec(Compression::kTopK, 1.5),
        CompressionSpec(Compression::kTopK, std::nan("")),
        CompressionSpec(Compression::kF16, 0.5)}) {
    absl::Status s = e.SetCompression(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << DescribeCompression(bad);
  }
  EXPECT_EQ(e.compression(), CompressionSpec());
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
