#include "libs/kvstore/codec.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

// Splits `bytes` into pieces of the given sizes (the rest in a last piece).
std::vector<absl::string_view> Cut(const std::string& bytes, std::vector<size_t> sizes) {
  std::vector<absl::string_view> out;
  size_t at = 0;
  for (size_t s : sizes) {
    out.push_back(absl::string_view(bytes).substr(at, s));
    at += s;
  }
  out.push_back(absl::string_view(bytes).substr(at));
  return out;
}

TEST(CodecTest, DecodesAcrossPieceBoundariesThatSplitElements) {
  std::vector<float> values = {1.5f, -2.25f, 3.0f, 1e-3f, 7.0f};
  std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  for (std::vector<size_t> sizes :
       {std::vector<size_t>{}, {1}, {3, 1}, {5, 0, 6, 2}, {4, 4, 4}, {19}}) {
    std::vector<float> out(5, 0.0f);
    ASSERT_TRUE(DecodeValue(Cut(bytes, sizes), DType::kF32, 5, out.data(), false).ok());
    EXPECT_EQ(out, values);
    ASSERT_TRUE(DecodeValue(Cut(bytes, sizes), DType::kF32, 5, out.data(), true).ok());
    for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], 2 * values[i]);
  }
}

TEST(CodecTest, HalfPrecisionRoundTrips) {
  std::vector<float> values = {0.5f, -1.0f, 65504.0f, 0.0f, 3.140625f};
  for (DType d : {DType::kF16, DType::kBF16}) {
    std::string bytes = EncodeToString(values.data(), 5, d);
    ASSERT_EQ(bytes.size(), 10u);
    std::vector<float> out(5);
    ASSERT_TRUE(DecodeValue(Cut(bytes, {3, 2}), d, 5, out.data(), false).ok());
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(out[i], values[i], 1e-2 * std::abs(values[i]));
  }
}

TEST(CodecTest, RejectsWrongSizesAndTypesWithoutWriting) {
  std::string bytes(12, '\0');
  std::vector<float> out(4, 9.0f);
  absl::Status s = DecodeValue({bytes}, DType::kF32, 4, out.data(), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<float>(4, 9.0f));
  EXPECT_FALSE(DecodeValue({bytes}, DType::kI32, 3, out.data(), false).ok());
  EXPECT_EQ(TotalBytes(Cut(bytes, {5})), 12u);
}

// A top-k push of the given (index, value) pairs.
std::string TopKPairs(const std::vector<std::pair<uint32_t, float>>& pairs) {
  std::string out;
  for (const auto& [index, value] : pairs) {
    out.append(reinterpret_cast<const char*>(&index), 4);
    out.append(reinterpret_cast<const char*>(&value), 4);
  }
  return out;
}

TEST(CodecTest, TopKPushScattersAcrossPieceBoundaries) {
  const CompressionSpec c(Compression::kTopK, 0.3);  // k = 3 of 10
  std::string bytes = TopKPairs({{0, 1.5f}, {4, -2.0f}, {9, 8.0f}});
  for (std::vector<size_t> sizes : {std::vector<size_t>{}, {3}, {5, 9}, {8, 8}, {1, 1, 1, 20}}) {
    std::vector<absl::string_view> pieces = Cut(bytes, sizes);
    ASSERT_TRUE(CheckPushValue(pieces, c, DType::kF32, 10).ok());
    std::vector<float> out(10, 7.0f);
    DecodePush(pieces, c, DType::kF32, 10, out.data(), /*accumulate=*/false);
    EXPECT_EQ(out, (std::vector<float>{1.5f, 0, 0, 0, -2.0f, 0, 0, 0, 0, 8.0f}));
    DecodePush(pieces, c, DType::kF32, 10, out.data(), /*accumulate=*/true);
    EXPECT_EQ(out, (std::vector<float>{3.0f, 0, 0, 0, -4.0f, 0, 0, 0, 0, 16.0f}));
  }
  // An index named twice adds twice (the honest encoder never does this).
  std::string twice = TopKPairs({{2, 1.0f}, {2, 2.0f}, {3, 1.0f}});
  ASSERT_TRUE(CheckPushValue({twice}, c, DType::kF32, 10).ok());
  std::vector<float> out(10, 0.0f);
  DecodePush({twice}, c, DType::kF32, 10, out.data(), true);
  EXPECT_EQ(out[2], 3.0f);
}

TEST(CodecTest, TopKPushRefusesHostileIndicesAndSizes) {
  const CompressionSpec c(Compression::kTopK, 0.3);
  for (uint32_t bad : {10u, 11u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) {
    std::string bytes = TopKPairs({{0, 1.0f}, {1, 1.0f}, {bad, 1.0f}});
    absl::Status s = CheckPushValue(Cut(bytes, {13}), c, DType::kF32, 10);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(absl::StrCat("pair 2 names index ", bad)), absl::string_view::npos)
        << s;
  }
  std::string short_push = TopKPairs({{0, 1.0f}, {1, 1.0f}});
  absl::Status s = CheckPushValue({short_push}, c, DType::kF32, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 24"), absl::string_view::npos) << s;
  // A dense push of the wrong size.
  std::string dense(12, '\0');
  EXPECT_EQ(CheckPushValue({dense}, Compression::kF16, DType::kF32, 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckPushValue({dense}, Compression::kNone, DType::kF32, 3).ok());
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
