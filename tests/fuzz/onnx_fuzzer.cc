// Fuzz target: the ONNX importer (libs/onnx/model.h) on any bytes, as a user
// of a shared cluster could submit them. The input is the model file; the
// job's input shape is the model's own.
//
// Checks beyond "no crash": every refusal is InvalidArgument or
// ResourceExhausted and starts with "model_file: "; a model that imports has
// a [classes] output, runs forward in eval and training mode on a batch of two
// with the output shape the importer inferred (so shape inference agrees with
// the kernels), runs backward, and its Export imports again with the same
// parameters. Caps are small so every accepted model is cheap to run.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "libs/autograd/functions.h"
#include "libs/onnx/model.h"
#include "libs/ops/ops.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "onnx_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

dtrain::onnx::ImportOptions Options() {
  dtrain::onnx::ImportOptions o;
  o.limits.max_file_bytes = 1 << 20;
  o.limits.max_nodes = 64;
  o.limits.max_initializers = 64;
  o.limits.max_initializer_bytes = 16 << 10;
  o.limits.max_elements_per_sample = 4096;
  o.limits.max_dim = 4096;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dtrain::Shape;
  using dtrain::Tensor;
  using dtrain::autograd::Variable;
  static const bool init = [] {
    dtrain::ops::SetCpuThreads(1);
    return true;
  }();
  (void)init;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto m = dtrain::onnx::ImportModel(bytes, Options());
  if (!m.ok()) {
    Check(m.status().code() == absl::StatusCode::kInvalidArgument ||
              m.status().code() == absl::StatusCode::kResourceExhausted,
          "refusals are InvalidArgument or ResourceExhausted");
    Check(absl::StartsWith(m.status().message(), "model_file: "), "errors start with model_file:");
    return 0;
  }
  auto& model = **m;
  Check(model.output_shape().size() == 1, "the output is [N, classes]");
  Shape in{2};
  for (int64_t d : model.input_shape()) in.push_back(d);
  Tensor x = Tensor::Empty(in);
  dtrain::ops::RandomUniform(&x, -1.0f, 1.0f, 7);
  {
    dtrain::autograd::NoGradGuard no_grad;
    model.Eval();
    Variable y = model.Forward(Variable(x));
    Check(y.shape() == Shape({2, model.output_shape()[0]}), "eval output has the inferred shape");
  }
  model.Train();
  Variable y = model.Forward(Variable(x));
  Check(y.shape() == Shape({2, model.output_shape()[0]}), "train output has the inferred shape");
  if (!model.Parameters().empty()) {
    Variable loss = dtrain::autograd::Sum(y);
    if (loss.requires_grad()) loss.Backward();
  }
  auto exported = model.Export();
  Check(exported.ok(), "export succeeds");
  auto again = dtrain::onnx::ImportModel(*exported, Options());
  Check(again.ok() || again.status().code() == absl::StatusCode::kResourceExhausted,
        "the export imports again");
  if (again.ok()) {
    Check((*again)->NamedParameters().size() == model.NamedParameters().size(),
          "same parameters after export");
  }
  return 0;
}
