// End to end: your own model (docs/models.md) on a `cluster up` cluster with
// mutual TLS. The PyTorch-exported LeNet (tests/reference/export_onnx.py),
// submitted as a file with `trainctl submit --model_file`, trains as a
// 2-trainer job (ALLREDUCE, and KVSTORE through a kvstore shard) exactly
// like the built-in LeNet from the same seed (our initializers: epoch loss,
// training and test accuracy equal within 1e-5 relative), and `trainctl
// export` of both jobs gives files python3-onnx's full checker accepts, the
// model file's with trained weights in place of the file's; that file,
// submitted again with `init: from_model` and a learning rate too small to
// move a weight, has the trained job's test accuracy. Both jobs' loss
// curves (JobStatus.step_losses) hold every step, and the first 20 steps'
// losses are equal within 1e-5 relative. The PyTorch ResNet-18 as a file
// does the same against the built-in ResNet-18 (a short job: 20 steps of 16
// images; test accuracy within 0.005), and `trainctl get` (text and
// `-o json`) shows its curve. A model with an
// unsupported op, a truncated file, a file over the scheduler's
// --max_model_bytes and an unknown digest are refused at submit with their
// errors (through trainctl, and straight through the API past trainctl's
// own check), while the scheduler stays up and a running job is untouched;
// another user can neither read nor export a user's model.
// A scheduler SIGKILLed between submit and placement loses no model: the
// queued job runs after the restart.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/grpc_status.h"
#include "libs/base/sha256.h"
#include "protos/scheduler.grpc.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

std::string TestModel(const std::string& name) {
  return Runfile(absl::StrCat("libs/onnx/testdata/", name));
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Digest(const std::string& bytes) { return absl::StrCat("sha256:", Sha256Hex(bytes)); }

// The jobs compared: LeNet on 2 trainers, 2 epochs of 16 steps of 64,
// kaiming init from seed 3, momentum, each epoch's checkpoint kept (for
// export).
v1::SubmitRequest LenetJob(const std::string& name, v1::SyncMode mode) {
  v1::SubmitRequest r = MomentumLenetJob(name, 2, 1024);
  r.mutable_spec()->set_keep_epoch_checkpoints(true);
  r.mutable_spec()->set_global_batch_size(64);
  r.mutable_spec()->set_test_limit(256);
  r.mutable_spec()->mutable_sync()->set_mode(mode);
  return r;
}

// The same job as trainctl flags, with --model_file instead of --model.
std::string TrainctlFlags(const v1::JobSpec& s) {
  return absl::StrCat("--name=", s.name(), " --epochs=", s.epochs(),
                      " --batch_size=", s.global_batch_size(), " --lr=", s.lr(),
                      " --momentum=", s.momentum(), " --init=", s.init(), " --seed=", s.seed(),
                      " --train_limit=", s.train_limit(), " --test_limit=", s.test_limit(),
                      " --threads=", s.threads(), " --num_trainers=", s.num_trainers(),
                      " --checkpoint_interval_epochs=", s.checkpoint_interval_epochs(),
                      s.keep_epoch_checkpoints() ? " --keep_epoch_checkpoints" : "",
                      " --sync=", v1::SyncMode_Name(s.sync().mode()));
}

void ExpectRelNear(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want) + 1e-12) << what;
}

// The loss curve a finished job reports (JobStatus.step_losses): every one
// of its `steps` steps (the scheduler keeps the first 100 and the newest
// 100), in order.
void ExpectWholeCurve(const v1::JobStatus& j, int64_t steps) {
  ASSERT_EQ(j.step_losses_size(), std::min<int64_t>(steps, 200)) << j.DebugString();
  for (int i = 0; i < j.step_losses_size(); ++i) {
    const int64_t want = i < 100 ? i : steps - (j.step_losses_size() - i);
    ASSERT_EQ(j.step_losses(i).step(), want) << "index " << i;
    ASSERT_TRUE(std::isfinite(j.step_losses(i).loss())) << "step " << want;
  }
}

// The first `n` steps' losses of `mine` equal those of `ref` within 1e-5
// relative (rank 0's batches: the same data order for both).
void ExpectSameFirstSteps(const v1::JobStatus& ref, const v1::JobStatus& mine, int n,
                          const char* what) {
  ASSERT_GE(ref.step_losses_size(), n);
  ASSERT_GE(mine.step_losses_size(), n);
  int distinct = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(mine.step_losses(i).step(), ref.step_losses(i).step());
    EXPECT_NEAR(mine.step_losses(i).loss(), ref.step_losses(i).loss(),
                1e-5 * std::abs(ref.step_losses(i).loss()))
        << what << ": step " << i + 1;
    if (i > 0 && ref.step_losses(i).loss() != ref.step_losses(i - 1).loss()) ++distinct;
  }
  // Each step's own loss, not one value repeated.
  EXPECT_GE(distinct, n / 2) << what;
  std::printf("%s: step 1 loss builtin=%.7f file=%.7f, step %d loss builtin=%.7f file=%.7f\n", what,
              ref.step_losses(0).loss(), mine.step_losses(0).loss(), n,
              ref.step_losses(n - 1).loss(), mine.step_losses(n - 1).loss());
}

// python3-onnx's full checker on `path`, and how many of its initializers
// differ from those of `original` ("" for none).
std::string CheckOnnx(const std::string& path, const std::string& original, int* rc) {
  const std::string script = absl::StrCat(
      "import onnx, sys\n"
      "from onnx import numpy_helper\n"
      "m = onnx.load(sys.argv[1])\n"
      "onnx.checker.check_model(m, full_check=True)\n"
      "print('checker=ok initializers=%d' % len(m.graph.initializer))\n"
      "if len(sys.argv) > 2:\n"
      "    o = {i.name: numpy_helper.to_array(i) for i in "
      "onnx.load(sys.argv[2]).graph.initializer}\n"
      "    same = sum(1 for i in m.graph.initializer if i.name in o and\n"
      "               (numpy_helper.to_array(i) == o[i.name]).all())\n"
      "    changed = sum(1 for i in m.graph.initializer if i.name in o) - same\n"
      "    print('changed=%d unchanged=%d' % (changed, same))\n");
  const std::string py = TmpDir("py") + "/check.py";
  std::ofstream(py) << script;
  return Run(absl::StrCat("/usr/bin/python3 ", py, " ", path, " ", original, " 2>&1"), rc);
}

// PutModel of `bytes` as the admin, straight through the API.
absl::Status PutModel(v1::JobService::Stub* stub, const std::string& bytes) {
  auto ctx = Ctx(absl::Seconds(30));
  v1::PutModelReply reply;
  auto writer = stub->PutModel(ctx.get(), &reply);
  v1::ModelChunk header;
  header.set_digest(Digest(bytes));
  header.set_total_bytes(static_cast<int64_t>(bytes.size()));
  header.set_data(bytes);
  writer->Write(header);
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish(), "PutModel");
}

// Submit of a job of the model `digest`.
absl::Status SubmitDigest(v1::JobService::Stub* stub, const std::string& digest) {
  v1::SubmitRequest r = LenetJob("by-digest", v1::ALLREDUCE);
  r.mutable_spec()->clear_model();
  r.mutable_spec()->set_model_digest(digest);
  auto ctx = Ctx();
  v1::JobStatus job;
  return FromGrpcStatus(stub->Submit(ctx.get(), r, &job), "Submit");
}

// JobService.GetJobModel: the whole file.
absl::StatusOr<std::string> ReadJobModel(v1::JobService::Stub* stub, const std::string& id) {
  auto ctx = Ctx(absl::Seconds(30));
  v1::GetJobModelRequest req;
  req.set_id(id);
  auto reader = stub->GetJobModel(ctx.get(), req);
  std::string bytes;
  v1::ModelChunk chunk;
  while (reader->Read(&chunk)) bytes += chunk.data();
  absl::Status s = FromGrpcStatus(reader->Finish(), "GetJobModel");
  if (!s.ok()) return s;
  return bytes;
}

class ModelFileE2eTest : public ClusterTest {
 protected:
  int SchedulerPid() const {
    for (const ClusterProcess& p : ReadCluster(dir())) {
      if (p.role == "scheduler") return p.pid;
    }
    return -1;
  }

  // The built-in LeNet and the PyTorch LeNet as a file, same job: equal
  // results; then both exported.
  void TrainBothAndExport(v1::SyncMode mode) {
    v1::SubmitRequest builtin = LenetJob("builtin", mode);
    JobStatus ref = WatchToEnd(Submit(builtin).id(), absl::Seconds(300));
    ASSERT_EQ(ref.state(), v1::SUCCEEDED) << ref.DebugString();

    v1::JobSpec spec = builtin.spec();
    spec.set_name("from-file");
    int rc = -1;
    const std::string out = cluster_->TrainctlAs(
        "admin",
        absl::StrCat("submit ", TrainctlFlags(spec), " --model_file=", TestModel("lenet.onnx")),
        &rc);
    ASSERT_EQ(rc, 0) << out;
    const std::string lenet = ReadAll(TestModel("lenet.onnx"));
    EXPECT_NE(out.find("uploaded"), std::string::npos) << out;
    EXPECT_NE(out.find(Digest(lenet)), std::string::npos) << out;
    const std::string id = SubmittedId(out);
    ASSERT_FALSE(id.empty()) << out;
    JobStatus mine = WatchToEnd(id, absl::Seconds(300));
    ASSERT_EQ(mine.state(), v1::SUCCEEDED) << mine.DebugString();
    EXPECT_EQ(mine.spec().model_digest(), Digest(lenet));
    EXPECT_TRUE(mine.spec().model().empty());
    std::printf(
        "sync=%s builtin_loss=%.7f file_loss=%.7f builtin_test_acc=%.4f file_test_acc=%.4f\n",
        v1::SyncMode_Name(mode).c_str(), ref.loss(), mine.loss(), ref.test_accuracy(),
        mine.test_accuracy());
    ExpectRelNear(mine.loss(), ref.loss(), "epoch loss");
    ExpectRelNear(mine.train_accuracy(), ref.train_accuracy(), "train accuracy");
    ExpectRelNear(mine.test_accuracy(), ref.test_accuracy(), "test accuracy");
    EXPECT_LT(ref.loss(), 2.2) << "it learned something";
    // The loss curves: every step's loss, and the first 20 equal.
    ExpectWholeCurve(ref, 2 * 16);
    ExpectWholeCurve(mine, 2 * 16);
    ExpectSameFirstSteps(ref, mine, 20, "lenet");
    // Each trainer fetched the file once, by digest.
    EXPECT_EQ(TrainerLogLines(dir(), {"fetched model " + Digest(lenet)}).size(), 2u);

    // Export both: the file's graph with the trained weights, and the
    // built-in model's own export.
    const std::string trained = TmpDir("export") + "/trained.onnx";
    const std::string exported =
        cluster_->TrainctlAs("admin", absl::StrCat("export ", id, " --out=", trained), &rc);
    ASSERT_EQ(rc, 0) << exported;
    EXPECT_NE(exported.find("the checkpoint of epoch 2"), std::string::npos) << exported;
    std::string check = CheckOnnx(trained, TestModel("lenet.onnx"), &rc);
    std::printf("%s", check.c_str());
    EXPECT_EQ(rc, 0) << check;
    EXPECT_NE(check.find("checker=ok"), std::string::npos) << check;
    const size_t at = check.find("changed=");
    ASSERT_NE(at, std::string::npos) << check;
    EXPECT_EQ(std::atoi(check.c_str() + at + 8), 8)
        << "every weight and bias of LeNet's 4 layers (2 conv, 2 linear) was trained: " << check;
    // The first epoch's, kept: other weights than the last epoch's.
    const std::string first = TmpDir("export") + "/epoch1.onnx";
    const std::string e1 =
        cluster_->TrainctlAs("admin", absl::StrCat("export ", id, " --epoch=1 --out=", first), &rc);
    ASSERT_EQ(rc, 0) << e1;
    EXPECT_NE(e1.find("the checkpoint of epoch 1"), std::string::npos) << e1;
    check = CheckOnnx(first, trained, &rc);
    std::printf("epoch 1 against epoch 2: %s", check.c_str());
    EXPECT_EQ(rc, 0) << check;
    EXPECT_NE(check.find("changed=8"), std::string::npos) << check;
    const std::string builtin_out = TmpDir("export") + "/builtin.onnx";
    const std::string b = cluster_->TrainctlAs(
        "admin", absl::StrCat("-o json export ", ref.id(), " --out=", builtin_out), &rc);
    ASSERT_EQ(rc, 0) << b;
    EXPECT_NE(b.find("\"model\":\"lenet\""), std::string::npos) << b;
    check = CheckOnnx(builtin_out, "", &rc);
    EXPECT_EQ(rc, 0) << check;
    EXPECT_NE(check.find("checker=ok"), std::string::npos) << check;
    if (mode != v1::ALLREDUCE) return;

    // The exported file back in, `init: from_model`, with a learning rate too
    // small to move a weight: the job starts from the trained weights, so its
    // test accuracy is the trained job's.
    spec.set_name("from-model");
    spec.set_epochs(1);
    spec.set_lr(1e-30);
    spec.set_momentum(0);
    spec.set_checkpoint_interval_epochs(0);
    spec.set_keep_epoch_checkpoints(false);
    const std::string again = cluster_->TrainctlAs(
        "admin",
        absl::StrCat("submit ", TrainctlFlags(spec), " --init=from_model --model_file=", trained),
        &rc);
    ASSERT_EQ(rc, 0) << again;
    JobStatus resumed = WatchToEnd(SubmittedId(again), absl::Seconds(300));
    ASSERT_EQ(resumed.state(), v1::SUCCEEDED) << resumed.DebugString();
    EXPECT_EQ(resumed.spec().init(), "from_model");
    std::printf("from_model_test_acc=%.4f trained_test_acc=%.4f\n", resumed.test_accuracy(),
                mine.test_accuracy());
    EXPECT_DOUBLE_EQ(resumed.test_accuracy(), mine.test_accuracy());
  }

  // The built-in ResNet-18 and the PyTorch ResNet-18 as a file, same job
  // (kaiming init from the same seed: the file's parameters are the
  // built-in's, in the same order): the first 20 steps' losses equal, the
  // test accuracy equal within 0.005. Kept small (1 epoch of 20 steps of 8
  // images, 4 a rank, and 64 test images): ResNet-18 at 28x28 costs about
  // 2.7 GFLOP per training sample (20 steps of 16 took 77 CPU-seconds of the
  // test's 4 jobs). lr 0.003: at 0.01 with batch 8 the loss rose (the last 5
  // steps' mean 4.34 against 3.30 at step 1; 2.99 at 0.003).
  void TrainResnetBoth(v1::SyncMode mode) {
    v1::SubmitRequest builtin = LenetJob("resnet-builtin", mode);
    v1::JobSpec* s = builtin.mutable_spec();
    s->set_model("resnet18");
    s->set_epochs(1);
    s->set_global_batch_size(8);
    s->set_train_limit(160);
    s->set_test_limit(64);
    s->set_lr(0.003);
    s->set_checkpoint_interval_epochs(0);
    s->set_keep_epoch_checkpoints(false);
    JobStatus ref = WatchToEnd(Submit(builtin).id(), absl::Seconds(600));
    ASSERT_EQ(ref.state(), v1::SUCCEEDED) << ref.DebugString();

    v1::JobSpec spec = builtin.spec();
    spec.set_name("resnet-file");
    int rc = -1;
    const std::string out = cluster_->TrainctlAs(
        "admin",
        absl::StrCat("submit ", TrainctlFlags(spec), " --model_file=", TestModel("resnet18.onnx")),
        &rc);
    ASSERT_EQ(rc, 0) << out;
    const std::string id = SubmittedId(out);
    ASSERT_FALSE(id.empty()) << out;
    JobStatus mine = WatchToEnd(id, absl::Seconds(600));
    ASSERT_EQ(mine.state(), v1::SUCCEEDED) << mine.DebugString();
    EXPECT_EQ(mine.spec().model_digest(), Digest(ReadAll(TestModel("resnet18.onnx"))));
    std::printf(
        "resnet18 sync=%s builtin_loss=%.7f file_loss=%.7f builtin_test_acc=%.4f "
        "file_test_acc=%.4f\n",
        v1::SyncMode_Name(mode).c_str(), ref.loss(), mine.loss(), ref.test_accuracy(),
        mine.test_accuracy());
    ExpectWholeCurve(ref, 20);
    ExpectWholeCurve(mine, 20);
    ExpectSameFirstSteps(ref, mine, 20, "resnet18");
    // It learned: the last 5 steps' mean loss below the first step's.
    double last5 = 0;
    for (int i = 15; i < 20; ++i) last5 += ref.step_losses(i).loss() / 5;
    std::printf("resnet18 sync=%s first_step_loss=%.4f last5_mean_loss=%.4f\n",
                v1::SyncMode_Name(mode).c_str(), ref.step_losses(0).loss(), last5);
    EXPECT_LT(last5, ref.step_losses(0).loss());
    EXPECT_NEAR(mine.test_accuracy(), ref.test_accuracy(), 0.005);

    // The curve as a user sees it: `trainctl get` lists it, 1-based, and
    // `-o json get` carries every kept step.
    const std::string text = cluster_->TrainctlAs("admin", absl::StrCat("get ", id), &rc);
    ASSERT_EQ(rc, 0) << text;
    EXPECT_NE(text.find("step losses (rank 0's batch"), std::string::npos) << text;
    EXPECT_NE(text.find(absl::StrFormat(" 20:%.6g", mine.step_losses(19).loss())),
              std::string::npos)
        << text;
    const std::string json = cluster_->TrainctlAs("admin", absl::StrCat("-o json get ", id), &rc);
    ASSERT_EQ(rc, 0) << json;
    const size_t curve = json.find("\"step_losses\":[");
    ASSERT_NE(curve, std::string::npos) << json;
    int losses = 0;
    for (size_t at = json.find("\"loss\":", curve); at != std::string::npos;
         at = json.find("\"loss\":", at + 1)) {
      ++losses;
    }
    EXPECT_EQ(losses, 20) << json;
  }
};

class ModelFileAllreduceTest : public ModelFileE2eTest {
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Up({.trainers = 2})); }
};

TEST_F(ModelFileAllreduceTest, TorchLenetFileTrainsLikeTheBuiltinAndExportsBack) {
  TrainBothAndExport(v1::ALLREDUCE);
}

class ModelFileKvstoreTest : public ModelFileE2eTest {
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Up({.trainers = 2, .kvstore_shards = 1})); }
};

TEST_F(ModelFileKvstoreTest, TorchLenetFileTrainsLikeTheBuiltinThroughTheKvstore) {
  TrainBothAndExport(v1::KVSTORE);
}

TEST_F(ModelFileAllreduceTest, TorchResnet18FileTrainsLikeTheBuiltinStepByStep) {
  TrainResnetBoth(v1::ALLREDUCE);
}

TEST_F(ModelFileKvstoreTest, TorchResnet18FileTrainsLikeTheBuiltinThroughTheKvstore) {
  TrainResnetBoth(v1::KVSTORE);
}

// The cap: 1 MiB (LeNet's file is about 250 KB, ResNet-18's about 45 MB).
class ModelFileRefusalTest : public ModelFileE2eTest {
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        Up({.trainers = 2, .users = {"alice", "bob"}, .flags = "--max_model_bytes=1048576"}));
  }
};

TEST_F(ModelFileRefusalTest, BadModelsAreRefusedAtSubmitAndOtherJobsAreUntouched) {
  const int pid = SchedulerPid();
  ASSERT_GT(pid, 0);
  // A job that runs meanwhile.
  JobStatus other = Submit(MomentumLenetJob("other", 3, 12288));
  other = PollJob(
      other.id(), [](const JobStatus& j) { return j.state() == v1::RUNNING; }, absl::Seconds(60));
  ASSERT_EQ(other.state(), v1::RUNNING) << other.DebugString();
  int rc = -1;

  // trainctl's own check refuses the unsupported op before any upload.
  std::string out = cluster_->TrainctlAs(
      "admin",
      absl::StrCat("submit ", TrainctlFlags(LenetJob("lstm", v1::ALLREDUCE).spec()),
                   " --model_file=", TestModel("lstm.onnx")),
      &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out;
  EXPECT_NE(out.find("is not supported; supported: "), std::string::npos) << out;
  EXPECT_EQ(out.find("submitted"), std::string::npos) << out;

  // Over the cap: the scheduler refuses the upload naming it.
  out = cluster_->TrainctlAs(
      "admin",
      absl::StrCat("submit ", TrainctlFlags(LenetJob("big", v1::ALLREDUCE).spec()),
                   " --model_file=", TestModel("resnet18.onnx")),
      &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("RESOURCE_EXHAUSTED"), std::string::npos) << out;
  EXPECT_NE(out.find("cap of 1048576 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("--max_model_bytes"), std::string::npos) << out;

  // Past trainctl, straight to the API: the scheduler's own checks.
  v1::JobService::Stub* stub = cluster_->stubs().jobs.get();
  const std::string lstm = ReadAll(TestModel("lstm.onnx"));
  ASSERT_TRUE(PutModel(stub, lstm).ok());
  absl::Status s = SubmitDigest(stub, Digest(lstm));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("is not supported; supported: "), std::string::npos) << s;
  EXPECT_NE(s.message().find("LSTM"), std::string::npos) << s;

  const std::string lenet = ReadAll(TestModel("lenet.onnx"));
  const std::string truncated = lenet.substr(0, lenet.size() / 3);
  ASSERT_TRUE(PutModel(stub, truncated).ok());
  s = SubmitDigest(stub, Digest(truncated));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("model_file: not a valid ONNX model"), std::string::npos) << s;

  const std::string big = ReadAll(TestModel("resnet18.onnx"));
  s = PutModel(stub, big);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  s = SubmitDigest(stub, Digest(big));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("upload the model first"), std::string::npos) << s;

  // Ownership: alice's model is read through her job, by her (and admins)
  // only.
  out = cluster_->TrainctlAs(
      "alice",
      absl::StrCat("submit ", TrainctlFlags(LenetJob("alices", v1::ALLREDUCE).spec()),
                   " --model_file=", TestModel("lenet.onnx")),
      &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string alices = SubmittedId(out);
  EXPECT_EQ(ReadJobModel(JobsAs(*cluster_, "bob").get(), alices).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<std::string> hers = ReadJobModel(JobsAs(*cluster_, "alice").get(), alices);
  ASSERT_TRUE(hers.ok()) << hers.status();
  EXPECT_EQ(*hers, lenet);
  out = cluster_->TrainctlAs(
      "bob", absl::StrCat("export ", alices, " --out=", TmpDir("bob"), "/stolen.onnx"), &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("PERMISSION_DENIED"), std::string::npos) << out;
  Cancel(alices);

  // The scheduler stayed up, and the other job trains on to the end.
  EXPECT_EQ(SchedulerPid(), pid);
  JobStatus done = WatchToEnd(other.id(), absl::Seconds(300));
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.attempts(), 1);
  EXPECT_EQ(SchedulerPid(), pid);
}

class ModelFileRestartTest : public ModelFileE2eTest {
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Up({.trainers = 2, .restart = true})); }
};

TEST_F(ModelFileRestartTest, ASchedulerRestartBetweenSubmitAndPlacementLosesNoModel) {
  // Both trainers busy, so the model's job waits in the queue.
  JobStatus blocker = Submit(MomentumLenetJob("blocker", 100, 12288));
  blocker = PollJob(
      blocker.id(), [](const JobStatus& j) { return j.state() == v1::RUNNING; }, absl::Seconds(60));
  ASSERT_EQ(blocker.state(), v1::RUNNING);
  v1::JobSpec spec = LenetJob("queued-model", v1::ALLREDUCE).spec();
  int rc = -1;
  const std::string out = cluster_->TrainctlAs(
      "admin",
      absl::StrCat("submit ", TrainctlFlags(spec), " --model_file=", TestModel("lenet.onnx")), &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string id = SubmittedId(out);
  ASSERT_EQ(Get(id).state(), v1::QUEUED);

  const int pid = SchedulerPid();
  ASSERT_GT(pid, 0);
  const int64_t killed_ms = absl::ToUnixMillis(absl::Now());
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(PollUntil(absl::Seconds(60), [&] {
    const int now = SchedulerPid();
    if (now <= 0 || now == pid) return false;
    return cluster_->Get(id).ok();
  })) << "the scheduler did not come back";
  EXPECT_EQ(Get(id).spec().model_digest(), Digest(ReadAll(TestModel("lenet.onnx"))));
  Cancel(blocker.id());
  JobStatus done = WatchToEnd(id, absl::Seconds(300));
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_GT(done.test_accuracy(), 0.3);
  // Placed only after the restart: the new scheduler found the model.
  int placed = 0;
  for (const v1::JobEvent& e : done.events()) {
    if (e.state() != v1::RUNNING) continue;
    ++placed;
    EXPECT_GT(e.time_unix_ms(), killed_ms) << e.reason();
  }
  EXPECT_EQ(placed, 1) << done.DebugString();
  EXPECT_EQ(TrainerLogLines(dir(), {"fetched model"}).size(), 2u);
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
