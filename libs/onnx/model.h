// ONNX models as dtrain modules: import a user's ModelProto, train it like a
// built-in model, write the trained weights back.
//
//   onnx::ImportOptions o;
//   o.input_shape = {1, 28, 28};   // one sample, the job's input
//   o.num_classes = 10;
//   DT_ASSIGN_OR_RETURN(std::shared_ptr<onnx::OnnxModel> net,
//                       onnx::ImportModelFile("lenet.onnx", o));
//   Variable logits = net->Forward(x);          // x: [N, 1, 28, 28]
//   ... train: nn::Sgd, DataParallelTrainer, graph::HybridizeTrainingStep ...
//   DT_ASSIGN_OR_RETURN(std::string trained, net->Export());   // ONNX bytes
//
// What an import is: the graph's nodes become a list of steps that Forward
// runs with the functions of libs/autograd (Conv -> autograd::Conv2d, Gemm ->
// autograd::Linear, BatchNormalization -> autograd::BatchNorm, ...), so the
// model trains through the same autograd, tracer (hybridize) and kernels as a
// built-in model, on CPU and CUDA. A few ops have no libs/autograd function
// yet (grouped or dilated Conv, broadcasting Add/Sub/Mul/Div, LeakyRelu,
// Sigmoid, Tanh, Erf, Transpose, Concat, Dropout with a ratio > 0): they run
// as CPU-only autograd functions of this library (eager_ops.h), which
// hybridize refuses by name; OnnxModel::cpu_only_ops lists the ones a model
// uses. docs/models.md has the table.
//
// Parameters: every float initializer a node reads as a weight (Conv W and B,
// Gemm B and C, BatchNormalization scale and B, operands of MatMul, Add, Sub,
// Mul, Div, Concat) becomes a parameter named after the initializer, in the
// file's initializer order; BatchNormalization's mean and var become buffers.
// With ImportOptions::from_model they keep the file's values, otherwise they
// are zero-filled for nn::InitParameters to initialize.
//
// Input is untrusted (a file from a user of a shared cluster): everything is
// checked before anything is allocated for the model, with caps on nodes,
// initializer bytes, dims and rank (ImportLimits), external data refused, and
// shapes inferred for the job's input shape. Errors are InvalidArgument
// (ResourceExhausted for a file over the size cap) starting with
// "model_file: " and naming the node, op type and opset, e.g.
//   model_file: node "/lstm/LSTM" (op LSTM, opset 13) is not supported;
//   supported: Add, AveragePool, ...
//
// Thread-safety: an OnnxModel is a Module: one thread at a time.
#ifndef DTRAIN_LIBS_ONNX_MODEL_H_
#define DTRAIN_LIBS_ONNX_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/nn/module.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace onnx {

// Caps on what an untrusted file may ask for. Defaults fit ResNet-50-sized
// classifiers with room to spare.
struct ImportLimits {
  int64_t max_file_bytes = int64_t{512} << 20;  // over: ResourceExhausted
  int64_t max_nodes = 10000;
  int64_t max_initializers = 10000;
  int64_t max_initializer_bytes = int64_t{512} << 20;  // all initializers together
  int max_rank = 6;
  int64_t max_dim = int64_t{1} << 24;  // any one dimension
  // Elements of any one value for one sample (activations included).
  int64_t max_elements_per_sample = int64_t{1} << 28;
};

struct ImportOptions {
  // One sample's shape, batch excluded (the job's input, e.g. {1, 28, 28}).
  // Empty: the model's own graph input, whose non-batch dims must be fixed.
  Shape input_shape;
  // > 0: the model's output must be [N, num_classes].
  int64_t num_classes = 0;
  // true (`init: from_model`): parameters and buffers keep the file's
  // values. false: parameters are zero (initialize with nn::InitParameters),
  // batch-norm statistics mean 0, variance 1.
  bool from_model = true;
  // Dropout's masks in training mode: the n-th Dropout call of a model draws
  // from Philox(seed, n << 32), so a job's masks follow its seed (JobSpec.seed)
  // and two models imported with the same seed drop the same units.
  uint64_t seed = 0;
  ImportLimits limits;
};

class OnnxModel : public nn::Module {
 public:
  ~OnnxModel() override;

  // x: [N, input_shape...]; returns the logits [N, classes] (a trailing
  // Softmax or LogSoftmax of the file is not applied: the training loss and
  // accuracy take logits; Export keeps it in the graph).
  autograd::Variable Forward(const autograd::Variable& x) override;
  std::string Describe() const override;

  // One sample's input and output shapes (batch excluded).
  const Shape& input_shape() const;
  const Shape& output_shape() const;
  // Names of ops this model runs with CPU-only eager functions (empty: the
  // model hybridizes and runs on CUDA like a built-in model).
  const std::vector<std::string>& cpu_only_ops() const;
  // The model's opset (default domain).
  int64_t opset() const;

  // The file's model with every parameter and buffer initializer replaced
  // by the current values (float32, raw_data), serialized. Loads in
  // onnx/onnxruntime and PyTorch as the original did.
  absl::StatusOr<std::string> Export() const;

  struct Impl;

 private:
  friend absl::StatusOr<std::shared_ptr<OnnxModel>> ImportModel(absl::string_view bytes,
                                                                const ImportOptions& options);
  OnnxModel();
  std::unique_ptr<Impl> impl_;
};

// Parses, validates and builds the model. Errors as the file comment says.
absl::StatusOr<std::shared_ptr<OnnxModel>> ImportModel(absl::string_view bytes,
                                                       const ImportOptions& options);
// Reads `path` (size checked against the cap before reading) and imports it.
absl::StatusOr<std::shared_ptr<OnnxModel>> ImportModelFile(const std::string& path,
                                                           const ImportOptions& options);

// The op types ImportModel accepts, sorted ("Add", "AveragePool", ...).
std::vector<std::string> SupportedOps();
// The opsets (default domain) ImportModel accepts.
inline constexpr int64_t kMinOpset = 13;
inline constexpr int64_t kMaxOpset = 17;

}  // namespace onnx
}  // namespace dtrain

#endif  // DTRAIN_LIBS_ONNX_MODEL_H_
