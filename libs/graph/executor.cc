#include "libs/graph/executor.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/graph/kernels.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"

namespace dtrain {
namespace graph {

// One node's call: the kernel, its operands (node inputs padded to the op's
// max_inputs, then outputs; null where absent) and attributes, all resolved
// at compile time.
struct Executable::Step {
  void (*run)(const Step&) = nullptr;
  void* fn = nullptr;
  Tensor* t[8] = {};
  ops::Conv2dParams conv;
  ops::Pool2dParams pool;
  bool relu = false, ta = false, tb = false;
  float alpha = 1.0f, momentum = 0.0f, eps = 0.0f;
  ops::SgdParams sgd;
  const ElementwiseInstr* program = nullptr;
  int num_instrs = 0;
  int num_inputs = 0;
  const kernels::PackedLinear* packed = nullptr;
  float* scratch = nullptr;
  Shape shape;
  int node = -1;
};

namespace {

using Step = Executable::Step;

template <typename Fn>
Fn* K(const Step& s) {
  return reinterpret_cast<Fn*>(s.fn);
}

void RunConv2d(const Step& s) {
  K<ops::Conv2dFn>(s)(*s.t[0], *s.t[1], s.t[2], s.conv, s.relu, s.t[3]);
}
void RunLinear(const Step& s) { K<ops::LinearFn>(s)(*s.t[0], *s.t[1], s.t[2], s.relu, s.t[3]); }
void RunSmallLinear(const Step& s) { s.packed->Run(*s.t[0], s.relu, s.t[3]); }
void RunMatMul(const Step& s) { K<ops::MatMulFn>(s)(*s.t[0], *s.t[1], s.ta, s.tb, s.t[2]); }
void RunRelu(const Step& s) { K<ops::ReluFn>(s)(*s.t[0], s.t[1]); }
void RunAdd(const Step& s) { K<ops::AddFn>(s)(*s.t[0], *s.t[1], s.t[2]); }
void RunScale(const Step& s) { K<ops::ScaleFn>(s)(*s.t[0], s.alpha, s.t[1]); }
void RunAvgPool2d(const Step& s) { K<ops::AvgPool2dFn>(s)(*s.t[0], s.pool, s.t[1]); }
void RunMaxPool2d(const Step& s) { K<ops::MaxPool2dFn>(s)(*s.t[0], s.pool, s.t[1], s.t[2]); }
void RunGlobalAvgPool(const Step& s) { K<ops::GlobalAvgPoolFn>(s)(*s.t[0], s.t[1]); }
void RunView(const Step& s) { *s.t[1] = s.t[0]->Reshape(s.shape); }
void RunBatchNormTrain(const Step& s) {
  K<ops::BatchNormTrainFn>(s)(*s.t[0], *s.t[1], *s.t[2], s.momentum, s.eps, s.t[3], s.t[4], s.t[5],
                              s.t[6], s.t[7]);
}
void RunBatchNormInference(const Step& s) {
  K<ops::BatchNormInferenceFn>(s)(*s.t[0], *s.t[1], *s.t[2], *s.t[3], *s.t[4], s.eps, s.t[5]);
}
void RunSoftmaxCrossEntropy(const Step& s) {
  K<ops::SoftmaxCrossEntropyFn>(s)(*s.t[0], *s.t[1], s.t[2], s.t[3]);
}
void RunSum(const Step& s) { K<ops::SumFn>(s)(*s.t[0], s.t[1]); }
void RunConv2dBackwardData(const Step& s) {
  K<ops::Conv2dBackwardDataFn>(s)(*s.t[0], *s.t[1], s.conv, s.t[2]);
}
void RunConv2dBackwardWeights(const Step& s) {
  K<ops::Conv2dBackwardWeightsFn>(s)(*s.t[0], *s.t[1], s.conv, s.t[2], s.t[3]);
}
void RunLinearBackward(const Step& s) {
  K<ops::LinearBackwardFn>(s)(*s.t[0], *s.t[1], *s.t[2], s.t[3], s.t[4], s.t[5]);
}
void RunReluBackward(const Step& s) { K<ops::ReluBackwardFn>(s)(*s.t[0], *s.t[1], s.t[2]); }
void RunAvgPool2dBackward(const Step& s) {
  K<ops::AvgPool2dBackwardFn>(s)(*s.t[0], s.pool, s.t[1]);
}
void RunMaxPool2dBackward(const Step& s) {
  K<ops::MaxPool2dBackwardFn>(s)(*s.t[0], *s.t[1], s.pool, s.t[2]);
}
void RunGlobalAvgPoolBackward(const Step& s) {
  K<ops::GlobalAvgPoolBackwardFn>(s)(*s.t[0], s.t[1]);
}
void RunBatchNormBackward(const Step& s) {
  K<ops::BatchNormBackwardFn>(s)(*s.t[0], *s.t[1], *s.t[2], *s.t[3], *s.t[4], s.t[5], s.t[6],
                                 s.t[7]);
}
void RunSgdUpdate(const Step& s) { K<ops::SgdUpdateFn>(s)(s.t[0], *s.t[1], s.t[2], s.sgd); }
void RunFusedElementwise(const Step& s) {
  const float* in[kMaxElementwiseInputs];
  for (int i = 0; i < s.num_inputs; ++i) in[i] = s.t[i]->data<float>();
  Tensor* y = s.t[kMaxElementwiseInputs];
  kernels::FusedElementwise(s.program, s.num_instrs, in, s.num_inputs, y->data<float>(),
                            y->numel());
}
void RunSmallConv2d(const Step& s) {
  kernels::SmallConv2d(*s.t[0], *s.t[1], s.t[2], s.conv, s.relu, s.t[3]);
}
void RunSmallConv2dBackwardWeights(const Step& s) {
  kernels::SmallConv2dBackwardWeights(*s.t[0], *s.t[1], s.conv, s.t[2], s.t[3], s.scratch);
}
void RunConvWeightsPoolRelu(const Step& s) {
  kernels::ConvWeightsPoolRelu(*s.t[0], *s.t[1], *s.t[2], s.conv, s.pool.kernel, s.t[3], s.t[4],
                               s.scratch);
}
void RunAvgPool2dReluBackward(const Step& s) {
  kernels::AvgPool2dReluBackward(*s.t[0], *s.t[1], s.pool, s.t[2]);
}

// The runner of each op that calls a registered kernel (null: handled
// specially).
using RunFn = void (*)(const Step&);
RunFn RegistryRunner(OpKind op) {
  switch (op) {
    case OpKind::kConv2d:
      return &RunConv2d;
    case OpKind::kLinear:
      return &RunLinear;
    case OpKind::kMatMul:
      return &RunMatMul;
    case OpKind::kRelu:
      return &RunRelu;
    case OpKind::kAdd:
      return &RunAdd;
    case OpKind::kScale:
      return &RunScale;
    case OpKind::kAvgPool2d:
      return &RunAvgPool2d;
    case OpKind::kMaxPool2d:
      return &RunMaxPool2d;
    case OpKind::kGlobalAvgPool:
      return &RunGlobalAvgPool;
    case OpKind::kBatchNormTrain:
      return &RunBatchNormTrain;
    case OpKind::kBatchNormInference:
      return &RunBatchNormInference;
    case OpKind::kSoftmaxCrossEntropy:
      return &RunSoftmaxCrossEntropy;
    case OpKind::kSum:
      return &RunSum;
    case OpKind::kConv2dBackwardData:
      return &RunConv2dBackwardData;
    case OpKind::kConv2dBackwardWeights:
      return &RunConv2dBackwardWeights;
    case OpKind::kLinearBackward:
      return &RunLinearBackward;
    case OpKind::kReluBackward:
      return &RunReluBackward;
    case OpKind::kAvgPool2dBackward:
      return &RunAvgPool2dBackward;
    case OpKind::kMaxPool2dBackward:
      return &RunMaxPool2dBackward;
    case OpKind::kGlobalAvgPoolBackward:
      return &RunGlobalAvgPoolBackward;
    case OpKind::kBatchNormBackward:
      return &RunBatchNormBackward;
    case OpKind::kSgdUpdate:
      return &RunSgdUpdate;
    case OpKind::kReshape:
    case OpKind::kFusedElementwise:
    case OpKind::kAvgPool2dReluBackward:
    case OpKind::kConv2dBackwardWeightsAvgPoolRelu:
      return nullptr;
  }
  return nullptr;
}

}  // namespace

Executable::~Executable() = default;

absl::StatusOr<std::unique_ptr<Executable>> Executable::Compile(const Graph& graph,
                                                                const ExecutorOptions& options) {
  DT_RETURN_IF_ERROR(graph.Validate());
  std::unique_ptr<Executable> exe(new Executable());
  exe->graph_ = graph;
  DT_RETURN_IF_ERROR(exe->Build(options));
  return exe;
}

absl::Status Executable::Build(const ExecutorOptions& options) {
  const Graph& g = graph_;
  const int nv = static_cast<int>(g.values().size());
  DT_ASSIGN_OR_RETURN(plan_, PlanMemory(g, options.planner));

  // One device for the whole graph.
  Device device = Device::Cpu();
  bool have_device = false;
  for (const Value& v : g.values()) {
    if (!have_device) {
      device = v.device;
      have_device = true;
    } else if (!(v.device == device)) {
      return absl::UnimplementedError(absl::StrCat(
          "executor: graph spans devices ", device.ToString(), " and ", v.device.ToString()));
    }
  }

  // Arenas and slot views.
  arenas_.assign(kNumDTypes, Tensor());
  for (int d = 0; d < kNumDTypes; ++d) {
    const int64_t bytes = plan_.arena_bytes[d];
    if (bytes == 0) continue;
    const DType dtype = static_cast<DType>(d);
    const int64_t elems = bytes / static_cast<int64_t>(DTypeSize(dtype));
    DT_ASSIGN_OR_RETURN(arenas_[d], Tensor::TryEmpty({elems}, dtype, device));
  }
  slots_.assign(nv, Tensor());
  for (int v = 0; v < nv; ++v) {
    const Value& val = g.value(v);
    if (val.bound()) {
      slots_[v] = val.data;
      continue;
    }
    const int b = plan_.value_buffer[v];
    if (b < 0) continue;  // input, absent, or a view of an input (bound per run)
    const PlannedBuffer& buf = plan_.buffers[b];
    const int64_t esize = static_cast<int64_t>(DTypeSize(val.dtype));
    const int64_t first = buf.offset / esize;
    slots_[v] = arenas_[static_cast<int>(val.dtype)]
                    .Slice(first, first + NumElements(val.shape))
                    .Reshape(val.shape);
  }
  // Views of bound tensors are fixed now.
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::kReshape) continue;
    const int root = plan_.view_of[n.outputs[0]];
    if (root >= 0 && g.value(root).bound()) {
      slots_[n.outputs[0]] = slots_[root].Reshape(g.value(n.outputs[0]).shape);
    }
  }

  // Steps.
  steps_.clear();
  steps_.reserve(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const OpInfo& info = GetOpInfo(n.op);
    Step s;
    s.node = static_cast<int>(i);
    const int max_in = info.max_inputs;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      s.t[k] = n.inputs[k] >= 0 ? &slots_[n.inputs[k]] : nullptr;
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      s.t[max_in + k] = n.outputs[k] >= 0 ? &slots_[n.outputs[k]] : nullptr;
    }
    const Attrs& a = n.attrs;
    s.conv = a.conv();
    s.pool = a.pool();
    s.relu = a.relu;
    s.ta = a.transpose_a;
    s.tb = a.transpose_b;
    s.alpha = a.alpha;
    s.momentum = a.momentum;
    s.eps = a.eps;
    s.sgd = a.sgd;
    switch (n.op) {
      case OpKind::kReshape: {
        const int root = plan_.view_of[n.outputs[0]];
        if (root >= 0 && g.value(root).kind == ValueKind::kInput) {
          // A view of a graph input: the input's storage changes per run.
          s.run = &RunView;
          s.shape = g.value(n.outputs[0]).shape;
          steps_.push_back(s);
        }
        continue;
      }
      case OpKind::kConv2dBackwardWeightsAvgPoolRelu: {
        if (!device.is_cpu()) {
          return absl::UnimplementedError(
              absl::StrCat("executor: ", info.name, " has no kernel for ", device.ToString()));
        }
        const Shape& x = g.value(n.inputs[0]).shape;
        const Shape& w = g.value(n.outputs[0]).shape;
        s.run = &RunConvWeightsPoolRelu;
        DT_ASSIGN_OR_RETURN(
            Tensor scratch,
            Tensor::TryEmpty({kernels::SmallConvBackwardWeightsScratch(x, w)}, DType::kF32));
        s.scratch = scratch.data<float>();
        scratch_.push_back(scratch);
        steps_.push_back(s);
        continue;
      }
      case OpKind::kFusedElementwise:
      case OpKind::kAvgPool2dReluBackward:
        if (!device.is_cpu()) {
          return absl::UnimplementedError(
              absl::StrCat("executor: ", info.name, " has no kernel for ", device.ToString()));
        }
        if (n.op == OpKind::kFusedElementwise) {
          s.run = &RunFusedElementwise;
          s.program = a.program.data();
          s.num_instrs = static_cast<int>(a.program.size());
          s.num_inputs = static_cast<int>(n.inputs.size());
        } else {
          s.run = &RunAvgPool2dReluBackward;
        }
        steps_.push_back(s);
        continue;
      default:
        break;
    }
    if (n.op == OpKind::kLinear && device.is_cpu() && options.small_linear_max_batch > 0 &&
        g.value(n.inputs[1]).kind == ValueKind::kConstant &&
        (n.inputs.size() < 3 || n.inputs[2] < 0 ||
         g.value(n.inputs[2]).kind == ValueKind::kConstant) &&
        g.value(n.inputs[0]).shape[0] <= options.small_linear_max_batch) {
      const Tensor* bias = n.inputs.size() > 2 && n.inputs[2] >= 0 ? &slots_[n.inputs[2]] : nullptr;
      std::unique_ptr<kernels::PackedLinear> packed =
          kernels::PackedLinear::Create(slots_[n.inputs[1]], bias);
      if (packed != nullptr) {
        s.run = &RunSmallLinear;
        s.packed = packed.get();
        packed_.push_back(std::move(packed));
        ++num_small_linear_;
        steps_.push_back(s);
        continue;
      }
    }
    if (device.is_cpu() && options.small_conv &&
        (n.op == OpKind::kConv2d || n.op == OpKind::kConv2dBackwardWeights)) {
      const Shape& x = g.value(n.inputs[0]).shape;
      const Shape& w =
          n.op == OpKind::kConv2d ? g.value(n.inputs[1]).shape : g.value(n.outputs[0]).shape;
      if (kernels::SmallConvSupported(x, w, s.conv)) {
        if (n.op == OpKind::kConv2d) {
          s.run = &RunSmallConv2d;
        } else {
          s.run = &RunSmallConv2dBackwardWeights;
          DT_ASSIGN_OR_RETURN(
              Tensor scratch,
              Tensor::TryEmpty({kernels::SmallConvBackwardWeightsScratch(x, w)}, DType::kF32));
          s.scratch = scratch.data<float>();
          scratch_.push_back(scratch);
        }
        ++num_small_conv_;
        steps_.push_back(s);
        continue;
      }
    }
    s.run = RegistryRunner(n.op);
    s.fn = ops::KernelRegistry::Global().Find(info.name, device.type);
    if (s.run == nullptr || s.fn == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("executor: no ", info.name, " kernel for ", device.ToString()));
    }
    steps_.push_back(s);
  }
  return absl::OkStatus();
}

absl::Status Executable::Bind(absl::Span<const Tensor> inputs) {
  const std::vector<int>& ids = graph_.inputs();
  if (inputs.size() != ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor: ", inputs.size(), " inputs for a graph of ", ids.size()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const Value& v = graph_.value(ids[i]);
    const Tensor& t = inputs[i];
    if (!t.defined() || t.shape() != v.shape || t.dtype() != v.dtype || !(t.device() == v.device)) {
      return absl::InvalidArgumentError(
          absl::StrCat("executor: input ", i, " (", v.name, ") is ",
                       t.defined() ? t.DebugString() : std::string("undefined"), ", want ",
                       DTypeName(v.dtype), ShapeToString(v.shape), " ", v.device.ToString()));
    }
    slots_[ids[i]] = t;
  }
  return absl::OkStatus();
}

absl::Status Executable::Run(absl::Span<const Tensor> inputs) {
  DT_RETURN_IF_ERROR(Bind(inputs));
  for (const Step& s : steps_) s.run(s);
  return absl::OkStatus();
}

void Executable::SetLearningRate(float lr) {
  for (Step& s : steps_) {
    if (s.run != &RunSgdUpdate) continue;
    s.sgd.lr = lr;
    graph_.nodes()[s.node].attrs.sgd.lr = lr;
  }
}

absl::StatusOr<std::vector<NodeProfile>> Executable::Profile(absl::Span<const Tensor> inputs,
                                                             int iterations) {
  DT_RETURN_IF_ERROR(Bind(inputs));
  std::vector<NodeProfile> out(steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    const Node& n = graph_.nodes()[s.node];
    out[i].op = GetOpInfo(n.op).name;
    if (s.run == &RunSmallLinear) out[i].op += "(small)";
    if (s.run == &RunView) out[i].op += "(view)";
    if (s.run == &RunSmallConv2d || s.run == &RunSmallConv2dBackwardWeights) {
      out[i].op += "(small)";
    }
    for (int id : n.outputs) {
      if (id >= 0) {
        out[i].shape = ShapeToString(graph_.value(id).shape);
        break;
      }
    }
  }
  using Clock = std::chrono::steady_clock;
  for (int it = 0; it < iterations; ++it) {
    for (size_t i = 0; i < steps_.size(); ++i) {
      auto t0 = Clock::now();
      steps_[i].run(steps_[i]);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      out[i].total_ms += ms;
      out[i].min_ms = it == 0 ? ms : std::min(out[i].min_ms, ms);
    }
  }
  return out;
}

}  // namespace graph
}  // namespace dtrain
