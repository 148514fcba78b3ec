#include "libs/kvstore/codec.h"

#include <cstring>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
