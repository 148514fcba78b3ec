#include "libs/kvstore/proto_convert.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

TEST(ProtoConvertTest, RoundTrips) {
  JobConfig c;
  c.job = "j";
  c.num_workers = 3;
  c.consistency = Consistency::kBoundedDelay;
  c.max_staleness = 2;
  c.optimizer = OptimizerKind::kSgd;
  c.learning_rate = 0.1;
  c.momentum = 0.9;
  c.weight_decay = 1e-4;
  c.gradient_scale = 1.0 / 3;
  c.placement = "v2 colocate_below_bytes=65536 slice_threshold_bytes=262144";
  EXPECT_EQ(*FromProto(ToProto(c)), c);

  SliceSpec s;
  s.key = "w";
  s.slice = 1;
  s.num_slices = 2;
  s.dtype = DType::kBF16;
  s.shape = {4, 5};
  s.offset = 10;
  s.count = 10;
  EXPECT_EQ(*FromProto(ToProto(s)), s);

  for (Compression k :
       {Compression::kNone, Compression::kF16, Compression::kBF16, Compression::kTopK}) {
    EXPECT_EQ(*FromProto(ToProto(k)), k);
  }
  EXPECT_EQ(*CompressionFromProto(v1::COMPRESSION_TOPK, 0.1),
            CompressionSpec(Compression::kTopK, 0.1));
  EXPECT_EQ(CompressionFromProto(v1::COMPRESSION_TOPK, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompressionFromProto(v1::COMPRESSION_F16, 0.1).status().code(),
            absl::StatusCode::kInvalidArgument);
  JobStatus status;
  status.config = c;
  status.shard_index = 2;
  status.num_keys = 1;
  status.slices.push_back({s, 4, 5});
  JobStatus back = *FromProto(ToProto(status));
  EXPECT_EQ(back.config, c);
  EXPECT_EQ(back.slices[0].spec, s);
  EXPECT_EQ(back.slices[0].pushed_round, 5);
}

TEST(ProtoConvertTest, RejectsUnknownValuesNamingThem) {
  v1::JobConfig p;
  p.set_job("j");
  EXPECT_TRUE(absl::StrContains(FromProto(p).status().message(), "consistency 0"));
  p.set_consistency(v1::CONSISTENCY_SYNC);
  p.set_optimizer(static_cast<v1::Optimizer>(5));
  EXPECT_TRUE(absl::StrContains(FromProto(p).status().message(), "optimizer 5"));
  p.set_optimizer(v1::OPTIMIZER_NONE);
  EXPECT_EQ(FromProto(p)->gradient_scale, 1);  // 0 means 1
  v1::SliceSpec s;
  s.set_key("w");
  s.set_dtype(77);
  EXPECT_TRUE(absl::StrContains(FromProto(s).status().message(), "77"));
  EXPECT_EQ(FromProto(static_cast<v1::Compression>(4)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
