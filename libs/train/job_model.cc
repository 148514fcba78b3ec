#include "libs/train/job_model.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "libs/base/files.h"
#include "libs/base/status.h"
#include "libs/nn/models.h"
#include "libs/onnx/model.h"

namespace dtrain {
namespace train {

absl::StatusOr<JobModel> OpenJobModel(const JobConfig& c, const nn::ModelOptions& options) {
  JobModel m;
  m.init = c.init.empty() ? "normal" : c.init;
  m.options = options;
  if (c.model_file.empty()) {
    DT_ASSIGN_OR_RETURN(m.sample_shape, nn::ModelInputShape(c.model, options));
    const std::string name = c.model;
    m.flops = [name, options] { return graph::TrainingFlopsPerSample(name, options); };
    return m;
  }
  absl::StatusOr<std::string> read = ReadFile(c.model_file);
  if (!read.ok()) return Annotate(read.status(), "model_file");
  auto bytes = std::make_shared<const std::string>(*std::move(read));
  // The model's own input: the data is checked against it.
  onnx::ImportOptions o;
  o.from_model = m.init == "from_model";
  o.seed = c.seed;  // Dropout's masks
  DT_ASSIGN_OR_RETURN(std::shared_ptr<onnx::OnnxModel> file_model, onnx::ImportModel(*bytes, o));
  m.sample_shape = file_model->input_shape();
  o.from_model = false;
  m.factory = [bytes, o]() -> absl::StatusOr<std::shared_ptr<nn::Module>> {
    DT_ASSIGN_OR_RETURN(std::shared_ptr<onnx::OnnxModel> net, onnx::ImportModel(*bytes, o));
    return std::shared_ptr<nn::Module>(std::move(net));
  };
  const Shape sample = m.sample_shape;
  m.flops = [bytes, o, sample]() -> absl::StatusOr<graph::TrainingFlops> {
    DT_ASSIGN_OR_RETURN(std::shared_ptr<onnx::OnnxModel> net, onnx::ImportModel(*bytes, o));
    return graph::TrainingFlopsPerSample(net.get(), sample);
  };
  if (m.init == "from_model") {
    m.init = "normal";
    m.init_from_model = [file_model](nn::Module* replica, nn::Sgd*) -> absl::Status {
      std::map<std::string, Tensor> from;  // handles of the file model's tensors
      for (auto& [name, p] : file_model->NamedParameters()) from.emplace(name, p.value());
      for (auto& [name, t] : file_model->NamedBuffers()) from.emplace(name, *t);
      for (auto& [name, p] : replica->NamedParameters()) {
        auto it = from.find(name);
        if (it == from.end()) return absl::InternalError(absl::StrCat("no weights for ", name));
        DT_RETURN_IF_ERROR(p.mutable_value().CopyFrom(it->second));
      }
      for (auto& [name, t] : replica->NamedBuffers()) {
        auto it = from.find(name);
        if (it == from.end()) return absl::InternalError(absl::StrCat("no buffer ", name));
        DT_RETURN_IF_ERROR(t->CopyFrom(it->second));
      }
      return absl::OkStatus();
    };
  }
  return m;
}

}  // namespace train
}  // namespace dtrain
