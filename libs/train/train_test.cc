#include "libs/train/train.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/checkpoint/checkpoint.h"
#include "libs/nn/models.h"
#include "libs/train/state_io.h"

namespace dtrain {
namespace train {
namespace {

TrainOptions Small(const std::string& model) {
  TrainOptions o;
  o.model = model;
  o.train_limit = 4096;
  o.test_limit = 1000;
  o.batch_size = 128;
  o.epochs = 2;
  o.threads = 1;
  o.lr = 0.2f;
  return o;
}

TEST(TrainTest, MlpLearnsOnASubset) {
  TrainOptions o = Small("mlp");
  o.init = "kaiming";
  o.lr = 0.1f;
  int calls = 0;
  absl::StatusOr<TrainResult> r = Train(o, [&](const Progress& p) {
    ++calls;
    EXPECT_EQ(p.steps_per_epoch, 32);
    EXPECT_LE(p.step, p.steps_per_epoch);
  });
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->epochs.size(), 2u);
  EXPECT_EQ(calls, 64);
  EXPECT_EQ(r->steps, 64);
  EXPECT_LT(r->epochs[1].loss, r->epochs[0].loss);
  EXPECT_GT(r->epochs[1].test_accuracy, 0.70);
  EXPECT_GT(r->epochs[1].samples_per_second, 0);
  EXPECT_GT(r->peak_bytes, 0);
  EXPECT_EQ(r->parameters, 784 * 256 + 256 + 256 * 10 + 10);
}

// stop_at_test_accuracy ends the run after the first epoch that reaches it;
// a level no epoch reaches runs every epoch.
TEST(TrainTest, StopAtTestAccuracyEndsAfterTheEpochThatReachesIt) {
  TrainOptions o = Small("mlp");
  o.init = "kaiming";
  o.lr = 0.1f;
  o.epochs = 3;
  absl::StatusOr<TrainResult> all = Train(o);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->epochs.size(), 3u);
  // The first epoch's accuracy as the target: the same seeded run stops there.
  o.stop_at_test_accuracy = all->epochs[0].test_accuracy;
  absl::StatusOr<TrainResult> stopped = Train(o);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_EQ(stopped->epochs.size(), 1u);
  EXPECT_EQ(stopped->epochs[0].test_accuracy, all->epochs[0].test_accuracy);
  EXPECT_EQ(stopped->steps, all->steps / 3);
  // Above every epoch's accuracy: all 3 epochs run.
  double best = 0;
  for (const EpochStats& e : all->epochs) best = std::max(best, e.test_accuracy);
  ASSERT_LT(best, 1.0);
  o.stop_at_test_accuracy = (best + 1.0) / 2;
  absl::StatusOr<TrainResult> unreached = Train(o);
  ASSERT_TRUE(unreached.ok()) << unreached.status();
  EXPECT_EQ(unreached->epochs.size(), 3u);
}

TEST(TrainTest, ResumeFromCheckpointGivesTheSameModelAsOneRun) {
  TrainOptions o = Small("lenet");
  o.train_limit = 1024;
  o.evaluate = false;
  o.momentum = 0.9f;
  o.lr = 0.05f;
  o.checkpoint_path = TestTmpPath("straight.ckpt");
  ASSERT_TRUE(Train(o).ok());

  TrainOptions first = o;
  first.checkpoint_path = TestTmpPath("resumed.ckpt");
  first.epochs = 1;
  ASSERT_TRUE(Train(first).ok());
  TrainOptions second = first;
  second.epochs = 2;
  second.resume = true;
  absl::StatusOr<TrainResult> r = Train(second);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epochs.size(), 1u);  // only epoch 2 ran
  EXPECT_EQ(r->epochs[0].epoch, 2);

  auto a = checkpoint::ReadCheckpoint(o.checkpoint_path);
  auto b = checkpoint::ReadCheckpoint(second.checkpoint_path);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  // 8 parameters + 8 momentum buffers.
  EXPECT_EQ(a->tensors.size(), 16u);
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    EXPECT_EQ(a->tensors[i].name, b->tensors[i].name);
    EXPECT_TRUE(a->tensors[i].data == b->tensors[i].data) << a->tensors[i].name;
  }
  EXPECT_EQ(a->metadata.at("epochs_done"), "2");
}

// A model_factory's model is trained instead of a built-in one; `model` only
// names it (in checkpoints), and the factory's error is Train's.
TEST(TrainTest, ModelFactoryBuildsTheModel) {
  TrainOptions o = Small("my_mlp");  // not a built-in name
  o.epochs = 1;
  o.init = "kaiming";
  o.lr = 0.1f;
  o.checkpoint_path = TestTmpPath("factory.ckpt");
  int calls = 0;
  o.model_factory = [&]() -> absl::StatusOr<std::shared_ptr<nn::Module>> {
    ++calls;
    return nn::MakeModel("mlp");
  };
  absl::StatusOr<TrainResult> r = Train(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r->parameters, 784 * 256 + 256 + 256 * 10 + 10);
  EXPECT_GT(r->epochs[0].test_accuracy, 0.6);
  auto ckpt = checkpoint::ReadCheckpoint(o.checkpoint_path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->metadata.at("model"), "my_mlp");

  o.model_factory = []() -> absl::StatusOr<std::shared_ptr<nn::Module>> {
    return absl::InvalidArgumentError("model_file: not a valid ONNX model");
  };
  EXPECT_EQ(Train(o).status().message(), "model_file: not a valid ONNX model");
}

TEST(TrainTest, BadOptionsNameTheOption) {
  struct Case {
    void (*mutate)(TrainOptions*);
    const char* needle;
  } cases[] = {
      {[](TrainOptions* o) { o->model = "alexnet"; }, "unknown model 'alexnet'"},
      {[](TrainOptions* o) { o->batch_size = 0; }, "batch_size"},
      {[](TrainOptions* o) { o->lr = -1; }, "lr"},
      {[](TrainOptions* o) { o->epochs = 0; }, "epochs"},
      {[](TrainOptions* o) { o->momentum = 1.5f; }, "momentum"},
      {[](TrainOptions* o) { o->init = "xavier"; }, "init"},
      {[](TrainOptions* o) { o->resume = true; }, "checkpoint_path"},
      {[](TrainOptions* o) { o->model = "mlp_chapter"; }, "hybridize"},
      {[](TrainOptions* o) { o->stop_at_test_accuracy = 1.5; }, "stop_at_test_accuracy"},
      {[](TrainOptions* o) {
         o->stop_at_test_accuracy = 0.5;
         o->evaluate = false;
       },
       "needs evaluate"},
  };
  for (const Case& c : cases) {
    TrainOptions o;
    c.mutate(&o);
    absl::Status s = ValidateOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
    EXPECT_EQ(Train(o).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TrainTest, MissingDataIsAClearError) {
  TrainOptions o = Small("mlp");
  o.data_dir = TestTmpPath("no-such-dir");
  absl::StatusOr<TrainResult> r = Train(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no-such-dir"), std::string::npos) << r.status();
}

TEST(TrainTest, CorruptOrForeignCheckpointIsRejectedAndModelUnchanged) {
  auto model = *nn::MakeModel("mlp");
  nn::InitParameters(model.get(), nn::Init::kNormal, 1);
  std::string path = TestTmpPath("mlp.ckpt");
  ASSERT_TRUE(SaveTrainingState(path, "mlp", model.get(), nullptr, {{"epochs_done", "1"}}).ok());

  auto other = *nn::MakeModel("lenet");
  auto s = LoadTrainingState(path, "lenet", other.get(), nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("of model 'mlp', not 'lenet'"), std::string::npos);

  // Flip a byte in the middle: checksum error, target model untouched.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() / 2] ^= 0x5a;
  std::string bad = TestTmpPath("bad.ckpt");
  {
    std::ofstream out(bad, std::ios::binary);
    out << bytes;
  }
  auto fresh = *nn::MakeModel("mlp");
  nn::InitParameters(fresh.get(), nn::Init::kNormal, 2);
  std::vector<float> before = fresh->NamedParameters()[0].second.value().ToVector<float>();
  auto r = LoadTrainingState(bad, "mlp", fresh.get(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status();
  EXPECT_EQ(before, fresh->NamedParameters()[0].second.value().ToVector<float>());

  // And the good file restores exactly.
  ASSERT_TRUE(LoadTrainingState(path, "mlp", fresh.get(), nullptr).ok());
  EXPECT_EQ(model->NamedParameters()[0].second.value().ToVector<float>(),
            fresh->NamedParameters()[0].second.value().ToVector<float>());

  TrainOptions o = Small("mlp");
  o.checkpoint_path = bad;
  o.resume = true;
  EXPECT_FALSE(Train(o).ok());
}

}  // namespace
}  // namespace train
}  // namespace dtrain
