#include "libs/graph/serialize.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libs/base/status.h"
#include "libs/checkpoint/checkpoint.h"
#include "libs/graph/passes.h"

namespace dtrain {
namespace graph {
namespace {

constexpr char kFormat[] = "dtrain.saved_model";
constexpr char kGraphMagic[] = "dtrain-graph";
// Sanity limits of the reader (a corrupt count must not allocate much).
constexpr int64_t kMaxCount = int64_t{1} << 22;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

const char* KindName(ValueKind k) { return ValueKindName(k); }

const char* ElementwiseName(ElementwiseOp op) {
  switch (op) {
    case ElementwiseOp::kAdd:
      return "add";
    case ElementwiseOp::kMul:
      return "mul";
    case ElementwiseOp::kRelu:
      return "relu";
    case ElementwiseOp::kReluMask:
      return "relu_mask";
    case ElementwiseOp::kScale:
      return "scale";
  }
  return "?";
}

// ---- writing ----

void Name(std::string* out, const std::string& name) {
  absl::StrAppend(out, " ", name.size(), ":", name);
}

std::string Encode(const Graph& g) {
  std::string s = absl::StrCat(kGraphMagic, " ", kSavedModelFormatVersion, "\n");
  absl::StrAppend(&s, "values ", g.values().size(), "\n");
  for (const Value& v : g.values()) {
    absl::StrAppend(&s, KindName(v.kind), " ", DTypeName(v.dtype), " ", v.shape.size());
    for (int64_t d : v.shape) absl::StrAppend(&s, " ", d);
    Name(&s, v.name);
    s += "\n";
  }
  auto ids = [&](const char* what, const std::vector<int>& v) {
    absl::StrAppend(&s, what, " ", v.size());
    for (int id : v) absl::StrAppend(&s, " ", id);
    s += "\n";
  };
  ids("inputs", g.inputs());
  ids("outputs", g.outputs());
  absl::StrAppend(&s, "nodes ", g.nodes().size(), "\n");
  for (const Node& n : g.nodes()) {
    absl::StrAppend(&s, GetOpInfo(n.op).name, " ", n.inputs.size());
    for (int id : n.inputs) absl::StrAppend(&s, " ", id);
    absl::StrAppend(&s, " ", n.outputs.size());
    for (int id : n.outputs) absl::StrAppend(&s, " ", id);
    const Attrs& a = n.attrs;
    absl::StrAppend(&s, " ", a.kernel, " ", a.stride, " ", a.padding, " ", int{a.relu}, " ",
                    int{a.transpose_a}, " ", int{a.transpose_b}, " ", Bits(a.alpha), " ",
                    Bits(a.momentum), " ", Bits(a.eps), " ", Bits(a.sgd.lr), " ",
                    Bits(a.sgd.momentum), " ", Bits(a.sgd.weight_decay), " ", int{a.sgd.nesterov},
                    " ", a.shape.size());
    for (int64_t d : a.shape) absl::StrAppend(&s, " ", d);
    absl::StrAppend(&s, " ", a.program.size());
    for (const ElementwiseInstr& in : a.program) {
      absl::StrAppend(&s, " ", ElementwiseName(in.op), " ", in.a, " ", in.b, " ", Bits(in.imm));
    }
    s += "\n";
  }
  return s;
}

// ---- reading ----

// Whitespace-separated tokens with bounds-checked conversions. Errors say
// what was expected and where.
class Reader {
 public:
  explicit Reader(absl::string_view text) : text_(text) {}

  absl::StatusOr<absl::string_view> Token(const char* what) {
    SkipSpace();
    size_t start = pos_;
    while (pos_ < text_.size() && !IsSpace(text_[pos_])) ++pos_;
    if (start == pos_) return Error(absl::StrCat("expected ", what, ", found the end"));
    return text_.substr(start, pos_ - start);
  }
  absl::Status Expect(absl::string_view word) {
    DT_ASSIGN_OR_RETURN(absl::string_view t, Token(std::string(word).c_str()));
    if (t != word) return Error(absl::StrCat("expected '", word, "', found '", t, "'"));
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Int(const char* what, int64_t lo, int64_t hi) {
    DT_ASSIGN_OR_RETURN(absl::string_view t, Token(what));
    int64_t v;
    if (!absl::SimpleAtoi(t, &v) || v < lo || v > hi) {
      return Error(absl::StrCat("bad ", what, " '", t, "' (want ", lo, " to ", hi, ")"));
    }
    return v;
  }
  absl::StatusOr<float> Float(const char* what) {
    DT_ASSIGN_OR_RETURN(int64_t b, Int(what, 0, 0xFFFFFFFFll));
    return FromBits(static_cast<uint32_t>(b));
  }
  absl::StatusOr<bool> Bool(const char* what) {
    DT_ASSIGN_OR_RETURN(int64_t b, Int(what, 0, 1));
    return b != 0;
  }
  // <length>:<bytes>
  absl::StatusOr<std::string> Name() {
    SkipSpace();
    size_t colon = text_.find(':', pos_);
    if (colon == absl::string_view::npos) return Error("expected a name");
    int64_t len;
    if (!absl::SimpleAtoi(text_.substr(pos_, colon - pos_), &len) || len < 0 ||
        static_cast<size_t>(len) > text_.size() - colon - 1) {
      return Error("bad name length");
    }
    pos_ = colon + 1 + static_cast<size_t>(len);
    return std::string(text_.substr(colon + 1, static_cast<size_t>(len)));
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }
  absl::Status Error(const std::string& m) const {
    return absl::DataLossError(absl::StrCat("graph, at byte ", pos_, ": ", m));
  }

 private:
  static bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
  void SkipSpace() {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
  }
  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<ValueKind> ParseKind(Reader& r) {
  DT_ASSIGN_OR_RETURN(absl::string_view t, r.Token("value kind"));
  for (int k = 0; k <= static_cast<int>(ValueKind::kIntermediate); ++k) {
    if (t == ValueKindName(static_cast<ValueKind>(k))) return static_cast<ValueKind>(k);
  }
  return r.Error(absl::StrCat("unknown value kind '", t, "'"));
}

absl::StatusOr<Graph> Decode(absl::string_view text, int* version) {
  Reader r(text);
  DT_RETURN_IF_ERROR(r.Expect(kGraphMagic));
  DT_ASSIGN_OR_RETURN(int64_t v, r.Int("graph version", 0, 1 << 30));
  *version = static_cast<int>(v);
  if (v != kSavedModelFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("graph encoding version ", v,
                                                      " is not the version this build reads (",
                                                      kSavedModelFormatVersion, ")"));
  }
  Graph g;
  DT_RETURN_IF_ERROR(r.Expect("values"));
  DT_ASSIGN_OR_RETURN(int64_t nv, r.Int("value count", 0, kMaxCount));
  for (int64_t i = 0; i < nv; ++i) {
    Value val;
    DT_ASSIGN_OR_RETURN(val.kind, ParseKind(r));
    DT_ASSIGN_OR_RETURN(absl::string_view dt, r.Token("dtype"));
    absl::StatusOr<DType> dtype = ParseDType(dt);
    if (!dtype.ok()) return r.Error(absl::StrCat("unknown dtype '", dt, "'"));
    val.dtype = *dtype;
    DT_ASSIGN_OR_RETURN(int64_t rank, r.Int("rank", 0, 8));
    for (int64_t d = 0; d < rank; ++d) {
      DT_ASSIGN_OR_RETURN(int64_t dim, r.Int("dimension", 0, int64_t{1} << 31));
      val.shape.push_back(dim);
    }
    DT_ASSIGN_OR_RETURN(val.name, r.Name());
    g.values().push_back(std::move(val));
  }
  auto ids = [&](const char* what, std::vector<int>* out, int64_t lo) -> absl::Status {
    DT_RETURN_IF_ERROR(r.Expect(what));
    DT_ASSIGN_OR_RETURN(int64_t n, r.Int("count", 0, kMaxCount));
    for (int64_t i = 0; i < n; ++i) {
      DT_ASSIGN_OR_RETURN(int64_t id, r.Int("value id", lo, nv - 1));
      out->push_back(static_cast<int>(id));
    }
    return absl::OkStatus();
  };
  DT_RETURN_IF_ERROR(ids("inputs", &g.inputs(), 0));
  DT_RETURN_IF_ERROR(ids("outputs", &g.outputs(), 0));
  DT_RETURN_IF_ERROR(r.Expect("nodes"));
  DT_ASSIGN_OR_RETURN(int64_t nn, r.Int("node count", 0, kMaxCount));
  for (int64_t i = 0; i < nn; ++i) {
    Node n;
    DT_ASSIGN_OR_RETURN(absl::string_view op, r.Token("op"));
    absl::StatusOr<OpKind> kind = OpKindFromName(op);
    if (!kind.ok()) return r.Error(std::string(kind.status().message()));
    n.op = *kind;
    auto list = [&](std::vector<int>* out) -> absl::Status {
      DT_ASSIGN_OR_RETURN(int64_t k, r.Int("operand count", 0, 16));
      for (int64_t j = 0; j < k; ++j) {
        DT_ASSIGN_OR_RETURN(int64_t id, r.Int("value id", -1, nv - 1));
        out->push_back(static_cast<int>(id));
      }
      return absl::OkStatus();
    };
    DT_RETURN_IF_ERROR(list(&n.inputs));
    DT_RETURN_IF_ERROR(list(&n.outputs));
    Attrs& a = n.attrs;
    constexpr int64_t kMaxAttr = 1 << 20;
    DT_ASSIGN_OR_RETURN(int64_t kernel, r.Int("kernel", 0, kMaxAttr));
    DT_ASSIGN_OR_RETURN(int64_t stride, r.Int("stride", 0, kMaxAttr));
    DT_ASSIGN_OR_RETURN(int64_t padding, r.Int("padding", 0, kMaxAttr));
    a.kernel = static_cast<int>(kernel);
    a.stride = static_cast<int>(stride);
    a.padding = static_cast<int>(padding);
    DT_ASSIGN_OR_RETURN(a.relu, r.Bool("relu"));
    DT_ASSIGN_OR_RETURN(a.transpose_a, r.Bool("transpose_a"));
    DT_ASSIGN_OR_RETURN(a.transpose_b, r.Bool("transpose_b"));
    DT_ASSIGN_OR_RETURN(a.alpha, r.Float("alpha"));
    DT_ASSIGN_OR_RETURN(a.momentum, r.Float("momentum"));
    DT_ASSIGN_OR_RETURN(a.eps, r.Float("eps"));
    DT_ASSIGN_OR_RETURN(a.sgd.lr, r.Float("sgd.lr"));
    DT_ASSIGN_OR_RETURN(a.sgd.momentum, r.Float("sgd.momentum"));
    DT_ASSIGN_OR_RETURN(a.sgd.weight_decay, r.Float("sgd.weight_decay"));
    DT_ASSIGN_OR_RETURN(a.sgd.nesterov, r.Bool("sgd.nesterov"));
    DT_ASSIGN_OR_RETURN(int64_t ns, r.Int("shape rank", 0, 8));
    for (int64_t j = 0; j < ns; ++j) {
      DT_ASSIGN_OR_RETURN(int64_t d, r.Int("shape dimension", -1, int64_t{1} << 31));
      a.shape.push_back(d);
    }
    DT_ASSIGN_OR_RETURN(int64_t np, r.Int("program length", 0, kMaxElementwiseInstrs));
    for (int64_t j = 0; j < np; ++j) {
      ElementwiseInstr in;
      DT_ASSIGN_OR_RETURN(absl::string_view name, r.Token("elementwise op"));
      bool found = false;
      for (ElementwiseOp e : {ElementwiseOp::kAdd, ElementwiseOp::kMul, ElementwiseOp::kRelu,
                              ElementwiseOp::kReluMask, ElementwiseOp::kScale}) {
        if (name == ElementwiseName(e)) {
          in.op = e;
          found = true;
        }
      }
      if (!found) return r.Error(absl::StrCat("unknown elementwise op '", name, "'"));
      DT_ASSIGN_OR_RETURN(int64_t oa, r.Int("operand", 0, 64));
      DT_ASSIGN_OR_RETURN(int64_t ob, r.Int("operand", 0, 64));
      in.a = static_cast<int>(oa);
      in.b = static_cast<int>(ob);
      DT_ASSIGN_OR_RETURN(in.imm, r.Float("immediate"));
      a.program.push_back(in);
    }
    g.nodes().push_back(std::move(n));
  }
  if (!r.AtEnd()) return r.Error("trailing data after the last node");
  // Producers, from the node lists (Validate checks they are consistent).
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (int id : g.nodes()[i].outputs) {
      if (id >= 0 && g.value(id).producer < 0) g.value(id).producer = static_cast<int>(i);
    }
  }
  return g;
}

absl::Status WithPath(const absl::Status& s, const std::string& path) {
  return Annotate(s, "saved model " + path);
}

}  // namespace

absl::Status SaveGraph(const Graph& graph, const std::string& path) {
  DT_RETURN_IF_ERROR(WithPath(graph.Validate(), path));
  checkpoint::Checkpoint ckpt;
  ckpt.metadata["format"] = kFormat;
  ckpt.metadata["format_version"] = std::to_string(kSavedModelFormatVersion);
  ckpt.metadata["graph"] = Encode(graph);
  for (const Value& v : graph.values()) {
    if (!v.bound()) continue;
    checkpoint::TensorRecord rec;
    rec.name = v.name;
    rec.dtype = static_cast<int32_t>(v.dtype);
    rec.shape.assign(v.shape.begin(), v.shape.end());
    rec.data.resize(v.data.nbytes());
    DT_RETURN_IF_ERROR(WithPath(v.data.CopyToHost(rec.data.data()), path));
    ckpt.tensors.push_back(std::move(rec));
  }
  return checkpoint::WriteCheckpoint(path, ckpt);
}

absl::StatusOr<Graph> LoadGraph(const std::string& path) {
  DT_ASSIGN_OR_RETURN(checkpoint::Checkpoint ckpt, checkpoint::ReadCheckpoint(path));
  auto meta = [&](const char* key) -> const std::string* {
    auto it = ckpt.metadata.find(key);
    return it == ckpt.metadata.end() ? nullptr : &it->second;
  };
  const std::string* format = meta("format");
  if (format == nullptr || *format != kFormat) {
    return absl::InvalidArgumentError("saved model " + path +
                                      ": a dtrain checkpoint, but not a saved model (no "
                                      "format=dtrain.saved_model)");
  }
  const std::string* version = meta("format_version");
  int64_t v = 0;
  if (version == nullptr || !absl::SimpleAtoi(*version, &v) || v < 1) {
    return absl::DataLossError("saved model " + path + ": missing or bad format_version");
  }
  if (v > kSavedModelFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("saved model ", path, ": format version ", v,
                                                      " is newer than this build reads (",
                                                      kSavedModelFormatVersion, ")"));
  }
  const std::string* text = meta("graph");
  if (text == nullptr) return absl::DataLossError("saved model " + path + ": no graph entry");
  int graph_version = 0;
  absl::StatusOr<Graph> decoded = Decode(*text, &graph_version);
  if (!decoded.ok()) return WithPath(decoded.status(), path);
  Graph g = std::move(*decoded);
  // Bind the tensors.
  for (Value& val : g.values()) {
    if (!val.bound()) continue;
    const checkpoint::TensorRecord* rec = ckpt.Find(val.name);
    if (rec == nullptr) {
      return absl::DataLossError("saved model " + path + ": no tensor for '" + val.name + "'");
    }
    Shape shape(rec->shape.begin(), rec->shape.end());
    if (rec->dtype != static_cast<int32_t>(val.dtype) || shape != val.shape) {
      return absl::DataLossError(absl::StrCat("saved model ", path, ": tensor '", val.name, "' is ",
                                              rec->dtype, ShapeToString(shape), ", the graph says ",
                                              DTypeName(val.dtype), ShapeToString(val.shape)));
    }
    absl::Status s = checkpoint::ValidateRecord(*rec, static_cast<int64_t>(DTypeSize(val.dtype)));
    if (!s.ok())
      return absl::DataLossError("saved model " + path + ": " + std::string(s.message()));
    val.data = Tensor::FromHost(rec->data.data(), static_cast<size_t>(NumElements(shape)), shape,
                                val.dtype);
  }
  absl::Status valid = g.Validate();
  if (!valid.ok()) {
    return absl::DataLossError("saved model " + path + ": " + std::string(valid.message()));
  }
  return g;
}

absl::StatusOr<std::unique_ptr<SavedModel>> SavedModel::Load(const std::string& path,
                                                             const ExecutorOptions& options) {
  DT_ASSIGN_OR_RETURN(Graph g, LoadGraph(path));
  absl::StatusOr<std::unique_ptr<SavedModel>> m = FromGraph(std::move(g), options);
  if (!m.ok()) return WithPath(m.status(), path);
  return m;
}

absl::StatusOr<std::unique_ptr<SavedModel>> SavedModel::FromGraph(Graph graph,
                                                                  const ExecutorOptions& options) {
  if (graph.inputs().size() != 1 || graph.value(graph.inputs()[0]).dtype != DType::kF32 ||
      graph.outputs().empty()) {
    return absl::InvalidArgumentError(
        "not an inference graph: want one f32 input and at least one output");
  }
  for (const Node& n : graph.nodes()) {
    switch (n.op) {
      case OpKind::kConv2d:
      case OpKind::kLinear:
      case OpKind::kMatMul:
      case OpKind::kRelu:
      case OpKind::kAdd:
      case OpKind::kScale:
      case OpKind::kAvgPool2d:
      case OpKind::kMaxPool2d:
      case OpKind::kGlobalAvgPool:
      case OpKind::kReshape:
      case OpKind::kBatchNormInference:
      case OpKind::kSum:
      case OpKind::kFusedElementwise:
        break;
      default:
        // Losses, gradients and updates belong to training steps; their
        // kernels also trust data (labels, indices) a file could forge.
        return absl::InvalidArgumentError(absl::StrCat(
            "not an inference graph: it has ", GetOpInfo(n.op).name, " (a training-step op)"));
    }
  }
  std::unique_ptr<SavedModel> m(new SavedModel());
  m->graph_ = std::move(graph);
  m->options_ = options;
  DT_ASSIGN_OR_RETURN(m->exe_, Executable::Compile(m->graph_, options));
  return m;
}

absl::StatusOr<Tensor> SavedModel::Run(const Tensor& x) {
  if (x.defined() && x.shape() != input_shape()) {
    // Another batch (or input size): plan again.
    Graph g = graph_;
    DT_RETURN_IF_ERROR(InferShapes(&g, {x.shape()}));
    DT_ASSIGN_OR_RETURN(exe_, Executable::Compile(g, options_));
  }
  DT_RETURN_IF_ERROR(exe_->Run({x}));
  return exe_->output(0);
}

}  // namespace graph
}  // namespace dtrain
