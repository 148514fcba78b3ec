#include "libs/scheduler/model_check.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"

namespace dtrain {
namespace scheduler {
namespace {

std::string ReadTestModel(const std::string& name) {
  return ReadFileForTest(RunfilePath("libs/onnx/testdata/" + name));
}

class ModelCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = ModelStore::Open({.dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/models")});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  // Stores `bytes`; a spec of an eager cpu job naming it.
  v1::JobSpec Stored(const std::string& bytes) {
    auto up = store_->BeginUpload(ModelDigestOf(bytes), static_cast<int64_t>(bytes.size()));
    EXPECT_TRUE(up.ok()) << up.status();
    EXPECT_TRUE((*up)->Append(bytes).ok());
    EXPECT_TRUE((*up)->Commit().ok());
    v1::JobSpec spec;
    spec.set_model_digest(ModelDigestOf(bytes));
    return spec;
  }
  std::unique_ptr<ModelStore> store_;
};

TEST_F(ModelCheckTest, AcceptsTheTorchLenetForFashionMnist) {
  const std::string lenet = ReadTestModel("lenet.onnx");
  ASSERT_GT(lenet.size(), 1000u);
  EXPECT_TRUE(CheckJobModel(Stored(lenet), store_.get()).ok());
  v1::JobSpec builtin;
  builtin.set_model("lenet");
  EXPECT_TRUE(CheckJobModel(builtin, nullptr).ok());
}

TEST_F(ModelCheckTest, UnknownDigestAsksForTheUpload) {
  v1::JobSpec spec;
  spec.set_model_digest(ModelDigestOf("never uploaded"));
  absl::Status s = CheckJobModel(spec, store_.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("upload the model first"), std::string::npos) << s;
  EXPECT_EQ(CheckJobModel(spec, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  spec.set_model_digest("sha256:nothex");
  EXPECT_EQ(CheckJobModel(spec, store_.get()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelCheckTest, RefusesWithTheImportersMessage) {
  // An LSTM: unsupported ops, named.
  absl::Status lstm = CheckJobModel(Stored(ReadTestModel("lstm.onnx")), store_.get());
  EXPECT_EQ(lstm.code(), absl::StatusCode::kInvalidArgument) << lstm;
  EXPECT_NE(lstm.message().find("is not supported; supported: "), std::string::npos) << lstm;
  EXPECT_NE(lstm.message().find("LSTM"), std::string::npos) << lstm;
  // Truncated.
  const std::string lenet = ReadTestModel("lenet.onnx");
  absl::Status cut = CheckJobModel(Stored(lenet.substr(0, lenet.size() / 2)), store_.get());
  EXPECT_EQ(cut.code(), absl::StatusCode::kInvalidArgument) << cut;
  EXPECT_NE(cut.message().find("model_file: "), std::string::npos) << cut;
  // The job's data has 100 classes.
  v1::JobSpec classes = Stored(lenet);
  classes.mutable_data()->set_num_classes(100);
  absl::Status c = CheckJobModel(classes, store_.get());
  EXPECT_EQ(c.code(), absl::StatusCode::kInvalidArgument) << c;
  EXPECT_NE(c.message().find("100"), std::string::npos) << c;
  // 3x32x32 images.
  v1::JobSpec shape = Stored(lenet);
  shape.mutable_data()->set_format("image_folder");
  shape.mutable_data()->set_channels(3);
  shape.mutable_data()->set_height(32);
  shape.mutable_data()->set_width(32);
  EXPECT_EQ(CheckJobModel(shape, store_.get()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelCheckTest, CpuOnlyOpsAreRefusedForHybridizeAndCudaJobs) {
  v1::JobSpec vgg = Stored(ReadTestModel("vgg_bn.onnx"));
  ASSERT_TRUE(CheckJobModel(vgg, store_.get()).ok()) << "an eager cpu job trains it";
  vgg.set_hybridize(true);
  absl::Status h = CheckJobModel(vgg, store_.get());
  EXPECT_EQ(h.code(), absl::StatusCode::kInvalidArgument) << h;
  EXPECT_NE(h.message().find("Dropout"), std::string::npos) << h;
  EXPECT_NE(h.message().find("hybridize"), std::string::npos) << h;
  vgg.set_hybridize(false);
  vgg.set_device_kind("cuda");
  absl::Status c = CheckJobModel(vgg, store_.get());
  EXPECT_EQ(c.code(), absl::StatusCode::kInvalidArgument) << c;
  EXPECT_NE(c.message().find("cuda"), std::string::npos) << c;
  // The LeNet has none.
  v1::JobSpec lenet = Stored(ReadTestModel("lenet.onnx"));
  lenet.set_device_kind("cuda");
  EXPECT_TRUE(CheckJobModel(lenet, store_.get()).ok());
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
