#include "libs/train/state_io.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/checkpoint/checkpoint.h"

namespace dtrain {
namespace train {
namespace {

// A failed copy (a device error) fails the save: a checkpoint must never
// hold bytes that were not the tensor's (its checksum would vouch for them).
absl::StatusOr<checkpoint::TensorRecord> ToRecord(const std::string& name, const Tensor& t) {
  checkpoint::TensorRecord r;
  r.name = name;
  r.dtype = static_cast<int32_t>(t.dtype());
  r.shape.assign(t.shape().begin(), t.shape().end());
  r.data.resize(t.nbytes());
  DT_RETURN_IF_ERROR(Annotate(t.CopyToHost(r.data.data()),
                              absl::StrCat("copying tensor '", name, "' (", t.DebugString(),
                                           ") to the host for a checkpoint")));
  return r;
}

absl::Status FromRecord(const std::string& path, const checkpoint::TensorRecord& r, Tensor* dst) {
  if (r.dtype != static_cast<int32_t>(dst->dtype()) ||
      Shape(r.shape.begin(), r.shape.end()) != dst->shape()) {
    absl::StatusOr<DType> dt = DTypeFromCode(r.dtype);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": tensor '", r.name, "' is ", dt.ok() ? DTypeName(*dt) : "?",
                     ShapeToString(Shape(r.shape.begin(), r.shape.end())), " but the model needs ",
                     DTypeName(dst->dtype()), ShapeToString(dst->shape())));
  }
  DT_RETURN_IF_ERROR(checkpoint::ValidateRecord(r, static_cast<int64_t>(DTypeSize(dst->dtype()))));
  Tensor host = Tensor::FromHost(r.data.data(), static_cast<size_t>(dst->numel()), dst->shape(),
                                 dst->dtype());
  return dst->CopyFrom(host);
}

}  // namespace

absl::Status SaveTrainingState(const std::string& path, const std::string& model_name,
                               nn::Module* model, nn::Sgd* optimizer,
                               const std::map<std::string, std::string>& metadata) {
  checkpoint::Checkpoint ckpt;
  ckpt.metadata = metadata;
  ckpt.metadata["model"] = model_name;
  auto add = [&ckpt](const std::string& name, const Tensor& t) -> absl::Status {
    DT_ASSIGN_OR_RETURN(checkpoint::TensorRecord r, ToRecord(name, t));
    ckpt.tensors.push_back(std::move(r));
    return absl::OkStatus();
  };
  for (auto& [name, p] : model->NamedParameters()) DT_RETURN_IF_ERROR(add(name, p.value()));
  for (auto& [name, b] : model->NamedBuffers()) DT_RETURN_IF_ERROR(add(name, *b));
  if (optimizer != nullptr) {
    for (auto& [name, t] : optimizer->NamedState()) DT_RETURN_IF_ERROR(add(name, *t));
  }
  return checkpoint::WriteCheckpoint(path, ckpt);
}

absl::StatusOr<std::map<std::string, std::string>> LoadTrainingState(const std::string& path,
                                                                     const std::string& model_name,
                                                                     nn::Module* model,
                                                                     nn::Sgd* optimizer) {
  DT_ASSIGN_OR_RETURN(checkpoint::Checkpoint ckpt, checkpoint::ReadCheckpoint(path));
  auto it = ckpt.metadata.find("model");
  if (it == ckpt.metadata.end() || it->second != model_name) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": checkpoint is of model '", it == ckpt.metadata.end() ? "(unknown)" : it->second,
        "', not '", model_name, "'"));
  }
  // Validate everything before touching the model, so a bad file changes nothing.
  std::vector<std::pair<const checkpoint::TensorRecord*, Tensor*>> plan;
  std::vector<Tensor*> owned;
  for (auto& [name, p] : model->NamedParameters()) {
    const checkpoint::TensorRecord* r = ckpt.Find(name);
    if (r == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": checkpoint has no tensor '", name, "' that the model needs"));
    }
    plan.emplace_back(r, &p.mutable_value());
  }
  for (auto& [name, b] : model->NamedBuffers()) {
    const checkpoint::TensorRecord* r = ckpt.Find(name);
    if (r == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": checkpoint has no buffer '", name, "' that the model needs"));
    }
    plan.emplace_back(r, b);
  }
  std::vector<Tensor> staged(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    staged[i] = Tensor::Empty(plan[i].second->shape(), plan[i].second->dtype(), Device::Cpu());
    DT_RETURN_IF_ERROR(FromRecord(path, *plan[i].first, &staged[i]));
  }
  for (size_t i = 0; i < plan.size(); ++i) DT_RETURN_IF_ERROR(plan[i].second->CopyFrom(staged[i]));
  if (optimizer != nullptr) {
    DT_RETURN_IF_ERROR(
        optimizer->LoadState([&](const std::string& name, Tensor* dst) -> absl::Status {
          const checkpoint::TensorRecord* r = ckpt.Find(name);
          if (r == nullptr) return absl::NotFoundError(name);
          return FromRecord(path, *r, dst);
        }));
  }
  return ckpt.metadata;
}

std::string EpochCheckpointPath(const std::string& checkpoint_path, int epoch) {
  return absl::StrCat(checkpoint_path, ".epoch", epoch);
}

}  // namespace train
}  // namespace dtrain
