#include "libs/agent/job_plan.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace agent {
namespace {

namespace v1 = scheduler::v1;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// An assignment with every JobSpec field set to a value other than its
// default, so a field that is not mapped shows.
v1::Assignment FullAssignment() {
  v1::Assignment a;
  a.set_job_id("job-000042");
  a.set_rank(1);
  a.set_world_size(2);
  a.set_attempt(3);
  a.set_resume_checkpoint("/shared/job-000042.ckpt");
  a.set_resume_epoch(4);
  a.set_collective_secret("attempt-3-secret");
  v1::JobSpec* s = a.mutable_spec();
  s->set_name("mapped");
  s->set_model("resnet18");
  s->set_data_dir("/data/fashion");
  s->set_epochs(7);
  s->set_global_batch_size(512);
  s->set_lr(0.125);
  s->set_momentum(0.5);
  s->set_weight_decay(0.25);
  s->set_num_trainers(2);
  s->set_devices_per_trainer(3);
  s->set_device_kind("cpu");
  s->mutable_sync()->set_mode(v1::ALLREDUCE);
  s->mutable_sync()->set_consistency(v1::SYNCHRONOUS);
  s->set_seed(99);
  s->set_checkpoint_interval_epochs(2);
  s->set_priority(5);
  s->set_train_limit(1000);
  s->set_test_limit(500);
  s->set_init("kaiming");
  s->set_threads(6);
  s->set_bucket_bytes(65536);
  s->set_sync_batch_norm(true);
  s->set_collective_tls(true);
  return a;
}

TrainerResources Cpu() {
  TrainerResources r;
  r.devices = {"cpu"};
  r.checkpoint_dir = "/ckpt";
  r.collective_host = "10.0.0.7";
  r.collective_timeout = absl::Seconds(17);
  r.data_roots = {"/data"};
  return r;
}

TEST(JobPlanTest, DataDirMustLieUnderTheTrainersDataRoots) {
  v1::Assignment a = FullAssignment();
  for (const char* ok : {"/data", "/data/fashion", "//data//fashion/"}) {
    a.mutable_spec()->set_data_dir(ok);
    EXPECT_TRUE(PlanJob(a, Cpu()).ok()) << ok;
  }
  // A relative path is refused at submit already (ValidateJobSpec).
  a.mutable_spec()->set_data_dir("data/fashion");
  EXPECT_EQ(PlanJob(a, Cpu()).status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* bad : {"/etc", "/database", "/data/../etc", "/data/./x"}) {
    a.mutable_spec()->set_data_dir(bad);
    absl::StatusOr<JobPlan> plan = PlanJob(a, Cpu());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kPermissionDenied) << bad;
    EXPECT_NE(plan.status().message().find("--data_roots (/data)"), std::string::npos)
        << plan.status();
  }
  // The default roots: Debian's datasets only.
  TrainerResources defaults;
  defaults.devices = {"cpu"};
  a.mutable_spec()->set_data_dir("/usr/share/datasets/fashion-mnist");
  EXPECT_TRUE(PlanJob(a, defaults).ok());
  a.mutable_spec()->set_data_dir("/root/.ssh");
  EXPECT_EQ(PlanJob(a, defaults).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(JobPlanTest, MapsEveryField) {
  absl::StatusOr<JobPlan> plan = PlanJob(FullAssignment(), Cpu());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const train::JobConfig& c = plan->config;
  EXPECT_EQ(c.name, "job-000042");
  EXPECT_EQ(c.model, "resnet18");
  EXPECT_EQ(c.data_dir, "/data/fashion");
  EXPECT_EQ(c.epochs, 7);
  EXPECT_EQ(c.global_batch_size, 512);
  EXPECT_FLOAT_EQ(c.sgd.lr, 0.125f);
  EXPECT_FLOAT_EQ(c.sgd.momentum, 0.5f);
  EXPECT_FLOAT_EQ(c.sgd.weight_decay, 0.25f);
  EXPECT_EQ(c.init, "kaiming");
  EXPECT_EQ(c.seed, 99u);
  EXPECT_EQ(c.threads, 6);
  EXPECT_EQ(c.bucket_bytes, 65536);
  EXPECT_EQ(c.train_limit, 1000);
  EXPECT_EQ(c.test_limit, 500);
  EXPECT_FALSE(c.hybridize);
  EXPECT_TRUE(c.sync_batch_norm);
  EXPECT_EQ(c.checkpoint_interval_epochs, 2);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.world_size, 2);
  EXPECT_EQ(c.devices, (std::vector<Device>{Device::Cpu(0), Device::Cpu(1), Device::Cpu(2)}));
  EXPECT_EQ(c.checkpoint_path, "/ckpt/job-000042.ckpt");
  EXPECT_EQ(c.checkpoint_metadata,
            (std::map<std::string, std::string>{{"job_id", "job-000042"}, {"attempt", "3"}}));
  EXPECT_EQ(c.resume_from, "/shared/job-000042.ckpt");
  EXPECT_EQ(c.communicator, nullptr);
  EXPECT_EQ(c.kvstore, nullptr);

  // Two CPU trainers: TCP allreduce with the trainer's collective settings.
  EXPECT_STREQ(plan->strategy->name(), "allreduce");
  EXPECT_EQ(plan->communicator_options.transport, collective::TransportKind::kTcp);
  EXPECT_EQ(plan->communicator_options.timeout, absl::Seconds(17));
  EXPECT_EQ(plan->communicator_options.tcp.host, "10.0.0.7");
  EXPECT_EQ(plan->communicator_options.key_prefix, "allreduce");
  EXPECT_EQ(plan->communicator_options.tcp.secret, "attempt-3-secret");
  EXPECT_TRUE(plan->communicator_options.tcp.tls);
  EXPECT_TRUE(plan->kvstore_job.empty());
}

TEST(JobPlanTest, HybridizeIsMapped) {
  v1::Assignment a;
  a.set_job_id("j");
  a.set_world_size(1);
  a.mutable_spec()->set_name("h");
  a.mutable_spec()->set_model("mlp");
  a.mutable_spec()->set_epochs(1);
  a.mutable_spec()->set_global_batch_size(64);
  a.mutable_spec()->set_lr(0.1);
  a.mutable_spec()->set_hybridize(true);
  absl::StatusOr<JobPlan> plan = PlanJob(a, Cpu());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->config.hybridize);
}

// A model file: the job trains <model_cache_dir>/<hex>, named by its digest.
TEST(JobPlanTest, ModelDigestIsTheCachedFile) {
  v1::Assignment a = FullAssignment();
  const std::string hex(64, 'a');
  a.mutable_spec()->clear_model();
  a.mutable_spec()->set_model_digest("sha256:" + hex);
  a.mutable_spec()->set_init("from_model");
  TrainerResources r = Cpu();
  r.model_cache_dir = "/work/models";
  absl::StatusOr<JobPlan> plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.model, "sha256:" + hex);
  EXPECT_EQ(plan->config.model_file, "/work/models/" + hex);
  EXPECT_EQ(plan->config.init, "from_model");
  // A built-in model has none.
  absl::StatusOr<JobPlan> builtin = PlanJob(FullAssignment(), r);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  EXPECT_EQ(builtin->config.model_file, "");
  // Without a cache directory the trainer cannot take it.
  EXPECT_EQ(PlanJob(a, Cpu()).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Zero values mean the documented defaults: one trainer, one cpu device,
// normal init, allreduce (nothing to connect for one trainer).
TEST(JobPlanTest, ZeroValuesMeanDefaults) {
  v1::Assignment a;
  a.set_job_id("job-1");
  a.set_world_size(1);
  a.mutable_spec()->set_name("d");
  a.mutable_spec()->set_model("mlp");
  a.mutable_spec()->set_epochs(1);
  a.mutable_spec()->set_global_batch_size(64);
  a.mutable_spec()->set_lr(0.1);
  absl::StatusOr<JobPlan> plan = PlanJob(a, Cpu());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.init, "normal");
  EXPECT_EQ(plan->config.devices, std::vector<Device>{Device::Cpu(0)});
  EXPECT_EQ(plan->config.rank, 0);
  EXPECT_EQ(plan->config.world_size, 1);
  EXPECT_EQ(plan->config.resume_from, "");
  EXPECT_EQ(plan->config.checkpoint_metadata.at("attempt"), "0");
  EXPECT_STREQ(plan->strategy->name(), "local");
}

TEST(JobPlanTest, KvstoreModeAndItsConsistencies) {
  v1::Assignment a = FullAssignment();
  a.mutable_spec()->set_sync_batch_norm(false);
  a.mutable_spec()->set_collective_tls(false);
  a.mutable_spec()->mutable_sync()->set_mode(v1::KVSTORE);
  TrainerResources r = Cpu();
  absl::Status none = PlanJob(a, r).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(none.message()), HasSubstr("--kvstore"));

  r.has_parameter_server = true;
  absl::StatusOr<JobPlan> plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_STREQ(plan->strategy->name(), "kvstore_sync");
  EXPECT_EQ(plan->kvstore_job, "job-000042-a3");
  EXPECT_EQ(plan->config.kvstore_consistency, kvstore::Consistency::kSync);

  a.mutable_spec()->mutable_sync()->set_consistency(v1::ASYNCHRONOUS);
  plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.kvstore_consistency, kvstore::Consistency::kAsync);
  EXPECT_STREQ(plan->strategy->name(), "kvstore_weights");

  a.mutable_spec()->mutable_sync()->set_consistency(v1::BOUNDED_DELAY);
  a.mutable_spec()->mutable_sync()->set_max_staleness(4);
  plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.kvstore_consistency, kvstore::Consistency::kBoundedDelay);
  EXPECT_EQ(plan->config.kvstore_max_staleness, 4);
  EXPECT_EQ(plan->config.kvstore_compression, kvstore::Compression::kNone);

  a.mutable_spec()->mutable_sync()->set_gradient_compression("bf16");
  plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.kvstore_compression, kvstore::Compression::kBF16);
  a.mutable_spec()->mutable_sync()->set_gradient_compression("topk:0.05");
  plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.kvstore_compression,
            kvstore::CompressionSpec(kvstore::Compression::kTopK, 0.05));
  a.mutable_spec()->mutable_sync()->set_gradient_compression("f8");
  EXPECT_EQ(PlanJob(a, r).status().code(), absl::StatusCode::kInvalidArgument);
}

// CUDA devices come from what the trainer offers; NCCL between trainers with
// one GPU each unless the trainer says tcp; host staging otherwise.
TEST(JobPlanTest, CudaDevicesAndNcclOrTcp) {
  v1::Assignment a = FullAssignment();
  a.mutable_spec()->set_device_kind("cuda");
  a.mutable_spec()->set_devices_per_trainer(1);
  TrainerResources r = Cpu();
  r.devices = {"cuda:2", "cuda:3"};
  absl::StatusOr<JobPlan> plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.devices, std::vector<Device>{Device::Cuda(2)});
  EXPECT_STREQ(plan->strategy->name(), "nccl_allreduce");
  EXPECT_EQ(plan->communicator_options.transport, collective::TransportKind::kNccl);
  EXPECT_EQ(plan->communicator_options.cuda_device, 2);

  r.cuda_collective = CudaCollective::kTcp;
  plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_STREQ(plan->strategy->name(), "allreduce");
  EXPECT_EQ(plan->communicator_options.transport, collective::TransportKind::kTcp);

  // Two GPUs per trainer: staged through host memory over TCP.
  r.cuda_collective = CudaCollective::kNccl;
  a.mutable_spec()->set_devices_per_trainer(2);
  plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.devices, (std::vector<Device>{Device::Cuda(2), Device::Cuda(3)}));
  EXPECT_STREQ(plan->strategy->name(), "allreduce");

  // "cuda" alone is cuda:0.
  r.devices = {"cpu", "cuda"};
  a.mutable_spec()->set_devices_per_trainer(1);
  plan = PlanJob(a, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.devices, std::vector<Device>{Device::Cuda(0)});
}

TEST(JobPlanTest, TooFewDevicesNamesBothSides) {
  v1::Assignment a = FullAssignment();
  a.mutable_spec()->set_device_kind("cuda");
  a.mutable_spec()->set_devices_per_trainer(2);
  TrainerResources r = Cpu();
  r.devices = {"cpu", "cuda:0"};
  absl::Status s = PlanJob(a, r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "the job needs 2 cuda devices; this trainer has cpu,cuda:0");
}

TEST(JobPlanTest, BadValuesAreNamed) {
  struct Case {
    std::function<void(v1::Assignment*)> change;
    std::string message_start;
  };
  const Case cases[] = {
      {[](v1::Assignment* a) { a->clear_job_id(); }, "assignment.job_id: required"},
      {[](v1::Assignment* a) { a->set_world_size(0); }, "assignment.world_size: must be >= 1"},
      {[](v1::Assignment* a) { a->set_rank(2); }, "assignment.rank: must be in 0..1, got 2"},
      {[](v1::Assignment* a) { a->set_rank(-1); }, "assignment.rank: must be in 0..1, got -1"},
      {[](v1::Assignment* a) { a->set_attempt(-1); }, "assignment.attempt: must be >= 0"},
      {[](v1::Assignment* a) { a->mutable_spec()->set_model("vgg"); }, "spec.model: "},
      {[](v1::Assignment* a) { a->mutable_spec()->set_epochs(0); }, "spec.epochs: "},
      {[](v1::Assignment* a) { a->mutable_spec()->set_lr(-1); }, "spec.lr: "},
      {[](v1::Assignment* a) { a->mutable_spec()->set_device_kind("tpu"); }, "spec.device_kind: "},
      {[](v1::Assignment* a) { a->mutable_spec()->set_init("zeros"); }, "spec.init: "},
      {[](v1::Assignment* a) { a->mutable_spec()->set_global_batch_size(511); },
       "spec.global_batch_size: "},
      {[](v1::Assignment* a) { a->set_world_size(3); },
       "spec.global_batch_size: must be divisible by assignment.world_size (3), got 512"},
  };
  for (const Case& c : cases) {
    v1::Assignment a = FullAssignment();
    c.change(&a);
    absl::Status s = PlanJob(a, Cpu()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message_start;
    EXPECT_THAT(std::string(s.message()), StartsWith(c.message_start));
  }
}

TEST(JobPlanTest, ParsesCudaCollective) {
  EXPECT_EQ(*ParseCudaCollective("auto"), CudaCollective::kAuto);
  EXPECT_EQ(*ParseCudaCollective("nccl"), CudaCollective::kNccl);
  EXPECT_EQ(*ParseCudaCollective("tcp"), CudaCollective::kTcp);
  absl::Status s = ParseCudaCollective("gloo").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "cuda collective must be auto, nccl or tcp, got 'gloo'");
}

TEST(JobPlanTest, DataSpecIsMappedAndItsPathsMustLieUnderTheDataRoots) {
  v1::Assignment a = FullAssignment();
  v1::DataSpec* d = a.mutable_spec()->mutable_data();
  d->set_format("webdataset");
  d->set_train("/data/shards/train-{000000..000003}.tar");
  d->set_test("/data/shards/test-000000.tar");
  d->set_channels(3);
  d->set_height(32);
  d->set_width(32);
  d->set_num_classes(10);
  d->set_data_threads(3);
  d->mutable_transforms()->set_crop_height(32);
  d->mutable_transforms()->set_crop_width(32);
  d->mutable_transforms()->set_random_flip(true);
  d->mutable_transforms()->set_mean("0.5, 0.4,0.3");
  d->mutable_transforms()->set_std("0.2,0.2,0.2");
  absl::StatusOr<JobPlan> plan = PlanJob(a, Cpu());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const data::DataConfig& c = plan->config.data;
  EXPECT_EQ(c.format, "webdataset");
  EXPECT_EQ(c.train, "/data/shards/train-{000000..000003}.tar");
  EXPECT_EQ(c.channels, 3);
  EXPECT_EQ(c.data_threads, 3);
  EXPECT_TRUE(c.transforms.random_flip);
  EXPECT_EQ(c.transforms.mean, (std::vector<float>{0.5f, 0.4f, 0.3f}));
  d->set_test("/etc/test-000000.tar");
  plan = PlanJob(a, Cpu());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kPermissionDenied) << plan.status();
  EXPECT_NE(plan.status().message().find("'/etc/test-000000.tar' is outside them"),
            std::string::npos)
      << plan.status();
}

}  // namespace
}  // namespace agent
}  // namespace dtrain
