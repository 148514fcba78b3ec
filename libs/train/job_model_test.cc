#include "libs/train/job_model.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/onnx/model.h"

namespace dtrain {
namespace train {
namespace {

std::string TestModel(const std::string& name) { return RunfilePath("libs/onnx/testdata/" + name); }

// Every value of `t` as floats.
std::vector<float> Values(const Tensor& t) { return t.ToVector<float>(); }

TEST(JobModelTest, BuiltinModelsByName) {
  JobConfig c;
  c.model = "lenet";
  absl::StatusOr<JobModel> m = OpenJobModel(c);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sample_shape, (Shape{1, 28, 28}));
  EXPECT_FALSE(m->factory);
  EXPECT_FALSE(m->init_from_model);
  EXPECT_EQ(m->init, "normal");
  absl::StatusOr<graph::TrainingFlops> f = m->flops();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_GT(f->total(), 0);
}

// The file's model: zero parameters from the factory (our initializers
// follow), FLOPs equal to the built-in twin's, and init from_model's hook
// copies the file's parameters and batch-norm statistics.
TEST(JobModelTest, FileModelFactoryFlopsAndFromModel) {
  JobConfig c;
  c.model = "sha256:whatever";
  c.model_file = TestModel("lenet.onnx");
  absl::StatusOr<JobModel> m = OpenJobModel(c);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sample_shape, (Shape{1, 28, 28}));
  ASSERT_TRUE(m->factory);
  EXPECT_FALSE(m->init_from_model);
  absl::StatusOr<std::shared_ptr<nn::Module>> replica = m->factory();
  ASSERT_TRUE(replica.ok()) << replica.status();
  for (auto& [name, p] : (*replica)->NamedParameters()) {
    for (float v : Values(p.value())) ASSERT_EQ(v, 0.0f) << name;
  }
  JobConfig builtin;
  builtin.model = "lenet";
  auto f = m->flops();
  auto g = OpenJobModel(builtin)->flops();
  ASSERT_TRUE(f.ok() && g.ok());
  EXPECT_EQ(f->total(), g->total()) << "the same graph, the same FLOPs";

  c.model_file = TestModel("vgg_bn.onnx");
  c.init = "from_model";
  m = OpenJobModel(c);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->init, "normal");  // initialized, then overwritten by the hook
  ASSERT_TRUE(m->init_from_model);
  replica = m->factory();
  ASSERT_TRUE(replica.ok());
  ASSERT_TRUE(m->init_from_model(replica->get(), nullptr).ok());
  onnx::ImportOptions o;
  auto file = onnx::ImportModelFile(c.model_file, o);
  ASSERT_TRUE(file.ok()) << file.status();
  auto want = (*file)->NamedParameters();
  auto got = (*replica)->NamedParameters();
  ASSERT_EQ(got.size(), want.size());
  ASSERT_GT(got.size(), 0u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(Values(got[i].second.value()), Values(want[i].second.value())) << got[i].first;
  }
  auto want_buffers = (*file)->NamedBuffers();
  auto got_buffers = (*replica)->NamedBuffers();
  ASSERT_EQ(got_buffers.size(), want_buffers.size());
  ASSERT_GT(got_buffers.size(), 0u) << "vgg_bn has batch-norm statistics";
  for (size_t i = 0; i < got_buffers.size(); ++i) {
    EXPECT_EQ(Values(*got_buffers[i].second), Values(*want_buffers[i].second))
        << got_buffers[i].first;
  }
}

TEST(JobModelTest, ABadFileIsTheImportersError) {
  JobConfig c;
  c.model_file = TestModel("lstm.onnx");
  EXPECT_EQ(OpenJobModel(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.model_file = "/nonexistent.onnx";
  EXPECT_EQ(OpenJobModel(c).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace train
}  // namespace dtrain
