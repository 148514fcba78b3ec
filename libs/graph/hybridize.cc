#include "libs/graph/hybridize.h"

#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/autograd/functions.h"
#include "libs/autograd/trace.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/graph/autodiff.h"

namespace dtrain {
namespace graph {
namespace {

using autograd::TraceEvent;
using autograd::Variable;

// Records the events of one forward pass into a Graph.
class GraphTracer : public autograd::Tracer {
 public:
  GraphTracer(nn::Module* module, bool training, const Variable& input) : training_(training) {
    for (auto& [name, p] : module->NamedParameters()) params_[p.id()] = {name, p};
    for (auto& [name, t] : module->NamedBuffers()) buffers_[t->raw_data()] = {name, t};
    ids_[input.id()] =
        graph_.AddInput("x", input.shape(), input.value().dtype(), input.value().device());
    keep_.push_back(input);
  }

  void Record(const TraceEvent& e) override {
    if (!status_.ok()) return;
    absl::Status s = RecordOrError(e);
    if (!s.ok()) status_ = s;
  }

  // The graph with `output` as its output, or the first error.
  absl::StatusOr<Graph> Finish(const Variable& output) {
    if (!status_.ok()) return status_;
    auto it = ids_.find(output.id());
    if (it == ids_.end()) {
      return absl::UnimplementedError(
          "trace: the model's output was not computed by traced ops (functions.h)");
    }
    graph_.outputs().push_back(it->second);
    DT_RETURN_IF_ERROR(graph_.Validate());
    return std::move(graph_);
  }

 private:
  struct Param {
    std::string name;
    Variable var;
  };
  struct Buffer {
    std::string name;
    Tensor* tensor;
  };

  // A bound value for `t`: shared in training graphs, copied in inference
  // graphs (snapshots).
  int Bind(ValueKind kind, const std::string& name, const Tensor& t) {
    return graph_.AddTensor(training_ ? kind : ValueKind::kConstant, name,
                            training_ ? t : t.Clone());
  }

  // The value of Variable `v` (-1 when undefined).
  int ValueOf(const Variable* v) {
    if (v == nullptr || !v->defined()) return -1;
    auto it = ids_.find(v->id());
    if (it != ids_.end()) return it->second;
    int id;
    auto p = params_.find(v->id());
    if (p != params_.end()) {
      id = Bind(ValueKind::kParameter, p->second.name, v->value());
    } else {
      // Produced outside the trace: a constant.
      id = graph_.AddTensor(ValueKind::kConstant, absl::StrCat("const.", constants_++),
                            v->value().Clone());
    }
    ids_[v->id()] = id;
    keep_.push_back(*v);
    return id;
  }

  // The value of a tensor argument (batch-norm statistics).
  int ValueOfTensor(const Tensor* t) {
    auto b = buffers_.find(t->raw_data());
    if (b != buffers_.end() && b->second.tensor == t) {
      auto it = tensor_ids_.find(t);
      if (it != tensor_ids_.end()) return it->second;
      int id = Bind(ValueKind::kState, b->second.name, *t);
      tensor_ids_[t] = id;
      return id;
    }
    return graph_.AddTensor(ValueKind::kConstant, absl::StrCat("const.", constants_++), t->Clone());
  }

  absl::Status RecordOrError(const TraceEvent& e) {
    const std::string op = e.op;
    std::vector<int> in;
    for (int i = 0; i < e.num_inputs; ++i) in.push_back(ValueOf(e.inputs[i]));
    Attrs a;
    OpKind kind;
    if (op == "conv2d" || op == "linear") {
      kind = op == "conv2d" ? OpKind::kConv2d : OpKind::kLinear;
      a.stride = e.conv.stride;
      a.padding = e.conv.padding;
      a.relu = e.relu;
    } else if (op == "matmul") {
      kind = OpKind::kMatMul;
    } else if (op == "relu") {
      kind = OpKind::kRelu;
    } else if (op == "add") {
      kind = OpKind::kAdd;
    } else if (op == "avg_pool2d" || op == "max_pool2d") {
      kind = op == "avg_pool2d" ? OpKind::kAvgPool2d : OpKind::kMaxPool2d;
      a.kernel = e.pool.kernel;
      a.stride = e.pool.stride;
      a.padding = e.pool.padding;
    } else if (op == "global_avg_pool") {
      kind = OpKind::kGlobalAvgPool;
    } else if (op == "reshape") {
      kind = OpKind::kReshape;
      a.shape.assign(e.shape.begin(), e.shape.end());
      // A leading dim equal to the input's batch follows the batch (0), so
      // the graph can run at other batch sizes (Flatten).
      const Shape& xs = e.inputs[0]->shape();
      if (!a.shape.empty() && !xs.empty() && a.shape[0] == xs[0] && xs[0] > 0) a.shape[0] = 0;
    } else if (op == "batch_norm") {
      kind = e.training ? OpKind::kBatchNormTrain : OpKind::kBatchNormInference;
      in.push_back(ValueOfTensor(e.tensors[0]));
      in.push_back(ValueOfTensor(e.tensors[1]));
      a.momentum = e.momentum;
      a.eps = e.eps;
    } else if (op == "sum") {
      kind = OpKind::kSum;
    } else {
      return absl::UnimplementedError(absl::StrCat(
          "trace: op ", op, " is not supported inside a hybridized forward",
          op == "softmax_cross_entropy" ? " (the training step adds the loss itself)" : ""));
    }
    DT_ASSIGN_OR_RETURN(std::vector<int> outs, graph_.AddNode(kind, in, a));
    const Value& v = graph_.value(outs[0]);
    const Tensor& actual = e.output->value();
    if (v.shape != actual.shape() || v.dtype != actual.dtype()) {
      return absl::InternalError(absl::StrCat("trace: ", op, " gave ", actual.DebugString(),
                                              " but the IR infers ", DTypeName(v.dtype),
                                              ShapeToString(v.shape)));
    }
    ids_[e.output->id()] = outs[0];
    keep_.push_back(*e.output);
    return absl::OkStatus();
  }

  bool training_;
  Graph graph_;
  absl::Status status_;
  std::unordered_map<const void*, Param> params_;
  std::unordered_map<const void*, Buffer> buffers_;
  std::unordered_map<const void*, int> ids_;  // Variable identity -> value
  std::unordered_map<const Tensor*, int> tensor_ids_;
  // Keeps every traced Variable alive, so that no identity is reused.
  std::vector<Variable> keep_;
  int constants_ = 0;
};

}  // namespace

absl::StatusOr<Graph> TraceModule(nn::Module* module, const Shape& input_shape, bool training) {
  for (int64_t d : input_shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError("trace: input shape " + ShapeToString(input_shape) +
                                        " must have positive dimensions");
    }
  }
  const bool was_training = module->training();
  // Training-mode batch norm updates running statistics: undo the trace's.
  std::vector<std::pair<Tensor*, Tensor>> saved;
  for (auto& [name, t] : module->NamedBuffers()) saved.emplace_back(t, t->Clone());
  module->Train(training);
  Variable x(Tensor::Zeros(input_shape));
  GraphTracer tracer(module, training, x);
  Variable y;
  {
    autograd::NoGradGuard no_grad;
    autograd::TraceScope scope(&tracer);
    y = module->Forward(x);
  }
  module->Train(was_training);
  for (auto& [t, copy] : saved) {
    absl::Status s = t->CopyFrom(copy);
    DT_CHECK(s.ok()) << s.message();
  }
  return tracer.Finish(y);
}

absl::StatusOr<std::unique_ptr<HybridModule>> HybridModule::Create(
    nn::Module* module, const Shape& input_shape, const HybridizeOptions& options) {
  const bool training = options.mode == HybridizeMode::kTrainingStep;
  DT_ASSIGN_OR_RETURN(Graph g, TraceModule(module, input_shape, training));
  std::unique_ptr<HybridModule> h(new HybridModule());
  h->mode_ = options.mode;
  if (training) {
    // relu fusion first: the relu flag's backward reads the fused output, as
    // autograd does for Linear/Conv2d followed by ReLU.
    if (options.optimize.fuse_conv_linear_relu) FuseConvLinearRelu(&g);
    DT_RETURN_IF_ERROR(BuildTrainingStep(&g, options.sgd));
  }
  DT_ASSIGN_OR_RETURN(h->stats_, Optimize(&g, options.optimize));
  DT_ASSIGN_OR_RETURN(h->exe_, Executable::Compile(g, options.executor));
  return h;
}

absl::StatusOr<Tensor> HybridModule::Forward(const Tensor& x) {
  if (mode_ != HybridizeMode::kInference) {
    return absl::FailedPreconditionError("Forward on a training-step plan; use Step");
  }
  DT_RETURN_IF_ERROR(exe_->Run({x}));
  return exe_->output(0);
}

absl::StatusOr<float> HybridModule::Step(const Tensor& x, const Tensor& labels) {
  if (mode_ != HybridizeMode::kTrainingStep) {
    return absl::FailedPreconditionError("Step on an inference plan; use Forward");
  }
  DT_RETURN_IF_ERROR(exe_->Run({x, labels}));
  return ops::ScalarValue(exe_->output(0));
}

const Tensor& HybridModule::logits() const {
  DT_CHECK(mode_ == HybridizeMode::kTrainingStep) << "logits() of an inference plan";
  return exe_->output(1);
}

float TrainStep::Run(const Tensor& x, const Tensor& labels) {
  absl::StatusOr<float> loss = module_->Step(x, labels);
  DT_CHECK(loss.ok()) << "hybridized training step: " << loss.status().message();
  return *loss;
}

absl::StatusOr<std::unique_ptr<TrainStep>> HybridizeTrainingStep(nn::Module* module,
                                                                 const Shape& input_shape,
                                                                 int64_t num_classes,
                                                                 const ops::SgdParams& sgd) {
  HybridizeOptions options;
  options.mode = HybridizeMode::kTrainingStep;
  options.sgd = sgd;
  DT_ASSIGN_OR_RETURN(std::unique_ptr<HybridModule> h,
                      HybridModule::Create(module, input_shape, options));
  const Shape& logits = h->graph().value(h->graph().outputs()[1]).shape;
  if (logits.size() != 2 || logits[1] != num_classes) {
    return absl::InvalidArgumentError(absl::StrCat("hybridize: the model's output is ",
                                                   ShapeToString(logits), ", want [N, ",
                                                   num_classes, "]"));
  }
  return std::make_unique<TrainStep>(std::move(h));
}

}  // namespace graph
}  // namespace dtrain
