#include "libs/onnx/export.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/autograd/trace.h"
#include "libs/base/status.h"
#include "third_party/onnx/onnx.pb.h"

namespace dtrain {
namespace onnx {
namespace {

namespace pb = ::onnx;
using autograd::TraceEvent;
using autograd::Variable;

void SetTensor(pb::TensorProto* t, const std::string& name, const Tensor& value) {
  t->set_name(name);
  t->set_data_type(pb::TensorProto::FLOAT);
  for (int64_t d : value.shape()) t->add_dims(d);
  std::string raw(value.nbytes(), '\0');
  absl::Status s = value.CopyToHost(raw.data());
  (void)s;  // CPU or device tensors of our own module: copies succeed
  t->set_raw_data(std::move(raw));
}

class OnnxTracer : public autograd::Tracer {
 public:
  // Parameters, then buffers, become initializers in registration order (the
  // importer registers parameters in initializer order).
  OnnxTracer(nn::Module* module, const Variable& input, pb::GraphProto* g) : g_(g) {
    for (auto& [name, p] : module->NamedParameters()) {
      params_[p.id()] = {name, p};
      SetTensor(g_->add_initializer(), name, p.value());
      names_[p.id()] = name;
      keep_.push_back(p);
    }
    for (auto& [name, t] : module->NamedBuffers()) {
      SetTensor(g_->add_initializer(), name, *t);
      emitted_buffers_[t] = name;
    }
    names_[input.id()] = "x";
    keep_.push_back(input);
  }

  void Record(const TraceEvent& e) override {
    if (!status_.ok()) return;
    status_ = RecordOrError(e);
  }

  absl::StatusOr<std::string> OutputName(const Variable& out) {
    DT_RETURN_IF_ERROR(status_);
    auto it = names_.find(out.id());
    if (it == names_.end()) {
      return absl::UnimplementedError("onnx export: the output was not computed by traced ops");
    }
    return it->second;
  }

 private:
  struct Param {
    std::string name;
    Variable var;
  };

  std::string NameOf(const Variable* v) {
    if (v == nullptr || !v->defined()) return "";
    auto it = names_.find(v->id());
    if (it != names_.end()) return it->second;
    std::string name;
    auto p = params_.find(v->id());
    if (p != params_.end()) {
      name = p->second.name;
    } else {
      name = absl::StrCat("const.", consts_++);
    }
    SetTensor(g_->add_initializer(), name, v->value());
    names_[v->id()] = name;
    keep_.push_back(*v);
    return name;
  }

  std::string NameOfTensor(const Tensor* t) {
    if (!emitted_buffers_.count(t)) {
      std::string name = absl::StrCat("const.", consts_++);
      SetTensor(g_->add_initializer(), name, *t);
      emitted_buffers_[t] = name;
    }
    return emitted_buffers_[t];
  }

  std::string Fresh(const char* what) { return absl::StrCat("/", what, "_", nodes_++); }

  pb::NodeProto* Node(const char* op, std::vector<std::string> in, const std::string& out) {
    pb::NodeProto* n = g_->add_node();
    n->set_op_type(op);
    n->set_name(absl::StrCat(op, "_", g_->node_size() - 1));
    for (const std::string& s : in) n->add_input(s);
    n->add_output(out);
    return n;
  }
  static void Ints(pb::NodeProto* n, const char* name, std::vector<int64_t> v) {
    pb::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(pb::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void Int(pb::NodeProto* n, const char* name, int64_t v) {
    pb::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(pb::AttributeProto::INT);
    a->set_i(v);
  }
  static void Float(pb::NodeProto* n, const char* name, float v) {
    pb::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(pb::AttributeProto::FLOAT);
    a->set_f(v);
  }

  absl::Status RecordOrError(const TraceEvent& e) {
    const std::string op = e.op;
    std::vector<std::string> in;
    for (int i = 0; i < e.num_inputs; ++i) in.push_back(NameOf(e.inputs[i]));
    while (!in.empty() && in.back().empty()) in.pop_back();
    std::string out = Fresh(e.op);
    if (op == "conv2d" || op == "linear") {
      std::string pre = e.relu ? Fresh("pre_relu") : out;
      if (op == "conv2d") {
        const Shape& w = e.inputs[1]->shape();
        pb::NodeProto* n = Node("Conv", in, pre);
        Ints(n, "kernel_shape", {w[2], w[3]});
        Ints(n, "strides", {e.conv.stride, e.conv.stride});
        Ints(n, "pads", {e.conv.padding, e.conv.padding, e.conv.padding, e.conv.padding});
      } else {
        pb::NodeProto* n = Node("Gemm", in, pre);
        Int(n, "transB", 1);
      }
      if (e.relu) Node("Relu", {pre}, out);
    } else if (op == "matmul") {
      Node("MatMul", in, out);
    } else if (op == "relu") {
      Node("Relu", in, out);
    } else if (op == "add") {
      Node("Add", in, out);
    } else if (op == "avg_pool2d" || op == "max_pool2d") {
      pb::NodeProto* n = Node(op == "avg_pool2d" ? "AveragePool" : "MaxPool", in, out);
      Ints(n, "kernel_shape", {e.pool.kernel, e.pool.kernel});
      Ints(n, "strides", {e.pool.stride, e.pool.stride});
      Ints(n, "pads", {e.pool.padding, e.pool.padding, e.pool.padding, e.pool.padding});
    } else if (op == "global_avg_pool") {
      Node("GlobalAveragePool", in, out);
    } else if (op == "reshape") {
      const Shape& ys = e.output->shape();
      if (ys.size() == 2) {
        Int(Node("Flatten", in, out), "axis", 1);
      } else {
        std::string shape_name = absl::StrCat("const.", consts_++);
        pb::TensorProto* t = g_->add_initializer();
        t->set_name(shape_name);
        t->set_data_type(pb::TensorProto::INT64);
        t->add_dims(static_cast<int64_t>(ys.size()));
        t->add_int64_data(-1);
        for (size_t i = 1; i < ys.size(); ++i) t->add_int64_data(ys[i]);
        in.push_back(shape_name);
        Node("Reshape", in, out);
      }
    } else if (op == "batch_norm") {
      in.push_back(NameOfTensor(e.tensors[0]));
      in.push_back(NameOfTensor(e.tensors[1]));
      pb::NodeProto* n = Node("BatchNormalization", in, out);
      Float(n, "epsilon", e.eps);
      Float(n, "momentum", 1.0f - e.momentum);
    } else {
      return absl::UnimplementedError(
          absl::StrCat("onnx export: op ", op, " has no ONNX mapping here"));
    }
    names_[e.output->id()] = out;
    keep_.push_back(*e.output);
    return absl::OkStatus();
  }

  pb::GraphProto* g_;
  std::map<const void*, Param> params_;
  std::map<const Tensor*, std::string> emitted_buffers_;
  std::map<const void*, std::string> names_;
  std::vector<Variable> keep_;  // keeps traced ids alive (no reuse)
  int consts_ = 0;
  int nodes_ = 0;
  absl::Status status_;
};

void SetValueInfo(pb::ValueInfoProto* vi, const std::string& name, const Shape& per_sample) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(pb::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("N");
  for (int64_t d : per_sample) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

}  // namespace

absl::StatusOr<std::string> ExportModule(nn::Module* module, const Shape& input_shape,
                                         const std::string& graph_name) {
  pb::ModelProto model;
  model.set_ir_version(7);
  model.set_producer_name("dtrain");
  model.add_opset_import()->set_version(13);
  pb::GraphProto* g = model.mutable_graph();
  g->set_name(graph_name);

  Shape full{1};
  for (int64_t d : input_shape) full.push_back(d);
  const bool was_training = module->training();
  module->Eval();
  Variable x(Tensor::Zeros(full), false);
  OnnxTracer tracer(module, x, g);
  Variable y;
  {
    autograd::NoGradGuard no_grad;
    autograd::TraceScope scope(&tracer);
    y = module->Forward(x);
  }
  module->Train(was_training);
  DT_ASSIGN_OR_RETURN(std::string out_name, tracer.OutputName(y));
  // The last node writes the graph output "logits".
  for (pb::NodeProto& n : *g->mutable_node()) {
    for (std::string& o : *n.mutable_output()) {
      if (o == out_name) o = "logits";
    }
  }
  SetValueInfo(g->add_input(), "x", input_shape);
  SetValueInfo(g->add_output(), "logits", Shape(y.shape().begin() + 1, y.shape().end()));
  std::string bytes;
  if (!model.SerializeToString(&bytes)) return absl::InternalError("onnx export: serialize");
  return bytes;
}

}  // namespace onnx
}  // namespace dtrain
