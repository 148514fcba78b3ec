// Forward outputs and parameter gradients of the book's models against
// PyTorch 1.13 for the same weights and input (tests/reference/
// make_reference.py documents the recipe and wrote torch_reference.json).
// Tolerance: 1e-4 relative, as the compute-core issue asks.
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/nn/models.h"

namespace dtrain {
namespace nn {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

constexpr double kRtol = 1e-4;

const Struct& Reference() {
  static Struct* s = [] {
    const char* dir = std::getenv("TEST_SRCDIR");
    std::string path =
        std::string(dir ? dir : ".") + "/dtrain/tests/reference/torch_reference.json";
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    auto* out = new Struct();
    auto status = google::protobuf::util::JsonStringToMessage(ss.str(), out);
    EXPECT_TRUE(status.ok()) << path << ": " << status.ToString();
    return out;
  }();
  return *s;
}

const Struct* FindCase(const std::string& name) {
  for (const Value& v : Reference().fields().at("cases").list_value().values()) {
    if (v.struct_value().fields().at("name").string_value() == name) return &v.struct_value();
  }
  return nullptr;
}

double Num(const Struct& s, const std::string& key) { return s.fields().at(key).number_value(); }
const ListValue& List(const Struct& s, const std::string& key) {
  return s.fields().at(key).list_value();
}

// The reference's deterministic "sinusoid" init (see make_reference.py).
void SinusoidInit(Module* m) {
  int p = 0;
  for (auto& [name, v] : m->NamedParameters()) {
    Tensor& t = v.mutable_value();
    double scale = t.ndim() >= 2 ? 1.0 / std::sqrt(static_cast<double>(t.numel() / t.dim(0))) : 0.1;
    float* d = t.data<float>();
    for (int64_t k = 0; k < t.numel(); ++k) {
      d[k] = static_cast<float>(scale * std::sin(0.5 + 0.1 * p + 0.7 * static_cast<double>(k)));
    }
    ++p;
  }
}

Tensor SinusoidInput(const Shape& shape) {
  Tensor x = Tensor::Empty(shape);
  for (int64_t k = 0; k < x.numel(); ++k) {
    x.data<float>()[k] = static_cast<float>(0.5 + 0.5 * std::sin(0.3 * static_cast<double>(k)));
  }
  return x;
}

struct StepResult {
  std::shared_ptr<Module> model;
  Tensor logits;
  float loss;
};

StepResult TrainStep(const Struct& c) {
  std::string model_name = c.fields().at("model").string_value();
  StepResult r;
  r.model = *MakeModel(model_name);
  SinusoidInit(r.model.get());
  r.model->Train();
  Shape shape;
  for (const Value& d : List(c.fields().at("input").struct_value(), "shape").values()) {
    shape.push_back(static_cast<int64_t>(d.number_value()));
  }
  Tensor x = SinusoidInput(shape);
  std::vector<int32_t> labels;
  for (const Value& v : List(c, "labels").values())
    labels.push_back(static_cast<int32_t>(v.number_value()));
  Tensor y = Tensor::FromVector(labels, {static_cast<int64_t>(labels.size())});
  autograd::Variable logits = r.model->Forward(autograd::Variable(x));
  autograd::Variable loss = autograd::SoftmaxCrossEntropy(logits, y);
  loss.Backward();
  r.logits = logits.value();
  r.loss = ops::ScalarValue(loss.value());
  return r;
}

void ExpectLogits(const Struct& c, const Tensor& logits) {
  std::vector<float> got = logits.ToVector<float>();
  const ListValue& want = List(c, "logits");
  ASSERT_EQ(got.size(), static_cast<size_t>(want.values_size()));
  double mean_abs = 0;
  for (const Value& v : want.values()) mean_abs += std::fabs(v.number_value());
  mean_abs /= want.values_size();
  for (size_t i = 0; i < got.size(); ++i) {
    double e = want.values(static_cast<int>(i)).number_value();
    EXPECT_NEAR(got[i], e, kRtol * std::max(std::fabs(e), mean_abs)) << "logit " << i;
  }
}

// Returns how many parameters had (analytically) zero gradients.
int CheckTrainCase(const std::string& name) {
  int zero_grads = 0;
  const Struct* c = FindCase(name);
  if (c == nullptr) {
    ADD_FAILURE() << "case " << name << " missing from torch_reference.json";
    return -1;
  }
  StepResult r = TrainStep(*c);
  ExpectLogits(*c, r.logits);
  double want_loss = Num(*c, "loss");
  EXPECT_NEAR(r.loss, want_loss, kRtol * std::fabs(want_loss));
  auto params = r.model->NamedParameters();
  const ListValue& ref = List(*c, "params");
  if (params.size() != static_cast<size_t>(ref.values_size())) {
    ADD_FAILURE() << "parameter count " << params.size() << " vs " << ref.values_size();
    return -1;
  }
  // Typical gradient element size of the model (largest RMS over parameters).
  // A conv bias followed by batch norm has an analytically zero gradient
  // (the normalization subtracts it out); both frameworks produce only float
  // noise there (~1e-6 of the typical size), which is compared as "tiny".
  double typical_model = 0;
  for (const Value& v : ref.values()) {
    const Struct& p = v.struct_value();
    typical_model = std::max(typical_model, Num(p, "grad_l2") / std::sqrt(Num(p, "numel")));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Struct& p = ref.values(static_cast<int>(i)).struct_value();
    const std::string& pname = p.fields().at("name").string_value();
    EXPECT_EQ(params[i].first, pname) << "parameter " << i << " name";
    // The init itself (guards against a recipe mismatch).
    std::vector<float> w = params[i].second.value().ToVector<float>();
    const ListValue& idx = List(p, "sample_indices");
    for (int j = 0; j < idx.values_size(); ++j) {
      double e = List(p, "init_samples").values(j).number_value();
      EXPECT_NEAR(w[static_cast<size_t>(idx.values(j).number_value())], e,
                  1e-6 * std::fabs(e) + 1e-9)
          << pname << " init";
    }
    const Tensor& g = params[i].second.grad();
    if (!g.defined()) {
      ADD_FAILURE() << pname << " has no gradient";
      continue;
    }
    std::vector<float> gv = g.ToVector<float>();
    double sum = 0, abs_sum = 0, l2 = 0;
    for (float v : gv) {
      sum += v;
      abs_sum += std::fabs(v);
      l2 += static_cast<double>(v) * v;
    }
    l2 = std::sqrt(l2);
    double want_l2 = Num(p, "grad_l2"), want_abs = Num(p, "grad_abs_sum");
    double rms_bound = 1e-4 * typical_model * std::sqrt(static_cast<double>(gv.size()));
    auto noise = p.fields().find("grad_is_rounding_noise");
    if (noise != p.fields().end() && noise->second.bool_value()) {
      EXPECT_LT(l2, rms_bound) << pname << ": PyTorch's gradient is zero up to float noise";
      ++zero_grads;
      continue;
    }
    EXPECT_NEAR(l2, want_l2, kRtol * want_l2) << pname << " grad L2";
    EXPECT_NEAR(abs_sum, want_abs, kRtol * want_abs) << pname << " grad |sum|";
    // A plain sum cancels: compare it relative to the sum of magnitudes.
    EXPECT_NEAR(sum, Num(p, "grad_sum"), kRtol * want_abs) << pname << " grad sum";
    double typical = want_l2 / std::sqrt(static_cast<double>(gv.size()));
    for (int j = 0; j < idx.values_size(); ++j) {
      double e = List(p, "grad_samples").values(j).number_value();
      EXPECT_NEAR(gv[static_cast<size_t>(idx.values(j).number_value())], e,
                  kRtol * std::max(std::fabs(e), typical))
          << pname << " grad element " << idx.values(j).number_value();
    }
  }
  return zero_grads;
}

TEST(TorchParityTest, Mlp) { EXPECT_EQ(CheckTrainCase("mlp"), 0); }
TEST(TorchParityTest, MlpChapter) { EXPECT_EQ(CheckTrainCase("mlp_chapter"), 0); }
TEST(TorchParityTest, LeNet) { EXPECT_EQ(CheckTrainCase("lenet"), 0); }
// The stem's and the 16 residual convolutions' biases feed batch norm.
TEST(TorchParityTest, ResNet18) { EXPECT_EQ(CheckTrainCase("resnet18"), 17); }

TEST(TorchParityTest, ResNet18EvalAfterOneTrainingStep) {
  const Struct* train_case = FindCase("resnet18");
  const Struct* c = FindCase("resnet18_eval");
  ASSERT_TRUE(train_case != nullptr && c != nullptr);
  StepResult r = TrainStep(*train_case);
  std::vector<std::pair<std::string, Tensor*>> buffers = r.model->NamedBuffers();
  for (const Value& v : List(*c, "bn_stats").values()) {
    const Struct& s = v.struct_value();
    std::string prefix = s.fields().at("name").string_value();
    const Tensor* mean = nullptr;
    const Tensor* var = nullptr;
    for (auto& [name, t] : buffers) {
      if (name == prefix + ".running_mean") mean = t;
      if (name == prefix + ".running_var") var = t;
    }
    ASSERT_TRUE(mean && var) << "no batch norm buffers named " << prefix;
    std::vector<float> m = mean->ToVector<float>(), va = var->ToVector<float>();
    double msum = 0, vsum = 0;
    for (float x : m) msum += x;
    for (float x : va) vsum += x;
    EXPECT_NEAR(vsum, Num(s, "running_var_sum"), kRtol * std::fabs(Num(s, "running_var_sum")));
    double mabs = 0;
    for (float x : m) mabs += std::fabs(x);
    EXPECT_NEAR(msum, Num(s, "running_mean_sum"), kRtol * mabs + 1e-7) << prefix;
    for (int j = 0; j < 3; ++j) {
      double e = List(s, "running_mean_first").values(j).number_value();
      EXPECT_NEAR(m[j], e, kRtol * std::fabs(e) + 1e-7) << prefix << " running_mean[" << j << "]";
    }
  }
  r.model->Eval();
  autograd::NoGradGuard no_grad;
  Shape shape;
  for (const Value& d : List(c->fields().at("input").struct_value(), "shape").values()) {
    shape.push_back(static_cast<int64_t>(d.number_value()));
  }
  ExpectLogits(*c, r.model->Forward(autograd::Variable(SinusoidInput(shape))).value());
}

}  // namespace
}  // namespace nn
}  // namespace dtrain
