// The ONNX importer on models exported by PyTorch (tests/reference/
// export_onnx.py, run at build time), the exporter of built-in models, the
// errors for bad files, and the round trip back into PyTorch
// (tests/reference/onnx_roundtrip.py).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/base/testing.h"
#include "libs/graph/hybridize.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/onnx/eager_ops.h"
#include "libs/onnx/export.h"
#include "libs/onnx/model.h"
#include "libs/ops/testing/gradcheck.h"
#include "third_party/onnx/onnx.pb.h"

namespace dtrain {
namespace onnx {
namespace {

using autograd::Variable;
using ops::testing::RandomTensor;
using ops::testing::TensorsNear;

std::string TestData(const std::string& name) { return RunfilePath("libs/onnx/testdata/" + name); }

ImportOptions Fmnist(bool from_model) {
  ImportOptions o;
  o.input_shape = {1, 28, 28};
  o.num_classes = 10;
  o.from_model = from_model;
  return o;
}

std::shared_ptr<OnnxModel> Import(const std::string& file, bool from_model = true) {
  auto m = ImportModelFile(TestData(file), Fmnist(from_model));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : nullptr;
}

// Copies every parameter and buffer of `from` into `to` by name; both must
// have exactly the same names and shapes.
void CopyByName(nn::Module* from, nn::Module* to) {
  std::map<std::string, Tensor> src;
  for (auto& [name, p] : from->NamedParameters()) src[name] = p.value();
  for (auto& [name, b] : from->NamedBuffers()) src[name + "#buffer"] = *b;
  size_t n = 0;
  for (auto& [name, p] : to->NamedParameters()) {
    ASSERT_TRUE(src.count(name)) << "parameter " << name << " missing in the built-in model";
    ASSERT_EQ(src[name].shape(), p.value().shape()) << name;
    ASSERT_TRUE(p.mutable_value().CopyFrom(src[name]).ok());
    ++n;
  }
  for (auto& [name, b] : to->NamedBuffers()) {
    ASSERT_TRUE(src.count(name + "#buffer")) << "buffer " << name;
    ASSERT_TRUE(b->CopyFrom(src[name + "#buffer"]).ok());
    ++n;
  }
  EXPECT_EQ(n, src.size()) << "every parameter and buffer has a counterpart";
}

// `steps` SGD steps of `net`, alternating between two fixed random batches
// (so the loss can go down); returns the losses.
std::vector<float> Losses(nn::Module* net, int64_t batch, int steps) {
  nn::Sgd sgd(net->NamedParameters(), {.lr = 0.01f, .momentum = 0.9f, .weight_decay = 1e-4f});
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor x = RandomTensor({batch, 1, 28, 28}, 100 + s % 2, 0.0f, 1.0f);
    std::vector<int32_t> labels(batch);
    for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((i * 7 + s % 2) % 10);
    Tensor y = Tensor::FromVector(labels, {batch});
    sgd.ZeroGrad();
    Variable loss = autograd::SoftmaxCrossEntropy(net->Forward(Variable(x)), y);
    loss.Backward();
    sgd.Step();
    losses.push_back(ops::ScalarValue(loss.value()));
  }
  return losses;
}

void ExpectSameLosses(const std::string& builtin, const std::string& file, int64_t batch) {
  auto ref = nn::MakeModel(builtin);
  ASSERT_TRUE(ref.ok());
  nn::InitParameters(ref->get(), nn::Init::kKaiming, 7);
  std::shared_ptr<OnnxModel> imported = Import(file, /*from_model=*/false);
  ASSERT_NE(imported, nullptr);
  EXPECT_TRUE(imported->cpu_only_ops().empty());
  EXPECT_EQ(imported->NumParameters(), (*ref)->NumParameters());
  CopyByName(ref->get(), imported.get());
  std::vector<float> a = Losses(ref->get(), batch, 20);
  std::vector<float> b = Losses(imported.get(), batch, 20);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "step " << i;
  }
  EXPECT_LT(a.back(), a.front()) << "training made progress";
}

TEST(OnnxImport, TorchLeNetTrainsLikeTheBuiltinLeNet) {
  ExpectSameLosses("lenet", "lenet.onnx", 32);
}

TEST(OnnxImport, TorchResNet18TrainsLikeTheBuiltinResNet18) {
  ExpectSameLosses("resnet18", "resnet18.onnx", 4);
}

TEST(OnnxImport, ParametersAreNamedAfterInitializersAndKeepTheirValues) {
  std::shared_ptr<OnnxModel> m = Import("resnet18.onnx");
  ASSERT_NE(m, nullptr);
  ::onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(ReadFileForTest(TestData("resnet18.onnx"))));
  std::map<std::string, const ::onnx::TensorProto*> inits;
  for (const auto& t : proto.graph().initializer()) inits[t.name()] = &t;
  auto params = m->NamedParameters();
  ASSERT_EQ(params.front().first, "0.weight");
  for (auto& [name, p] : params) {
    ASSERT_TRUE(inits.count(name)) << name;
    const std::string& raw = inits[name]->raw_data();
    ASSERT_EQ(raw.size(), p.value().nbytes()) << name;
    EXPECT_EQ(0, std::memcmp(raw.data(), p.value().raw_data(), raw.size())) << name;
  }
  auto buffers = m->NamedBuffers();
  EXPECT_EQ(buffers.size(), 2u * 17);  // running mean and var of 17 batch norms
  EXPECT_EQ(buffers[0].first, "1.running_mean");
}

TEST(OnnxImport, ImportedLeNetHybridizesLikeTheBuiltin) {
  auto ref = nn::MakeModel("lenet");
  ASSERT_TRUE(ref.ok());
  nn::InitParameters(ref->get(), nn::Init::kKaiming, 3);
  std::shared_ptr<OnnxModel> imported = Import("lenet.onnx", false);
  ASSERT_NE(imported, nullptr);
  CopyByName(ref->get(), imported.get());
  const ops::SgdParams sgd{.lr = 0.05f};
  auto a = graph::HybridizeTrainingStep(ref->get(), {16, 1, 28, 28}, 10, sgd);
  auto b = graph::HybridizeTrainingStep(imported.get(), {16, 1, 28, 28}, 10, sgd);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (int s = 0; s < 5; ++s) {
    Tensor x = RandomTensor({16, 1, 28, 28}, s, 0.0f, 1.0f);
    std::vector<int32_t> labels(16);
    for (int i = 0; i < 16; ++i) labels[i] = (i + s) % 10;
    Tensor y = Tensor::FromVector(labels, {16});
    float la = (*a)->Run(x, y), lb = (*b)->Run(x, y);
    EXPECT_NEAR(lb, la, 1e-5 * std::abs(la)) << "step " << s;
  }
}

// "The same graph": the imported twins of the built-in models trace (what
// hybridize and the FLOPs count see) to exactly the built-in models' graphs,
// parameter names included.
TEST(OnnxImport, ImportedTwinsTraceToTheBuiltinGraphs) {
  for (const auto& [builtin, file] : std::vector<std::pair<std::string, std::string>>{
           {"lenet", "lenet.onnx"}, {"resnet18", "resnet18.onnx"}}) {
    SCOPED_TRACE(builtin);
    auto ref = nn::MakeModel(builtin);
    ASSERT_TRUE(ref.ok());
    std::shared_ptr<OnnxModel> imported = Import(file);
    ASSERT_NE(imported, nullptr);
    for (bool training : {true, false}) {
      auto a = graph::TraceModule(ref->get(), {2, 1, 28, 28}, training);
      auto b = graph::TraceModule(imported.get(), {2, 1, 28, 28}, training);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->ToString(), a->ToString());
    }
  }
}

TEST(OnnxImport, VggWithBatchNormAndDropoutTrains) {
  std::shared_ptr<OnnxModel> m = Import("vgg_bn.onnx");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->cpu_only_ops(), std::vector<std::string>{"Dropout"});
  EXPECT_EQ(m->NamedBuffers().size(), 4u);
  // Eval mode: dropout is off, two forwards agree; training mode: it is on.
  Tensor x = RandomTensor({4, 1, 28, 28}, 1, 0.0f, 1.0f);
  m->Eval();
  Tensor e1 = m->Forward(Variable(x)).value(), e2 = m->Forward(Variable(x)).value();
  EXPECT_TRUE(TensorsNear(e1, e2, 0, 0, "eval forward"));
  m->Train();
  std::vector<float> losses = Losses(m.get(), 16, 30);
  EXPECT_LT(losses.back(), losses.front() * 0.8f) << "loss goes down";
  // The masks follow ImportOptions::seed (the job's seed): the same seed
  // drops the same units, another seed others.
  auto masked = [&](uint64_t seed) {
    ImportOptions o = Fmnist(true);
    o.seed = seed;
    auto net = ImportModelFile(TestData("vgg_bn.onnx"), o);
    EXPECT_TRUE(net.ok()) << net.status();
    (*net)->Train();
    return (*net)->Forward(Variable(x)).value();
  };
  Tensor s1 = masked(1), s1_again = masked(1), s2 = masked(2);
  EXPECT_TRUE(TensorsNear(s1, s1_again, 0, 0, "same seed"));
  EXPECT_FALSE(TensorsNear(s2, s1, 1e-3, 1e-3, "other seed"));
  // Hybridize refuses the eager Dropout by name instead of tracing it wrong.
  auto h = graph::HybridizeTrainingStep(m.get(), {4, 1, 28, 28}, 10, {});
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::StrContains(h.status().message(), "onnx_dropout")) << h.status();
}

TEST(OnnxImport, ExportedBuiltinModelsImportWithTheSameNamesAndOutputs) {
  for (const std::string name : {"mlp", "lenet", "resnet18"}) {
    SCOPED_TRACE(name);
    auto ref = nn::MakeModel(name);
    ASSERT_TRUE(ref.ok());
    nn::InitParameters(ref->get(), nn::Init::kKaiming, 11);
    auto bytes = ExportModule(ref->get(), {1, 28, 28}, name);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto m = ImportModel(*bytes, Fmnist(true));
    ASSERT_TRUE(m.ok()) << m.status();
    auto pa = (*ref)->NamedParameters(), pb = (*m)->NamedParameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i].first, pb[i].first);
      EXPECT_TRUE(TensorsNear(pb[i].second.value(), pa[i].second.value(), 0, 0, pa[i].first));
    }
    Tensor x = RandomTensor({3, 1, 28, 28}, 5, 0.0f, 1.0f);
    for (bool train : {false, true}) {
      (*ref)->Train(train);
      (*m)->Train(train);
      autograd::NoGradGuard ng;
      EXPECT_TRUE(TensorsNear((*m)->Forward(Variable(x)).value(),
                              (*ref)->Forward(Variable(x)).value(), 1e-6, 1e-6, "logits"));
    }
  }
}

// Every supported op, in small hand-built models: each imports with the
// model's own input shape, runs on the path it should, and trains.
TEST(OnnxImport, SmallModelsOfEverySupportedOpImportAndTrain) {
  struct Case {
    std::string file;
    Shape input;
    int64_t classes;
    std::vector<std::string> cpu_only;
  };
  std::vector<Case> cases = {
      {"seed_lenet", {1, 8, 8}, 4, {}},
      {"seed_resblock", {1, 8, 8}, 3, {}},
      {"seed_grouped",
       {1, 8, 8},
       3,
       {"Conv (grouped, dilated or asymmetric)", "LeakyRelu", "Sigmoid", "Mul", "Tanh", "Transpose",
        "Concat", "Sub", "Div"}},
      {"seed_mlp_gelu",
       {16},
       5,
       {"Div", "Erf", "Add (broadcasting)", "Mul", "Dropout", "Gemm (transB=0 with C)"}},
  };
  std::set<std::string> ops_seen;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    std::string bytes = ReadFileForTest(TestData(c.file));
    ::onnx::ModelProto proto;
    ASSERT_TRUE(proto.ParseFromString(bytes));
    for (const auto& n : proto.graph().node()) ops_seen.insert(n.op_type());
    ImportOptions o;  // the model's own input shape
    auto m = ImportModel(bytes, o);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->input_shape(), c.input);
    EXPECT_EQ((*m)->output_shape(), Shape{c.classes});
    std::set<std::string> got((*m)->cpu_only_ops().begin(), (*m)->cpu_only_ops().end());
    EXPECT_EQ(got, std::set<std::string>(c.cpu_only.begin(), c.cpu_only.end()));
    Shape in{6};
    for (int64_t d : c.input) in.push_back(d);
    Tensor x = RandomTensor(in, 3, 0.0f, 1.0f);
    Tensor y = Tensor::FromVector(std::vector<int32_t>{0, 1, 2, 0, 1, 2}, {6});
    nn::Sgd sgd((*m)->NamedParameters(), {.lr = 0.1f, .momentum = 0.9f});
    float first = 0, last = 0;
    for (int s = 0; s < 30; ++s) {
      sgd.ZeroGrad();
      Variable loss = autograd::SoftmaxCrossEntropy((*m)->Forward(Variable(x)), y);
      loss.Backward();
      sgd.Step();
      (s == 0 ? first : last) = ops::ScalarValue(loss.value());
    }
    EXPECT_LT(last, first * 0.7f) << "the loss falls";
  }
  std::vector<std::string> supported = SupportedOps();
  EXPECT_EQ(ops_seen, std::set<std::string>(supported.begin(), supported.end()))
      << "the small models cover every supported op";
}

// ---- the CPU-only ops against finite differences ----

TEST(OnnxEagerOps, GradientsMatchFiniteDifferences) {
  Tensor x = RandomTensor({2, 4, 5, 5}, 1);
  Tensor w = RandomTensor({6, 2, 3, 3}, 2);
  Tensor s = RandomTensor({1, 4, 1, 5}, 3, 0.5f, 1.5f);
  // LeakyRelu's kink at 0 defeats finite differences: inputs with |v| >= 0.1.
  Tensor away_from_zero = RandomTensor({2, 4, 5, 5}, 4, 0.1f, 1.0f);
  for (int64_t i = 0; i < away_from_zero.numel(); i += 2) away_from_zero.data<float>()[i] *= -1;
  ConvParams cp;
  cp.stride = {2, 1};
  cp.pads = {1, 0, 2, 1};
  cp.dilation = {1, 2};
  cp.groups = 2;
  struct Case {
    const char* name;
    std::function<Variable(const Variable&)> f;
  };
  std::vector<Case> cases = {
      {"conv", [&](const Variable& v) { return ConvGeneral(v, Variable(w), Variable(), cp); }},
      {"conv_w", [&](const Variable& v) { return ConvGeneral(Variable(x), v, Variable(), cp); }},
      {"mul", [&](const Variable& v) { return Binary(BinaryOp::kMul, v, Variable(s)); }},
      {"div", [&](const Variable& v) { return Binary(BinaryOp::kDiv, v, Variable(s)); }},
      {"sub_b", [&](const Variable& v) { return Binary(BinaryOp::kSub, Variable(x), v); }},
      {"sigmoid", [&](const Variable& v) { return Unary(UnaryOp::kSigmoid, v); }},
      {"tanh", [&](const Variable& v) { return Unary(UnaryOp::kTanh, v); }},
      {"erf", [&](const Variable& v) { return Unary(UnaryOp::kErf, v); }},
      {"leaky", [&](const Variable& v) { return Unary(UnaryOp::kLeakyRelu, v, 0.2f); }},
      {"transpose",
       [&](const Variable& v) {
         return Transpose(v, {0, 2, 3, 1});
       }},
      {"concat",
       [&](const Variable& v) {
         return Concat({v, Unary(UnaryOp::kTanh, v)}, 1);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor in = std::string(c.name) == "conv_w"  ? w
                : std::string(c.name) == "sub_b" ? s
                : std::string(c.name) == "leaky" ? away_from_zero
                                                 : x;
    Variable v(in.Clone(), true);
    Variable y = c.f(v);
    Tensor dy = RandomTensor(y.shape(), 9);
    y.Backward(dy);
    Tensor num = ops::testing::NumericGradient(
        [&](const Tensor& t) {
          autograd::NoGradGuard ng;
          return c.f(Variable(t)).value();
        },
        in, dy, 1e-2);
    EXPECT_TRUE(TensorsNear(v.grad(), num, 2e-2, 2e-3, c.name));
  }
}

// ---- bad files ----

absl::Status ImportStatus(const std::string& bytes, ImportOptions o = Fmnist(true)) {
  auto m = ImportModel(bytes, o);
  return m.ok() ? absl::OkStatus() : m.status();
}

TEST(OnnxErrors, UnsupportedOpNamesNodeOpOpsetAndTheSupportedOps) {
  absl::Status s = ImportStatus(ReadFileForTest(TestData("lstm.onnx")));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "model_file: node \"")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "(op Shape, opset 13) is not supported; supported: "
                                "Add, AveragePool, BatchNormalization"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "LSTM")) << s;
}

TEST(OnnxErrors, TruncatedFileIsRefused) {
  std::string bytes = ReadFileForTest(TestData("lenet.onnx"));
  for (size_t len : {bytes.size() / 2, bytes.size() - 1, size_t{10}}) {
    absl::Status s = ImportStatus(bytes.substr(0, len));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << len;
    EXPECT_TRUE(absl::StartsWith(s.message(), "model_file: ")) << s;
  }
  EXPECT_TRUE(absl::StrContains(ImportStatus(bytes.substr(0, bytes.size() / 2)).message(),
                                "not a valid ONNX model"));
}

TEST(OnnxErrors, CapsAreEnforced) {
  std::string bytes = ReadFileForTest(TestData("lenet.onnx"));
  ImportOptions o = Fmnist(true);
  o.limits.max_file_bytes = 100000;
  absl::Status s = ImportStatus(bytes, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(s.message(), "over the cap of 100000 bytes")) << s;
  o = Fmnist(true);
  o.limits.max_nodes = 5;
  s = ImportStatus(bytes, o);
  EXPECT_TRUE(absl::StrContains(s.message(), "nodes is over the cap of 5")) << s;
  o = Fmnist(true);
  o.limits.max_initializer_bytes = 200000;
  s = ImportStatus(bytes, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "cap of 200000 bytes")) << s;
  o = Fmnist(true);
  o.limits.max_rank = 3;
  s = ImportStatus(bytes, o);
  EXPECT_TRUE(absl::StrContains(s.message(), "rank")) << s;
  o = Fmnist(true);
  o.limits.max_elements_per_sample = 1000;
  s = ImportStatus(bytes, o);
  EXPECT_TRUE(absl::StrContains(s.message(), "elements per sample")) << s;
}

TEST(OnnxErrors, ExternalDataShapesAndClassesAreChecked) {
  ::onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(ReadFileForTest(TestData("lenet.onnx"))));
  ::onnx::ModelProto ext = proto;
  auto* t = ext.mutable_graph()->mutable_initializer(0);
  t->clear_raw_data();
  t->set_data_location(::onnx::TensorProto::EXTERNAL);
  auto* kv = t->add_external_data();
  kv->set_key("location");
  kv->set_value("/etc/passwd");
  absl::Status s = ImportStatus(ext.SerializeAsString());
  EXPECT_TRUE(absl::StrContains(s.message(), "initializer \"0.weight\" uses external data")) << s;

  ImportOptions o = Fmnist(true);
  o.input_shape = {3, 32, 32};
  s = ImportStatus(proto.SerializeAsString(), o);
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "the model's input is [N, 1, 28, 28] but the job's "
                                "input is [3, 32, 32]"))
      << s;
  o = Fmnist(true);
  o.num_classes = 100;
  s = ImportStatus(proto.SerializeAsString(), o);
  EXPECT_TRUE(absl::StrContains(s.message(), "outputs 10 classes; the job's data has 100")) << s;

  ::onnx::ModelProto old = proto;
  old.mutable_opset_import(0)->set_version(9);
  s = ImportStatus(old.SerializeAsString());
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "opset 9 of the default domain is not supported; "
                                "supported: 13-17"))
      << s;

  ::onnx::ModelProto bad_conv = proto;
  auto* attr = bad_conv.mutable_graph()->mutable_node(0)->add_attribute();
  attr->set_name("auto_pad");
  attr->set_type(::onnx::AttributeProto::STRING);
  attr->set_s("SAME_UPPER");
  s = ImportStatus(bad_conv.SerializeAsString());
  EXPECT_TRUE(absl::StrContains(s.message(), "(op Conv, opset 13): auto_pad \"SAME_UPPER\"")) << s;

  ::onnx::ModelProto huge = proto;
  huge.mutable_graph()->mutable_initializer(0)->set_dims(0, int64_t{1} << 40);
  s = ImportStatus(huge.SerializeAsString());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "initializer \"0.weight\"")) << s;
}

// ---- the round trip back into PyTorch ----

void WriteFloats(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
}

// Trains `file`'s model a few steps, exports it, and has PyTorch load the
// exported file (onnx.checker first), copy its initializers into the same
// PyTorch model and compare eval-mode outputs with ours.
void RoundTrip(const std::string& name) {
  std::shared_ptr<OnnxModel> m = Import(name + ".onnx");
  ASSERT_NE(m, nullptr);
  Losses(m.get(), 8, 3);
  auto bytes = m->Export();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string model = dir + "/" + name + "_trained.onnx";
  {
    std::ofstream f(model, std::ios::binary);
    f << *bytes;
  }
  // Our export imports again with the trained values.
  auto again = ImportModel(*bytes, Fmnist(true));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(TensorsNear((*again)->NamedParameters()[0].second.value(),
                          m->NamedParameters()[0].second.value(), 0, 0, "reimported"));
  Tensor x = RandomTensor({5, 1, 28, 28}, 42, 0.0f, 1.0f);
  m->Eval();
  Tensor y;
  {
    autograd::NoGradGuard ng;
    y = m->Forward(Variable(x)).value();
  }
  WriteFloats(dir + "/x.f32", x);
  WriteFloats(dir + "/y.f32", y);
  const std::string script =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                   "/tests/reference/onnx_roundtrip.py");
  const std::string cmd = absl::StrCat("/usr/bin/python3 ", script, " ", name, " ", model, " ", dir,
                                       "/x.f32 ", dir, "/y.f32 > ", dir, "/rt.txt 2>&1");
  int rc = std::system(cmd.c_str());
  std::string out = ReadFileForTest(dir + "/rt.txt");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "checker=ok")) << out;
  EXPECT_TRUE(absl::StrContains(out, "match=1")) << out;
}

TEST(OnnxRoundTrip, TrainedLeNetLoadsInOnnxAndPyTorch) { RoundTrip("lenet"); }
TEST(OnnxRoundTrip, TrainedVggLoadsInOnnxAndPyTorch) { RoundTrip("vgg_bn"); }
TEST(OnnxRoundTrip, GroupedConvNetMatchesPyTorch) { RoundTrip("grouped"); }

}  // namespace
}  // namespace onnx
}  // namespace dtrain
