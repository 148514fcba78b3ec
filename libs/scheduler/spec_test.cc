#include "libs/scheduler/spec.h"

#include <cmath>
#include <functional>

#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

JobSpec Good() {
  JobSpec s;
  s.set_name("mlp-test");
  s.set_model("mlp");
  s.set_epochs(2);
  s.set_global_batch_size(256);
  s.set_lr(0.1);
  return s;
}

TEST(SpecTest, GoodSpecPassesAndGetsDefaults) {
  JobSpec s = Good();
  ASSERT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
  ApplyDefaults(&s);
  EXPECT_EQ(s.num_trainers(), 1);
  EXPECT_EQ(s.devices_per_trainer(), 1);
  EXPECT_EQ(s.device_kind(), "cpu");
  EXPECT_EQ(s.sync().mode(), v1::ALLREDUCE);
  EXPECT_EQ(s.sync().consistency(), v1::SYNCHRONOUS);
  EXPECT_EQ(s.init(), "normal");
  EXPECT_EQ(s.min_trainers(), 1);
  EXPECT_EQ(s.max_trainers(), 1);
}

TEST(SpecTest, ElasticAllreduceJobPassesAndKeepsItsBounds) {
  JobSpec s = Good();
  s.set_num_trainers(2);
  s.set_min_trainers(1);
  s.set_max_trainers(4);
  ASSERT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
  ApplyDefaults(&s);
  EXPECT_EQ(s.min_trainers(), 1);
  EXPECT_EQ(s.max_trainers(), 4);
  // CUDA trainers too (their state travels through host memory), several
  // GPUs per trainer included.
  s.set_device_kind("cuda");
  s.set_devices_per_trainer(2);
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
}

TEST(SpecTest, EveryBadFieldIsNamed) {
  struct Case {
    std::function<void(JobSpec*)> mutate;
    std::string field;
  };
  const Case cases[] = {
      {[](JobSpec* s) { s->set_name(""); }, "name: required"},
      {[](JobSpec* s) { s->set_name("has space"); }, "name:"},
      {[](JobSpec* s) { s->set_name(std::string(64, 'a')); }, "name:"},
      {[](JobSpec* s) { s->set_model("vgg"); }, "model:"},
      {[](JobSpec* s) { s->set_model(""); }, "model:"},
      // Both a built-in model and a model file.
      {[](JobSpec* s) { s->set_model_digest("sha256:" + std::string(64, 'a')); },
       "model: give either model"},
      {[](JobSpec* s) {
         s->clear_model();
         s->set_model_digest("sha256:ABC");
       },
       "model_digest: must be \"sha256:\" and 64 lowercase hex digits"},
      {[](JobSpec* s) { s->set_init("from_model"); }, "init: from_model"},
      {[](JobSpec* s) { s->set_epochs(0); }, "epochs:"},
      {[](JobSpec* s) { s->set_global_batch_size(0); }, "global_batch_size:"},
      {[](JobSpec* s) {
         s->set_num_trainers(3);
         s->set_global_batch_size(256);
       },
       "global_batch_size: must be divisible"},
      {[](JobSpec* s) { s->set_lr(0); }, "lr:"},
      {[](JobSpec* s) { s->set_lr(-1); }, "lr:"},
      {[](JobSpec* s) { s->set_momentum(1); }, "momentum:"},
      // Checked as the float32 values the trainers use.
      {[](JobSpec* s) { s->set_lr(1e308); }, "lr: must be in (0, 1000] and a normal float32"},
      {[](JobSpec* s) { s->set_lr(1e-50); }, "lr: must be in (0, 1000] and a normal float32"},
      {[](JobSpec* s) { s->set_lr(std::nan("")); }, "lr:"},
      {[](JobSpec* s) { s->set_momentum(0.9999999999); },
       "momentum: must be in [0, 1) as a float32 number, got 0.99999999989999999 (float32 1)"},
      {[](JobSpec* s) { s->set_weight_decay(1e300); }, "weight_decay: must be in [0, 1]"},
      {[](JobSpec* s) { s->set_weight_decay(std::nan("")); }, "weight_decay:"},
      {[](JobSpec* s) { s->set_weight_decay(-0.1); }, "weight_decay:"},
      {[](JobSpec* s) { s->set_num_trainers(-1); }, "num_trainers:"},
      {[](JobSpec* s) { s->set_num_trainers(2000); }, "num_trainers:"},
      {[](JobSpec* s) { s->set_devices_per_trainer(-1); }, "devices_per_trainer:"},
      {[](JobSpec* s) { s->set_device_kind("tpu"); }, "device_kind:"},
      {[](JobSpec* s) {
         s->set_hybridize(true);
         s->set_num_trainers(2);
       },
       "hybridize:"},
      {[](JobSpec* s) {
         s->set_sync_batch_norm(true);
         s->set_num_trainers(2);
         s->mutable_sync()->set_mode(v1::KVSTORE);
       },
       "sync_batch_norm:"},
      {[](JobSpec* s) {
         s->set_collective_tls(true);
         s->mutable_sync()->set_mode(v1::KVSTORE);
       },
       "collective_tls:"},
      {[](JobSpec* s) {
         s->set_hybridize(true);
         s->set_device_kind("cuda");
       },
       "hybridize:"},
      {[](JobSpec* s) { s->mutable_sync()->set_consistency(v1::ASYNCHRONOUS); },
       "sync.consistency:"},
      {[](JobSpec* s) {
         s->mutable_sync()->set_mode(v1::KVSTORE);
         s->mutable_sync()->set_consistency(v1::BOUNDED_DELAY);
       },
       "sync.max_staleness:"},
      {[](JobSpec* s) { s->mutable_sync()->set_mode(static_cast<v1::SyncMode>(42)); },
       "sync.mode:"},
      {[](JobSpec* s) { s->set_checkpoint_interval_epochs(-1); }, "checkpoint_interval_epochs:"},
      {[](JobSpec* s) { s->set_priority(5000); }, "priority:"},
      {[](JobSpec* s) { s->set_train_limit(-1); }, "train_limit:"},
      {[](JobSpec* s) { s->set_test_limit(-1); }, "test_limit:"},
      {[](JobSpec* s) { s->set_init("zeros"); }, "init:"},
      {[](JobSpec* s) { s->set_threads(-2); }, "threads:"},
      {[](JobSpec* s) { s->set_bucket_bytes(100); }, "bucket_bytes:"},
      {[](JobSpec* s) { s->set_bucket_bytes((int64_t{1} << 30) + 1); }, "bucket_bytes:"},
      {[](JobSpec* s) {
         s->set_num_trainers(2);
         s->set_min_trainers(3);
       },
       "min_trainers: must be in 1..num_trainers"},
      {[](JobSpec* s) { s->set_min_trainers(-1); }, "min_trainers:"},
      {[](JobSpec* s) {
         s->set_num_trainers(2);
         s->set_max_trainers(1);
       },
       "max_trainers: must be in num_trainers..1024"},
      {[](JobSpec* s) {
         s->set_num_trainers(2);
         s->set_min_trainers(1);
         s->mutable_sync()->set_mode(v1::KVSTORE);
       },
       "min_trainers: elastic jobs"},
      {[](JobSpec* s) {
         s->set_num_trainers(2);
         s->set_max_trainers(4);
         s->set_sync_batch_norm(true);
       },
       "max_trainers: elastic jobs"},
      {[](JobSpec* s) { s->set_max_trainers(2); }, "max_trainers: elastic jobs"},
      {[](JobSpec* s) {
         s->mutable_sync()->set_mode(v1::KVSTORE);
         s->mutable_sync()->set_gradient_compression("fp8");
       },
       "sync.gradient_compression: unknown gradient compression 'fp8'"},
      {[](JobSpec* s) { s->mutable_sync()->set_gradient_compression("f16"); },
       "sync.gradient_compression: f16 needs sync.mode KVSTORE"},
      {[](JobSpec* s) {
         s->mutable_sync()->set_mode(v1::KVSTORE);
         s->mutable_sync()->set_gradient_compression("topk:0");
       },
       "sync.gradient_compression: top-k ratio '0' must be a number in (0, 1]"},
      {[](JobSpec* s) {
         s->mutable_sync()->set_mode(v1::KVSTORE);
         s->mutable_sync()->set_gradient_compression("topk:1.5");
       },
       "sync.gradient_compression: top-k ratio '1.5' must be a number in (0, 1]"},
      {[](JobSpec* s) { s->mutable_sync()->set_gradient_compression("topk"); },
       "sync.gradient_compression: topk needs sync.mode KVSTORE"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    JobSpec s = Good();
    c.mutate(&s);
    absl::Status st = ValidateJobSpec(s);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(st.message().rfind(c.field, 0), 0u) << st.message();
  }
}

TEST(SpecTest, AModelFileJobNamesItsDigest) {
  JobSpec s = Good();
  s.clear_model();
  s.set_model_digest("sha256:" + std::string(64, '0'));
  s.set_init("from_model");
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
}

TEST(SpecTest, KvstoreBoundedDelayIsFine) {
  JobSpec s = Good();
  s.mutable_sync()->set_mode(v1::KVSTORE);
  s.mutable_sync()->set_consistency(v1::BOUNDED_DELAY);
  s.mutable_sync()->set_max_staleness(2);
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
  for (const char* c : {"none", "f16", "bf16", "topk", "topk:0.1", "topk:1"}) {
    s.mutable_sync()->set_gradient_compression(c);
    EXPECT_TRUE(ValidateJobSpec(s).ok()) << c << ": " << ValidateJobSpec(s);
  }
}

TEST(SpecTest, DataSpecIsCheckedAtSubmit) {
  JobSpec s = Good();
  s.mutable_data()->set_format("webdataset");
  s.mutable_data()->set_train("/data/fmnist/train-{000000..000005}.tar");
  s.mutable_data()->set_channels(1);
  s.mutable_data()->set_height(28);
  s.mutable_data()->set_width(28);
  ASSERT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
  const std::vector<std::pair<std::function<void(JobSpec*)>, std::string>> bad = {
      {[](JobSpec* j) { j->mutable_data()->set_train("shards/train-{0..3}.tar"); },
       "data.train: 'shards/train-0.tar' is a relative path"},
      {[](JobSpec* j) { j->mutable_data()->set_format("csv"); }, "data.format:"},
      {[](JobSpec* j) { j->mutable_data()->set_channels(4); }, "data.channels:"},
      {[](JobSpec* j) { j->mutable_data()->set_width(0); }, "data.height:"},
      {[](JobSpec* j) { j->mutable_data()->mutable_transforms()->set_mean("0.5,x"); },
       "data.transforms.mean:"},
      {[](JobSpec* j) { j->set_data_dir("fashion"); }, "data_dir: 'fashion' is a relative path"},
  };
  for (const auto& [change, expected] : bad) {
    JobSpec j = s;
    change(&j);
    absl::Status status = ValidateJobSpec(j);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << expected;
    EXPECT_EQ(std::string(status.message()).rfind(expected, 0), 0u) << status;
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
