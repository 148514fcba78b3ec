// ShardHandler without a transport: requests as the data port hands them
// over (DataRequest), control calls as protobufs, and what the shard
// counts in its metrics.
#include "libs/kvstore/shard.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/kvstore/proto_convert.h"
#include "libs/security/job_token.h"

namespace dtrain {
namespace kvstore {
namespace {

std::string F32(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> Floats(absl::string_view bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// The value of `name`{labels} in `families`; -1 when absent.
double Value(const std::vector<prometheus::MetricFamily>& families, const std::string& name,
             const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> have;
      for (const prometheus::ClientMetric::Label& l : m.label) have[l.name] = l.value;
      if (have != labels) continue;
      if (f.type == prometheus::MetricType::Counter) return m.counter.value;
      if (f.type == prometheus::MetricType::Gauge) return m.gauge.value;
      if (f.type == prometheus::MetricType::Histogram) {
        return static_cast<double>(m.histogram.sample_count);
      }
    }
  }
  return -1;
}

class ShardTest : public testing::Test {
 protected:
  void SetUp() override {
    ShardHandlerOptions options;
    options.max_pull_wait = absl::Seconds(5);
    shard_ = std::make_unique<ShardHandler>(options, &store_, &snapshotter_, nullptr);
    // Job "j": one worker, key "w" of 4 f32 starting at 1 2 3 4.
    JobConfig config;
    config.job = "j";
    v1::CreateJobRequest create;
    *create.mutable_config() = ToProto(config);
    v1::CreateJobResponse created;
    ASSERT_TRUE(shard_->CreateJob(create, &created).ok());
    ASSERT_TRUE(created.created());
    SliceSpec spec;
    spec.key = "w";
    spec.shape = {4};
    spec.count = 4;
    v1::InitRequest init;
    init.set_job("j");
    *init.add_slices() = ToProto(spec);
    v1::Chunk* chunk = init.add_chunks();
    chunk->set_item(0);
    chunk->set_data(F32({1, 2, 3, 4}));
    bool sent = false;
    v1::InitResponse initialized;
    ASSERT_TRUE(shard_
                    ->Init(
                        [&](v1::InitRequest* m) {
                          if (sent) return false;
                          *m = init;
                          sent = true;
                          return true;
                        },
                        &initialized)
                    .ok());
    ASSERT_EQ(initialized.created(), 1);
  }

  // A data port request of `op` with `header` and `payload`.
  absl::Status Handle(DataOp op, const google::protobuf::Message& header,
                      const std::string& payload, DataReply* reply) {
    const std::string serialized = header.SerializeAsString();
    DataRequest request;
    request.op = op;
    request.header = serialized;
    request.payload_bytes = payload.size();
    request.read_payload = [&]() -> absl::StatusOr<absl::string_view> { return payload; };
    request.deadline = absl::Now() + absl::Seconds(5);
    request.cancelled = [] { return false; };
    security::Identity who = security::Anonymous();
    request.who = &who;
    return shard_->Handle(request, reply);
  }

  v1::PushRequest Push(int64_t round) {
    v1::PushRequest push;
    push.set_job("j");
    v1::PushItem* item = push.add_items();
    item->set_key("w");
    item->set_round(round);
    item->set_dtype(static_cast<int32_t>(DType::kF32));
    item->add_shape(4);
    return push;
  }

  std::vector<prometheus::MetricFamily> Metrics() {
    std::vector<prometheus::MetricFamily> all = shard_->registry()->Collect();
    std::vector<prometheus::MetricFamily> store = shard_->store_metrics()->Collect();
    all.insert(all.end(), store.begin(), store.end());
    return all;
  }

  Store store_{StoreOptions()};
  Snapshotter snapshotter_{&store_, "", absl::ZeroDuration()};
  std::unique_ptr<ShardHandler> shard_;
};

TEST_F(ShardTest, PushPullAndPullThroughTheDataPortEntryPoint) {
  DataReply reply;
  ASSERT_TRUE(Handle(DataOp::kPushPull, Push(1), F32({10, 20, 30, 40}), &reply).ok());
  v1::PullResponse header;
  ASSERT_TRUE(header.ParseFromString(reply.header));
  ASSERT_EQ(header.items_size(), 1);
  EXPECT_EQ(header.items(0).round(), 1);
  ASSERT_EQ(reply.values.size(), 1u);
  // One worker, no optimizer: the round's value is its gradient.
  EXPECT_EQ(Floats(reply.values[0]), (std::vector<float>{10, 20, 30, 40}));

  v1::PullRequest pull;
  pull.set_job("j");
  v1::PullItem* item = pull.add_items();
  item->set_key("w");
  item->set_round(1);
  DataReply pulled;
  ASSERT_TRUE(Handle(DataOp::kPull, pull, "", &pulled).ok());
  ASSERT_EQ(pulled.values.size(), 1u);
  EXPECT_EQ(Floats(pulled.values[0]), (std::vector<float>{10, 20, 30, 40}));
  // The same values through the gRPC adapters' entry point.
  absl::StatusOr<std::vector<PulledValue>> values = shard_->Pull(pull, PullOptions());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(Floats((*values)[0].bytes.view()), (std::vector<float>{10, 20, 30, 40}));

  const std::vector<prometheus::MetricFamily> m = Metrics();
  EXPECT_EQ(Value(m, "dtrain_kvstore_requests_total", {{"method", "PushPull"}, {"code", "OK"}}), 1);
  EXPECT_EQ(Value(m, "dtrain_kvstore_requests_total", {{"method", "Pull"}, {"code", "OK"}}), 1);
  EXPECT_EQ(Value(m, "dtrain_kvstore_push_bytes_total", {}), 16);
  // PushPull's reply and Pull's: 16 bytes each (Pull above is not a call).
  EXPECT_EQ(Value(m, "dtrain_kvstore_pull_bytes_total", {}), 32);
  EXPECT_EQ(Value(m, "dtrain_kvstore_keys", {{"job", "j"}}), 1);
  EXPECT_EQ(Value(m, "dtrain_kvstore_rounds_completed_total", {{"job", "j"}}), 1);
}

TEST_F(ShardTest, ARetriedPushIsCountedAsADuplicate) {
  DataReply first, again;
  ASSERT_TRUE(Handle(DataOp::kPush, Push(1), F32({1, 1, 1, 1}), &first).ok());
  ASSERT_TRUE(Handle(DataOp::kPush, Push(1), F32({1, 1, 1, 1}), &again).ok());
  v1::PushResponse a, b;
  ASSERT_TRUE(a.ParseFromString(first.header));
  ASSERT_TRUE(b.ParseFromString(again.header));
  EXPECT_EQ(a.applied(), 1);
  EXPECT_EQ(b.applied(), 0);
  EXPECT_EQ(b.duplicates(), 1);
  EXPECT_EQ(Value(Metrics(), "dtrain_kvstore_duplicate_pushes_total", {}), 1);
}

TEST_F(ShardTest, MalformedRequestsAreRefusedAndCountedByCode) {
  v1::PullRequest pull;
  pull.set_job("j");
  DataReply reply;
  absl::Status s = Handle(DataOp::kPull, pull, "xx", &reply);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("carries no payload"), std::string::npos) << s;
  // A payload that disagrees with the items' sizes.
  s = Handle(DataOp::kPush, Push(1), F32({1, 2}), &reply);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("items need 16"), std::string::npos) << s;
  // REPLICATE on an unreplicated shard.
  s = Handle(DataOp::kReplicate, v1::ReplicateBatch(), "", &reply);
  EXPECT_FALSE(s.ok());
  const std::vector<prometheus::MetricFamily> m = Metrics();
  EXPECT_EQ(
      Value(m, "dtrain_kvstore_requests_total", {{"method", "Pull"}, {"code", "INVALID_ARGUMENT"}}),
      1);
  EXPECT_EQ(
      Value(m, "dtrain_kvstore_requests_total", {{"method", "Push"}, {"code", "INVALID_ARGUMENT"}}),
      1);
  EXPECT_EQ(Value(m, "dtrain_kvstore_push_bytes_total", {}), 0);
}

TEST(ShardAuthorizeTest, TrainersNeedATokenForTheJobTheyName) {
  const std::string secret(64, 'a');
  ShardHandlerOptions options;
  options.job_token_secret = secret;
  Store store{StoreOptions()};
  Snapshotter snapshotter(&store, "", absl::ZeroDuration());
  ShardHandler shard(options, &store, &snapshotter, nullptr);
  security::Identity trainer{"trainer-0", security::Role::kTrainer, true};
  absl::StatusOr<ShardHandler::Grant> none = shard.Authorize(trainer, "Push", nullptr);
  EXPECT_TRUE(absl::IsPermissionDenied(none.status())) << none.status();

  const std::string token =
      security::MintJobToken(secret, "job-a", absl::Now() + absl::Hours(1), 2);
  absl::StatusOr<ShardHandler::Grant> grant = shard.Authorize(trainer, "Push", &token);
  ASSERT_TRUE(grant.ok()) << grant.status();
  ASSERT_TRUE(grant->has_value());
  EXPECT_EQ((*grant)->job, "job-a");
  // The data port's HELLO binds the connection to the token's job only.
  v1::DataHello hello;
  hello.set_job("job-b");
  hello.set_token(token);
  absl::StatusOr<ShardHandler::Grant> other = shard.Hello(trainer, hello, DataConn::Kind::kTcp);
  EXPECT_TRUE(absl::IsPermissionDenied(other.status())) << other.status();
  hello.set_job("job-a");
  EXPECT_TRUE(shard.Hello(trainer, hello, DataConn::Kind::kTcp).ok());

  // Admins are unconfined and need no token; trainers may not snapshot.
  security::Identity admin{"root", security::Role::kAdmin, true};
  absl::StatusOr<ShardHandler::Grant> unconfined = shard.Authorize(admin, "Snapshot", nullptr);
  ASSERT_TRUE(unconfined.ok()) << unconfined.status();
  EXPECT_FALSE(unconfined->has_value());
  EXPECT_TRUE(absl::IsPermissionDenied(shard.Authorize(trainer, "Snapshot", &token).status()));
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
