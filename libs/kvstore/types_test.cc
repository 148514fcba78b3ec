#include "libs/kvstore/types.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

TEST(TypesTest, JobConfigValidation) {
  JobConfig c;
  c.job = "j";
  c.num_workers = 2;
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  struct Case {
    const char* what;
    void (*mutate)(JobConfig&);
  } cases[] = {
      {"num_workers", [](JobConfig& c) { c.num_workers = 0; }},
      {"max_staleness", [](JobConfig& c) { c.max_staleness = 2; }},
      {"sgd", [](JobConfig& c) { c.momentum = 0.9; }},
      {"learning_rate", [](JobConfig& c) { c.optimizer = OptimizerKind::kSgd; }},
      {"momentum",
       [](JobConfig& c) {
         c.optimizer = OptimizerKind::kSgd;
         c.learning_rate = 0.1;
         c.momentum = 1.0;
       }},
      {"gradient_scale", [](JobConfig& c) { c.gradient_scale = 0; }},
      {"placement", [](JobConfig& c) { c.placement = std::string(129, 'x'); }},
      {"max_staleness",
       [](JobConfig& c) {
         c.consistency = Consistency::kBoundedDelay;
         c.max_staleness = -1;
       }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    JobConfig bad = c;
    k.mutate(bad);
    absl::Status s = ValidateJobConfig(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), k.what)) << s;
  }
  EXPECT_TRUE(absl::StrContains(DescribeJobConfig(c), "consistency=sync"));
  JobConfig placed = c;
  placed.placement = "v2 colocate_below_bytes=0 slice_threshold_bytes=1";
  EXPECT_TRUE(ValidateJobConfig(placed).ok());
  EXPECT_NE(placed, c);  // a job's workers must agree on it
  EXPECT_TRUE(absl::StrContains(DescribeJobConfig(placed),
                                "placement=(v2 colocate_below_bytes=0 slice_threshold_bytes=1)"));
}

TEST(TypesTest, SliceSpecValidation) {
  SliceSpec s;
  s.key = "w";
  s.shape = {2, 3};
  s.count = 6;
  EXPECT_TRUE(ValidateSliceSpec(s).ok());
  EXPECT_EQ(DescribeSlice(s), "key 'w' slice 0/1 f32[2, 3] elements [0, 6)");
  SliceSpec bad = s;
  bad.offset = 1;
  EXPECT_FALSE(ValidateSliceSpec(bad).ok());
  bad = s;
  bad.slice = 1;
  EXPECT_FALSE(ValidateSliceSpec(bad).ok());
  bad = s;
  bad.shape = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_FALSE(ValidateSliceSpec(bad).ok());
  bad = s;
  bad.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_FALSE(ValidateSliceSpec(bad).ok());
  bad = s;
  bad.key = std::string(kMaxKeyLength + 1, 'k');
  EXPECT_FALSE(ValidateSliceSpec(bad).ok());
  EXPECT_EQ(WireDType(DType::kF32, Compression::kBF16), DType::kBF16);
  EXPECT_EQ(WireDType(DType::kF16, Compression::kNone), DType::kF16);
}

TEST(TypesTest, ParseCompressionNamesEveryEncodingAndRejectsOthers) {
  for (Compression c : {Compression::kNone, Compression::kF16, Compression::kBF16}) {
    absl::StatusOr<CompressionSpec> parsed = ParseCompression(CompressionName(c));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_EQ(*ParseCompression(""), Compression::kNone);
  absl::StatusOr<CompressionSpec> bad = ParseCompression("fp8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'fp8'"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("none, f16, bf16, topk"), std::string::npos)
      << bad.status();
}

TEST(TypesTest, ParseCompressionReadsTopKRatios) {
  EXPECT_EQ(*ParseCompression("topk"), CompressionSpec(Compression::kTopK, kDefaultTopKRatio));
  EXPECT_EQ(*ParseCompression("topk:0.05"), CompressionSpec(Compression::kTopK, 0.05));
  EXPECT_EQ(*ParseCompression("topk:1"), CompressionSpec(Compression::kTopK, 1.0));
  for (const char* bad : {"topk:0", "topk:-0.1", "topk:1.5", "topk:", "topk:x", "topk:nan"}) {
    absl::StatusOr<CompressionSpec> parsed = ParseCompression(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("(0, 1]"), std::string::npos) << parsed.status();
  }
  const CompressionSpec c(Compression::kTopK, 0.05);
  EXPECT_EQ(*ParseCompression(DescribeCompression(c)), c);
  EXPECT_EQ(DescribeCompression(Compression::kBF16), "bf16");
  EXPECT_TRUE(ValidateCompression(c).ok());
  EXPECT_FALSE(ValidateCompression({Compression::kTopK, 0}).ok());
  EXPECT_FALSE(ValidateCompression({Compression::kNone, 0.5}).ok());
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
