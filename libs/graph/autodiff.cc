#include "libs/graph/autodiff.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"

namespace dtrain {
namespace graph {
namespace {

// `shape` with dim 0 marked "the batch of the gradient" (see InferShapes).
std::vector<int64_t> BatchRelative(const Shape& shape) {
  std::vector<int64_t> s(shape.begin(), shape.end());
  if (!s.empty()) s[0] = 0;
  return s;
}

class Differentiator {
 public:
  explicit Differentiator(Graph* g) : g_(*g) {}

  absl::Status Run(int logits, int labels, const ops::SgdParams& sgd);

 private:
  bool Needs(int id) const { return id >= 0 && id < static_cast<int>(needs_.size()) && needs_[id]; }
  int Grad(int id) const { return id >= 0 && id < static_cast<int>(grad_.size()) ? grad_[id] : -1; }
  // Adds `g` to the gradient of `id` (if `id` needs one).
  absl::Status Contribute(int id, int g);
  absl::StatusOr<int> Add1(OpKind op, std::vector<int> inputs, Attrs attrs) {
    DT_ASSIGN_OR_RETURN(std::vector<int> out, g_.AddNode(op, std::move(inputs), std::move(attrs)));
    return out[0];
  }
  absl::Status Backward(const Node& n);

  Graph& g_;
  std::vector<bool> needs_;
  std::vector<int> grad_;
};

absl::Status Differentiator::Contribute(int id, int g) {
  if (!Needs(id) || g < 0) return absl::OkStatus();
  if (grad_.size() < g_.values().size()) grad_.resize(g_.values().size(), -1);
  if (grad_[id] < 0) {
    grad_[id] = g;
    return absl::OkStatus();
  }
  // Fan-out: the sum of all contributions (as autograd's accumulation).
  DT_ASSIGN_OR_RETURN(int sum, Add1(OpKind::kAdd, {grad_[id], g}, {}));
  grad_[id] = sum;
  return absl::OkStatus();
}

absl::Status Differentiator::Backward(const Node& n) {
  const int y = n.outputs.empty() ? -1 : n.outputs[0];
  int gy = Grad(y);
  if (gy < 0) return absl::OkStatus();
  const Attrs& a = n.attrs;
  const char* name = GetOpInfo(n.op).name;
  auto input = [&](size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; };
  switch (n.op) {
    case OpKind::kConv2d:
    case OpKind::kLinear: {
      const int x = input(0), w = input(1), b = input(2);
      if (a.relu) {
        DT_ASSIGN_OR_RETURN(gy, Add1(OpKind::kReluBackward, {y, gy}, {}));
      }
      if (n.op == OpKind::kLinear) {
        uint32_t mask = (Needs(x) ? 1u : 0u) | (Needs(w) ? 2u : 0u) | (Needs(b) ? 4u : 0u);
        if (mask == 0) return absl::OkStatus();
        DT_ASSIGN_OR_RETURN(std::vector<int> d,
                            g_.AddNode(OpKind::kLinearBackward, {x, w, gy}, {}, mask));
        DT_RETURN_IF_ERROR(Contribute(x, d[0]));
        DT_RETURN_IF_ERROR(Contribute(w, d[1]));
        return Contribute(b, d[2]);
      }
      if (Needs(x)) {
        Attrs da;
        da.stride = a.stride;
        da.padding = a.padding;
        da.shape = BatchRelative(g_.value(x).shape);
        DT_ASSIGN_OR_RETURN(int dx, Add1(OpKind::kConv2dBackwardData, {gy, w}, da));
        DT_RETURN_IF_ERROR(Contribute(x, dx));
      }
      if (Needs(w) || Needs(b)) {
        Attrs wa;
        wa.stride = a.stride;
        wa.padding = a.padding;
        const Shape& ws = g_.value(w).shape;
        wa.shape.assign(ws.begin(), ws.end());
        DT_ASSIGN_OR_RETURN(std::vector<int> d, g_.AddNode(OpKind::kConv2dBackwardWeights, {x, gy},
                                                           wa, Needs(b) ? 2u : 0u));
        DT_RETURN_IF_ERROR(Contribute(w, d[0]));
        DT_RETURN_IF_ERROR(Contribute(b, d[1]));
      }
      return absl::OkStatus();
    }
    case OpKind::kMatMul: {
      if (a.transpose_a || a.transpose_b) break;
      const int x = input(0), w = input(1);
      if (Needs(x)) {
        Attrs t;
        t.transpose_b = true;
        DT_ASSIGN_OR_RETURN(int d, Add1(OpKind::kMatMul, {gy, w}, t));
        DT_RETURN_IF_ERROR(Contribute(x, d));
      }
      if (Needs(w)) {
        Attrs t;
        t.transpose_a = true;
        DT_ASSIGN_OR_RETURN(int d, Add1(OpKind::kMatMul, {x, gy}, t));
        DT_RETURN_IF_ERROR(Contribute(w, d));
      }
      return absl::OkStatus();
    }
    case OpKind::kRelu: {
      DT_ASSIGN_OR_RETURN(int d, Add1(OpKind::kReluBackward, {y, gy}, {}));
      return Contribute(input(0), d);
    }
    case OpKind::kAdd:
      DT_RETURN_IF_ERROR(Contribute(input(0), gy));
      return Contribute(input(1), gy);
    case OpKind::kScale: {
      Attrs s;
      s.alpha = a.alpha;
      DT_ASSIGN_OR_RETURN(int d, Add1(OpKind::kScale, {gy}, s));
      return Contribute(input(0), d);
    }
    case OpKind::kAvgPool2d:
    case OpKind::kMaxPool2d: {
      if (!Needs(input(0))) return absl::OkStatus();
      Attrs p;
      p.kernel = a.kernel;
      p.stride = a.stride;
      p.padding = a.padding;
      p.shape = BatchRelative(g_.value(input(0)).shape);
      int d;
      if (n.op == OpKind::kAvgPool2d) {
        DT_ASSIGN_OR_RETURN(d, Add1(OpKind::kAvgPool2dBackward, {gy}, p));
      } else {
        DT_ASSIGN_OR_RETURN(d, Add1(OpKind::kMaxPool2dBackward, {gy, n.outputs[1]}, p));
      }
      return Contribute(input(0), d);
    }
    case OpKind::kGlobalAvgPool: {
      Attrs p;
      p.shape = BatchRelative(g_.value(input(0)).shape);
      DT_ASSIGN_OR_RETURN(int d, Add1(OpKind::kGlobalAvgPoolBackward, {gy}, p));
      return Contribute(input(0), d);
    }
    case OpKind::kReshape: {
      Attrs r;
      r.shape = BatchRelative(g_.value(input(0)).shape);
      DT_ASSIGN_OR_RETURN(int d, Add1(OpKind::kReshape, {gy}, r));
      return Contribute(input(0), d);
    }
    case OpKind::kBatchNormTrain: {
      const int x = input(0), gamma = input(1), beta = input(2);
      uint32_t mask = (Needs(x) ? 1u : 0u) | (Needs(gamma) ? 2u : 0u) | (Needs(beta) ? 4u : 0u);
      if (mask == 0) return absl::OkStatus();
      DT_ASSIGN_OR_RETURN(std::vector<int> d,
                          g_.AddNode(OpKind::kBatchNormBackward,
                                     {x, gy, gamma, n.outputs[1], n.outputs[2]}, {}, mask));
      DT_RETURN_IF_ERROR(Contribute(x, d[0]));
      DT_RETURN_IF_ERROR(Contribute(gamma, d[1]));
      return Contribute(beta, d[2]);
    }
    case OpKind::kBatchNormInference:
      // Autograd records no gradient for batch norm in eval mode.
      return absl::OkStatus();
    default:
      break;
  }
  return absl::UnimplementedError(absl::StrCat("autodiff: no gradient rule for ", name,
                                               n.op == OpKind::kMatMul ? " with transposes" : ""));
}

absl::Status Differentiator::Run(int logits, int labels, const ops::SgdParams& sgd) {
  const int forward_nodes = static_cast<int>(g_.nodes().size());
  needs_.assign(g_.values().size(), false);
  for (size_t i = 0; i < g_.values().size(); ++i) {
    needs_[i] = g_.value(static_cast<int>(i)).kind == ValueKind::kParameter;
  }
  for (const Node& n : g_.nodes()) {
    if (n.op == OpKind::kBatchNormInference) continue;
    bool any = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      // batch_norm_train's running statistics are not differentiated.
      if (n.op == OpKind::kBatchNormTrain && i >= 3) continue;
      any = any || Needs(n.inputs[i]);
    }
    if (!any) continue;
    // Only the first output carries a gradient (saved statistics and
    // indices are not differentiable).
    if (n.outputs[0] >= 0) needs_[n.outputs[0]] = true;
  }
  DT_ASSIGN_OR_RETURN(std::vector<int> sce,
                      g_.AddNode(OpKind::kSoftmaxCrossEntropy, {logits, labels}, {}, 0b11));
  const int loss = sce[0];
  grad_.assign(g_.values().size(), -1);
  DT_RETURN_IF_ERROR(Contribute(logits, sce[1]));
  for (int i = forward_nodes - 1; i >= 0; --i) {
    const Node n = g_.nodes()[i];  // a copy: AddNode grows the node list
    DT_RETURN_IF_ERROR(Backward(n));
  }
  // Updates, in parameter order.
  const int nv = static_cast<int>(g_.values().size());
  for (int v = 0; v < nv; ++v) {
    if (g_.value(v).kind != ValueKind::kParameter || Grad(v) < 0) continue;
    int mom = -1;
    if (sgd.momentum != 0.0f) {
      const Value& p = g_.value(v);
      mom = g_.AddTensor(ValueKind::kState, p.name + ".momentum_buffer",
                         Tensor::Zeros(p.shape, p.dtype, p.device));
    }
    Attrs u;
    u.sgd = sgd;
    DT_RETURN_IF_ERROR(g_.AddNode(OpKind::kSgdUpdate, {v, Grad(v), mom}, u).status());
  }
  g_.outputs() = {loss, logits};
  return absl::OkStatus();
}

}  // namespace

absl::Status BuildTrainingStep(Graph* graph, const ops::SgdParams& sgd) {
  if (graph->inputs().size() != 1 || graph->outputs().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "autodiff: want a forward graph with one input and the logits as output 0, got ",
        graph->inputs().size(), " inputs and ", graph->outputs().size(), " outputs"));
  }
  Graph g = *graph;
  const int logits = g.outputs()[0];
  const Shape shape = g.value(logits).shape;
  const Device device = g.value(logits).device;
  if (shape.size() != 2 || g.value(logits).dtype != DType::kF32) {
    return absl::InvalidArgumentError("autodiff: logits are " + ShapeToString(shape) +
                                      ", want f32 [N, C]");
  }
  if (g.FindValue("labels") >= 0) {
    return absl::InvalidArgumentError("autodiff: the graph already has a value named labels");
  }
  const int labels = g.AddInput("labels", {shape[0]}, DType::kI32, device);
  Differentiator d(&g);
  DT_RETURN_IF_ERROR(d.Run(logits, labels, sgd));
  DT_RETURN_IF_ERROR(g.Validate());
  *graph = std::move(g);
  return absl::OkStatus();
}

}  // namespace graph
}  // namespace dtrain
