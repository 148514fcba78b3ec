// Must-shows of docs/data.md that need training to converge, in process (one
// rank, RunJob as a trainer runs it):
//
// - Fashion-MNIST written out as a PNG image folder (classes sorted by name,
//   so the samples come in another order than the IDX files') reaches the
//   IDX run's test accuracy within 0.01 with the same job.
// - An RGB data set the test draws (coloured shapes, 10 classes, 32 x 32,
//   JPEG in WebDataset shards) trains ResNet-18 with resize to 12 x 12 +
//   random crop (padded) + flip + normalize to >= 0.95 test accuracy on the
//   CPU (20,000 images, one epoch), and a second run with the same seed
//   gives the same losses bit for bit, step after step, for its first 50
//   steps (seeded transforms on a decode thread, deterministic kernels).
//
// Two targets run this file: data_accuracy_test (the image folder) and
// shapes_resnet18_test (ResNet-18; the slow one).
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/open.h"
#include "libs/data/pack.h"
#include "libs/train/job.h"
#include "libs/train/job_test_util.h"

namespace dtrain {
namespace train {
namespace {

using testing::EpochRecorder;
using testing::SameBits;
using testing::TmpDir;

// Runs `c` on one rank; its per-epoch progress.
std::vector<JobProgress> Train(const JobConfig& c, const char* what) {
  EpochRecorder rec;
  JobProgress last;
  const absl::Time start = absl::Now();
  const absl::Status s = RunJob(c, &rec, &last);
  EXPECT_TRUE(s.ok()) << what << ": " << s;
  for (const JobProgress& p : rec.epochs) {
    std::fprintf(stderr, "%s: epoch %d loss %.6f train_acc %.4f test_acc %.4f (%.0f samples/s)\n",
                 what, p.epoch, p.loss, p.train_accuracy, p.test_accuracy, p.samples_per_second);
  }
  std::fprintf(stderr, "%s: %s\n", what, absl::FormatDuration(absl::Now() - start).c_str());
  return rec.epochs;
}

TEST(DataAccuracyTest, PngImageFolderReachesTheIdxTestAccuracy) {
  constexpr int64_t kTrain = 20000;
  absl::StatusOr<data::Dataset> train =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTrain);
  absl::StatusOr<data::Dataset> test =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTest);
  ASSERT_TRUE(train.ok() && test.ok()) << train.status() << test.status();
  const std::string root = TmpDir("folder");
  mkdir(root.c_str(), 0755);
  // Class directories 00000..00009: name order is label order.
  absl::Status written = data::WriteImageFolder(data::Subset(*train, kTrain), root + "/train", {});
  ASSERT_TRUE(written.ok()) << written;
  written = data::WriteImageFolder(*test, root + "/test", {});
  ASSERT_TRUE(written.ok()) << written;

  JobConfig c;
  c.name = "folder-accuracy";
  c.model = "lenet";
  c.epochs = 2;
  c.global_batch_size = 128;
  c.sgd = {.lr = 0.05f, .momentum = 0.9f};
  c.seed = 5;
  c.init = "kaiming";
  c.threads = 2;
  c.train_limit = kTrain;
  const std::vector<JobProgress> idx = Train(c, "idx");
  c.data.format = "image_folder";
  c.data.train = root + "/train";
  c.data.test = root + "/test";
  c.data.channels = 1;
  c.data.height = c.data.width = 28;
  c.data.num_classes = 10;
  const std::vector<JobProgress> folder = Train(c, "image_folder");
  ASSERT_EQ(idx.size(), 2u);
  ASSERT_EQ(folder.size(), 2u);
  EXPECT_EQ(folder.back().data_train_samples, kTrain);
  EXPECT_EQ(folder.back().data_test_samples, 10000);
  // Another order of the same samples: not the same losses, the same model
  // quality.
  EXPECT_FALSE(SameBits(folder[0].loss, idx[0].loss));
  std::fprintf(stderr, "test accuracy: idx %.4f, image_folder %.4f, difference %.4f\n",
               idx.back().test_accuracy, folder.back().test_accuracy,
               std::fabs(folder.back().test_accuracy - idx.back().test_accuracy));
  EXPECT_NEAR(folder.back().test_accuracy, idx.back().test_accuracy, 0.01);
  EXPECT_GT(idx.back().test_accuracy, 0.8);
}

// The shapes: 0 disc, 1 ring, 2 square, 3 hollow square, 4 triangle up,
// 5 triangle down, 6 plus, 7 diagonal cross, 8 horizontal bar, 9 vertical
// bar (all symmetric under a horizontal flip), at a random place and size,
// in a random colour on another random colour, with noise.
bool Inside(int shape, double dx, double dy, double r) {
  const double ax = std::fabs(dx), ay = std::fabs(dy), d = std::sqrt(dx * dx + dy * dy);
  const double s = 0.8 * r;
  switch (shape) {
    case 0:
      return d <= r;
    case 1:
      return d <= r && d >= r - 3;
    case 2:
      return ax <= s && ay <= s;
    case 3:
      return ax <= s && ay <= s && (ax > s - 3 || ay > s - 3);
    case 4:  // apex up: wider further down
      return dy >= -r && dy <= 0.7 * r && ax <= (dy + r) / 1.7;
    case 5:
      return -dy >= -r && -dy <= 0.7 * r && ax <= (-dy + r) / 1.7;
    case 6:
      return (ax <= 2 && ay <= r) || (ay <= 2 && ax <= r);
    case 7:
      return (std::fabs(dx - dy) <= 2.5 || std::fabs(dx + dy) <= 2.5) && ax <= 0.75 * r &&
             ay <= 0.75 * r;
    case 8:
      return ay <= 2.5 && ax <= r;
    default:
      return ax <= 2.5 && ay <= r;
  }
}

data::Dataset Shapes(int64_t n, uint32_t seed) {
  constexpr int kSide = 32;
  data::Dataset d;
  d.size = n;
  d.channels = 3;
  d.rows = d.cols = kSide;
  d.num_classes = 10;
  d.images.resize(n * 3 * kSide * kSide);
  d.labels.resize(n);
  std::mt19937 rng(seed);
  auto uniform = [&](double lo, double hi) {
    return lo + (hi - lo) * (rng() / static_cast<double>(std::mt19937::max()));
  };
  for (int64_t i = 0; i < n; ++i) {
    const int shape = static_cast<int>(i % 10);
    d.labels[i] = static_cast<uint8_t>(shape);
    int fg[3], bg[3];
    // A light colour on a dark one.
    do {
      for (int c = 0; c < 3; ++c) {
        fg[c] = static_cast<int>(uniform(60, 255));
        bg[c] = static_cast<int>(uniform(0, 120));
      }
    } while (fg[0] + fg[1] + fg[2] - bg[0] - bg[1] - bg[2] < 250);
    const double cx = 15.5 + uniform(-3, 3), cy = 15.5 + uniform(-3, 3), r = uniform(8, 11);
    uint8_t* img = d.images.data() + i * 3 * kSide * kSide;
    for (int y = 0; y < kSide; ++y) {
      for (int x = 0; x < kSide; ++x) {
        const bool in = Inside(shape, x - cx, y - cy, r);
        for (int c = 0; c < 3; ++c) {
          const double v = (in ? fg[c] : bg[c]) + uniform(-12, 12);
          img[(c * kSide + y) * kSide + x] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
        }
      }
    }
  }
  return d;
}

// The ResNet-18 job on the shapes: 20,000 training images, one epoch.
// ResNet-18 (3x3 stem, no down-sampling before its stages) costs about 0.6
// GFLOP per 12 x 12 sample to train; at batch 32 (625 steps, lr 0.04) it
// trains 222 samples/s alone on the 2-core development machine against 113
// at batch 16 (1,250 steps, lr 0.02), both ending at 0.999 test accuracy;
// batch 64 (312 steps, lr 0.08) ended at 0.456. The second run stops after
// kSecondRunSteps steps.
constexpr int64_t kShapesTrain = 20000;
constexpr int64_t kSecondRunSteps = 50;

// Every step's running loss and training accuracy of the epoch; stops the
// job after `stop_after` steps (0: never).
class StepRecorder : public JobObserver, public JobControl {
 public:
  explicit StepRecorder(int64_t stop_after) : stop_after_(stop_after) {}
  void OnStep(const JobProgress& p, const StepTimes& t) override {
    losses.push_back(p.loss);
    train_accuracies.push_back(p.train_accuracy);
  }
  void OnEpoch(const JobProgress& p) override { epochs.push_back(p); }
  bool StopRequested() override {
    return stop_after_ > 0 && static_cast<int64_t>(losses.size()) >= stop_after_;
  }
  std::vector<double> losses, train_accuracies;
  std::vector<JobProgress> epochs;

 private:
  const int64_t stop_after_;
};

TEST(DataAccuracyTest, ResNet18LearnsColouredShapesFromJpegShardsWithCropFlipNormalize) {
  constexpr int kSide = 12;  // the model's input: resized from 32 x 32
  constexpr int64_t kTest = 1000;
  const std::string dir = TmpDir("shapes");
  const absl::Time made = absl::Now();
  absl::StatusOr<std::vector<std::string>> train = data::WriteWebDataset(
      Shapes(kShapesTrain, 1), dir, "train", {.shard_size = 2000, .jpeg_quality = 90});
  absl::StatusOr<std::vector<std::string>> test = data::WriteWebDataset(
      Shapes(kTest, 2), dir, "test", {.shard_size = 1000, .jpeg_quality = 90});
  ASSERT_TRUE(train.ok() && test.ok()) << train.status() << test.status();
  EXPECT_EQ(train->size(), 10u);
  std::fprintf(stderr, "shapes: %lld + %lld JPEG images in %zu + %zu shards in %s\n",
               static_cast<long long>(kShapesTrain), static_cast<long long>(kTest), train->size(),
               test->size(), absl::FormatDuration(absl::Now() - made).c_str());

  JobConfig c;
  c.name = "shapes";
  c.model = "resnet18";
  c.epochs = 1;
  c.global_batch_size = 32;
  // Momentum smooths the one epoch's last steps (without it, lr 0.1 ended
  // one run at 0.88 test accuracy).
  c.sgd = {.lr = 0.04f, .momentum = 0.9f};
  c.seed = 11;
  c.init = "normal";
  c.threads = 2;
  c.data.format = "webdataset";
  c.data.train = data::BraceLocation(dir, "train", train->size());
  c.data.test = data::BraceLocation(dir, "test", test->size());
  c.data.channels = 3;
  c.data.height = c.data.width = kSide;
  c.data.num_classes = 10;
  c.data.data_threads = 1;
  c.data.transforms.resize = kSide;
  c.data.transforms.crop_height = c.data.transforms.crop_width = kSide;
  c.data.transforms.crop_padding = 1;
  c.data.transforms.random_crop = true;
  c.data.transforms.random_flip = true;
  c.data.transforms.mean = {0.5f, 0.5f, 0.5f};
  c.data.transforms.std = {0.3f, 0.3f, 0.3f};
  const int64_t steps = kShapesTrain / c.global_batch_size;
  StepRecorder first(0);
  JobProgress last;
  absl::Time start = absl::Now();
  absl::Status s = RunJob(c, &first, &last);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(first.epochs.size(), 1u);
  const JobProgress& epoch = first.epochs[0];
  std::fprintf(stderr,
               "resnet18: %lld steps, loss %.6f after 100 steps, %.6f over the epoch, train_acc "
               "%.4f, test_acc %.4f (%.0f samples/s) in %s\n",
               static_cast<long long>(steps), first.losses[99], epoch.loss, epoch.train_accuracy,
               epoch.test_accuracy, epoch.samples_per_second,
               absl::FormatDuration(absl::Now() - start).c_str());
  EXPECT_EQ(epoch.data_train_samples, kShapesTrain);
  EXPECT_EQ(epoch.data_test_samples, kTest);
  ASSERT_EQ(static_cast<int64_t>(first.losses.size()), steps);
  EXPECT_GE(epoch.test_accuracy, 0.95);
  // It learned: the epoch's mean loss is below that of its first 100 steps.
  EXPECT_LT(epoch.loss, first.losses[99]);
  // The same seed again, stopped after kSecondRunSteps steps (a second
  // whole epoch would double the test's time): the same crops, flips and
  // batches from the decode thread, the same kernels: every step's running
  // loss and training accuracy the same, bit for bit.
  StepRecorder second(kSecondRunSteps);
  start = absl::Now();
  s = RunJob(c, &second, &last);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  ASSERT_EQ(static_cast<int64_t>(second.losses.size()), kSecondRunSteps);
  int64_t same = 0;
  for (int64_t i = 0; i < kSecondRunSteps; ++i) {
    EXPECT_TRUE(SameBits(second.losses[i], first.losses[i]))
        << "step " << i + 1 << ": loss " << second.losses[i] << " vs " << first.losses[i];
    EXPECT_TRUE(SameBits(second.train_accuracies[i], first.train_accuracies[i]))
        << "step " << i + 1;
    same += SameBits(second.losses[i], first.losses[i]) ? 1 : 0;
  }
  std::fprintf(stderr, "resnet18 again: %lld of %lld steps with the same loss bits in %s\n",
               static_cast<long long>(same), static_cast<long long>(kSecondRunSteps),
               absl::FormatDuration(absl::Now() - start).c_str());
}

}  // namespace
}  // namespace train
}  // namespace dtrain
