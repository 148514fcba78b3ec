#include "libs/graph/passes.h"

#include <cmath>
#include <functional>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/graph/executor.h"

namespace dtrain {
namespace graph {
namespace {

bool IsConstant(const Graph& g, int id) {
  return id >= 0 && g.value(id).kind == ValueKind::kConstant;
}

std::vector<bool> OutputMask(const Graph& g) {
  std::vector<bool> out(g.values().size(), false);
  for (int id : g.outputs()) out[id] = true;
  return out;
}

// The value's only reader is node `node` (and it is not a graph output).
bool SoleUse(const std::vector<std::vector<int>>& consumers, const std::vector<bool>& is_output,
             int value, int node) {
  return !is_output[value] && consumers[value].size() == 1 && consumers[value][0] == node;
}

// A name no value has yet, starting with `prefix`.
std::string FreshName(const Graph& g, const std::string& prefix) {
  std::unordered_set<std::string> names;
  for (const Value& v : g.values()) names.insert(v.name);
  for (int i = 0;; ++i) {
    std::string n = absl::StrCat(prefix, i);
    if (names.count(n) == 0) return n;
  }
}

// The skeleton of the passes that merge a node with the node producing one
// of its inputs: for every node of `op` (the consumer), the producer of its
// input `input` (read by the consumer alone, not a graph output, not merged
// yet) is offered to `merge(graph, consumer, producer)`, which merges the
// two and returns the one left over to remove, or -1 to leave them as they
// are. Removes the left-over nodes; returns how many pairs merged.
int MergeWithProducers(Graph* graph, OpKind op, size_t input,
                       const std::function<int(Graph& g, int consumer, int producer)>& merge) {
  Graph& g = *graph;
  const std::vector<std::vector<int>> consumers = g.Consumers();
  const std::vector<bool> is_output = OutputMask(g);
  const int nn = static_cast<int>(g.nodes().size());
  std::vector<bool> remove(nn, false);
  int merged = 0;
  for (int c = 0; c < nn; ++c) {
    const Node& consumer = g.nodes()[c];
    if (consumer.op != op || remove[c] || consumer.inputs.size() <= input) continue;
    const int v = consumer.inputs[input];
    const int p = v < 0 ? -1 : g.value(v).producer;
    if (p < 0 || remove[p] || !SoleUse(consumers, is_output, v, c)) continue;
    const int left_over = merge(g, c, p);
    if (left_over < 0) continue;
    remove[left_over] = true;
    ++merged;
  }
  if (merged > 0) g.RemoveNodes(remove);
  return merged;
}

// Elementwise ops the fusion pass merges.
bool Fusable(OpKind op) {
  return op == OpKind::kRelu || op == OpKind::kAdd || op == OpKind::kScale ||
         op == OpKind::kReluBackward || op == OpKind::kFusedElementwise;
}

std::vector<ElementwiseInstr> ToProgram(const Node& n) {
  switch (n.op) {
    case OpKind::kRelu:
      return {{ElementwiseOp::kRelu, 0, 0, 0.0f}};
    case OpKind::kAdd:
      return {{ElementwiseOp::kAdd, 0, 1, 0.0f}};
    case OpKind::kScale:
      return {{ElementwiseOp::kScale, 0, 0, n.attrs.alpha}};
    case OpKind::kReluBackward:
      return {{ElementwiseOp::kReluMask, 0, 1, 0.0f}};
    default:
      return n.attrs.program;
  }
}

bool Binary(ElementwiseOp op) {
  return op == ElementwiseOp::kAdd || op == ElementwiseOp::kMul || op == ElementwiseOp::kReluMask;
}

// Merges producer `p` (whose output `v` feeds only `c`) into consumer `c`.
// Returns false (changing nothing) when the result would exceed the limits.
bool MergeInto(const Node& p, int v, Node* c) {
  std::vector<int> inputs;
  auto index_of = [&](int id) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i] == id) return static_cast<int>(i);
    }
    inputs.push_back(id);
    return static_cast<int>(inputs.size()) - 1;
  };
  for (int id : c->inputs) {
    if (id != v) index_of(id);
  }
  for (int id : p.inputs) index_of(id);
  const std::vector<ElementwiseInstr> pp = ToProgram(p), cp = ToProgram(*c);
  if (inputs.size() > static_cast<size_t>(kMaxElementwiseInputs) ||
      pp.size() + cp.size() > static_cast<size_t>(kMaxElementwiseInstrs)) {
    return false;
  }
  const int ni = static_cast<int>(inputs.size());
  const int np = static_cast<int>(p.inputs.size()), nc = static_cast<int>(c->inputs.size());
  std::vector<ElementwiseInstr> prog;
  auto map_p = [&](int o) { return o < np ? index_of(p.inputs[o]) : ni + (o - np); };
  const int p_result = ni + static_cast<int>(pp.size()) - 1;
  auto map_c = [&](int o) {
    if (o < nc) return c->inputs[o] == v ? p_result : index_of(c->inputs[o]);
    return ni + static_cast<int>(pp.size()) + (o - nc);
  };
  for (ElementwiseInstr in : pp) {
    in.a = map_p(in.a);
    if (Binary(in.op)) in.b = map_p(in.b);
    prog.push_back(in);
  }
  for (ElementwiseInstr in : cp) {
    in.a = map_c(in.a);
    if (Binary(in.op)) in.b = map_c(in.b);
    prog.push_back(in);
  }
  c->op = OpKind::kFusedElementwise;
  c->inputs = std::move(inputs);
  c->attrs = Attrs();
  c->attrs.program = std::move(prog);
  return true;
}

}  // namespace

absl::Status InferShapes(Graph* graph, const std::vector<Shape>& input_shapes) {
  if (input_shapes.size() != graph->inputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("shape inference: ", input_shapes.size(),
                                                   " input shapes for ", graph->inputs().size(),
                                                   " graph inputs"));
  }
  Graph g = *graph;
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    for (int64_t d : input_shapes[i]) {
      if (d < 0) {
        return absl::InvalidArgumentError("shape inference: negative dimension in input shape " +
                                          ShapeToString(input_shapes[i]));
      }
    }
    g.value(g.inputs()[i]).shape = input_shapes[i];
  }
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const Node& node = g.nodes()[n];
    absl::StatusOr<std::vector<TensorType>> types = InferOutputTypes(g, node);
    if (!types.ok()) {
      return Annotate(types.status(), absl::StrCat("shape inference: node ", n));
    }
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      if (node.outputs[k] < 0) continue;
      Value& v = g.value(node.outputs[k]);
      v.shape = (*types)[k].shape;
      v.dtype = (*types)[k].dtype;
    }
  }
  *graph = std::move(g);
  return absl::OkStatus();
}

int EliminateDeadCode(Graph* graph) {
  Graph& g = *graph;
  std::vector<bool> needed = OutputMask(g);
  const int nn = static_cast<int>(g.nodes().size());
  std::vector<bool> remove(nn, false);
  int removed = 0;
  for (int i = nn - 1; i >= 0; --i) {
    Node& n = g.nodes()[i];
    const OpInfo& info = GetOpInfo(n.op);
    bool keep = info.mutated_inputs != 0;
    for (int id : n.outputs) keep = keep || (id >= 0 && needed[id]);
    if (!keep) {
      remove[i] = true;
      ++removed;
      continue;
    }
    // Optional outputs nobody reads are not computed.
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k] >= 0 && !needed[n.outputs[k]] && (info.optional_outputs >> k & 1)) {
        n.outputs[k] = -1;
      }
    }
    for (int id : n.inputs) {
      if (id >= 0) needed[id] = true;
    }
  }
  g.RemoveNodes(remove);
  return removed;
}

absl::StatusOr<int> FoldConstants(Graph* graph) {
  Graph& g = *graph;
  const int nn = static_cast<int>(g.nodes().size());
  std::vector<bool> remove(nn, false);
  int folded = 0;
  for (int i = 0; i < nn; ++i) {
    const Node& n = g.nodes()[i];
    const OpInfo& info = GetOpInfo(n.op);
    if (info.mutated_inputs != 0) continue;
    bool all_constant = true;
    for (int id : n.inputs) all_constant = all_constant && (id < 0 || IsConstant(g, id));
    if (!all_constant) continue;
    std::vector<Tensor> results(n.outputs.size());
    if (n.op == OpKind::kReshape) {
      // A view: no computation, no copy.
      results[0] = g.value(n.inputs[0]).data.Reshape(g.value(n.outputs[0]).shape);
    } else {
      // Run the node alone on its constant inputs.
      Graph one;
      std::vector<int> ins;
      for (int id : n.inputs) {
        ins.push_back(
            id < 0 ? -1 : one.AddTensor(ValueKind::kConstant, g.value(id).name, g.value(id).data));
      }
      uint32_t mask = 0;
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (n.outputs[k] >= 0) mask |= 1u << k;
      }
      DT_ASSIGN_OR_RETURN(std::vector<int> outs, one.AddNode(n.op, ins, n.attrs, mask));
      for (int id : outs) {
        if (id >= 0) one.outputs().push_back(id);
      }
      ExecutorOptions opts;
      opts.small_linear_max_batch = 0;
      DT_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, Executable::Compile(one, opts));
      DT_RETURN_IF_ERROR(exe->Run({}));
      int o = 0;
      for (size_t k = 0; k < outs.size(); ++k) {
        if (outs[k] >= 0) results[k] = exe->output(o++).Clone();
      }
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k] < 0) continue;
      Value& v = g.value(n.outputs[k]);
      v.name = FreshName(g, "folded.");
      v.kind = ValueKind::kConstant;
      v.data = results[k];
      v.producer = -1;
    }
    remove[i] = true;
    ++folded;
  }
  if (folded > 0) g.RemoveNodes(remove);
  return folded;
}

int FoldBatchNorm(Graph* graph) {
  return MergeWithProducers(graph, OpKind::kBatchNormInference, 0, [](Graph& g, int j, int p) {
    const Node& bn = g.nodes()[j];
    const Node& conv = g.nodes()[p];
    if (conv.op != OpKind::kConv2d || conv.attrs.relu) return -1;
    const bool has_bias = conv.inputs.size() > 2 && conv.inputs[2] >= 0;
    bool constant = IsConstant(g, conv.inputs[1]) && (!has_bias || IsConstant(g, conv.inputs[2]));
    for (int k = 1; k < 5; ++k) constant = constant && IsConstant(g, bn.inputs[k]);
    if (!constant) return -1;
    const Tensor& w = g.value(conv.inputs[1]).data;
    const int64_t o = w.dim(0), per = w.numel() / o;
    const float* gamma = g.value(bn.inputs[1]).data.data<float>();
    const float* beta = g.value(bn.inputs[2]).data.data<float>();
    const float* mean = g.value(bn.inputs[3]).data.data<float>();
    const float* var = g.value(bn.inputs[4]).data.data<float>();
    const float* b = has_bias ? g.value(conv.inputs[2]).data.data<float>() : nullptr;
    Tensor w2 = Tensor::Empty(w.shape(), w.dtype(), w.device());
    Tensor b2 = Tensor::Empty({o}, w.dtype(), w.device());
    const float* pw = w.data<float>();
    float* pw2 = w2.data<float>();
    float* pb2 = b2.data<float>();
    const double eps = bn.attrs.eps;
    for (int64_t c = 0; c < o; ++c) {
      const double s = gamma[c] / std::sqrt(static_cast<double>(var[c]) + eps);
      for (int64_t i = 0; i < per; ++i) pw2[c * per + i] = static_cast<float>(pw[c * per + i] * s);
      pb2[c] = static_cast<float>(((b != nullptr ? b[c] : 0.0) - mean[c]) * s + beta[c]);
    }
    const std::string base = g.value(conv.inputs[1]).name;
    const int bn_out = bn.outputs[0];
    const int wid = g.AddTensor(ValueKind::kConstant, FreshName(g, base + ".bn_folded."), w2);
    const int bid = g.AddTensor(ValueKind::kConstant, FreshName(g, base + ".bn_folded_bias."), b2);
    Node& c2 = g.nodes()[p];  // AddTensor does not move nodes, but be explicit
    c2.inputs = {c2.inputs[0], wid, bid};
    c2.outputs[0] = bn_out;
    g.value(bn_out).producer = p;
    return j;
  });
}

int FuseConvLinearRelu(Graph* graph) {
  return MergeWithProducers(graph, OpKind::kRelu, 0, [](Graph& g, int r, int p) {
    Node& prod = g.nodes()[p];
    if ((prod.op != OpKind::kConv2d && prod.op != OpKind::kLinear) || prod.attrs.relu) return -1;
    const int relu_out = g.nodes()[r].outputs[0];
    prod.attrs.relu = true;
    prod.outputs[0] = relu_out;
    g.value(relu_out).producer = p;
    return r;
  });
}

int FusePoolReluBackward(Graph* graph) {
  return MergeWithProducers(graph, OpKind::kReluBackward, 1, [](Graph& g, int r, int q) {
    Node& rb = g.nodes()[r];
    const Node& pool = g.nodes()[q];
    if (pool.op != OpKind::kAvgPool2dBackward || rb.inputs[0] == rb.inputs[1]) return -1;
    const int y = rb.inputs[0];
    rb.op = OpKind::kAvgPool2dReluBackward;
    rb.inputs = {pool.inputs[0], y};
    rb.attrs = pool.attrs;
    return q;
  });
}

int FuseConvWeightsGradient(Graph* graph) {
  return MergeWithProducers(graph, OpKind::kConv2dBackwardWeights, 1, [](Graph& g, int i, int q) {
    Node& cw = g.nodes()[i];
    const Node& pool = g.nodes()[q];
    if (pool.op != OpKind::kAvgPool2dReluBackward || pool.attrs.kernel != pool.attrs.stride ||
        pool.attrs.padding != 0) {
      return -1;
    }
    Node fused_node;
    fused_node.op = OpKind::kConv2dBackwardWeightsAvgPoolRelu;
    fused_node.inputs = {cw.inputs[0], pool.inputs[0], pool.inputs[1]};
    fused_node.outputs = cw.outputs;
    fused_node.attrs.stride = cw.attrs.stride;
    fused_node.attrs.padding = cw.attrs.padding;
    fused_node.attrs.kernel = pool.attrs.kernel;
    fused_node.attrs.shape = cw.attrs.shape;
    // The op's own limits (first layers) decide.
    if (!InferOutputTypes(g, fused_node).ok()) return -1;
    cw = std::move(fused_node);
    return q;
  });
}

int FuseElementwise(Graph* graph) {
  Graph& g = *graph;
  int merged = 0;
  for (;;) {
    const std::vector<std::vector<int>> consumers = g.Consumers();
    const std::vector<bool> is_output = OutputMask(g);
    const int nn = static_cast<int>(g.nodes().size());
    int victim = -1;
    for (int c = 0; c < nn && victim < 0; ++c) {
      Node& cn = g.nodes()[c];
      if (!Fusable(cn.op)) continue;
      for (int v : cn.inputs) {
        if (v < 0) continue;
        const int p = g.value(v).producer;
        if (p < 0 || !Fusable(g.nodes()[p].op) || !SoleUse(consumers, is_output, v, c)) continue;
        // Moving p's reads to c's position must not cross an in-place update.
        bool mutable_input = false;
        for (int id : g.nodes()[p].inputs) {
          ValueKind k = g.value(id).kind;
          mutable_input = mutable_input || k == ValueKind::kParameter || k == ValueKind::kState;
        }
        if (mutable_input) continue;
        if (MergeInto(g.nodes()[p], v, &cn)) {
          victim = p;
          break;
        }
      }
    }
    if (victim < 0) break;
    std::vector<bool> remove(nn, false);
    remove[victim] = true;
    g.RemoveNodes(remove);
    ++merged;
  }
  return merged;
}

absl::StatusOr<OptimizeStats> Optimize(Graph* graph, const OptimizeOptions& options) {
  OptimizeStats stats;
  if (options.fold_batch_norm) stats.batch_norms_folded = FoldBatchNorm(graph);
  if (options.fold_constants) {
    DT_ASSIGN_OR_RETURN(stats.constants_folded, FoldConstants(graph));
  }
  if (options.fuse_conv_linear_relu) stats.relus_fused = FuseConvLinearRelu(graph);
  if (options.fuse_pool_relu_backward) {
    stats.pool_relu_backward_fused = FusePoolReluBackward(graph);
  }
  if (options.fuse_conv_weights_gradient) {
    stats.conv_weights_gradient_fused = FuseConvWeightsGradient(graph);
  }
  if (options.fuse_elementwise) stats.elementwise_fused = FuseElementwise(graph);
  stats.dead_nodes_removed = EliminateDeadCode(graph);
  DT_RETURN_IF_ERROR(graph->Validate());
  return stats;
}

}  // namespace graph
}  // namespace dtrain
