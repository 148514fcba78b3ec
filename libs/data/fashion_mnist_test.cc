#include "libs/data/fashion_mnist.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;

// The real data set, installed by tools/setup (package dataset-fashion-mnist).
Dataset LoadOrDie(Split split) {
  absl::StatusOr<Dataset> data = LoadFashionMnist(kDefaultFashionMnistDir, split);
  EXPECT_TRUE(data.ok()) << data.status();
  return data.ok() ? *std::move(data) : Dataset{};
}

std::array<int, 10> Histogram(const Dataset& data) {
  std::array<int, 10> counts{};
  for (uint8_t label : data.labels) {
    if (label < 10) ++counts[label];
  }
  return counts;
}

int64_t PixelSum(const Dataset& data, int64_t sample) {
  const int64_t pixels = int64_t{data.rows} * data.cols;
  return std::accumulate(data.images.begin() + sample * pixels,
                         data.images.begin() + (sample + 1) * pixels, int64_t{0});
}

TEST(FashionMnistTest, LoadsTrainSplit) {
  const Dataset train = LoadOrDie(Split::kTrain);
  ASSERT_EQ(train.size, 60000);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.cols, 28);
  ASSERT_EQ(train.images.size(), 60000u * 28 * 28);
  ASSERT_EQ(train.labels.size(), 60000u);
  std::array<int, 10> expected;
  expected.fill(6000);
  EXPECT_EQ(Histogram(train), expected);
  EXPECT_EQ(train.labels[0], 9);
  EXPECT_STREQ(FashionMnistClassName(train.labels[0]), "ankle boot");
  EXPECT_EQ(std::vector<uint8_t>(train.labels.begin(), train.labels.begin() + 10),
            (std::vector<uint8_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}));
  EXPECT_EQ(train.labels[59999], 5);
  // Golden pixel sums (Python's gzip module): the data start right after the
  // header and run to the end of the file.
  EXPECT_EQ(PixelSum(train, 0), 76247);
  EXPECT_EQ(PixelSum(train, 59999), 16684);
  EXPECT_EQ(std::accumulate(train.images.begin(), train.images.end(), int64_t{0}), 3431114169);
}

TEST(FashionMnistTest, LoadsTestSplit) {
  const Dataset test = LoadOrDie(Split::kTest);
  ASSERT_EQ(test.size, 10000);
  EXPECT_EQ(test.rows, 28);
  EXPECT_EQ(test.cols, 28);
  ASSERT_EQ(test.images.size(), 10000u * 28 * 28);
  std::array<int, 10> expected;
  expected.fill(1000);
  EXPECT_EQ(Histogram(test), expected);
  EXPECT_EQ(std::vector<uint8_t>(test.labels.begin(), test.labels.begin() + 5),
            (std::vector<uint8_t>{9, 2, 1, 1, 6}));
  EXPECT_EQ(PixelSum(test, 0), 33456);
  EXPECT_EQ(std::accumulate(test.images.begin(), test.images.end(), int64_t{0}), 573469082);
}

TEST(FashionMnistTest, MaxSamplesLoadsTheFirstSamplesOnly) {
  // The limit of a job's train_limit: the same first samples as the whole
  // split, and no more.
  absl::StatusOr<Dataset> head = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain, 1000);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, 1000);
  ASSERT_EQ(head->images.size(), 1000u * 28 * 28);
  ASSERT_EQ(head->labels.size(), 1000u);
  const Dataset all = LoadOrDie(Split::kTrain);
  EXPECT_TRUE(std::equal(head->images.begin(), head->images.end(), all.images.begin()));
  EXPECT_TRUE(std::equal(head->labels.begin(), head->labels.end(), all.labels.begin()));
  EXPECT_EQ(PixelSum(*head, 0), 76247);
  absl::StatusOr<Dataset> more = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest, 20000);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(more->size, 10000);
}

TEST(FashionMnistTest, ClassNames) {
  const char* expected[] = {"t-shirt", "trouser", "pullover", "dress", "coat",
                            "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
  for (int i = 0; i < 10; ++i) EXPECT_STREQ(FashionMnistClassName(i), expected[i]);
  EXPECT_STREQ(FashionMnistClassName(-1), "unknown");
  EXPECT_STREQ(FashionMnistClassName(10), "unknown");
  EXPECT_STREQ(SplitName(Split::kTrain), "train");
  EXPECT_STREQ(SplitName(Split::kTest), "test");
}

TEST(FashionMnistTest, SubsetTakesTheFirstSamples) {
  Dataset data;
  data.size = 3;
  data.rows = 2;
  data.cols = 2;
  data.images = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  data.labels = {7, 8, 9};
  Dataset two = Subset(data, 2);
  EXPECT_EQ(two.size, 2);
  EXPECT_EQ(two.rows, 2);
  EXPECT_EQ(two.cols, 2);
  EXPECT_EQ(two.images, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(two.labels, (std::vector<uint8_t>{7, 8}));
  EXPECT_EQ(Subset(data, 100).images, data.images);
  EXPECT_EQ(Subset(data, 100).size, 3);
  EXPECT_EQ(Subset(data, -1).size, 0);
  EXPECT_TRUE(Subset(data, 0).images.empty());
}

// Writes uncompressed Fashion-MNIST-like files into a fresh directory.
class FakeDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/fake_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(dir_.c_str(), 0755);
  }

  static std::vector<uint8_t> Idx(uint32_t magic, const std::vector<uint32_t>& dims, size_t payload,
                                  uint8_t fill) {
    std::vector<uint32_t> words = {magic};
    words.insert(words.end(), dims.begin(), dims.end());
    std::vector<uint8_t> out;
    for (uint32_t v : words) {
      for (int shift = 24; shift >= 0; shift -= 8) out.push_back((v >> shift) & 0xFF);
    }
    out.insert(out.end(), payload, fill);
    return out;
  }

  void Write(const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream out(dir_ + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    ASSERT_TRUE(out.good());
  }

  // `n` test images of rows x cols and `labels` labels all equal to `label`.
  void WriteTestSplit(uint32_t n, uint32_t rows, uint32_t cols, uint32_t labels, uint8_t label) {
    Write("t10k-images-idx3-ubyte", Idx(0x803, {n, rows, cols}, n * rows * cols, 200));
    Write("t10k-labels-idx1-ubyte", Idx(0x801, {labels}, labels, label));
  }

  std::string dir_;
};

TEST_F(FakeDirTest, LoadsUncompressedFiles) {
  WriteTestSplit(3, 28, 28, 3, 4);
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir_ + "/", Split::kTest);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 3);
  EXPECT_EQ(data->images, std::vector<uint8_t>(3 * 28 * 28, 200));
  EXPECT_EQ(data->labels, std::vector<uint8_t>(3, 4));
}

TEST_F(FakeDirTest, MissingFilesSayHowToGetThem) {
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir_, Split::kTrain);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  const std::string message(data.status().message());
  EXPECT_THAT(message, HasSubstr(dir_ + "/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(message, HasSubstr("dataset-fashion-mnist"));
  EXPECT_THAT(message, HasSubstr("--data_dir"));

  data = LoadFashionMnist(dir_ + "/does/not/exist", Split::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("does/not/exist"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("dataset-fashion-mnist"));
}

TEST_F(FakeDirTest, LabelOutOfRangeIsAnError) {
  WriteTestSplit(3, 28, 28, 3, 10);
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir_, Split::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("t10k-labels-idx1-ubyte"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("label 10 of sample 0"));
}

TEST_F(FakeDirTest, CountMismatchIsAnError) {
  WriteTestSplit(3, 28, 28, 4, 1);
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir_, Split::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("3 images but"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("4 labels"));
}

TEST_F(FakeDirTest, WrongImageSizeIsAnError) {
  WriteTestSplit(2, 27, 28, 2, 1);
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir_, Split::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("2 x 27 x 28"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("expected 28 x 28"));
}

TEST_F(FakeDirTest, SwappedFilesAreAnError) {
  Write("t10k-images-idx3-ubyte", Idx(0x801, {3}, 3, 1));
  Write("t10k-labels-idx1-ubyte", Idx(0x803, {3, 28, 28}, 3 * 28 * 28, 1));
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir_, Split::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("expected 3-D images"));
}

TEST_F(FakeDirTest, DamagedFileErrorsNameTheFileAndTheFix) {
  WriteTestSplit(3, 28, 28, 3, 1);
  Write("t10k-images-idx3-ubyte", Idx(0x803, {3, 28, 28}, 100, 1));  // truncated
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir_, Split::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  const std::string message(data.status().message());
  EXPECT_THAT(message, HasSubstr(dir_ + "/t10k-images-idx3-ubyte"));
  EXPECT_THAT(message, HasSubstr("truncated"));
  EXPECT_THAT(message, HasSubstr("dataset-fashion-mnist"));
}

}  // namespace
}  // namespace dtrain::data
