// The formats end to end on files the test writes: Fashion-MNIST (the
// Debian package's, first samples) as WebDataset PNG shards and as .npy
// give the IDX path's batches bit for bit; image folders; the checks at
// open; the loader's threads and seeded transforms.
#include "libs/data/open.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/loader.h"
#include "libs/data/pack.h"
#include "libs/data/tar.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;

std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base != nullptr ? base : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const Dataset& Fmnist() {
  static const Dataset* data = [] {
    absl::StatusOr<Dataset> d = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
    EXPECT_TRUE(d.ok()) << d.status();
    return new Dataset(Subset(*d, 1000));
  }();
  return *data;
}

std::vector<Batch> AllBatches(const Dataset& data, LoaderOptions o, int64_t epoch) {
  absl::StatusOr<std::unique_ptr<DataLoader>> loader = DataLoader::Create(&data, o);
  EXPECT_TRUE(loader.ok()) << loader.status();
  std::vector<Batch> out;
  (*loader)->StartEpoch(epoch);
  Batch b;
  while ((*loader)->Next(&b)) out.push_back(b);
  EXPECT_TRUE((*loader)->status().ok()) << (*loader)->status();
  return out;
}

void ExpectSameBatches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].labels, b[i].labels) << "batch " << i;
    ASSERT_EQ(a[i].images.size(), b[i].images.size()) << "batch " << i;
    // Bit for bit: memcmp, not float ==.
    EXPECT_EQ(std::memcmp(a[i].images.data(), b[i].images.data(), a[i].images.size() * 4), 0)
        << "batch " << i;
  }
}

DataConfig Shape(const std::string& format, const std::string& train) {
  DataConfig c;
  c.format = format;
  c.train = train;
  c.channels = 1;
  c.height = 28;
  c.width = 28;
  c.num_classes = 10;
  return c;
}

TEST(OpenTest, WebDatasetAndNpyGiveTheIdxBatchesBitForBit) {
  const Dataset& idx = Fmnist();
  const std::string dir = TmpDir("fmnist-wds");
  PackOptions po;
  po.shard_size = 300;  // 4 shards, the last partial
  absl::StatusOr<std::vector<std::string>> shards = WriteWebDataset(idx, dir, "train", po);
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), 4u);
  absl::StatusOr<Dataset> wds =
      OpenDataset(Shape("webdataset", BraceLocation(dir, "train", 4)), Split::kTrain);
  ASSERT_TRUE(wds.ok()) << wds.status();
  EXPECT_EQ(wds->size, 1000);
  EXPECT_EQ(wds->num_classes, 10);

  const std::string npy_dir = TmpDir("fmnist-npy");
  ASSERT_TRUE(WriteNpyDataset(idx, npy_dir).ok());
  absl::StatusOr<Dataset> npy = OpenDataset(Shape("npy", npy_dir), Split::kTrain);
  ASSERT_TRUE(npy.ok()) << npy.status();
  EXPECT_EQ(npy->size, 1000);

  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      LoaderOptions o;
      o.batch_size = 64;
      o.seed = 5;
      o.rank = rank;
      o.world_size = world;
      const std::vector<Batch> want = AllBatches(idx, o, 1);
      o.threads = 3;
      ExpectSameBatches(AllBatches(*wds, o, 1), want);
      o.prefetch = 0;
      ExpectSameBatches(AllBatches(*npy, o, 1), want);
    }
  }
}

TEST(OpenTest, MaxSamplesKeepsTheFirstSamplesOfEveryFormat) {
  // A job's train_limit: the idx format reads only that much of its files,
  // the others open everything and keep the first samples; either way the
  // same batches as the first samples of the whole set.
  const Dataset& idx = Fmnist();  // the first 1000
  DataConfig c;
  absl::StatusOr<Dataset> head = OpenDataset(c, Split::kTrain, kDefaultFashionMnistDir, 1000);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, 1000);
  EXPECT_EQ(head->images, idx.images);
  EXPECT_EQ(head->labels, idx.labels);
  const std::string npy_dir = TmpDir("fmnist-npy-limit");
  ASSERT_TRUE(WriteNpyDataset(idx, npy_dir).ok());
  absl::StatusOr<Dataset> npy = OpenDataset(Shape("npy", npy_dir), Split::kTrain, "", 300);
  ASSERT_TRUE(npy.ok()) << npy.status();
  EXPECT_EQ(npy->size, 300);
  LoaderOptions o;
  o.batch_size = 64;
  o.seed = 5;
  const Dataset first300 = Subset(idx, 300);
  ExpectSameBatches(AllBatches(*npy, o, 1), AllBatches(first300, o, 1));
  // A limit above the size keeps everything.
  npy = OpenDataset(Shape("npy", npy_dir), Split::kTrain, "", 5000);
  ASSERT_TRUE(npy.ok()) << npy.status();
  EXPECT_EQ(npy->size, 1000);
}

TEST(OpenTest, ImageFolderSortsClassesByName) {
  const std::string root = TmpDir("folder");
  const Dataset small = Subset(Fmnist(), 40);
  ASSERT_TRUE(WriteImageFolder(small, root,
                               {"t-shirt", "trouser", "pullover", "dress", "coat", "sandal",
                                "shirt", "sneaker", "bag", "ankle boot"})
                  .ok());
  absl::StatusOr<Dataset> d = OpenDataset(Shape("image_folder", root), Split::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 40);
  ASSERT_EQ(d->class_names.size(), 10u);
  EXPECT_EQ(d->class_names[0], "ankle boot");
  EXPECT_EQ(d->class_names[9], "trouser");
  DatasetSummary s = Summarize(*d);
  int64_t total = 0;
  for (int c = 0; c < 10; ++c) total += s.histogram[c];
  EXPECT_EQ(total, 40);
  // Every "ankle boot" (label 9 in Fashion-MNIST) is class 0 here.
  int64_t boots = 0;
  for (int64_t i = 0; i < small.size; ++i) boots += small.labels[i] == 9;
  EXPECT_EQ(s.histogram[0], boots);
}

TEST(OpenTest, CorruptImageNamesTheFileOrIsSkippedAndCounted) {
  const std::string root = TmpDir("corrupt");
  ASSERT_TRUE(WriteImageFolder(Subset(Fmnist(), 20), root, {}).ok());
  // Damage one file: sample 3's.
  std::string victim;
  for (int c = 0; c < 10 && victim.empty(); ++c) {
    const std::string p = root + "/" + std::string(4, '0') + std::to_string(c) + "/000003.png";
    if (!ReadFile(p).empty()) victim = p;
  }
  ASSERT_FALSE(victim.empty());
  std::string bytes = ReadFile(victim);
  WriteFile(victim, bytes.substr(0, bytes.size() - 30));
  DataConfig c = Shape("image_folder", root);
  absl::StatusOr<Dataset> d = OpenDataset(c, Split::kTrain);
  EXPECT_TRUE(absl::IsDataLoss(d.status())) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr(victim));
  EXPECT_THAT(d.status().message(), HasSubstr("corrupt PNG"));
  EXPECT_THAT(d.status().message(), HasSubstr("skip_corrupt"));
  c.skip_corrupt = true;
  d = OpenDataset(c, Split::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 19);
  EXPECT_EQ(d->corrupt_skipped, 1);
}

TEST(OpenTest, ChecksFailFastNamingTheProblem) {
  // Missing path.
  absl::StatusOr<Dataset> d = OpenDataset(Shape("npy", "/nonexistent/npy"), Split::kTrain);
  EXPECT_TRUE(absl::IsNotFound(d.status())) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("/nonexistent/npy/x.npy"));
  // Label out of range.
  const std::string npy_dir = TmpDir("labels");
  ASSERT_TRUE(WriteNpyDataset(Subset(Fmnist(), 30), npy_dir).ok());
  DataConfig c = Shape("npy", npy_dir);
  c.num_classes = 3;
  d = OpenDataset(c, Split::kTrain);
  EXPECT_THAT(d.status().message(), HasSubstr("out of range (num_classes is 3)"));
  EXPECT_THAT(d.status().message(), HasSubstr("x.npy row"));
  // Shape disagreement.
  c = Shape("npy", npy_dir);
  c.height = c.width = 32;
  EXPECT_THAT(OpenDataset(c, Split::kTrain).status().message(), HasSubstr("add resize and crop"));
  // A shard with a '../' member.
  const std::string shard = TmpDir("evil") + "/evil-0.tar";
  TarWriter w;
  w.Add("000.cls", "1");
  w.Add("../../etc/000.png", "x");
  WriteFile(shard, w.Finish());
  d = OpenDataset(Shape("webdataset", shard), Split::kTrain);
  EXPECT_THAT(d.status().message(), HasSubstr(shard));
  EXPECT_THAT(d.status().message(), HasSubstr("'..' component; refused"));
  // A decompression bomb.
  const std::string bomb_dir = TmpDir("bomb");
  Image big;
  big.channels = 1;
  big.height = big.width = 4000;
  big.u8.assign(4000 * 4000, 0);
  TarWriter bw;
  bw.Add("0.png", *EncodePng(big));
  bw.Add("0.cls", "0");
  WriteFile(bomb_dir + "/b-0.tar", bw.Finish());
  c = Shape("webdataset", bomb_dir + "/b-0.tar");
  c.max_image_pixels = 1 << 20;
  c.skip_corrupt = true;  // a bomb is refused, not skipped
  d = OpenDataset(c, Split::kTrain);
  EXPECT_THAT(d.status().message(), HasSubstr("decompression bomb"));
  EXPECT_THAT(d.status().message(), HasSubstr("b-0.tar member 0.png"));
}

TEST(OpenTest, ValidationRefusesRelativePathsAndBadShapes) {
  DataConfig c = Shape("webdataset", "shards/train-{0..3}.tar");
  EXPECT_THAT(ValidateDataConfig(c).message(), HasSubstr("relative path"));
  c.train = "/d/../etc/x.tar";
  EXPECT_THAT(ValidateDataConfig(c).message(), HasSubstr("'..'"));
  c = Shape("tfrecord", "/d");
  EXPECT_THAT(ValidateDataConfig(c).message(), HasSubstr("must be idx, image_folder"));
  c = Shape("npy", "/d");
  c.channels = 2;
  EXPECT_THAT(ValidateDataConfig(c).message(), HasSubstr("data.channels"));
  c = Shape("npy", "/d");
  c.transforms.mean = {0.5f, 0.5f};
  c.transforms.std = {0.5f, 0.5f};
  EXPECT_THAT(ValidateDataConfig(c).message(), HasSubstr("one value per channel"));
  EXPECT_TRUE(ValidateDataConfig(Shape("npy", "/data/x")).ok());
  EXPECT_TRUE(ValidateDataConfig(DataConfig{}).ok());  // the Fashion-MNIST default
  // Roots.
  c = Shape("webdataset", "/data/a-{0..1}.tar,/other/b.tar");
  EXPECT_TRUE(CheckDataRoots(c, {"/data", "/other"}).ok());
  absl::Status denied = CheckDataRoots(c, {"/data"});
  EXPECT_TRUE(absl::IsPermissionDenied(denied)) << denied;
  EXPECT_THAT(denied.message(), HasSubstr("'/other/b.tar' is outside them"));
}

TEST(OpenTest, LoaderThreadsDefaultToTheCoresTheStepLeaves) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  DataConfig c = Shape("webdataset", "/d/a.tar");
  EXPECT_EQ(LoaderThreads(c, 1), std::max(1, cores - 1));
  EXPECT_EQ(LoaderThreads(c, cores), 1);  // the step takes every core: still one
  EXPECT_EQ(LoaderThreads(c, 0), cores);
  c.data_threads = 5;  // set: taken as it is
  EXPECT_EQ(LoaderThreads(c, cores), 5);
  EXPECT_EQ(LoaderThreads(DataConfig{}, 0), 1);  // idx: copying pixels needs one
}

TEST(OpenTest, BracePatternsExpandInOrder) {
  absl::StatusOr<std::vector<std::string>> p = ExpandLocation("/d/t-{0008..0011}.tar,/e/x.tar");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (std::vector<std::string>{"/d/t-0008.tar", "/d/t-0009.tar", "/d/t-0010.tar",
                                          "/d/t-0011.tar", "/e/x.tar"}));
  EXPECT_EQ(ExpandLocation("/d/{9..11}")->back(), "/d/11");
  EXPECT_FALSE(ExpandLocation("/d/{3..1}.tar").ok());
  EXPECT_FALSE(ExpandLocation("/d/{a..b}.tar").ok());
  EXPECT_FALSE(ExpandLocation("/d/{0..9999999}.tar").ok());
}

TEST(OpenTest, RandomTransformsDependOnSeedEpochAndIndexOnly) {
  const std::string dir = TmpDir("aug");
  ASSERT_TRUE(WriteWebDataset(Subset(Fmnist(), 200), dir, "a", {.shard_size = 64}).ok());
  DataConfig c = Shape("webdataset", BraceLocation(dir, "a", 4));
  c.height = c.width = 24;
  c.transforms.crop_height = c.transforms.crop_width = 24;
  c.transforms.crop_padding = 2;
  c.transforms.random_crop = c.transforms.random_flip = true;
  c.transforms.mean = {0.3f};
  c.transforms.std = {0.3f};
  absl::StatusOr<Dataset> d = OpenDataset(c, Split::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  LoaderOptions o;
  o.batch_size = 32;
  o.seed = 11;
  const std::vector<Batch> one = AllBatches(*d, o, 2);
  o.threads = 4;
  o.prefetch = 1;
  ExpectSameBatches(AllBatches(*d, o, 2), one);
  // Resumed mid-epoch: the same batches from there on.
  absl::StatusOr<std::unique_ptr<DataLoader>> loader = DataLoader::Create(&*d, o);
  ASSERT_TRUE(loader.ok());
  (*loader)->StartEpoch(2, 3);
  Batch b;
  ASSERT_TRUE((*loader)->Next(&b));
  ExpectSameBatches({b}, {one[3]});
  // Another epoch: other crops.
  const std::vector<Batch> next = AllBatches(*d, o, 3);
  EXPECT_NE(next[0].images, one[0].images);
  // The test split has no random parts: the center crop.
  c.test = c.train;
  absl::StatusOr<Dataset> test = OpenDataset(c, Split::kTest);
  ASSERT_TRUE(test.ok());
  EXPECT_FALSE(test->transforms.random_crop);
  EXPECT_EQ(test->transforms.crop_padding, 0);
}

TEST(OpenTest, AFileDamagedAfterOpenFailsTheEpochNamingIt) {
  const std::string root = TmpDir("later");
  ASSERT_TRUE(WriteImageFolder(Subset(Fmnist(), 10), root, {}).ok());
  absl::StatusOr<Dataset> d = OpenDataset(Shape("image_folder", root), Split::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string victim = d->source->Describe(4).substr(0, d->source->Describe(4).find(' '));
  WriteFile(victim, "garbage");
  LoaderOptions o;
  o.batch_size = 2;
  o.shuffle = false;
  absl::StatusOr<std::unique_ptr<DataLoader>> loader = DataLoader::Create(&*d, o);
  ASSERT_TRUE(loader.ok());
  (*loader)->StartEpoch(0);
  Batch b;
  int batches = 0;
  while ((*loader)->Next(&b)) ++batches;
  EXPECT_EQ(batches, 2);  // samples 0..3
  EXPECT_THAT((*loader)->status().message(), HasSubstr(victim));
  EXPECT_THAT((*loader)->status().message(), HasSubstr("sample 4"));
}

}  // namespace
}  // namespace dtrain::data
