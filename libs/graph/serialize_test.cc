#include "libs/graph/serialize.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "libs/autograd/variable.h"
#include "libs/base/testing.h"
#include "libs/checkpoint/checkpoint.h"
#include "libs/graph/hybridize.h"
#include "libs/nn/models.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace graph {
namespace {

std::shared_ptr<nn::Module> Model(const std::string& name) {
  absl::StatusOr<std::shared_ptr<nn::Module>> m = nn::MakeModel(name);
  EXPECT_TRUE(m.ok());
  nn::InitParameters(m->get(), nn::Init::kKaiming, 3);
  // Non-trivial running statistics so that batch-norm folding matters.
  uint64_t off = 0;
  for (auto& [bname, t] : (*m)->NamedBuffers()) {
    bool var = bname.find("running_var") != std::string::npos;
    ops::RandomUniform(t, var ? 0.5f : -0.2f, var ? 1.5f : 0.2f, 4, off += 1 << 20);
  }
  return *m;
}

Shape WithBatch(const std::string& name, int64_t batch) {
  Shape s = {batch};
  absl::StatusOr<Shape> sample = nn::ModelInputShape(name);
  s.insert(s.end(), sample->begin(), sample->end());
  return s;
}

Tensor Input(const Shape& shape, uint64_t seed) {
  Tensor x = Tensor::Empty(shape);
  ops::RandomUniform(&x, -1.0f, 1.0f, seed);
  return x;
}

Tensor Imperative(nn::Module* m, const Tensor& x) {
  m->Eval();
  autograd::NoGradGuard no_grad;
  return m->Forward(autograd::Variable(x)).value();
}

void ExpectNear(const Tensor& a, const Tensor& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  std::vector<float> va = a.ToVector<float>(), vb = b.ToVector<float>();
  double scale = 0;
  for (float v : vb) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_LE(std::fabs(double(va[i]) - vb[i]), rtol * std::fabs(double(vb[i])) + 1e-5 * scale)
        << what << " element " << i;
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class SavedModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SavedModelTest, LoadedModelGivesTheHybridizedResults) {
  const std::string name = GetParam();
  std::shared_ptr<nn::Module> m = Model(name);
  const Shape shape = WithBatch(name, 2);
  absl::StatusOr<std::unique_ptr<HybridModule>> h = HybridModule::Create(m.get(), shape);
  ASSERT_TRUE(h.ok()) << h.status();
  const std::string path = TestTmpPath(name + ".dtmodel");
  ASSERT_TRUE(SaveGraph((*h)->graph(), path).ok());

  absl::StatusOr<Graph> g = LoadGraph(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->ToString(), (*h)->graph().ToString());
  for (size_t i = 0; i < g->values().size(); ++i) {
    if (!g->value(i).bound()) continue;
    EXPECT_EQ(g->value(i).data.ToVector<float>(), (*h)->graph().value(i).data.ToVector<float>())
        << g->value(i).name;
  }

  absl::StatusOr<std::unique_ptr<SavedModel>> loaded = SavedModel::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Tensor x = Input(shape, 7);
  absl::StatusOr<Tensor> want = (*h)->Forward(x);
  ASSERT_TRUE(want.ok());
  Tensor want_copy = want->Clone();
  absl::StatusOr<Tensor> got = (*loaded)->Run(x);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->ToVector<float>(), want_copy.ToVector<float>());  // same plan, same bits

  // Another batch size: planned again from the saved graph.
  const Shape other = WithBatch(name, 5);
  Tensor x5 = Input(other, 8);
  got = (*loaded)->Run(x5);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*loaded)->input_shape(), other);
  ExpectNear(*got, Imperative(m.get(), x5), 1e-4, name + " at batch 5");
}

INSTANTIATE_TEST_SUITE_P(Models, SavedModelTest,
                         ::testing::Values("mlp", "mlp_chapter", "lenet", "resnet18"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// The runfiles path of a binary of this package.
std::string Runfile(const std::string& name) { return RunfilePath("libs/graph/" + name); }

// Runs `command`, returning its stdout and exit status.
std::string RunCommand(const std::string& command, int* status) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

TEST(SavedModelProcessTest, AnotherProcessWithoutModelCodeGivesTheSameOutputs) {
  for (const std::string name : {"mlp_chapter", "lenet"}) {
    std::shared_ptr<nn::Module> m = Model(name);
    const Shape shape = WithBatch(name, 3);
    absl::StatusOr<std::unique_ptr<HybridModule>> h = HybridModule::Create(m.get(), shape);
    ASSERT_TRUE(h.ok()) << h.status();
    const std::string model = TestTmpPath(name + "_process.dtmodel");
    ASSERT_TRUE(SaveGraph((*h)->graph(), model).ok());
    Tensor x = Input(shape, 9);
    const std::string input = TestTmpPath(name + "_input.f32");
    std::vector<float> xv = x.ToVector<float>();
    WriteFile(input, std::string(reinterpret_cast<const char*>(xv.data()), xv.size() * 4));
    absl::StatusOr<Tensor> want = (*h)->Forward(x);
    ASSERT_TRUE(want.ok());

    std::string shape_flag;
    for (int64_t d : shape) shape_flag += (shape_flag.empty() ? "" : ",") + std::to_string(d);
    int status = 0;
    const std::string out = RunCommand(Runfile("run_saved_model") + " --model=" + model +
                                           " --shape=" + shape_flag + " --input=" + input,
                                       &status);
    ASSERT_EQ(status, 0) << out;
    std::vector<float> got;
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (!absl::ConsumePrefix(&line, "output=")) continue;
      for (absl::string_view v : absl::StrSplit(line, ' ')) {
        float f;
        ASSERT_TRUE(absl::SimpleAtof(v, &f)) << v;
        got.push_back(f);
      }
    }
    // %.9g round-trips f32 exactly; same kernels, same plan.
    EXPECT_EQ(got, want->ToVector<float>()) << name << "\n" << out;
  }
}

TEST(SavedModelProcessTest, CorruptFileIsAClearErrorInTheOtherProcess) {
  const std::string path = TestTmpPath("garbage.dtmodel");
  WriteFile(path, "not a model at all");
  int status = 0;
  const std::string out =
      RunCommand(Runfile("run_saved_model") + " --model=" + path + " 2>&1", &status);
  EXPECT_EQ(status, 1);
  EXPECT_NE(out.find("not a dtrain checkpoint"), std::string::npos) << out;
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::shared_ptr<nn::Module> m = Model("mlp_chapter");
    absl::StatusOr<std::unique_ptr<HybridModule>> h = HybridModule::Create(m.get(), {1, 512});
    ASSERT_TRUE(h.ok());
    graph_ = (*h)->graph();
    path_ = TestTmpPath("good.dtmodel");
    ASSERT_TRUE(SaveGraph(graph_, path_).ok());
    bytes_ = ReadFile(path_);
    ASSERT_GT(bytes_.size(), 1000u);
  }
  absl::Status LoadBytes(const std::string& bytes) {
    const std::string p = TestTmpPath("bad.dtmodel");
    WriteFile(p, bytes);
    absl::StatusOr<std::unique_ptr<SavedModel>> m = SavedModel::Load(p);
    return m.status();
  }
  // A file with a valid container around `metadata` (graph tensors kept).
  absl::Status LoadWithMetadata(const std::map<std::string, std::string>& metadata) {
    absl::StatusOr<checkpoint::Checkpoint> ck = checkpoint::ReadCheckpoint(path_);
    EXPECT_TRUE(ck.ok());
    for (const auto& [k, v] : metadata) ck->metadata[k] = v;
    const std::string p = TestTmpPath("edited.dtmodel");
    EXPECT_TRUE(checkpoint::WriteCheckpoint(p, *ck).ok());
    return SavedModel::Load(p).status();
  }

  Graph graph_;
  std::string path_, bytes_;
};

TEST_F(CorruptionTest, TruncatedFile) {
  for (size_t keep : {size_t{0}, size_t{10}, size_t{47}, bytes_.size() / 2, bytes_.size() - 1}) {
    absl::Status s = LoadBytes(bytes_.substr(0, keep));
    EXPECT_FALSE(s.ok()) << keep;
    EXPECT_TRUE(s.code() == absl::StatusCode::kDataLoss ||
                s.code() == absl::StatusCode::kInvalidArgument)
        << s;
    EXPECT_NE(s.message().find("bad.dtmodel"), absl::string_view::npos) << s;
  }
  EXPECT_NE(LoadBytes(bytes_.substr(0, bytes_.size() / 2)).message().find("truncated"),
            absl::string_view::npos);
}

TEST_F(CorruptionTest, FlippedBitsAnywhere) {
  for (size_t at : {size_t{3}, size_t{30}, size_t{200}, bytes_.size() / 2, bytes_.size() - 20}) {
    std::string b = bytes_;
    b[at] ^= 0x10;
    absl::Status s = LoadBytes(b);
    EXPECT_FALSE(s.ok()) << "flip at " << at;
  }
  std::string b = bytes_;
  b[bytes_.size() / 2] ^= 1;  // inside the weights
  EXPECT_NE(LoadBytes(b).message().find("checksum"), absl::string_view::npos) << LoadBytes(b);
}

TEST_F(CorruptionTest, NotASavedModel) {
  checkpoint::Checkpoint ck;
  ck.metadata["model"] = "lenet";
  const std::string p = TestTmpPath("plain.dtckpt");
  ASSERT_TRUE(checkpoint::WriteCheckpoint(p, ck).ok());
  absl::Status s = SavedModel::Load(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not a saved model"), absl::string_view::npos) << s;
  EXPECT_EQ(SavedModel::Load(TestTmpPath("missing.dtmodel")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CorruptionTest, NewerVersionIsRejected) {
  absl::Status s = LoadWithMetadata({{"format_version", "2"}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("newer"), absl::string_view::npos) << s;
}

TEST_F(CorruptionTest, MalformedGraphsWithValidChecksumsAreErrors) {
  std::string text = checkpoint::ReadCheckpoint(path_)->metadata.at("graph");
  // Each edit must be rejected (never a crash).
  std::vector<std::string> bad = {
      "",
      "dtrain-graph",
      "dtrain-graph 1 values 99999999999",
      text.substr(0, text.size() / 2),
      text + " trailing",
  };
  // Replace the first linear with an op the IR does not know, then with a
  // training op, then break an operand id and a shape.
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) t.replace(at, from.size(), to);
    return t;
  };
  bad.push_back(edit("linear ", "frobnicate "));
  bad.push_back(edit("linear ", "sgd_update "));
  bad.push_back(edit("f32 2 256 512", "f32 2 256 511"));
  bad.push_back(edit("inputs 1 0", "inputs 1 9999"));
  bad.push_back(edit("outputs 1 ", "outputs 1 99 "));  // out of range, then a stray token
  for (const std::string& g : bad) {
    absl::Status s = LoadWithMetadata({{"graph", g}});
    EXPECT_FALSE(s.ok()) << g.substr(0, 80);
  }
}

TEST(SavedModelTest2, TrainingGraphsAreNotInferenceModels) {
  std::shared_ptr<nn::Module> m = Model("mlp");
  absl::StatusOr<std::unique_ptr<TrainStep>> step =
      HybridizeTrainingStep(m.get(), WithBatch("mlp", 2), 10, {.lr = 0.1f});
  ASSERT_TRUE(step.ok());
  const std::string path = TestTmpPath("train.dtmodel");
  ASSERT_TRUE(SaveGraph((*step)->module().graph(), path).ok());
  absl::StatusOr<Graph> g = LoadGraph(path);
  ASSERT_TRUE(g.ok()) << g.status();  // the graph itself round-trips
  EXPECT_EQ(g->ToString(), (*step)->module().graph().ToString());
  EXPECT_EQ(SavedModel::Load(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SavedModelTest2, WrongInputShapeIsAnError) {
  std::shared_ptr<nn::Module> m = Model("mlp_chapter");
  absl::StatusOr<std::unique_ptr<HybridModule>> h = HybridModule::Create(m.get(), {1, 512});
  ASSERT_TRUE(h.ok());
  absl::StatusOr<std::unique_ptr<SavedModel>> s = SavedModel::FromGraph((*h)->graph());
  ASSERT_TRUE(s.ok());
  absl::Status st = (*s)->Run(Tensor::Zeros({1, 100})).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("linear"), absl::string_view::npos) << st;
  EXPECT_TRUE((*s)->Run(Tensor::Zeros({4, 512})).ok());
}

}  // namespace
}  // namespace graph
}  // namespace dtrain
