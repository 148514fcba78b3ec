#include "libs/scheduler/model_check.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/status.h"

namespace dtrain {
namespace scheduler {

onnx::ImportOptions ImportOptionsFor(const v1::JobSpec& spec) {
  onnx::ImportOptions o;
  o.from_model = false;  // the check keeps no weights
  const v1::DataSpec& d = spec.data();
  const bool idx = d.format().empty() || d.format() == "idx";
  if (d.channels() > 0 && d.height() > 0 && d.width() > 0) {
    o.input_shape = {d.channels(), d.height(), d.width()};
  } else if (idx) {
    o.input_shape = {1, 28, 28};
  }
  o.num_classes = d.num_classes() > 0 ? d.num_classes() : (idx ? 10 : 0);
  return o;
}

absl::Status CheckJobModel(const v1::JobSpec& spec, ModelStore* store) {
  if (spec.model_digest().empty()) return absl::OkStatus();
  DT_RETURN_IF_ERROR(ValidateModelDigest(spec.model_digest(), "model_digest"));
  if (store == nullptr) {
    return absl::FailedPreconditionError(
        "model_digest: this scheduler has no model store (start it with --data_dir); upload "
        "the model first");
  }
  absl::StatusOr<std::string> path = store->Find(spec.model_digest());
  if (absl::IsNotFound(path.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("model_digest: ", spec.model_digest(),
                     " is not in the scheduler's model store; upload the model first "
                     "(trainctl submit --model_file=FILE does)"));
  }
  DT_RETURN_IF_ERROR(path.status());
  onnx::ImportOptions o = ImportOptionsFor(spec);
  o.limits.max_file_bytes = store->max_model_bytes();
  DT_ASSIGN_OR_RETURN(std::shared_ptr<onnx::OnnxModel> model, onnx::ImportModelFile(*path, o));
  const bool cuda = spec.device_kind() == "cuda";
  if ((spec.hybridize() || cuda) && !model->cpu_only_ops().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_file: ", absl::StrJoin(model->cpu_only_ops(), ", "),
        " run only eagerly on the CPU here (docs/models.md, supported operators), so a ",
        spec.hybridize() ? "hybridize" : "cuda",
        " job cannot train this model; submit it as an eager cpu job"));
  }
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace dtrain
