#include "libs/onnx/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/autograd/functions.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/onnx/eager_ops.h"
#include "libs/ops/ops.h"
#include "third_party/onnx/onnx.pb.h"

namespace dtrain {
namespace onnx {

namespace pb = ::onnx;
namespace ag = ::dtrain::autograd;

namespace {

// Batch size used for shape inference. Any size works for the supported ops;
// 2 (not 1) so that a Reshape that folds the batch into another dim is caught.
constexpr int64_t kProbeBatch = 2;

const std::vector<std::string>& SupportedList() {
  static const auto* ops =
      new std::vector<std::string>{"Add",      "AveragePool", "BatchNormalization",
                                   "Concat",   "Constant",    "Conv",
                                   "Div",      "Dropout",     "Erf",
                                   "Flatten",  "Gemm",        "GlobalAveragePool",
                                   "Identity", "LeakyRelu",   "LogSoftmax",
                                   "MatMul",   "MaxPool",     "Mul",
                                   "Pad",      "Relu",        "Reshape",
                                   "Sigmoid",  "Softmax",     "Sub",
                                   "Tanh",     "Transpose"};
  return *ops;
}

// A user-supplied name, short and printable.
std::string Quote(const std::string& s) {
  std::string t = s.size() > 80 ? s.substr(0, 80) + "..." : s;
  return absl::StrCat("\"", absl::CHexEscape(t), "\"");
}

enum class StepKind {
  kConv,         // autograd::Conv2d (relu may be fused)
  kConvGeneral,  // eager: groups, dilation, asymmetric pads or strides
  kLinear,       // autograd::Linear (relu may be fused)
  kMatMul,       // autograd::MatMul
  kAdd,          // autograd::Add (same shapes)
  kBinary,       // eager broadcasting
  kRelu,
  kUnary,  // eager
  kMaxPool,
  kAvgPool,
  kGlobalAvgPool,
  kBatchNorm,
  kReshape,  // to [N, per_sample...]
  kTranspose,
  kConcat,
  kDropout,
};

struct Step {
  StepKind kind;
  std::vector<int> in;  // slots (-1: absent optional input)
  int out = -1;
  bool relu = false;
  ops::Conv2dParams conv;
  ConvParams gconv;
  ops::Pool2dParams pool;
  BinaryOp bop = BinaryOp::kAdd;
  UnaryOp uop = UnaryOp::kSigmoid;
  float alpha = 0.01f;
  int bn = -1;  // index into Impl::bn_stats
  float momentum = 0.1f, eps = 1e-5f;
  Shape per_sample;
  std::vector<int> perm;
  int axis = 1;
  float ratio = 0.0f;
};

// Element count with overflow and cap checks; -1 when over `cap`.
int64_t CheckedElements(const Shape& s, int64_t cap) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) return -1;
    if (d != 0 && n > cap / d) return -1;
    n *= d;
  }
  return n;
}

}  // namespace

struct OnnxModel::Impl {
  pb::ModelProto model;
  int64_t opset = 0;
  Shape input_shape, output_shape;
  std::vector<std::string> cpu_only;
  std::vector<Step> steps;
  std::vector<Variable> slots;  // params and constants filled; activations empty
  int input_slot = 0;
  int output_slot = -1;
  int num_nodes = 0;
  std::vector<std::pair<Tensor*, Tensor*>> bn_stats;  // running mean, var
  // Initializer name -> parameter or buffer, for Export.
  std::map<std::string, Variable> params;
  std::map<std::string, Tensor*> buffers;
  uint64_t dropout_seed = 0;  // ImportOptions::seed
  uint64_t dropout_calls = 0;
};

OnnxModel::OnnxModel() : impl_(std::make_unique<Impl>()) {}
OnnxModel::~OnnxModel() = default;

const Shape& OnnxModel::input_shape() const { return impl_->input_shape; }
const Shape& OnnxModel::output_shape() const { return impl_->output_shape; }
const std::vector<std::string>& OnnxModel::cpu_only_ops() const { return impl_->cpu_only; }
int64_t OnnxModel::opset() const { return impl_->opset; }

std::string OnnxModel::Describe() const {
  return absl::StrCat("OnnxModel(", Quote(impl_->model.graph().name()), ", ", impl_->num_nodes,
                      " nodes, opset ", impl_->opset, ")");
}

autograd::Variable OnnxModel::Forward(const autograd::Variable& x) {
  Impl& m = *impl_;
  DT_CHECK(x.shape().size() == m.input_shape.size() + 1)
      << "OnnxModel: input " << ShapeToString(x.shape()) << ", want [N, "
      << ShapeToString(m.input_shape) << "...]";
  for (size_t i = 0; i < m.input_shape.size(); ++i) {
    DT_CHECK(x.shape()[i + 1] == m.input_shape[i])
        << "OnnxModel: input " << ShapeToString(x.shape()) << " does not match the model's "
        << ShapeToString(m.input_shape);
  }
  std::vector<Variable> v = m.slots;
  v[m.input_slot] = x;
  auto in = [&](const Step& s, int i) -> const Variable& {
    static const Variable kNone;
    return s.in[i] < 0 ? kNone : v[s.in[i]];
  };
  for (const Step& s : m.steps) {
    Variable& out = v[s.out];
    switch (s.kind) {
      case StepKind::kConv:
        out = ag::Conv2d(in(s, 0), in(s, 1), in(s, 2), s.conv, s.relu);
        break;
      case StepKind::kConvGeneral:
        out = ConvGeneral(in(s, 0), in(s, 1), in(s, 2), s.gconv);
        if (s.relu) out = ag::Relu(out);
        break;
      case StepKind::kLinear:
        out = ag::Linear(in(s, 0), in(s, 1), in(s, 2), s.relu);
        break;
      case StepKind::kMatMul:
        out = ag::MatMul(in(s, 0), in(s, 1));
        break;
      case StepKind::kAdd:
        out = ag::Add(in(s, 0), in(s, 1));
        break;
      case StepKind::kBinary:
        out = Binary(s.bop, in(s, 0), in(s, 1));
        break;
      case StepKind::kRelu:
        out = ag::Relu(in(s, 0));
        break;
      case StepKind::kUnary:
        out = Unary(s.uop, in(s, 0), s.alpha);
        break;
      case StepKind::kMaxPool:
        out = ag::MaxPool2d(in(s, 0), s.pool);
        break;
      case StepKind::kAvgPool:
        out = ag::AvgPool2d(in(s, 0), s.pool);
        break;
      case StepKind::kGlobalAvgPool:
        out = ag::GlobalAvgPool(in(s, 0));
        break;
      case StepKind::kBatchNorm:
        out = ag::BatchNorm(in(s, 0), in(s, 1), in(s, 2), m.bn_stats[s.bn].first,
                            m.bn_stats[s.bn].second, training(), s.momentum, s.eps);
        break;
      case StepKind::kReshape: {
        Shape target;
        target.push_back(x.shape()[0]);
        for (int64_t d : s.per_sample) target.push_back(d);
        out = ag::Reshape(in(s, 0), target);
        break;
      }
      case StepKind::kTranspose:
        out = Transpose(in(s, 0), s.perm);
        break;
      case StepKind::kConcat: {
        std::vector<Variable> xs;
        for (int i : s.in) xs.push_back(v[i]);
        out = Concat(xs, s.axis);
        break;
      }
      case StepKind::kDropout:
        out = training() ? Dropout(in(s, 0), s.ratio, m.dropout_seed, (m.dropout_calls++) << 32)
                         : in(s, 0);
        break;
    }
  }
  return v[m.output_slot];
}

absl::StatusOr<std::string> OnnxModel::Export() const {
  pb::ModelProto out = impl_->model;
  for (pb::TensorProto& t : *out.mutable_graph()->mutable_initializer()) {
    Tensor value;
    auto p = impl_->params.find(t.name());
    if (p != impl_->params.end()) {
      value = p->second.value();
    } else {
      auto b = impl_->buffers.find(t.name());
      if (b == impl_->buffers.end()) continue;
      value = *b->second;
    }
    std::string raw(value.nbytes(), '\0');
    DT_RETURN_IF_ERROR(value.CopyToHost(raw.data()));
    t.clear_float_data();
    t.set_data_type(pb::TensorProto::FLOAT);
    t.set_raw_data(std::move(raw));
  }
  std::string bytes;
  if (!out.SerializeToString(&bytes)) return absl::InternalError("onnx export: serialize failed");
  return bytes;
}

std::vector<std::string> SupportedOps() { return SupportedList(); }

namespace {

// Reads attributes of one node with the checks an untrusted file needs.
class Attrs {
 public:
  explicit Attrs(const pb::NodeProto& n) {
    for (const pb::AttributeProto& a : n.attribute()) by_name_[a.name()] = &a;
  }
  bool Has(const std::string& name) const { return by_name_.count(name) > 0; }
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t def) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return def;
    if (it->second->type() != pb::AttributeProto::INT) return Bad(name, "an int");
    return it->second->i();
  }
  absl::StatusOr<float> Float(const std::string& name, float def) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return def;
    if (it->second->type() != pb::AttributeProto::FLOAT) return Bad(name, "a float");
    if (!std::isfinite(it->second->f())) return Bad(name, "a finite float");
    return it->second->f();
  }
  absl::StatusOr<std::string> String(const std::string& name, const std::string& def) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return def;
    if (it->second->type() != pb::AttributeProto::STRING) return Bad(name, "a string");
    return it->second->s();
  }
  // Ints of exactly `n` entries (when n >= 0), each in [lo, hi].
  absl::StatusOr<std::vector<int64_t>> Ints(const std::string& name, std::vector<int64_t> def,
                                            int n, int64_t lo, int64_t hi) const {
    auto it = by_name_.find(name);
    std::vector<int64_t> v = def;
    if (it != by_name_.end()) {
      if (it->second->type() != pb::AttributeProto::INTS) return Bad(name, "a list of ints");
      v.assign(it->second->ints().begin(), it->second->ints().end());
    }
    if (n >= 0 && static_cast<int>(v.size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute ", name, " has ", v.size(), " entries, want ", n));
    }
    for (int64_t x : v) {
      if (x < lo || x > hi) {
        return absl::InvalidArgumentError(
            absl::StrCat("attribute ", name, " value ", x, " is outside [", lo, ", ", hi, "]"));
      }
    }
    return v;
  }
  const pb::AttributeProto* Get(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }

 private:
  static absl::Status Bad(const std::string& name, const char* want) {
    return absl::InvalidArgumentError(absl::StrCat("attribute ", name, " must be ", want));
  }
  std::map<std::string, const pb::AttributeProto*> by_name_;
};

// Checks a TensorProto's header (type, dims, data location and size) and
// returns its shape. Does not copy data.
absl::StatusOr<Shape> CheckTensor(const pb::TensorProto& t, const ImportLimits& lim,
                                  int64_t* bytes) {
  if (t.data_location() == pb::TensorProto::EXTERNAL || t.external_data_size() > 0) {
    return absl::InvalidArgumentError(
        "uses external data (weights in a separate file); external data is refused: save the "
        "model with its weights inside (onnx.save(model, path, save_as_external_data=False))");
  }
  if (t.has_segment()) return absl::InvalidArgumentError("segmented tensors are not supported");
  if (t.dims_size() > lim.max_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", t.dims_size(), " is over the cap of ", lim.max_rank));
  }
  Shape s;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > lim.max_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension ", d, " is outside [0, ", lim.max_dim, "]"));
    }
    s.push_back(d);
  }
  int64_t n = CheckedElements(s, lim.max_initializer_bytes / 4 + 1);
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("has more elements than the cap of ",
                                                   lim.max_initializer_bytes, " bytes allows"));
  }
  int64_t size = 0;
  switch (t.data_type()) {
    case pb::TensorProto::FLOAT:
      size = 4;
      if (!t.has_raw_data() && t.float_data_size() != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("holds ", t.float_data_size(), " floats for ", n, " elements"));
      }
      break;
    case pb::TensorProto::INT64:
      size = 8;
      if (!t.has_raw_data() && t.int64_data_size() != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("holds ", t.int64_data_size(), " int64s for ", n, " elements"));
      }
      break;
    case pb::TensorProto::BOOL:
      size = 1;
      if (!t.has_raw_data() && t.int32_data_size() != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("holds ", t.int32_data_size(), " bools for ", n, " elements"));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("has data type ", t.data_type(),
                       "; supported: FLOAT (1), INT64 (7), BOOL (9) (convert the model to "
                       "float32)"));
  }
  if (t.has_raw_data() && static_cast<int64_t>(t.raw_data().size()) != n * size) {
    return absl::InvalidArgumentError(absl::StrCat("raw_data has ", t.raw_data().size(),
                                                   " bytes for ", n, " elements of ", size));
  }
  *bytes = n * size;
  return s;
}

Tensor FloatData(const pb::TensorProto& t, const Shape& s) {
  Tensor out = Tensor::Empty(s);
  if (t.has_raw_data()) {
    std::memcpy(out.raw_data(), t.raw_data().data(), t.raw_data().size());
  } else {
    std::copy(t.float_data().begin(), t.float_data().end(), out.data<float>());
  }
  return out;
}

std::vector<int64_t> IntData(const pb::TensorProto& t) {
  std::vector<int64_t> v;
  if (t.data_type() == pb::TensorProto::BOOL) {
    if (t.has_raw_data()) {
      for (char c : t.raw_data()) v.push_back(c != 0);
    } else {
      for (int32_t x : t.int32_data()) v.push_back(x != 0);
    }
  } else if (t.has_raw_data()) {
    v.resize(t.raw_data().size() / 8);
    std::memcpy(v.data(), t.raw_data().data(), v.size() * 8);
  } else {
    v.assign(t.int64_data().begin(), t.int64_data().end());
  }
  return v;
}

// What the importer knows about one named value.
struct Val {
  Shape shape;  // with the probe batch for activations
  bool activation = false;
  bool is_float = true;
  int slot = -1;
  // Constants (initializers and Constant nodes).
  const pb::TensorProto* proto = nullptr;
  bool has_ints = false;
  std::vector<int64_t> ints;  // int64 / bool constants
  Tensor fconst;              // float Constant-node values
  std::string unavailable;    // non-empty: why it cannot be read
};

// Input positions of each op that hold trainable weights / buffers.
bool IsWeightInput(const std::string& op, int i) {
  if (op == "Conv" || op == "Gemm") return i == 1 || i == 2;
  if (op == "BatchNormalization") return i == 1 || i == 2;
  if (op == "MatMul" || op == "Add" || op == "Sub" || op == "Mul" || op == "Div") return true;
  if (op == "Concat") return true;
  return false;
}
bool IsBufferInput(const std::string& op, int i) {
  return op == "BatchNormalization" && (i == 3 || i == 4);
}

class Importer {
 public:
  Importer(const ImportOptions& o, OnnxModel::Impl* impl) : o_(o), m_(*impl) {}

  absl::Status Run(absl::string_view bytes);

  // nn::Module's protected registration, bound by ImportModel (a friend).
  std::function<Variable&(const std::string&, Tensor)> register_param;
  std::function<Tensor&(const std::string&, Tensor)> register_buffer;

 private:
  absl::Status CheckModel();
  absl::Status CheckInitializers();
  absl::Status SetUpInput();
  absl::Status RegisterWeights();
  absl::Status AddNode(int index, const pb::NodeProto& n);
  absl::Status AddNodeOrError(const pb::NodeProto& n, const Attrs& a);
  absl::Status Finish();
  void FuseRelu();

  int NewSlot() {
    m_.slots.emplace_back();
    return static_cast<int>(m_.slots.size()) - 1;
  }
  absl::StatusOr<Val*> Input(const pb::NodeProto& n, int i, bool optional = false);
  absl::Status Output(const pb::NodeProto& n, int i, const Shape& shape, int slot);
  absl::Status CheckShape(const Shape& s);
  void CpuOnly(const std::string& op) {
    if (std::find(m_.cpu_only.begin(), m_.cpu_only.end(), op) == m_.cpu_only.end()) {
      m_.cpu_only.push_back(op);
    }
  }

  const ImportOptions& o_;
  OnnxModel::Impl& m_;
  std::map<std::string, Val> vals_;
  std::set<std::string> init_names_;
  std::string input_name_;
  std::map<std::string, std::string> role_;  // initializer -> "param" / "buffer"
};

absl::Status Importer::CheckShape(const Shape& s) {
  if (static_cast<int>(s.size()) > o_.limits.max_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("result rank ", s.size(), " is over the cap of ", o_.limits.max_rank));
  }
  Shape per(s.begin() + (s.empty() ? 0 : 1), s.end());
  for (int64_t d : per) {
    if (d <= 0 || d > o_.limits.max_dim) {
      return absl::InvalidArgumentError(absl::StrCat("result shape ", ShapeToString(s),
                                                     " has a dimension outside [1, ",
                                                     o_.limits.max_dim, "]"));
    }
  }
  if (CheckedElements(per, o_.limits.max_elements_per_sample) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("result shape ", ShapeToString(s), " is over the cap of ",
                     o_.limits.max_elements_per_sample, " elements per sample"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Val*> Importer::Input(const pb::NodeProto& n, int i, bool optional) {
  if (i >= n.input_size() || n.input(i).empty()) {
    if (optional) return nullptr;
    return absl::InvalidArgumentError(absl::StrCat("input ", i, " is missing"));
  }
  auto it = vals_.find(n.input(i));
  if (it == vals_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input ", Quote(n.input(i)),
        " is not produced by an earlier node, an initializer or the graph input (nodes must be "
        "in topological order)"));
  }
  if (!it->second.unavailable.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input ", Quote(n.input(i)), " ", it->second.unavailable));
  }
  return &it->second;
}

absl::Status Importer::Output(const pb::NodeProto& n, int i, const Shape& shape, int slot) {
  if (i >= n.output_size() || n.output(i).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("output ", i, " is missing"));
  }
  DT_RETURN_IF_ERROR(CheckShape(shape));
  if (vals_.count(n.output(i))) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", Quote(n.output(i)), " is already defined (SSA form required)"));
  }
  Val v;
  v.shape = shape;
  v.activation = true;
  v.slot = slot;
  vals_[n.output(i)] = std::move(v);
  return absl::OkStatus();
}

absl::Status Importer::CheckModel() {
  const pb::ModelProto& mp = m_.model;
  if (!mp.has_graph()) return absl::InvalidArgumentError("model_file: the model has no graph");
  if (mp.ir_version() < 3) {
    return absl::InvalidArgumentError(absl::StrCat("model_file: ir_version ", mp.ir_version(),
                                                   " is not supported (want 3 or later)"));
  }
  for (const pb::OperatorSetIdProto& os : mp.opset_import()) {
    if (os.domain().empty() || os.domain() == "ai.onnx") m_.opset = os.version();
  }
  if (m_.opset < kMinOpset || m_.opset > kMaxOpset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_file: opset ", m_.opset, " of the default domain is not supported; supported: ",
        kMinOpset, "-", kMaxOpset, " (torch.onnx.export(..., opset_version=13))"));
  }
  if (mp.functions_size() > 0) {
    return absl::InvalidArgumentError("model_file: model-local functions are not supported");
  }
  const pb::GraphProto& g = mp.graph();
  if (g.node_size() > o_.limits.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_file: ", g.node_size(), " nodes is over the cap of ", o_.limits.max_nodes));
  }
  if (g.sparse_initializer_size() > 0) {
    return absl::InvalidArgumentError("model_file: sparse initializers are not supported");
  }
  if (g.output_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("model_file: the graph has ", g.output_size(),
                                                   " outputs; want 1 (the logits)"));
  }
  return absl::OkStatus();
}

absl::Status Importer::CheckInitializers() {
  const pb::GraphProto& g = m_.model.graph();
  if (g.initializer_size() > o_.limits.max_initializers) {
    return absl::InvalidArgumentError(absl::StrCat("model_file: ", g.initializer_size(),
                                                   " initializers is over the cap of ",
                                                   o_.limits.max_initializers));
  }
  int64_t total = 0;
  for (const pb::TensorProto& t : g.initializer()) {
    int64_t bytes = 0;
    absl::StatusOr<Shape> s = CheckTensor(t, o_.limits, &bytes);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_file: initializer ", Quote(t.name()), " ", s.status().message()));
    }
    total += bytes;
    if (total > o_.limits.max_initializer_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_file: initializers hold more than the cap of ",
                       o_.limits.max_initializer_bytes, " bytes"));
    }
    if (t.name().empty() || vals_.count(t.name())) {
      return absl::InvalidArgumentError(absl::StrCat("model_file: initializer ", Quote(t.name()),
                                                     " is unnamed or defined twice"));
    }
    Val v;
    v.shape = *s;
    v.proto = &t;
    v.is_float = t.data_type() == pb::TensorProto::FLOAT;
    if (!v.is_float) {
      v.has_ints = true;
      v.ints = IntData(t);
    }
    init_names_.insert(t.name());
    vals_[t.name()] = std::move(v);
  }
  return absl::OkStatus();
}

absl::Status Importer::SetUpInput() {
  const pb::GraphProto& g = m_.model.graph();
  const pb::ValueInfoProto* input = nullptr;
  for (const pb::ValueInfoProto& vi : g.input()) {
    if (init_names_.count(vi.name())) continue;  // older exporters list initializers as inputs
    if (input != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_file: the graph has more than one "
                       "data input (",
                       Quote(input->name()), ", ", Quote(vi.name()), "); want 1"));
    }
    input = &vi;
  }
  if (input == nullptr) return absl::InvalidArgumentError("model_file: the graph has no input");
  Shape model_shape;
  bool model_fixed = false;
  if (input->type().has_tensor_type()) {
    const auto& tt = input->type().tensor_type();
    if (tt.elem_type() != pb::TensorProto::FLOAT) {
      return absl::InvalidArgumentError(absl::StrCat("model_file: input ", Quote(input->name()),
                                                     " has element type ", tt.elem_type(),
                                                     "; want FLOAT (1)"));
    }
    if (tt.has_shape()) {
      model_fixed = true;
      if (tt.shape().dim_size() > o_.limits.max_rank) {
        return absl::InvalidArgumentError("model_file: the input's rank is over the cap");
      }
      for (int i = 1; i < tt.shape().dim_size(); ++i) {
        const auto& d = tt.shape().dim(i);
        if (!d.has_dim_value()) {
          model_fixed = false;
          model_shape.push_back(-1);
        } else {
          model_shape.push_back(d.dim_value());
        }
      }
    }
  }
  if (o_.input_shape.empty()) {
    if (!model_fixed || model_shape.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_file: input ", Quote(input->name()),
                       " has no fixed per-sample shape; give the job's input shape"));
    }
    m_.input_shape = model_shape;
  } else {
    m_.input_shape = o_.input_shape;
    bool rank_known = input->type().tensor_type().has_shape();
    if (rank_known && model_shape.size() != o_.input_shape.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_file: input ", Quote(input->name()), " has rank ",
                       model_shape.size() + 1, "; the job's input [N, ",
                       ShapeToString(o_.input_shape), "] has rank ", o_.input_shape.size() + 1));
    }
    for (size_t i = 0; rank_known && i < model_shape.size(); ++i) {
      if (model_shape[i] >= 0 && model_shape[i] != o_.input_shape[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("model_file: the model's input is [N, ", absl::StrJoin(model_shape, ", "),
                         "] but the job's input is ", ShapeToString(o_.input_shape)));
      }
    }
  }
  Shape full{kProbeBatch};
  for (int64_t d : m_.input_shape) full.push_back(d);
  absl::Status s = CheckShape(full);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("model_file: input ", s.message()));
  input_name_ = input->name();
  Val v;
  v.shape = full;
  v.activation = true;
  v.slot = NewSlot();
  m_.input_slot = v.slot;
  vals_[input_name_] = std::move(v);
  return absl::OkStatus();
}

absl::Status Importer::RegisterWeights() {
  const pb::GraphProto& g = m_.model.graph();
  for (const pb::NodeProto& n : g.node()) {
    for (int i = 0; i < n.input_size(); ++i) {
      if (!init_names_.count(n.input(i))) continue;
      std::string role = IsBufferInput(n.op_type(), i)   ? "buffer"
                         : IsWeightInput(n.op_type(), i) ? "param"
                                                         : "";
      if (role.empty()) continue;
      auto [it, inserted] = role_.emplace(n.input(i), role);
      if (!inserted && it->second != role) {
        return absl::InvalidArgumentError(
            absl::StrCat("model_file: initializer ", Quote(n.input(i)),
                         " is used both as a weight and as batch-norm statistics"));
      }
    }
  }
  for (const pb::TensorProto& t : g.initializer()) {
    auto r = role_.find(t.name());
    if (r == role_.end()) continue;
    Val& v = vals_[t.name()];
    if (!v.is_float) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_file: initializer ", Quote(t.name()), " is a weight but not FLOAT"));
    }
    Tensor value;
    if (o_.from_model) {
      value = FloatData(t, v.shape);
    } else {
      value = Tensor::Zeros(v.shape);
    }
    v.slot = NewSlot();
    if (r->second == "param") {
      Variable& p = register_param(t.name(), value);
      m_.slots[v.slot] = p;
      m_.params[t.name()] = p;
    } else {
      if (!o_.from_model && absl::EndsWith(t.name(), "var")) ops::Fill(&value, 1.0f);
      Tensor& b = register_buffer(t.name(), value);
      m_.buffers[t.name()] = &b;
    }
  }
  return absl::OkStatus();
}

std::string NodeLabel(int index, const pb::NodeProto& n, int64_t opset) {
  return absl::StrCat("node ", Quote(n.name().empty() ? absl::StrCat("#", index) : n.name()),
                      " (op ", absl::CHexEscape(n.op_type().substr(0, 60)), ", opset ", opset, ")");
}

bool Supported(const pb::NodeProto& n) {
  const auto& sup = SupportedList();
  return (n.domain().empty() || n.domain() == "ai.onnx") &&
         std::find(sup.begin(), sup.end(), n.op_type()) != sup.end();
}

// The first node whose op is not supported, naming every unsupported op type.
absl::Status CheckAllSupported(const pb::GraphProto& g, int64_t opset) {
  int first = -1;
  std::set<std::string> others;
  for (int i = 0; i < g.node_size(); ++i) {
    if (Supported(g.node(i))) continue;
    if (first < 0) first = i;
    if (others.size() < 20) others.insert(absl::CHexEscape(g.node(i).op_type().substr(0, 60)));
  }
  if (first < 0) return absl::OkStatus();
  const pb::NodeProto& n = g.node(first);
  const bool default_domain = n.domain().empty() || n.domain() == "ai.onnx";
  return absl::InvalidArgumentError(absl::StrCat(
      "model_file: ", NodeLabel(first, n, opset),
      default_domain ? "" : absl::StrCat(" in domain ", Quote(n.domain())),
      " is not supported; supported: ", absl::StrJoin(SupportedList(), ", "),
      others.size() > 1
          ? absl::StrCat(" (unsupported ops in this model: ", absl::StrJoin(others, ", "), ")")
          : ""));
}

absl::Status Importer::AddNode(int index, const pb::NodeProto& n) {
  const std::string label = NodeLabel(index, n, m_.opset);
  Attrs a(n);
  absl::Status s = AddNodeOrError(n, a);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("model_file: ", label, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status Importer::AddNodeOrError(const pb::NodeProto& n, const Attrs& a) {
  const std::string& op = n.op_type();
  auto need_rank = [](const Val* v, size_t r, const char* what) -> absl::Status {
    if (v->shape.size() != r) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has shape ", ShapeToString(v->shape), "; want rank ", r));
    }
    return absl::OkStatus();
  };
  auto weight = [&](int i, bool optional) -> absl::StatusOr<Val*> {
    DT_ASSIGN_OR_RETURN(Val * v, Input(n, i, optional));
    if (v != nullptr && (!v->is_float || v->slot < 0)) {
      if (v->fconst.defined()) {
        v->slot = NewSlot();
        m_.slots[v->slot] = Variable(v->fconst, false);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", i, " must be a float tensor (an initializer or a result)"));
      }
    }
    return v;
  };
  Step st;
  if (op == "Constant") {
    if (n.attribute_size() != 1 || a.Get("value") == nullptr ||
        a.Get("value")->type() != pb::AttributeProto::TENSOR) {
      return absl::InvalidArgumentError("only the tensor attribute 'value' is supported");
    }
    const pb::TensorProto& t = a.Get("value")->t();
    int64_t bytes = 0;
    DT_ASSIGN_OR_RETURN(Shape shape, CheckTensor(t, o_.limits, &bytes));
    if (bytes > o_.limits.max_initializer_bytes) {
      return absl::InvalidArgumentError("value is over the initializer cap");
    }
    if (n.output_size() != 1 || n.output(0).empty() || vals_.count(n.output(0))) {
      return absl::InvalidArgumentError("needs one new output");
    }
    Val v;
    v.shape = shape;
    v.is_float = t.data_type() == pb::TensorProto::FLOAT;
    if (v.is_float) {
      v.fconst = FloatData(t, shape);
    } else {
      v.has_ints = true;
      v.ints = IntData(t);
    }
    vals_[n.output(0)] = std::move(v);
    return absl::OkStatus();
  }
  if (op == "Identity") {
    DT_ASSIGN_OR_RETURN(Val * x, Input(n, 0));
    if (n.output_size() != 1 || n.output(0).empty() || vals_.count(n.output(0))) {
      return absl::InvalidArgumentError("needs one new output");
    }
    Val copy = *x;
    vals_[n.output(0)] = std::move(copy);
    return absl::OkStatus();
  }
  if (op == "Pad") {
    // torch exports AvgPool2d as Pad (all zeros) + AveragePool: an identity.
    DT_ASSIGN_OR_RETURN(Val * x, Input(n, 0));
    DT_ASSIGN_OR_RETURN(Val * pads, Input(n, 1));
    DT_ASSIGN_OR_RETURN(std::string mode, a.String("mode", "constant"));
    DT_ASSIGN_OR_RETURN(Val * value, Input(n, 2, /*optional=*/true));
    bool zero = pads->has_ints && mode == "constant";
    for (int64_t p : pads->ints) zero = zero && p == 0;
    if (!zero || value != nullptr || n.input_size() > 3) {
      return absl::InvalidArgumentError(
          "only constant-mode Pad with all-zero pads is supported (put padding into the pads "
          "attribute of the Conv or pooling that follows)");
    }
    if (n.output_size() != 1 || n.output(0).empty() || vals_.count(n.output(0))) {
      return absl::InvalidArgumentError("needs one new output");
    }
    Val copy = *x;
    vals_[n.output(0)] = std::move(copy);
    return absl::OkStatus();
  }
  if (op == "Softmax" || op == "LogSoftmax") {
    if (n.output_size() != 1 || n.output(0) != m_.model.graph().output(0).name()) {
      return absl::InvalidArgumentError(
          "is supported only as the last op, producing the graph's output (training applies "
          "softmax in its loss)");
    }
    DT_ASSIGN_OR_RETURN(Val * x, Input(n, 0));
    DT_RETURN_IF_ERROR(need_rank(x, 2, "input"));
    DT_ASSIGN_OR_RETURN(int64_t axis, a.Int("axis", -1));
    if (axis != -1 && axis != 1) return absl::InvalidArgumentError("axis must be 1 or -1");
    if (!x->activation) return absl::InvalidArgumentError("input must be a result");
    Val copy = *x;
    vals_[n.output(0)] = std::move(copy);
    return absl::OkStatus();
  }
  // Every other op computes: its first input is an activation.
  DT_ASSIGN_OR_RETURN(Val * x, Input(n, 0));
  if (!x->activation && op != "MatMul" && op != "Add" && op != "Sub" && op != "Mul" &&
      op != "Div" && op != "Concat") {
    return absl::InvalidArgumentError("input 0 must be computed from the graph input");
  }
  Shape y;
  if (op == "Conv") {
    DT_RETURN_IF_ERROR(need_rank(x, 4, "input X"));
    DT_ASSIGN_OR_RETURN(Val * w, weight(1, false));
    DT_RETURN_IF_ERROR(need_rank(w, 4, "weight W"));
    DT_ASSIGN_OR_RETURN(Val * b, weight(2, true));
    DT_ASSIGN_OR_RETURN(std::string auto_pad, a.String("auto_pad", "NOTSET"));
    if (auto_pad != "NOTSET" && auto_pad != "VALID") {
      return absl::InvalidArgumentError("auto_pad " + Quote(auto_pad) +
                                        " is not supported; give explicit pads");
    }
    DT_ASSIGN_OR_RETURN(int64_t group, a.Int("group", 1));
    DT_ASSIGN_OR_RETURN(auto strides, a.Ints("strides", {1, 1}, 2, 1, 1024));
    DT_ASSIGN_OR_RETURN(auto pads, a.Ints("pads", {0, 0, 0, 0}, 4, 0, 1024));
    DT_ASSIGN_OR_RETURN(auto dil, a.Ints("dilations", {1, 1}, 2, 1, 1024));
    if (a.Has("kernel_shape")) {
      DT_ASSIGN_OR_RETURN(auto ks, a.Ints("kernel_shape", {}, 2, 1, o_.limits.max_dim));
      if (ks[0] != w->shape[2] || ks[1] != w->shape[3]) {
        return absl::InvalidArgumentError("kernel_shape does not match the weight's shape");
      }
    }
    const int64_t C = x->shape[1], O = w->shape[0];
    if (group < 1 || C % group != 0 || O % group != 0 || w->shape[1] * group != C) {
      return absl::InvalidArgumentError(absl::StrCat("input has ", C, " channels, weight ",
                                                     ShapeToString(w->shape), ", group ", group,
                                                     ": channels do not match"));
    }
    if (b != nullptr && b->shape != Shape{O}) {
      return absl::InvalidArgumentError(
          absl::StrCat("bias B has shape ", ShapeToString(b->shape), "; want [", O, "]"));
    }
    int64_t oh = ConvOut(x->shape[2], w->shape[2], strides[0], pads[0], pads[2], dil[0]);
    int64_t ow = ConvOut(x->shape[3], w->shape[3], strides[1], pads[1], pads[3], dil[1]);
    if (oh <= 0 || ow <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the kernel does not fit the input ", ShapeToString(x->shape)));
    }
    y = {x->shape[0], O, oh, ow};
    st.in = {x->slot, w->slot, b ? b->slot : -1};
    bool simple = group == 1 && dil[0] == 1 && dil[1] == 1 && strides[0] == strides[1] &&
                  pads[0] == pads[1] && pads[1] == pads[2] && pads[2] == pads[3] &&
                  w->shape[2] == w->shape[3];
    if (simple) {
      st.kind = StepKind::kConv;
      st.conv.stride = static_cast<int>(strides[0]);
      st.conv.padding = static_cast<int>(pads[0]);
    } else {
      st.kind = StepKind::kConvGeneral;
      st.gconv.stride = {static_cast<int>(strides[0]), static_cast<int>(strides[1])};
      for (int i = 0; i < 4; ++i) st.gconv.pads[i] = static_cast<int>(pads[i]);
      st.gconv.dilation = {static_cast<int>(dil[0]), static_cast<int>(dil[1])};
      st.gconv.groups = static_cast<int>(group);
      CpuOnly("Conv (grouped, dilated or asymmetric)");
    }
  } else if (op == "Gemm") {
    DT_RETURN_IF_ERROR(need_rank(x, 2, "input A"));
    DT_ASSIGN_OR_RETURN(Val * w, weight(1, false));
    DT_RETURN_IF_ERROR(need_rank(w, 2, "input B"));
    DT_ASSIGN_OR_RETURN(Val * c, weight(2, true));
    DT_ASSIGN_OR_RETURN(int64_t ta, a.Int("transA", 0));
    DT_ASSIGN_OR_RETURN(int64_t tb, a.Int("transB", 0));
    DT_ASSIGN_OR_RETURN(float alpha, a.Float("alpha", 1.0f));
    DT_ASSIGN_OR_RETURN(float beta, a.Float("beta", 1.0f));
    if (ta != 0 || alpha != 1.0f || beta != 1.0f) {
      return absl::InvalidArgumentError("only transA=0, alpha=1, beta=1 are supported");
    }
    const int64_t K = x->shape[1];
    const int64_t M = tb ? w->shape[0] : w->shape[1];
    if ((tb ? w->shape[1] : w->shape[0]) != K) {
      return absl::InvalidArgumentError(absl::StrCat("A ", ShapeToString(x->shape), " and B ",
                                                     ShapeToString(w->shape), " (transB ", tb,
                                                     ") do not multiply"));
    }
    y = {x->shape[0], M};
    if (tb) {
      if (c != nullptr && c->shape != Shape{M}) {
        return absl::InvalidArgumentError(
            absl::StrCat("C has shape ", ShapeToString(c->shape), "; want [", M, "]"));
      }
      st.kind = StepKind::kLinear;
      st.in = {x->slot, w->slot, c ? c->slot : -1};
    } else {
      st.kind = StepKind::kMatMul;
      st.in = {x->slot, w->slot};
      if (c != nullptr) {
        Shape bs;
        if (!BroadcastShape(y, c->shape, &bs) || bs != y) {
          return absl::InvalidArgumentError("C does not broadcast to the result");
        }
        st.out = NewSlot();
        m_.steps.push_back(st);
        st = Step();
        st.kind = StepKind::kBinary;
        st.bop = BinaryOp::kAdd;
        st.in = {m_.steps.back().out, c->slot};
        CpuOnly("Gemm (transB=0 with C)");
      }
    }
  } else if (op == "MatMul") {
    DT_ASSIGN_OR_RETURN(Val * a0, weight(0, false));
    DT_ASSIGN_OR_RETURN(Val * b0, weight(1, false));
    DT_RETURN_IF_ERROR(need_rank(a0, 2, "input A"));
    DT_RETURN_IF_ERROR(need_rank(b0, 2, "input B"));
    if (!a0->activation) return absl::InvalidArgumentError("input A must be a result");
    if (a0->shape[1] != b0->shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(ShapeToString(a0->shape), " and ",
                                                     ShapeToString(b0->shape), " do not multiply"));
    }
    y = {a0->shape[0], b0->shape[1]};
    st.kind = StepKind::kMatMul;
    st.in = {a0->slot, b0->slot};
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    DT_ASSIGN_OR_RETURN(Val * a0, weight(0, false));
    DT_ASSIGN_OR_RETURN(Val * b0, weight(1, false));
    if (!BroadcastShape(a0->shape, b0->shape, &y)) {
      return absl::InvalidArgumentError(absl::StrCat("shapes ", ShapeToString(a0->shape), " and ",
                                                     ShapeToString(b0->shape),
                                                     " do not broadcast"));
    }
    if (y.empty() || y[0] != kProbeBatch || (!a0->activation && !b0->activation)) {
      return absl::InvalidArgumentError("the result must keep the batch dimension first");
    }
    st.in = {a0->slot, b0->slot};
    if (op == "Add" && a0->shape == b0->shape) {
      st.kind = StepKind::kAdd;
    } else {
      st.kind = StepKind::kBinary;
      st.bop = op == "Add"   ? BinaryOp::kAdd
               : op == "Sub" ? BinaryOp::kSub
               : op == "Mul" ? BinaryOp::kMul
                             : BinaryOp::kDiv;
      CpuOnly(op == "Add" ? "Add (broadcasting)" : op);
    }
  } else if (op == "Relu") {
    y = x->shape;
    st.kind = StepKind::kRelu;
    st.in = {x->slot};
  } else if (op == "LeakyRelu" || op == "Sigmoid" || op == "Tanh" || op == "Erf") {
    y = x->shape;
    st.kind = StepKind::kUnary;
    st.uop = op == "LeakyRelu" ? UnaryOp::kLeakyRelu
             : op == "Sigmoid" ? UnaryOp::kSigmoid
             : op == "Tanh"    ? UnaryOp::kTanh
                               : UnaryOp::kErf;
    DT_ASSIGN_OR_RETURN(st.alpha, a.Float("alpha", 0.01f));
    st.in = {x->slot};
    CpuOnly(op);
  } else if (op == "MaxPool" || op == "AveragePool") {
    DT_RETURN_IF_ERROR(need_rank(x, 4, "input X"));
    if (n.output_size() > 1 && !n.output(1).empty()) {
      return absl::InvalidArgumentError("the Indices output is not supported");
    }
    DT_ASSIGN_OR_RETURN(std::string auto_pad, a.String("auto_pad", "NOTSET"));
    DT_ASSIGN_OR_RETURN(auto ks, a.Ints("kernel_shape", {}, 2, 1, 1024));
    DT_ASSIGN_OR_RETURN(auto strides, a.Ints("strides", {1, 1}, 2, 1, 1024));
    DT_ASSIGN_OR_RETURN(auto pads, a.Ints("pads", {0, 0, 0, 0}, 4, 0, 1024));
    DT_ASSIGN_OR_RETURN(auto dil, a.Ints("dilations", {1, 1}, 2, 1, 1));
    DT_ASSIGN_OR_RETURN(int64_t ceil_mode, a.Int("ceil_mode", 0));
    DT_ASSIGN_OR_RETURN(int64_t storage, a.Int("storage_order", 0));
    DT_ASSIGN_OR_RETURN(int64_t include_pad, a.Int("count_include_pad", 0));
    if ((auto_pad != "NOTSET" && auto_pad != "VALID") || ceil_mode != 0 || storage != 0 ||
        ks[0] != ks[1] || strides[0] != strides[1] || pads[0] != pads[1] || pads[1] != pads[2] ||
        pads[2] != pads[3] || (include_pad != 0 && pads[0] != 0) || pads[0] * 2 > ks[0]) {
      return absl::InvalidArgumentError(
          "supported: square kernels, equal strides, equal pads on every side (at most half "
          "the kernel), no dilation, ceil_mode=0, auto_pad NOTSET or VALID, and for "
          "AveragePool with pads count_include_pad=0");
    }
    st.kind = op == "MaxPool" ? StepKind::kMaxPool : StepKind::kAvgPool;
    st.pool = {static_cast<int>(ks[0]), static_cast<int>(strides[0]), static_cast<int>(pads[0])};
    int64_t oh = ConvOut(x->shape[2], ks[0], strides[0], pads[0], pads[0], 1);
    int64_t ow = ConvOut(x->shape[3], ks[1], strides[1], pads[0], pads[0], 1);
    if (oh <= 0 || ow <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the window does not fit the input ", ShapeToString(x->shape)));
    }
    y = {x->shape[0], x->shape[1], oh, ow};
    st.in = {x->slot};
  } else if (op == "GlobalAveragePool") {
    DT_RETURN_IF_ERROR(need_rank(x, 4, "input X"));
    y = {x->shape[0], x->shape[1], 1, 1};
    st.kind = StepKind::kGlobalAvgPool;
    st.in = {x->slot};
  } else if (op == "BatchNormalization") {
    if (x->shape.size() != 4 && x->shape.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("input X has shape ", ShapeToString(x->shape), "; want rank 2 or 4"));
    }
    const int64_t C = x->shape[1];
    Val* in[5] = {x};
    for (int i = 1; i < 5; ++i) {
      DT_ASSIGN_OR_RETURN(in[i], Input(n, i));
      if (in[i]->proto == nullptr || role_.count(n.input(i)) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("input ", i, " must be an initializer"));
      }
      if (in[i]->shape != Shape{C}) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input ", i, " has shape ", ShapeToString(in[i]->shape), "; want [", C, "]"));
      }
    }
    DT_ASSIGN_OR_RETURN(float eps, a.Float("epsilon", 1e-5f));
    DT_ASSIGN_OR_RETURN(float momentum, a.Float("momentum", 0.9f));
    if (eps <= 0 || momentum < 0 || momentum > 1) {
      return absl::InvalidArgumentError("epsilon must be > 0 and momentum in [0, 1]");
    }
    st.kind = StepKind::kBatchNorm;
    st.eps = eps;
    // ONNX's momentum is PyTorch's 1 - momentum stored as a float (0.9f for
    // 0.1); 6 significant digits give back what the exporter meant, so the
    // running statistics update as the PyTorch (and built-in) layer's do.
    st.momentum =
        std::strtof(absl::StrFormat("%.6g", 1.0 - static_cast<double>(momentum)).c_str(), nullptr);
    st.in = {x->slot, in[1]->slot, in[2]->slot};
    st.bn = static_cast<int>(m_.bn_stats.size());
    m_.bn_stats.emplace_back(m_.buffers.at(n.input(3)), m_.buffers.at(n.input(4)));
    y = x->shape;
    // Training-mode exports list running statistics as extra outputs.
    for (int i = 1; i < n.output_size(); ++i) {
      if (n.output(i).empty()) continue;
      Val u;
      u.unavailable = "is a batch-norm statistics output, which is not supported as an input";
      vals_[n.output(i)] = u;
    }
  } else if (op == "Flatten") {
    DT_ASSIGN_OR_RETURN(int64_t axis, a.Int("axis", 1));
    const int64_t r = static_cast<int64_t>(x->shape.size());
    if (axis < 0) axis += r;
    if (axis != 1) {
      return absl::InvalidArgumentError(
          "only axis=1 is supported (the batch stays the first dimension)");
    }
    int64_t rest = 1;
    for (int64_t i = 1; i < r; ++i) rest *= x->shape[i];
    y = {x->shape[0], rest};
    st.kind = StepKind::kReshape;
    st.per_sample = {-1};  // as autograd::Flatten: [N, -1]
    st.in = {x->slot};
  } else if (op == "Reshape") {
    DT_ASSIGN_OR_RETURN(Val * sv, Input(n, 1));
    if (!sv->has_ints || sv->shape.size() != 1) {
      return absl::InvalidArgumentError(
          "the shape (input 1) must be a constant int64 vector (an initializer or Constant)");
    }
    DT_ASSIGN_OR_RETURN(int64_t allowzero, a.Int("allowzero", 0));
    if (allowzero != 0) return absl::InvalidArgumentError("allowzero=1 is not supported");
    if (static_cast<int>(sv->ints.size()) > o_.limits.max_rank) {
      return absl::InvalidArgumentError("the target rank is over the cap");
    }
    int64_t numel = 1;
    for (int64_t d : x->shape) numel *= d;
    int infer = -1;
    int64_t known = 1;
    y.clear();
    for (size_t i = 0; i < sv->ints.size(); ++i) {
      int64_t d = sv->ints[i];
      if (d == 0) {
        if (i >= x->shape.size()) return absl::InvalidArgumentError("0 past the input's rank");
        d = x->shape[i];
      }
      if (d == -1) {
        if (infer >= 0) return absl::InvalidArgumentError("more than one -1 in the shape");
        infer = static_cast<int>(i);
        d = 1;
      } else if (d <= 0 || d > o_.limits.max_dim * kProbeBatch) {
        return absl::InvalidArgumentError(absl::StrCat("shape entry ", sv->ints[i], " is invalid"));
      }
      y.push_back(d);
      known *= d;
    }
    if (infer >= 0) {
      if (numel % known != 0) {
        return absl::InvalidArgumentError("the -1 dimension cannot be inferred");
      }
      y[infer] = numel / known;
    } else if (known != numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot reshape ", ShapeToString(x->shape), " to ", ShapeToString(y)));
    }
    if (y.empty() || y[0] != kProbeBatch) {
      return absl::InvalidArgumentError(
          absl::StrCat("the target shape [", absl::StrJoin(sv->ints, ", "),
                       "] does not keep the batch as the first dimension (use -1 or 0 there)"));
    }
    st.kind = StepKind::kReshape;
    st.per_sample = Shape(y.begin() + 1, y.end());
    st.in = {x->slot};
  } else if (op == "Transpose") {
    const int r = static_cast<int>(x->shape.size());
    std::vector<int64_t> def;
    for (int i = r - 1; i >= 0; --i) def.push_back(i);
    DT_ASSIGN_OR_RETURN(auto perm, a.Ints("perm", def, r, 0, r - 1));
    std::vector<bool> seen(r, false);
    for (int64_t p : perm) {
      if (seen[p]) return absl::InvalidArgumentError("perm is not a permutation");
      seen[p] = true;
    }
    if (perm.empty() || perm[0] != 0) {
      return absl::InvalidArgumentError("perm must keep the batch first (perm[0] = 0)");
    }
    for (int64_t p : perm) {
      y.push_back(x->shape[p]);
      st.perm.push_back(static_cast<int>(p));
    }
    st.kind = StepKind::kTranspose;
    st.in = {x->slot};
    CpuOnly(op);
  } else if (op == "Concat") {
    DT_ASSIGN_OR_RETURN(int64_t axis, a.Int("axis", 0));
    if (!a.Has("axis")) return absl::InvalidArgumentError("attribute axis is required");
    const int64_t r = static_cast<int64_t>(x->shape.size());
    if (axis < 0) axis += r;
    if (axis < 1 || axis >= r) {
      return absl::InvalidArgumentError("axis must be a non-batch dimension of the inputs");
    }
    y = x->shape;
    y[axis] = 0;
    for (int i = 0; i < n.input_size(); ++i) {
      DT_ASSIGN_OR_RETURN(Val * v, weight(i, false));
      if (v->shape.size() != x->shape.size() || v->shape[0] != kProbeBatch) {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", i, " has shape ", ShapeToString(v->shape)));
      }
      for (int64_t d = 0; d < r; ++d) {
        if (d != axis && v->shape[d] != x->shape[d]) {
          return absl::InvalidArgumentError(absl::StrCat("input ", i, " has shape ",
                                                         ShapeToString(v->shape), ", input 0 ",
                                                         ShapeToString(x->shape)));
        }
      }
      y[axis] += v->shape[axis];
      st.in.push_back(v->slot);
    }
    st.kind = StepKind::kConcat;
    st.axis = static_cast<int>(axis);
    CpuOnly(op);
  } else if (op == "Dropout") {
    float ratio = 0.5f;
    DT_ASSIGN_OR_RETURN(Val * rv, Input(n, 1, /*optional=*/true));
    if (rv != nullptr) {
      const pb::TensorProto* t = rv->proto;
      if (rv->fconst.defined() && rv->fconst.numel() == 1) {
        ratio = rv->fconst.data<float>()[0];
      } else if (t != nullptr && rv->is_float && rv->shape.empty()) {
        ratio = FloatData(*t, {}).data<float>()[0];
      } else {
        return absl::InvalidArgumentError("the ratio (input 1) must be a constant float scalar");
      }
    }
    if (!(ratio >= 0.0f && ratio < 1.0f)) {
      return absl::InvalidArgumentError("ratio must be in [0, 1)");
    }
    if (n.output_size() > 1 && !n.output(1).empty()) {
      Val u;
      u.unavailable = "is a dropout mask, which is not supported as an input";
      vals_[n.output(1)] = u;
    }
    y = x->shape;
    if (ratio == 0.0f) {
      Val copy = *x;
      if (n.output_size() < 1 || n.output(0).empty() || vals_.count(n.output(0))) {
        return absl::InvalidArgumentError("needs one new output");
      }
      vals_[n.output(0)] = std::move(copy);
      return absl::OkStatus();
    }
    st.kind = StepKind::kDropout;
    st.ratio = ratio;
    st.in = {x->slot};
    CpuOnly("Dropout");
  } else {
    return absl::InternalError("supported op without a mapping: " + op);
  }
  st.out = NewSlot();
  DT_RETURN_IF_ERROR(Output(n, 0, y, st.out));
  m_.steps.push_back(st);
  return absl::OkStatus();
}

// A Conv or Gemm whose only reader is a Relu runs as one fused kernel, as
// nn::Sequential does for the built-in models.
void Importer::FuseRelu() {
  std::vector<int> readers(m_.slots.size(), 0);
  for (const Step& s : m_.steps) {
    for (int i : s.in) {
      if (i >= 0) ++readers[i];
    }
  }
  readers[m_.output_slot]++;
  std::vector<int> producer(m_.slots.size(), -1);
  std::vector<Step> out;
  for (const Step& s : m_.steps) {
    if (s.kind == StepKind::kRelu && producer[s.in[0]] >= 0 && readers[s.in[0]] == 1) {
      Step& p = out[producer[s.in[0]]];
      if ((p.kind == StepKind::kConv || p.kind == StepKind::kLinear) && !p.relu) {
        p.relu = true;
        p.out = s.out;
        producer[s.out] = producer[s.in[0]];
        continue;
      }
    }
    producer[s.out] = static_cast<int>(out.size());
    out.push_back(s);
  }
  m_.steps = std::move(out);
}

absl::Status Importer::Finish() {
  const std::string& name = m_.model.graph().output(0).name();
  auto it = vals_.find(name);
  if (it == vals_.end() || !it->second.activation) {
    return absl::InvalidArgumentError(absl::StrCat("model_file: the graph output ", Quote(name),
                                                   " is not computed from the input"));
  }
  const Shape& s = it->second.shape;
  if (s.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_file: the output ", Quote(name), " has shape [N, ",
        absl::StrJoin(s.begin() + 1, s.end(), ", "), "]; want [N, classes] (add a Flatten)"));
  }
  if (o_.num_classes > 0 && s[1] != o_.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_file: the model outputs ", s[1], " classes; the job's data has ", o_.num_classes));
  }
  m_.output_shape = {s[1]};
  m_.output_slot = it->second.slot;
  m_.num_nodes = m_.model.graph().node_size();
  FuseRelu();
  return absl::OkStatus();
}

absl::Status Importer::Run(absl::string_view bytes) {
  if (static_cast<int64_t>(bytes.size()) > o_.limits.max_file_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("model_file: ", bytes.size(),
                                                     " bytes is over the cap of ",
                                                     o_.limits.max_file_bytes, " bytes"));
  }
  if (!m_.model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_file: not a valid ONNX model (", bytes.size(),
                     " bytes that do not parse as an onnx.ModelProto; truncated?)"));
  }
  DT_RETURN_IF_ERROR(CheckModel());
  DT_RETURN_IF_ERROR(CheckAllSupported(m_.model.graph(), m_.opset));
  DT_RETURN_IF_ERROR(CheckInitializers());
  DT_RETURN_IF_ERROR(SetUpInput());
  // Weights are allocated before the node checks; their total is capped
  // (ImportLimits::max_initializer_bytes) by CheckInitializers.
  DT_RETURN_IF_ERROR(RegisterWeights());
  for (int i = 0; i < m_.model.graph().node_size(); ++i) {
    DT_RETURN_IF_ERROR(AddNode(i, m_.model.graph().node(i)));
  }
  return Finish();
}

}  // namespace

absl::StatusOr<std::shared_ptr<OnnxModel>> ImportModel(absl::string_view bytes,
                                                       const ImportOptions& options) {
  std::shared_ptr<OnnxModel> model(new OnnxModel());
  OnnxModel* raw = model.get();
  raw->impl_->dropout_seed = options.seed;
  Importer imp(options, raw->impl_.get());
  imp.register_param = [raw](const std::string& name, Tensor t) -> Variable& {
    return raw->RegisterParameter(name, std::move(t));
  };
  imp.register_buffer = [raw](const std::string& name, Tensor t) -> Tensor& {
    return raw->RegisterBuffer(name, std::move(t));
  };
  DT_RETURN_IF_ERROR(imp.Run(bytes));
  return model;
}

absl::StatusOr<std::shared_ptr<OnnxModel>> ImportModelFile(const std::string& path,
                                                           const ImportOptions& options) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("model_file: cannot read ", path, ": ", std::strerror(errno)));
  }
  if (st.st_size > options.limits.max_file_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("model_file: ", path, " has ", st.st_size,
                                                     " bytes, over the cap of ",
                                                     options.limits.max_file_bytes, " bytes"));
  }
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) {
    return absl::NotFoundError(absl::StrCat("model_file: cannot read ", path));
  }
  return ImportModel(bytes, options);
}

}  // namespace onnx
}  // namespace dtrain
