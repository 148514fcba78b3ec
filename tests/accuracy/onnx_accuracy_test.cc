// Models imported from PyTorch ONNX exports (libs/onnx) trained by dtrain on
// the real Fashion-MNIST data, against PyTorch training the same model and
// against the built-in model they mirror (issue 32's accuracy must-shows):
//
//  - VggReachesPyTorchsAccuracyAndRoundTrips: the small VGG-style net with
//    BatchNorm and Dropout of tests/reference/export_onnx.py (no built-in
//    covers it), imported from its ONNX file and trained by train::Train,
//    and the same PyTorch model trained by
//    tests/reference/torch_train_reference.py from dtrain's initial weights
//    with the same data in the same order, epochs, lr, momentum and batch:
//    dtrain's final test accuracy is within 0.02 of PyTorch's, mean over 3
//    seeds. Each seed's trained model goes back into PyTorch through
//    OnnxModel::Export (python3-onnx's full checker, initializers copied by
//    name, tests/reference/onnx_roundtrip.py), where its test accuracy equals
//    the one dtrain reported within 0.001.
//  - ImportedLeNetTrainsLikeTheBuiltinLeNet: the exported LeNet against the
//    built-in "lenet" from the same weights and seed, 2 epochs: every epoch's loss
//    agrees within 1e-4 relative and its test accuracy within 0.005.
//    PyTorch, started from the same weights with the same data order (LeNet
//    has no Dropout), has the same first-epoch loss within 0.2%: the check
//    that the reference sees dtrain's data, order and hyperparameters.
//
// Both sides run here (no stored reference numbers), with SGD lr 0.02,
// momentum 0.9, batch 128, 3 epochs on the first 12,000 training images,
// tested on all 10,000 test images: a few minutes on 2 cores (docs/models.md
// has the measured figures). Over 6 seeds the VGG net's per-seed difference
// was at most 0.012 (lr 0.05 gave differences up to 0.03: Dropout's masks
// differ between the two, and at that rate the runs diverge more).
// ResNet-18 is not here: at about 30 samples/s on 2 cores a training run
// that means anything for accuracy is a GPU job (onnx_test checks its
// 20-step losses against the built-in model within 1e-5).
// Not exclusive: nothing in it is timed, so it shares the cores with other
// tests (it then takes longer, well inside its size-large timeout).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "libs/base/subprocess.h"
#include "libs/base/testing.h"
#include "libs/onnx/model.h"
#include "libs/train/state_io.h"
#include "libs/train/train.h"

namespace dtrain {
namespace {

constexpr int64_t kTrainLimit = 12000;
constexpr int64_t kTestLimit = 10000;
constexpr int kEpochs = 3;
constexpr int64_t kBatch = 128;
constexpr float kLr = 0.02f;
constexpr float kMomentum = 0.9f;
constexpr int kThreads = 2;

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

absl::StatusOr<std::shared_ptr<onnx::OnnxModel>> Import(const std::string& name) {
  onnx::ImportOptions o;
  o.input_shape = {1, 28, 28};
  o.num_classes = 10;
  o.from_model = false;  // initialized by Train with init/seed
  return onnx::ImportModelFile(RunfilePath(absl::StrCat("libs/onnx/testdata/", name, ".onnx")), o);
}

train::TrainOptions Options(const std::string& name, uint64_t seed, int epochs) {
  train::TrainOptions o;
  o.model = name;
  o.epochs = epochs;
  o.batch_size = kBatch;
  o.lr = kLr;
  o.momentum = kMomentum;
  o.init = "kaiming";
  o.seed = seed;
  o.threads = kThreads;
  o.train_limit = kTrainLimit;
  o.test_limit = kTestLimit;
  return o;
}

// Trains the imported `name` (or the built-in model of that name). Writes
// the initial weights to <name>_<seed>_init.ckpt and the final state to
// <name>_<seed>.ckpt.
absl::StatusOr<train::TrainResult> TrainDtrain(const std::string& name, uint64_t seed,
                                               bool imported, int epochs = kEpochs) {
  train::TrainOptions o = Options(name, seed, epochs);
  const std::string prefix = TmpPath(absl::StrCat(name, imported ? "" : "_builtin", "_", seed));
  o.save_initial_path = prefix + "_init.ckpt";
  o.checkpoint_path = prefix + ".ckpt";
  if (imported) {
    o.model_factory = [name]() -> absl::StatusOr<std::shared_ptr<nn::Module>> {
      auto m = Import(name);
      if (!m.ok()) return m.status();
      return std::shared_ptr<nn::Module>(*m);
    };
  }
  return train::Train(o);
}

// Runs python3 with `args`; returns its output (stdout and stderr), or an
// error with the output when it fails.
absl::StatusOr<std::string> Python(const std::vector<std::string>& args, const std::string& log) {
  SubprocessOptions so;
  so.argv = {"/usr/bin/python3"};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.output_file = TmpPath(log);
  std::remove(so.output_file.c_str());
  auto child = Subprocess::Start(so);
  if (!child.ok()) return child.status();
  auto status = (*child)->Wait(absl::Minutes(10));
  if (!status.ok()) return status.status();
  std::string out = ReadAll(so.output_file);
  if (!status->success()) {
    return absl::InternalError(absl::StrCat(args[0], " ", status->ToString(), ":\n", out));
  }
  return out;
}

// The values of `key=` on the script's "epoch=" lines, in order.
std::vector<double> EpochValues(const std::string& out, const std::string& key) {
  std::vector<double> values;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "epoch=")) continue;
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      double v;
      if (absl::ConsumePrefix(&field, key + "=") && absl::SimpleAtod(field, &v)) {
        values.push_back(v);
      }
    }
  }
  return values;
}

// PyTorch trains `name` from dtrain's initial weights of `seed`.
absl::StatusOr<std::string> TrainPyTorch(const std::string& name, uint64_t seed,
                                         int epochs = kEpochs) {
  return Python(
      {RunfilePath("tests/reference/torch_train_reference.py"), name,
       absl::StrCat("--init_from=", TmpPath(absl::StrCat(name, "_", seed, "_init.ckpt"))),
       absl::StrCat("--seed=", seed), absl::StrCat("--epochs=", epochs),
       absl::StrCat("--batch_size=", kBatch), absl::StrCat("--lr=", kLr),
       absl::StrCat("--momentum=", kMomentum), absl::StrCat("--train_limit=", kTrainLimit),
       absl::StrCat("--test_limit=", kTestLimit), absl::StrCat("--threads=", kThreads)},
      absl::StrCat(name, "_", seed, "_torch.txt"));
}

// The final checkpoint of the imported `name` of `seed`, exported into its
// ONNX graph (as `trainctl export` does), loaded by PyTorch: its test
// accuracy there.
absl::StatusOr<double> RoundTripAccuracy(const std::string& name, uint64_t seed) {
  auto m = Import(name);
  if (!m.ok()) return m.status();
  auto meta = train::LoadTrainingState(TmpPath(absl::StrCat(name, "_", seed, ".ckpt")), name,
                                       m->get(), nullptr);
  if (!meta.ok()) return meta.status();
  auto bytes = (*m)->Export();
  if (!bytes.ok()) return bytes.status();
  const std::string path = TmpPath(absl::StrCat(name, "_", seed, "_trained.onnx"));
  std::ofstream(path, std::ios::binary) << *bytes;
  auto out = Python({RunfilePath("tests/reference/onnx_roundtrip.py"), name, path,
                     "--test_accuracy", "--test_limit", absl::StrCat(kTestLimit)},
                    absl::StrCat(name, "_", seed, "_roundtrip.txt"));
  if (!out.ok()) return out.status();
  if (!absl::StrContains(*out, "checker=ok\n")) {
    return absl::InternalError(absl::StrCat("no checker=ok in:\n", *out));
  }
  for (absl::string_view line : absl::StrSplit(*out, '\n')) {
    double v;
    if (absl::ConsumePrefix(&line, "test_acc=") && absl::SimpleAtod(line, &v)) return v;
  }
  return absl::InternalError(absl::StrCat("no test_acc= in:\n", *out));
}

TEST(OnnxAccuracyTest, VggReachesPyTorchsAccuracyAndRoundTrips) {
  const std::string name = "vgg_bn";
  double dtrain_sum = 0, torch_sum = 0;
  const std::vector<uint64_t> seeds = {1, 2, 3};
  for (uint64_t seed : seeds) {
    auto ours = TrainDtrain(name, seed, /*imported=*/true);
    ASSERT_TRUE(ours.ok()) << ours.status();
    ASSERT_EQ(ours->epochs.size(), static_cast<size_t>(kEpochs));
    const double dtrain_acc = ours->epochs.back().test_accuracy;
    auto torch_out = TrainPyTorch(name, seed);
    ASSERT_TRUE(torch_out.ok()) << torch_out.status();
    std::vector<double> torch_acc = EpochValues(*torch_out, "test_acc");
    ASSERT_EQ(torch_acc.size(), static_cast<size_t>(kEpochs)) << *torch_out;
    auto round_trip = RoundTripAccuracy(name, seed);
    ASSERT_TRUE(round_trip.ok()) << round_trip.status();
    std::vector<double> torch_loss = EpochValues(*torch_out, "loss");
    for (int e = 0; e < kEpochs; ++e) {
      std::printf(
          "vgg_bn seed=%d epoch=%d dtrain_loss=%.4f torch_loss=%.4f dtrain_test_acc=%.4f "
          "torch_test_acc=%.4f\n",
          static_cast<int>(seed), e + 1, ours->epochs[e].loss, torch_loss[e],
          ours->epochs[e].test_accuracy, torch_acc[e]);
    }
    std::printf("vgg_bn seed=%d roundtrip_torch_test_acc=%.4f\n", static_cast<int>(seed),
                *round_trip);
    // It learned: far above chance (0.1) on both sides.
    EXPECT_GT(dtrain_acc, 0.75);
    EXPECT_GT(torch_acc.back(), 0.75);
    // The exported weights are the ones dtrain evaluated.
    EXPECT_NEAR(*round_trip, dtrain_acc, 0.001);
    dtrain_sum += dtrain_acc;
    torch_sum += torch_acc.back();
  }
  const double dtrain_mean = dtrain_sum / seeds.size(), torch_mean = torch_sum / seeds.size();
  std::printf("vgg_bn mean_dtrain_test_acc=%.4f mean_torch_test_acc=%.4f diff=%.4f\n", dtrain_mean,
              torch_mean, dtrain_mean - torch_mean);
  EXPECT_NEAR(dtrain_mean, torch_mean, 0.02);
}

// Two epochs (the second checks that the momentum buffers carry over alike),
// and PyTorch's first, which is all the reference check below compares.
TEST(OnnxAccuracyTest, ImportedLeNetTrainsLikeTheBuiltinLeNet) {
  const uint64_t seed = 7;
  constexpr int kLenetEpochs = 2;
  auto builtin = TrainDtrain("lenet", seed, /*imported=*/false, kLenetEpochs);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  auto imported = TrainDtrain("lenet", seed, /*imported=*/true, kLenetEpochs);
  ASSERT_TRUE(imported.ok()) << imported.status();
  auto torch_out = TrainPyTorch("lenet", seed, /*epochs=*/1);
  ASSERT_TRUE(torch_out.ok()) << torch_out.status();
  std::vector<double> torch_loss = EpochValues(*torch_out, "loss");
  std::vector<double> torch_acc = EpochValues(*torch_out, "test_acc");
  ASSERT_EQ(torch_loss.size(), 1u) << *torch_out;
  ASSERT_EQ(builtin->epochs.size(), static_cast<size_t>(kLenetEpochs));
  ASSERT_EQ(imported->epochs.size(), static_cast<size_t>(kLenetEpochs));
  std::printf("lenet epoch=1 torch_loss=%.6f torch_test_acc=%.4f\n", torch_loss[0], torch_acc[0]);
  for (int e = 0; e < kLenetEpochs; ++e) {
    const train::EpochStats& b = builtin->epochs[e];
    const train::EpochStats& i = imported->epochs[e];
    std::printf(
        "lenet epoch=%d builtin_loss=%.6f imported_loss=%.6f "
        "builtin_test_acc=%.4f imported_test_acc=%.4f\n",
        e + 1, b.loss, i.loss, b.test_accuracy, i.test_accuracy);
    EXPECT_NEAR(i.loss, b.loss, 1e-4 * b.loss) << "epoch " << e + 1;
    EXPECT_NEAR(i.test_accuracy, b.test_accuracy, 0.005) << "epoch " << e + 1;
  }
  // The reference sees the same data in the same order from the same
  // weights: without Dropout its first epoch's mean loss is dtrain's up to
  // rounding (another order or lr would move it by far more).
  EXPECT_NEAR(torch_loss[0], builtin->epochs[0].loss, 2e-3 * builtin->epochs[0].loss);
  EXPECT_GT(builtin->epochs.back().test_accuracy, 0.7);  // 0.7549 (chance: 0.1)
}

}  // namespace
}  // namespace dtrain
