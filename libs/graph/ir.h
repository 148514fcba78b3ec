// The graph IR of hybridized models: values (typed tensors) and nodes (ops),
// in execution order.
//
//   Graph g;
//   int x = g.AddInput("x", {1, 512});
//   int w = g.AddTensor(ValueKind::kConstant, "0.weight", weight);
//   int b = g.AddTensor(ValueKind::kConstant, "0.bias", bias);
//   Attrs a;
//   a.relu = true;
//   DT_ASSIGN_OR_RETURN(std::vector<int> y, g.AddNode(OpKind::kLinear, {x, w, b}, a));
//   g.outputs().push_back(y[0]);
//   std::cout << g.ToString();
//
// Values are numbered; a value is a graph input (a placeholder bound when the
// graph runs), a parameter, state (batch-norm running statistics, momentum
// buffers: tensors ops update in place), a constant, or the output of exactly
// one node. Parameters, state and constants carry their tensor (`data`),
// shared with the module they came from (no copy) unless a pass made a new
// one.
//
// Nodes are kept in execution order, which is always a topological order:
// every node reads only graph inputs, bound tensors and outputs of earlier
// nodes. Ops that update a bound tensor in place (batch_norm_train's running
// statistics, sgd_update's parameter and momentum) run where they stand in
// that order, so reads before them see the old value and reads after them
// the new one.
//
// Op semantics are those of libs/ops/ops.h; each op's inputs, outputs and
// attributes are listed with OpKind below. Optional inputs and outputs are
// -1 when absent. InferOutputTypes gives every op's output shapes and checks
// everything the kernels require (it returns errors, never crashes), so a
// graph read from a file can be validated before it runs.
//
// Thread-safety: a Graph is a plain value; use it from one thread at a time.
#ifndef DTRAIN_LIBS_GRAPH_IR_H_
#define DTRAIN_LIBS_GRAPH_IR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/ops/ops.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace graph {

// Ops, with inputs -> outputs and the attributes they use. `?` marks an
// optional input or output (-1 when absent).
enum class OpKind : int32_t {
  // x[N,C,H,W], w[O,C,kh,kw], b?[O] -> y   {stride, padding, relu}
  kConv2d,
  // x[N,K], w[M,K], b?[M] -> y[N,M]   {relu}
  kLinear,
  // a, b -> c   {transpose_a, transpose_b}
  kMatMul,
  // x -> y
  kRelu,
  // a, b -> c (same shapes)
  kAdd,
  // x -> alpha * x   {alpha}
  kScale,
  // x -> y   {kernel, stride, padding}
  kAvgPool2d,
  // x -> y, indices (i32)   {kernel, stride, padding}
  kMaxPool2d,
  // x[N,C,H,W] -> y[N,C,1,1]
  kGlobalAvgPool,
  // x -> y, a view with dims `shape` (0 copies the input's dim 0, -1 is
  // inferred)   {shape}
  kReshape,
  // x, gamma, beta, running_mean, running_var -> y, saved_mean, saved_inv_std;
  // updates running_mean and running_var (inputs 3, 4) in place
  // {momentum, eps}
  kBatchNormTrain,
  // x, gamma, beta, running_mean, running_var -> y   {eps}
  kBatchNormInference,
  // logits[N,C], labels (i32 [N]) -> loss (f32 []), dlogits?
  kSoftmaxCrossEntropy,
  // x -> y (f32 [])
  kSum,
  // dy, w -> dx   {stride, padding, shape: dx's shape}
  kConv2dBackwardData,
  // x, dy -> dw, db?   {stride, padding, shape: dw's shape}
  kConv2dBackwardWeights,
  // x, w, dy -> dx?, dw?, db?
  kLinearBackward,
  // y, dy -> dx (dy where y > 0)
  kReluBackward,
  // dy -> dx   {kernel, stride, padding, shape: dx's shape}
  kAvgPool2dBackward,
  // dy, indices -> dx   {kernel, stride, padding, shape: dx's shape}
  kMaxPool2dBackward,
  // dy[N,C,1,1] -> dx   {shape: dx's shape}
  kGlobalAvgPoolBackward,
  // x, dy, gamma, saved_mean, saved_inv_std -> dx?, dgamma?, dbeta?
  kBatchNormBackward,
  // param, grad, momentum? -> (nothing); updates param and momentum (inputs
  // 0, 2) in place   {sgd}
  kSgdUpdate,
  // x0, x1, ... (same shapes) -> y: `program` evaluated per element
  kFusedElementwise,
  // avg_pool2d_backward followed by relu_backward in one pass:
  // dy_pooled, y -> dx = y > 0 ? avg_pool2d_backward(dy_pooled) : 0
  // {kernel, stride, padding, shape: dx's shape}
  kAvgPool2dReluBackward,
  // conv2d_backward_weights whose dy is avg_pool2d_relu_backward(dy_pooled,
  // y), never stored: x, dy_pooled, y -> dw, db?   {stride, padding (the
  // convolution's), kernel (the pooling window, tiled: stride = kernel, no
  // padding), shape: dw's shape}. For first layers only: stride 1,
  // C * kh * kw <= kFusedWeightsMaxTaps, C * (H + 2p) * (W + 2p) <=
  // kFusedWeightsMaxInput.
  kConv2dBackwardWeightsAvgPoolRelu,
};
inline constexpr int kNumOpKinds = static_cast<int>(OpKind::kConv2dBackwardWeightsAvgPoolRelu) + 1;
inline constexpr int64_t kFusedWeightsMaxTaps = 32;
inline constexpr int64_t kFusedWeightsMaxInput = 16384;

// Instructions of a fused elementwise program. Operands name the node's
// inputs (0 .. num_inputs-1) or earlier instructions' results
// (num_inputs + instruction index). The node's output is the last result.
enum class ElementwiseOp : int32_t {
  kAdd = 0,       // a + b
  kMul = 1,       // a * b
  kRelu = 2,      // max(a, 0) (NaN stays NaN)
  kReluMask = 3,  // a > 0 ? b : 0 (relu_backward with a = y, b = dy)
  kScale = 4,     // imm * a
};
struct ElementwiseInstr {
  ElementwiseOp op = ElementwiseOp::kAdd;
  int a = 0;
  int b = 0;  // unused by unary ops
  float imm = 0.0f;
  bool operator==(const ElementwiseInstr& o) const {
    return op == o.op && a == o.a && b == o.b && imm == o.imm;
  }
};
// Most instructions / inputs a fused elementwise node may have.
inline constexpr int kMaxElementwiseInstrs = 16;
inline constexpr int kMaxElementwiseInputs = 6;

// Attributes of a node; each op reads the ones listed with its OpKind.
struct Attrs {
  int kernel = 0;   // pooling window
  int stride = 1;   // convolution / pooling
  int padding = 0;  // convolution / pooling
  bool relu = false;
  bool transpose_a = false;
  bool transpose_b = false;
  float alpha = 1.0f;
  float momentum = 0.0f;
  float eps = 0.0f;
  ops::SgdParams sgd;
  std::vector<int64_t> shape;
  std::vector<ElementwiseInstr> program;

  ops::Conv2dParams conv() const { return {stride, padding}; }
  ops::Pool2dParams pool() const { return {kernel, stride, padding}; }
};

enum class ValueKind : int32_t {
  kInput = 0,         // placeholder, bound per run
  kParameter = 1,     // trainable tensor (sgd_update writes it)
  kState = 2,         // mutable non-trainable tensor (running stats, momentum)
  kConstant = 3,      // immutable tensor
  kIntermediate = 4,  // produced by a node
};
const char* ValueKindName(ValueKind kind);

struct TensorType {
  Shape shape;
  DType dtype = DType::kF32;
  bool operator==(const TensorType& o) const { return shape == o.shape && dtype == o.dtype; }
};

struct Value {
  ValueKind kind = ValueKind::kIntermediate;
  // Parameters, state, constants and inputs: a unique name ("0.weight",
  // "x"); intermediates: empty.
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  Device device = Device::Cpu();
  // Parameters, state and constants: the tensor (shape, dtype and device as
  // above).
  Tensor data;
  // Intermediates: index of the producing node.
  int producer = -1;

  bool bound() const {
    return kind == ValueKind::kParameter || kind == ValueKind::kState ||
           kind == ValueKind::kConstant;
  }
  TensorType type() const { return {shape, dtype}; }
};

struct Node {
  OpKind op = OpKind::kRelu;
  std::vector<int> inputs;   // value ids, -1 for an absent optional input
  std::vector<int> outputs;  // value ids, -1 for an absent optional output
  Attrs attrs;
};

// Static facts about an op.
struct OpInfo {
  const char* name;  // "conv2d", as in ops.h and the serialized form
  int min_inputs;    // required inputs come first
  int max_inputs;    // -1: any number (fused elementwise)
  int num_outputs;
  uint32_t optional_inputs;   // bit i: input i may be -1
  uint32_t optional_outputs;  // bit i: output i may be -1
  uint32_t mutated_inputs;    // bit i: the op updates input i in place
  // The output has the shape of input 0 and may be written over an input
  // whose last use this is (element i depends only on inputs' element i).
  bool elementwise;
};
const OpInfo& GetOpInfo(OpKind op);
// The op named `name`, or InvalidArgument.
absl::StatusOr<OpKind> OpKindFromName(absl::string_view name);

class Graph {
 public:
  // Adds a graph input (placeholder) and returns its id.
  int AddInput(const std::string& name, const Shape& shape, DType dtype = DType::kF32,
               const Device& device = Device::Cpu());
  // Adds a parameter, state or constant bound to `data` (shared, not copied).
  // REQUIRES: kind is kParameter, kState or kConstant; data is defined.
  int AddTensor(ValueKind kind, const std::string& name, const Tensor& data);
  // Appends a node, creating its outputs with the types InferOutputTypes
  // gives. `outputs_mask` selects the optional outputs to create (bit i for
  // output i; required outputs are always created). Returns the output ids
  // (-1 for those not created), or the error InferOutputTypes found (the
  // graph is then unchanged).
  absl::StatusOr<std::vector<int>> AddNode(OpKind op, std::vector<int> inputs, Attrs attrs,
                                           uint32_t outputs_mask = ~0u);

  std::vector<Value>& values() { return values_; }
  const std::vector<Value>& values() const { return values_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Value& value(int id) const { return values_[id]; }
  Value& value(int id) { return values_[id]; }
  // Graph inputs in the order a run binds them.
  std::vector<int>& inputs() { return inputs_; }
  const std::vector<int>& inputs() const { return inputs_; }
  // Values a run returns, in order.
  std::vector<int>& outputs() { return outputs_; }
  const std::vector<int>& outputs() const { return outputs_; }

  // The id of the value named `name`, or -1.
  int FindValue(absl::string_view name) const;
  // For each value, the indices of the nodes that read it, in order.
  std::vector<std::vector<int>> Consumers() const;

  // Removes the nodes whose index is set in `remove` (size nodes().size()),
  // then every value that no node, input or output refers to, and
  // renumbers values and nodes (keeping their order).
  void RemoveNodes(const std::vector<bool>& remove);

  // Checks the invariants above: ids in range, each intermediate produced
  // once and before its uses, operand counts, mutated inputs bound to
  // parameters or state, types equal to what InferOutputTypes gives, unique
  // names. Returns the first problem found (kInvalidArgument).
  absl::Status Validate() const;

  // One line per input, bound tensor and node, for debugging and tests:
  //   %3 = linear(%0, %1, %2) {relu} : f32[1, 256]
  std::string ToString() const;

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<int> inputs_;
  std::vector<int> outputs_;
};

// The types of `node`'s outputs given the graph's value types (absent
// optional outputs get an empty TensorType), or kInvalidArgument naming the
// op and saying what does not fit: wrong operand count, rank, dtype, shape
// or attribute. Accepting a node means the kernels' preconditions hold for
// it.
absl::StatusOr<std::vector<TensorType>> InferOutputTypes(const Graph& graph, const Node& node);

}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_IR_H_
