#include "libs/graph/ir.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"

namespace dtrain {
namespace graph {
namespace {

// Largest dimension / element count the IR accepts (kernels index with
// int64 and convolution geometry uses int).
constexpr int64_t kMaxDim = int64_t{1} << 31;
constexpr int64_t kMaxElements = int64_t{1} << 40;

// name, min_inputs, max_inputs, num_outputs, optional_inputs,
// optional_outputs, mutated_inputs, elementwise
const OpInfo kOpInfos[kNumOpKinds] = {
    {"conv2d", 2, 3, 1, 0b100, 0, 0, false},
    {"linear", 2, 3, 1, 0b100, 0, 0, false},
    {"matmul", 2, 2, 1, 0, 0, 0, false},
    {"relu", 1, 1, 1, 0, 0, 0, true},
    {"add", 2, 2, 1, 0, 0, 0, true},
    {"scale", 1, 1, 1, 0, 0, 0, true},
    {"avg_pool2d", 1, 1, 1, 0, 0, 0, false},
    {"max_pool2d", 1, 1, 2, 0, 0, 0, false},
    {"global_avg_pool", 1, 1, 1, 0, 0, 0, false},
    {"reshape", 1, 1, 1, 0, 0, 0, false},
    {"batch_norm_train", 5, 5, 3, 0, 0, 0b11000, false},
    {"batch_norm_inference", 5, 5, 1, 0, 0, 0, false},
    {"softmax_cross_entropy", 2, 2, 2, 0, 0b10, 0, false},
    {"sum", 1, 1, 1, 0, 0, 0, false},
    {"conv2d_backward_data", 2, 2, 1, 0, 0, 0, false},
    {"conv2d_backward_weights", 2, 2, 2, 0, 0b10, 0, false},
    {"linear_backward", 3, 3, 3, 0, 0b111, 0, false},
    {"relu_backward", 2, 2, 1, 0, 0, 0, true},
    {"avg_pool2d_backward", 1, 1, 1, 0, 0, 0, false},
    {"max_pool2d_backward", 2, 2, 1, 0, 0, 0, false},
    {"global_avg_pool_backward", 1, 1, 1, 0, 0, 0, false},
    {"batch_norm_backward", 5, 5, 3, 0, 0b111, 0, false},
    {"sgd_update", 2, 3, 0, 0b100, 0, 0b101, false},
    {"fused_elementwise", 1, kMaxElementwiseInputs, 1, 0, 0, 0, true},
    {"avg_pool2d_relu_backward", 2, 2, 1, 0, 0, 0, false},
    {"conv2d_backward_weights_avg_pool_relu", 3, 3, 2, 0, 0b10, 0, false},
};

std::string TypeString(const TensorType& t) {
  return absl::StrCat(DTypeName(t.dtype), ShapeToString(t.shape));
}

// Error helper: "<op>: <message>".
absl::Status Bad(OpKind op, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(GetOpInfo(op).name, ": ", message));
}

bool ValidShape(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0 || d > kMaxDim) return false;
    if (d > 0 && n > kMaxElements / d) return false;
    n *= d;
  }
  return true;
}

// Output size of a window along one axis, or -1 if the geometry is invalid
// or empty.
int64_t WindowOut(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  if (kernel < 1 || stride < 1 || padding < 0) return -1;
  int64_t span = in + 2 * padding - kernel;
  if (span < 0) return -1;
  return span / stride + 1;
}

class Inferrer {
 public:
  Inferrer(const Graph& g, const Node& n) : g_(g), n_(n), op_(n.op) {}

  absl::StatusOr<std::vector<TensorType>> Run();

 private:
  // Type of input i (REQUIRES: present).
  const TensorType& In(int i) { return types_[i]; }
  bool Has(int i) const { return i < static_cast<int>(n_.inputs.size()) && n_.inputs[i] >= 0; }
  absl::Status Rank(int i, const char* what, std::initializer_list<int> ranks) {
    int r = static_cast<int>(In(i).shape.size());
    for (int want : ranks) {
      if (r == want) return absl::OkStatus();
    }
    return Bad(op_, absl::StrCat(what, " has rank ", r, " (", TypeString(In(i)), "), want ",
                                 absl::StrJoin(ranks, " or ")));
  }
  absl::Status F32(int i, const char* what) {
    if (In(i).dtype != DType::kF32) {
      return Bad(op_, absl::StrCat(what, " is ", TypeString(In(i)), ", want f32"));
    }
    return absl::OkStatus();
  }
  absl::Status Same(int i, const char* a, int j, const char* b) {
    if (In(i).shape != In(j).shape) {
      return Bad(op_, absl::StrCat(a, " ", TypeString(In(i)), " and ", b, " ", TypeString(In(j)),
                                   " differ in shape"));
    }
    return absl::OkStatus();
  }
  absl::Status ShapeIs(int i, const char* what, const Shape& want) {
    if (In(i).shape != want) {
      return Bad(op_,
                 absl::StrCat(what, " is ", TypeString(In(i)), ", want ", ShapeToString(want)));
    }
    return absl::OkStatus();
  }
  // The `shape` attribute with dim 0 taken from `batch` when it is 0.
  absl::StatusOr<Shape> AttrShape(int64_t batch) {
    const std::vector<int64_t>& a = n_.attrs.shape;
    if (a.empty() || a.size() > 8) {
      return Bad(op_, absl::StrCat("shape attribute has rank ", a.size(), ", want 1 to 8"));
    }
    Shape s(a.begin(), a.end());
    if (s[0] == 0) s[0] = batch;
    if (!ValidShape(s)) return Bad(op_, "invalid shape attribute " + ShapeToString(s));
    return s;
  }
  absl::Status Pool(int64_t* ho, int64_t* wo, const Shape& x) {
    const Attrs& a = n_.attrs;
    if (a.kernel < 1 || a.stride < 1 || a.padding < 0 || 2 * a.padding > a.kernel) {
      return Bad(op_,
                 absl::StrCat("kernel ", a.kernel, ", stride ", a.stride, ", padding ", a.padding,
                              " (need kernel, stride >= 1, 0 <= padding <= "
                              "kernel / 2)"));
    }
    *ho = WindowOut(x[2], a.kernel, a.stride, a.padding);
    *wo = WindowOut(x[3], a.kernel, a.stride, a.padding);
    if (*ho <= 0 || *wo <= 0) {
      return Bad(op_, "window does not fit input " + ShapeToString(x));
    }
    return absl::OkStatus();
  }
  absl::Status Conv(const Shape& x, const Shape& w, Shape* y) {
    const Attrs& a = n_.attrs;
    if (x.size() != 4 || w.size() != 4 || x[1] != w[1]) {
      return Bad(op_, absl::StrCat("x ", ShapeToString(x), ", w ", ShapeToString(w),
                                   " (want x [N,C,H,W] and w [O,C,kh,kw])"));
    }
    if (a.stride < 1 || a.padding < 0) {
      return Bad(op_, absl::StrCat("stride ", a.stride, ", padding ", a.padding));
    }
    int64_t ho = WindowOut(x[2], w[2], a.stride, a.padding);
    int64_t wo = WindowOut(x[3], w[3], a.stride, a.padding);
    if (ho <= 0 || wo <= 0 || w[2] < 1 || w[3] < 1) {
      return Bad(op_, absl::StrCat("x ", ShapeToString(x), ", w ", ShapeToString(w), ", stride ",
                                   a.stride, ", padding ", a.padding, " give an empty output"));
    }
    *y = {x[0], w[0], ho, wo};
    return absl::OkStatus();
  }

  const Graph& g_;
  const Node& n_;
  OpKind op_;
  std::vector<TensorType> types_;
};

absl::StatusOr<std::vector<TensorType>> Inferrer::Run() {
  if (static_cast<int>(op_) < 0 || static_cast<int>(op_) >= kNumOpKinds) {
    return absl::InvalidArgumentError(absl::StrCat("unknown op code ", static_cast<int>(op_)));
  }
  const OpInfo& info = GetOpInfo(op_);
  const int num_in = static_cast<int>(n_.inputs.size());
  if (num_in < info.min_inputs || (info.max_inputs >= 0 && num_in > info.max_inputs)) {
    return Bad(op_,
               absl::StrCat(num_in, " inputs, want ", info.min_inputs, " to ", info.max_inputs));
  }
  types_.resize(num_in);
  for (int i = 0; i < num_in; ++i) {
    int id = n_.inputs[i];
    if (id == -1 && (info.optional_inputs >> i & 1)) continue;
    if (id < 0 || id >= static_cast<int>(g_.values().size())) {
      return Bad(op_,
                 absl::StrCat("input ", i, " refers to value ", id, " of ", g_.values().size()));
    }
    types_[i] = g_.value(id).type();
  }
  const Attrs& a = n_.attrs;
  std::vector<TensorType> out(info.num_outputs);
  auto f32 = [](Shape s) { return TensorType{std::move(s), DType::kF32}; };
  switch (op_) {
    case OpKind::kConv2d: {
      DT_RETURN_IF_ERROR(F32(0, "x"));
      DT_RETURN_IF_ERROR(F32(1, "w"));
      Shape y;
      DT_RETURN_IF_ERROR(Conv(In(0).shape, In(1).shape, &y));
      if (Has(2)) {
        DT_RETURN_IF_ERROR(F32(2, "b"));
        DT_RETURN_IF_ERROR(ShapeIs(2, "b", {In(1).shape[0]}));
      }
      out[0] = f32(y);
      break;
    }
    case OpKind::kLinear: {
      DT_RETURN_IF_ERROR(F32(0, "x"));
      DT_RETURN_IF_ERROR(F32(1, "w"));
      DT_RETURN_IF_ERROR(Rank(0, "x", {2}));
      DT_RETURN_IF_ERROR(Rank(1, "w", {2}));
      const Shape &x = In(0).shape, &w = In(1).shape;
      if (x[1] != w[1] || x[1] == 0) {
        return Bad(op_, absl::StrCat("x ", ShapeToString(x), ", w ", ShapeToString(w),
                                     " (want x [N,K] and w [M,K], K > 0)"));
      }
      if (Has(2)) {
        DT_RETURN_IF_ERROR(F32(2, "b"));
        DT_RETURN_IF_ERROR(ShapeIs(2, "b", {w[0]}));
      }
      out[0] = f32({x[0], w[0]});
      break;
    }
    case OpKind::kMatMul: {
      DT_RETURN_IF_ERROR(F32(0, "a"));
      DT_RETURN_IF_ERROR(F32(1, "b"));
      DT_RETURN_IF_ERROR(Rank(0, "a", {2}));
      DT_RETURN_IF_ERROR(Rank(1, "b", {2}));
      const Shape &sa = In(0).shape, &sb = In(1).shape;
      int64_t m = a.transpose_a ? sa[1] : sa[0], k = a.transpose_a ? sa[0] : sa[1];
      int64_t kb = a.transpose_b ? sb[1] : sb[0], n = a.transpose_b ? sb[0] : sb[1];
      if (k != kb) return Bad(op_, absl::StrCat("inner sizes ", k, " and ", kb));
      out[0] = f32({m, n});
      break;
    }
    case OpKind::kRelu:
    case OpKind::kScale:
      DT_RETURN_IF_ERROR(F32(0, "x"));
      out[0] = In(0);
      break;
    case OpKind::kAdd:
    case OpKind::kReluBackward:
      DT_RETURN_IF_ERROR(F32(0, "input 0"));
      DT_RETURN_IF_ERROR(F32(1, "input 1"));
      DT_RETURN_IF_ERROR(Same(0, "input 0", 1, "input 1"));
      out[0] = In(0);
      break;
    case OpKind::kAvgPool2d:
    case OpKind::kMaxPool2d: {
      DT_RETURN_IF_ERROR(F32(0, "x"));
      DT_RETURN_IF_ERROR(Rank(0, "x", {4}));
      int64_t ho, wo;
      const Shape& x = In(0).shape;
      DT_RETURN_IF_ERROR(Pool(&ho, &wo, x));
      out[0] = f32({x[0], x[1], ho, wo});
      if (op_ == OpKind::kMaxPool2d) out[1] = {out[0].shape, DType::kI32};
      break;
    }
    case OpKind::kGlobalAvgPool: {
      DT_RETURN_IF_ERROR(F32(0, "x"));
      DT_RETURN_IF_ERROR(Rank(0, "x", {4}));
      const Shape& x = In(0).shape;
      out[0] = f32({x[0], x[1], 1, 1});
      break;
    }
    case OpKind::kReshape: {
      const Shape& x = In(0).shape;
      const std::vector<int64_t>& want = a.shape;
      if (want.size() > 8) return Bad(op_, "target rank above 8");
      Shape s;
      int infer = -1;
      int64_t known = 1;
      for (size_t i = 0; i < want.size(); ++i) {
        int64_t d = want[i];
        if (d == 0 && i == 0 && !x.empty()) d = x[0];
        if (d == -1) {
          if (infer >= 0) return Bad(op_, "more than one -1 in the target shape");
          infer = static_cast<int>(i);
          s.push_back(1);
          continue;
        }
        if (d < 0 || d > kMaxDim) return Bad(op_, absl::StrCat("invalid target dim ", d));
        s.push_back(d);
        if (d > 0 && known > kMaxElements / d) return Bad(op_, "target shape too large");
        known *= d;
      }
      int64_t total = NumElements(x);
      if (infer >= 0) {
        if (known == 0 || total % known != 0) {
          return Bad(op_, absl::StrCat("cannot reshape ", ShapeToString(x), " to ",
                                       ShapeToString(Shape(want.begin(), want.end()))));
        }
        s[infer] = total / known;
      }
      if (NumElements(s) != total) {
        return Bad(op_,
                   absl::StrCat("cannot reshape ", ShapeToString(x), " to ", ShapeToString(s)));
      }
      out[0] = {s, In(0).dtype};
      break;
    }
    case OpKind::kBatchNormTrain:
    case OpKind::kBatchNormInference: {
      DT_RETURN_IF_ERROR(Rank(0, "x", {4, 2}));
      const char* names[5] = {"x", "gamma", "beta", "running_mean", "running_var"};
      for (int i = 0; i < 5; ++i) DT_RETURN_IF_ERROR(F32(i, names[i]));
      const Shape& x = In(0).shape;
      for (int i = 1; i < 5; ++i) DT_RETURN_IF_ERROR(ShapeIs(i, names[i], {x[1]}));
      if (!(a.eps >= 0.0f)) return Bad(op_, absl::StrCat("eps ", a.eps));
      out[0] = In(0);
      if (op_ == OpKind::kBatchNormTrain) {
        if (x[1] > 0 && NumElements(x) / x[1] < 2) {
          return Bad(op_, "x " + ShapeToString(x) + " has one value per channel");
        }
        out[1] = f32({x[1]});
        out[2] = f32({x[1]});
      }
      break;
    }
    case OpKind::kSoftmaxCrossEntropy: {
      DT_RETURN_IF_ERROR(F32(0, "logits"));
      DT_RETURN_IF_ERROR(Rank(0, "logits", {2}));
      DT_RETURN_IF_ERROR(Rank(1, "labels", {1}));
      if (In(1).dtype != DType::kI32 || In(1).shape[0] != In(0).shape[0]) {
        return Bad(op_, absl::StrCat("labels ", TypeString(In(1)), " for logits ",
                                     TypeString(In(0)), " (want i32 [N])"));
      }
      // out[0] is already f32 [] (a scalar).
      out[1] = In(0);
      break;
    }
    case OpKind::kSum:
      DT_RETURN_IF_ERROR(F32(0, "x"));
      // out[0] is already f32 [] (a scalar).
      break;
    case OpKind::kConv2dBackwardData: {
      DT_RETURN_IF_ERROR(F32(0, "dy"));
      DT_RETURN_IF_ERROR(F32(1, "w"));
      DT_RETURN_IF_ERROR(Rank(0, "dy", {4}));
      DT_ASSIGN_OR_RETURN(Shape dx, AttrShape(In(0).shape[0]));
      Shape y;
      DT_RETURN_IF_ERROR(Conv(dx, In(1).shape, &y));
      DT_RETURN_IF_ERROR(ShapeIs(0, "dy", y));
      out[0] = f32(dx);
      break;
    }
    case OpKind::kConv2dBackwardWeights: {
      DT_RETURN_IF_ERROR(F32(0, "x"));
      DT_RETURN_IF_ERROR(F32(1, "dy"));
      DT_ASSIGN_OR_RETURN(Shape dw, AttrShape(0));
      if (dw[0] == 0) return Bad(op_, "weights shape with 0 filters");
      Shape y;
      DT_RETURN_IF_ERROR(Conv(In(0).shape, dw, &y));
      DT_RETURN_IF_ERROR(ShapeIs(1, "dy", y));
      out[0] = f32(dw);
      out[1] = f32({dw[0]});
      break;
    }
    case OpKind::kConv2dBackwardWeightsAvgPoolRelu: {
      DT_RETURN_IF_ERROR(F32(0, "x"));
      DT_RETURN_IF_ERROR(F32(1, "dy_pooled"));
      DT_RETURN_IF_ERROR(F32(2, "y"));
      DT_ASSIGN_OR_RETURN(Shape dw, AttrShape(0));
      if (dw[0] == 0) return Bad(op_, "weights shape with 0 filters");
      Shape y;
      DT_RETURN_IF_ERROR(Conv(In(0).shape, dw, &y));
      DT_RETURN_IF_ERROR(ShapeIs(2, "y", y));
      const Shape& x = In(0).shape;
      if (a.stride != 1 || dw[1] * dw[2] * dw[3] > kFusedWeightsMaxTaps ||
          x[1] * (x[2] + 2 * a.padding) * (x[3] + 2 * a.padding) > kFusedWeightsMaxInput) {
        return Bad(op_, "only for stride-1 convolutions of few input channels");
      }
      if (a.kernel < 1 || y[2] / a.kernel < 1 || y[3] / a.kernel < 1) {
        return Bad(op_, absl::StrCat("pooling window ", a.kernel, " for ", ShapeToString(y)));
      }
      DT_RETURN_IF_ERROR(ShapeIs(1, "dy_pooled", {y[0], y[1], y[2] / a.kernel, y[3] / a.kernel}));
      out[0] = f32(dw);
      out[1] = f32({dw[0]});
      break;
    }
    case OpKind::kLinearBackward: {
      DT_RETURN_IF_ERROR(F32(0, "x"));
      DT_RETURN_IF_ERROR(F32(1, "w"));
      DT_RETURN_IF_ERROR(F32(2, "dy"));
      DT_RETURN_IF_ERROR(Rank(0, "x", {2}));
      DT_RETURN_IF_ERROR(Rank(1, "w", {2}));
      const Shape &x = In(0).shape, &w = In(1).shape;
      if (x[1] != w[1]) {
        return Bad(op_, absl::StrCat("x ", ShapeToString(x), ", w ", ShapeToString(w)));
      }
      DT_RETURN_IF_ERROR(ShapeIs(2, "dy", {x[0], w[0]}));
      out[0] = In(0);
      out[1] = In(1);
      out[2] = f32({w[0]});
      break;
    }
    case OpKind::kAvgPool2dBackward:
    case OpKind::kMaxPool2dBackward:
    case OpKind::kAvgPool2dReluBackward: {
      DT_RETURN_IF_ERROR(F32(0, "dy"));
      DT_RETURN_IF_ERROR(Rank(0, "dy", {4}));
      DT_ASSIGN_OR_RETURN(Shape dx, AttrShape(In(0).shape[0]));
      if (dx.size() != 4) return Bad(op_, "dx shape " + ShapeToString(dx) + " is not 4-D");
      int64_t ho, wo;
      DT_RETURN_IF_ERROR(Pool(&ho, &wo, dx));
      DT_RETURN_IF_ERROR(ShapeIs(0, "dy", {dx[0], dx[1], ho, wo}));
      if (op_ == OpKind::kMaxPool2dBackward) {
        if (In(1).dtype != DType::kI32 || In(1).shape != In(0).shape) {
          return Bad(op_, "indices " + TypeString(In(1)) + " for dy " + TypeString(In(0)));
        }
      }
      if (op_ == OpKind::kAvgPool2dReluBackward) {
        DT_RETURN_IF_ERROR(F32(1, "y"));
        DT_RETURN_IF_ERROR(ShapeIs(1, "y", dx));
      }
      out[0] = f32(dx);
      break;
    }
    case OpKind::kGlobalAvgPoolBackward: {
      DT_RETURN_IF_ERROR(F32(0, "dy"));
      DT_ASSIGN_OR_RETURN(Shape dx, AttrShape(In(0).shape.empty() ? 0 : In(0).shape[0]));
      if (dx.size() != 4) return Bad(op_, "dx shape " + ShapeToString(dx) + " is not 4-D");
      DT_RETURN_IF_ERROR(ShapeIs(0, "dy", {dx[0], dx[1], 1, 1}));
      out[0] = f32(dx);
      break;
    }
    case OpKind::kBatchNormBackward: {
      DT_RETURN_IF_ERROR(Rank(0, "x", {4, 2}));
      const char* names[5] = {"x", "dy", "gamma", "saved_mean", "saved_inv_std"};
      for (int i = 0; i < 5; ++i) DT_RETURN_IF_ERROR(F32(i, names[i]));
      DT_RETURN_IF_ERROR(Same(0, "x", 1, "dy"));
      const Shape& x = In(0).shape;
      for (int i = 2; i < 5; ++i) DT_RETURN_IF_ERROR(ShapeIs(i, names[i], {x[1]}));
      out[0] = In(0);
      out[1] = f32({x[1]});
      out[2] = f32({x[1]});
      break;
    }
    case OpKind::kSgdUpdate: {
      DT_RETURN_IF_ERROR(F32(0, "param"));
      DT_RETURN_IF_ERROR(F32(1, "grad"));
      DT_RETURN_IF_ERROR(Same(0, "param", 1, "grad"));
      const ops::SgdParams& p = a.sgd;
      if (!(p.lr >= 0.0f) || !(p.momentum >= 0.0f) || !(p.weight_decay >= 0.0f) ||
          (p.nesterov && p.momentum <= 0.0f)) {
        return Bad(op_, absl::StrCat("invalid sgd parameters lr=", p.lr, " momentum=", p.momentum,
                                     " weight_decay=", p.weight_decay, " nesterov=", p.nesterov));
      }
      if (p.momentum != 0.0f) {
        if (!Has(2)) return Bad(op_, "momentum without a momentum buffer");
        DT_RETURN_IF_ERROR(F32(2, "momentum"));
        DT_RETURN_IF_ERROR(Same(0, "param", 2, "momentum"));
      }
      break;
    }
    case OpKind::kFusedElementwise: {
      for (int i = 0; i < num_in; ++i) {
        DT_RETURN_IF_ERROR(F32(i, "input"));
        DT_RETURN_IF_ERROR(Same(0, "input 0", i, "input"));
      }
      const std::vector<ElementwiseInstr>& prog = a.program;
      if (prog.empty() || prog.size() > static_cast<size_t>(kMaxElementwiseInstrs)) {
        return Bad(op_, absl::StrCat("program of ", prog.size(), " instructions, want 1 to ",
                                     kMaxElementwiseInstrs));
      }
      for (size_t k = 0; k < prog.size(); ++k) {
        const ElementwiseInstr& in = prog[k];
        int avail = num_in + static_cast<int>(k);
        bool binary = in.op == ElementwiseOp::kAdd || in.op == ElementwiseOp::kMul ||
                      in.op == ElementwiseOp::kReluMask;
        bool known = binary || in.op == ElementwiseOp::kRelu || in.op == ElementwiseOp::kScale;
        if (!known || in.a < 0 || in.a >= avail || (binary && (in.b < 0 || in.b >= avail))) {
          return Bad(op_, absl::StrCat("invalid instruction ", k));
        }
      }
      out[0] = In(0);
      break;
    }
  }
  for (const TensorType& t : out) {
    if (!ValidShape(t.shape)) return Bad(op_, "output shape " + ShapeToString(t.shape));
  }
  return out;
}

}  // namespace

const char* ValueKindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::kInput:
      return "input";
    case ValueKind::kParameter:
      return "parameter";
    case ValueKind::kState:
      return "state";
    case ValueKind::kConstant:
      return "constant";
    case ValueKind::kIntermediate:
      return "intermediate";
  }
  return "?";
}

const OpInfo& GetOpInfo(OpKind op) {
  int i = static_cast<int>(op);
  DT_CHECK(i >= 0 && i < kNumOpKinds) << "unknown op code " << i;
  return kOpInfos[i];
}

absl::StatusOr<OpKind> OpKindFromName(absl::string_view name) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    if (name == kOpInfos[i].name) return static_cast<OpKind>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown op '", name, "'"));
}

absl::StatusOr<std::vector<TensorType>> InferOutputTypes(const Graph& graph, const Node& node) {
  return Inferrer(graph, node).Run();
}

int Graph::AddInput(const std::string& name, const Shape& shape, DType dtype,
                    const Device& device) {
  Value v;
  v.kind = ValueKind::kInput;
  v.name = name;
  v.shape = shape;
  v.dtype = dtype;
  v.device = device;
  values_.push_back(std::move(v));
  inputs_.push_back(static_cast<int>(values_.size()) - 1);
  return inputs_.back();
}

int Graph::AddTensor(ValueKind kind, const std::string& name, const Tensor& data) {
  DT_CHECK(kind == ValueKind::kParameter || kind == ValueKind::kState ||
           kind == ValueKind::kConstant)
      << "AddTensor with kind " << ValueKindName(kind);
  DT_CHECK(data.defined()) << "AddTensor(" << name << ") with an undefined tensor";
  Value v;
  v.kind = kind;
  v.name = name;
  v.shape = data.shape();
  v.dtype = data.dtype();
  v.device = data.device();
  v.data = data;
  values_.push_back(std::move(v));
  return static_cast<int>(values_.size()) - 1;
}

absl::StatusOr<std::vector<int>> Graph::AddNode(OpKind op, std::vector<int> inputs, Attrs attrs,
                                                uint32_t outputs_mask) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  DT_ASSIGN_OR_RETURN(std::vector<TensorType> types, InferOutputTypes(*this, n));
  const OpInfo& info = GetOpInfo(op);
  Device device = Device::Cpu();
  for (int id : n.inputs) {
    if (id >= 0) {
      device = values_[id].device;
      break;
    }
  }
  int node_index = static_cast<int>(nodes_.size());
  for (int i = 0; i < info.num_outputs; ++i) {
    bool optional = info.optional_outputs >> i & 1;
    if (optional && !(outputs_mask >> i & 1)) {
      n.outputs.push_back(-1);
      continue;
    }
    Value v;
    v.kind = ValueKind::kIntermediate;
    v.shape = types[i].shape;
    v.dtype = types[i].dtype;
    v.device = device;
    v.producer = node_index;
    values_.push_back(std::move(v));
    n.outputs.push_back(static_cast<int>(values_.size()) - 1);
  }
  std::vector<int> outs = n.outputs;
  nodes_.push_back(std::move(n));
  return outs;
}

int Graph::FindValue(absl::string_view name) const {
  if (name.empty()) return -1;
  for (size_t i = 0; i < values_.size(); ++i) {
    if (values_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<std::vector<int>> Graph::Consumers() const {
  std::vector<std::vector<int>> out(values_.size());
  for (size_t n = 0; n < nodes_.size(); ++n) {
    for (int id : nodes_[n].inputs) {
      if (id >= 0 && (out[id].empty() || out[id].back() != static_cast<int>(n))) {
        out[id].push_back(static_cast<int>(n));
      }
    }
  }
  return out;
}

void Graph::RemoveNodes(const std::vector<bool>& remove) {
  DT_CHECK(remove.size() == nodes_.size()) << "RemoveNodes: mask size";
  std::vector<Node> kept;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!remove[i]) kept.push_back(std::move(nodes_[i]));
  }
  nodes_ = std::move(kept);
  // Values still referred to.
  std::vector<bool> used(values_.size(), false);
  for (int id : inputs_) used[id] = true;
  for (int id : outputs_) used[id] = true;
  for (const Node& n : nodes_) {
    for (int id : n.inputs) {
      if (id >= 0) used[id] = true;
    }
    for (int id : n.outputs) {
      if (id >= 0) used[id] = true;
    }
  }
  std::vector<int> remap(values_.size(), -1);
  std::vector<Value> vals;
  for (size_t i = 0; i < values_.size(); ++i) {
    if (!used[i]) continue;
    remap[i] = static_cast<int>(vals.size());
    vals.push_back(std::move(values_[i]));
  }
  values_ = std::move(vals);
  auto fix = [&](std::vector<int>& ids) {
    for (int& id : ids) {
      if (id >= 0) id = remap[id];
    }
  };
  fix(inputs_);
  fix(outputs_);
  for (size_t n = 0; n < nodes_.size(); ++n) {
    fix(nodes_[n].inputs);
    fix(nodes_[n].outputs);
    for (int id : nodes_[n].outputs) {
      if (id >= 0) values_[id].producer = static_cast<int>(n);
    }
  }
}

absl::Status Graph::Validate() const {
  const int nv = static_cast<int>(values_.size());
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError("graph: " + m); };
  std::unordered_set<std::string> names;
  for (int i = 0; i < nv; ++i) {
    const Value& v = values_[i];
    if (static_cast<int>(v.kind) < 0 || static_cast<int>(v.kind) > 4) {
      return bad(absl::StrCat("value %", i, " has an unknown kind"));
    }
    if (!v.name.empty() && !names.insert(v.name).second) {
      return bad("duplicate value name '" + v.name + "'");
    }
    if (!ValidShape(v.shape)) return bad(absl::StrCat("value %", i, " has an invalid shape"));
    if (v.bound()) {
      if (!v.data.defined() || v.data.shape() != v.shape || v.data.dtype() != v.dtype ||
          !(v.data.device() == v.device)) {
        return bad(
            absl::StrCat("value %", i, " (", v.name, ") is not bound to a tensor of its type"));
      }
    }
  }
  std::vector<bool> is_input(nv, false);
  for (int id : inputs_) {
    if (id < 0 || id >= nv || values_[id].kind != ValueKind::kInput) {
      return bad(absl::StrCat("graph input %", id, " is not an input value"));
    }
    is_input[id] = true;
  }
  for (int i = 0; i < nv; ++i) {
    if (values_[i].kind == ValueKind::kInput && !is_input[i]) {
      return bad(absl::StrCat("input value %", i, " is not a graph input"));
    }
  }
  std::vector<bool> defined(nv, false);
  for (int i = 0; i < nv; ++i) defined[i] = values_[i].kind != ValueKind::kIntermediate;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    if (static_cast<int>(node.op) < 0 || static_cast<int>(node.op) >= kNumOpKinds) {
      return bad(absl::StrCat("node ", n, " has an unknown op"));
    }
    const OpInfo& info = GetOpInfo(node.op);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int id = node.inputs[i];
      if (id == -1) continue;
      if (id < 0 || id >= nv) return bad(absl::StrCat("node ", n, " reads value %", id));
      if (!defined[id]) {
        return bad(
            absl::StrCat("node ", n, " (", info.name, ") reads %", id, " before it is produced"));
      }
      if (info.mutated_inputs >> i & 1) {
        ValueKind k = values_[id].kind;
        if (k != ValueKind::kParameter && k != ValueKind::kState) {
          return bad(absl::StrCat("node ", n, " (", info.name, ") updates %", id, ", a ",
                                  ValueKindName(k), " value"));
        }
      }
    }
    absl::StatusOr<std::vector<TensorType>> types = InferOutputTypes(*this, node);
    if (!types.ok()) return bad(absl::StrCat("node ", n, ": ", types.status().message()));
    if (node.outputs.size() != static_cast<size_t>(info.num_outputs)) {
      return bad(absl::StrCat("node ", n, " (", info.name, ") has ", node.outputs.size(),
                              " outputs, want ", info.num_outputs));
    }
    for (int i = 0; i < info.num_outputs; ++i) {
      int id = node.outputs[i];
      if (id == -1 && (info.optional_outputs >> i & 1)) continue;
      if (id < 0 || id >= nv) return bad(absl::StrCat("node ", n, " writes value %", id));
      const Value& v = values_[id];
      if (v.kind != ValueKind::kIntermediate || v.producer != static_cast<int>(n) || defined[id]) {
        return bad(absl::StrCat("node ", n, " output %", id, " is not its own intermediate"));
      }
      if (!(v.type() == (*types)[i])) {
        return bad(absl::StrCat("node ", n, " (", info.name, ") output %", id, " is ",
                                TypeString(v.type()), " but the op gives ",
                                TypeString((*types)[i])));
      }
      defined[id] = true;
    }
  }
  for (int i = 0; i < nv; ++i) {
    if (!defined[i]) return bad(absl::StrCat("value %", i, " is never produced"));
  }
  for (int id : outputs_) {
    if (id < 0 || id >= nv) return bad(absl::StrCat("graph output %", id, " out of range"));
  }
  return absl::OkStatus();
}

std::string Graph::ToString() const {
  std::string s;
  auto ref = [](int id) { return id < 0 ? std::string("_") : absl::StrCat("%", id); };
  for (size_t i = 0; i < values_.size(); ++i) {
    const Value& v = values_[i];
    if (v.kind == ValueKind::kIntermediate) continue;
    absl::StrAppend(&s, "%", i, " = ", ValueKindName(v.kind), " \"", v.name,
                    "\" : ", TypeString(v.type()), "\n");
  }
  for (const Node& n : nodes_) {
    std::vector<std::string> outs, ins, attrs;
    for (int id : n.outputs) outs.push_back(ref(id));
    for (int id : n.inputs) ins.push_back(ref(id));
    const Attrs& a = n.attrs;
    switch (n.op) {
      case OpKind::kConv2d:
      case OpKind::kConv2dBackwardData:
      case OpKind::kConv2dBackwardWeights:
        attrs.push_back(absl::StrCat("stride=", a.stride, ", padding=", a.padding));
        break;
      case OpKind::kConv2dBackwardWeightsAvgPoolRelu:
        attrs.push_back(
            absl::StrCat("stride=", a.stride, ", padding=", a.padding, ", pool=", a.kernel));
        break;
      case OpKind::kAvgPool2d:
      case OpKind::kMaxPool2d:
      case OpKind::kAvgPool2dBackward:
      case OpKind::kMaxPool2dBackward:
      case OpKind::kAvgPool2dReluBackward:
        attrs.push_back(
            absl::StrCat("kernel=", a.kernel, ", stride=", a.stride, ", padding=", a.padding));
        break;
      case OpKind::kBatchNormTrain:
        attrs.push_back(absl::StrCat("momentum=", a.momentum));
        [[fallthrough]];
      case OpKind::kBatchNormInference:
        attrs.push_back(absl::StrCat("eps=", a.eps));
        break;
      case OpKind::kScale:
        attrs.push_back(absl::StrCat("alpha=", a.alpha));
        break;
      case OpKind::kMatMul:
        if (a.transpose_a) attrs.push_back("transpose_a");
        if (a.transpose_b) attrs.push_back("transpose_b");
        break;
      case OpKind::kSgdUpdate:
        attrs.push_back(absl::StrCat("lr=", a.sgd.lr, ", momentum=", a.sgd.momentum,
                                     ", weight_decay=", a.sgd.weight_decay));
        break;
      case OpKind::kFusedElementwise: {
        static const char* kNames[] = {"add", "mul", "relu", "relu_mask", "scale"};
        std::vector<std::string> prog;
        for (const ElementwiseInstr& in : a.program) {
          int op = static_cast<int>(in.op);
          prog.push_back(
              absl::StrCat(op >= 0 && op < 5 ? kNames[op] : "?", "(", in.a, ",", in.b, ")"));
        }
        attrs.push_back(absl::StrJoin(prog, " "));
        break;
      }
      default:
        break;
    }
    if (a.relu) attrs.push_back("relu");
    if (!a.shape.empty()) attrs.push_back("shape=[" + absl::StrJoin(a.shape, ", ") + "]");
    std::vector<std::string> types;
    for (int id : n.outputs) {
      if (id >= 0) types.push_back(TypeString(values_[id].type()));
    }
    absl::StrAppend(&s, outs.empty() ? "" : absl::StrJoin(outs, ", ") + " = ", GetOpInfo(n.op).name,
                    "(", absl::StrJoin(ins, ", "), ")",
                    attrs.empty() ? "" : " {" + absl::StrJoin(attrs, ", ") + "}",
                    types.empty() ? "" : " : " + absl::StrJoin(types, ", "), "\n");
  }
  std::vector<std::string> outs;
  for (int id : outputs_) outs.push_back(ref(id));
  absl::StrAppend(&s, "return ", absl::StrJoin(outs, ", "), "\n");
  return s;
}

}  // namespace graph
}  // namespace dtrain
