// The model a job trains: a built-in model by name (nn::MakeModel) or the
// user's ONNX file (JobConfig::model_file, imported with libs/onnx), as
// what DataParallelTrainer takes (DataParallelOptions::model, or
// model_factory and, for `init: from_model`, a restore hook) plus what the
// job needs to know about it (one sample's shape, FLOPs for MFU).
//
//   DT_ASSIGN_OR_RETURN(JobModel m, OpenJobModel(config));
//   o.model_factory = m.factory;          // null for a built-in model
//   if (m.init_from_model) o.restore = m.init_from_model;
//
// An imported model's parameters are zero from the factory; the trainer
// initializes them with nn::InitParameters (so the PyTorch export of a
// built-in model trains exactly like it from the same seed), or the restore
// hook copies the file's weights and batch-norm statistics (init
// "from_model"). Errors: the importer's ("model_file: ..."), NotFound for
// an unreadable file, the built-in model's for an unknown name.
#ifndef DTRAIN_LIBS_TRAIN_JOB_MODEL_H_
#define DTRAIN_LIBS_TRAIN_JOB_MODEL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/graph/flops.h"
#include "libs/nn/models.h"
#include "libs/nn/module.h"
#include "libs/nn/optim.h"
#include "libs/tensor/tensor.h"
#include "libs/train/job.h"

namespace dtrain {
namespace train {

struct JobModel {
  Shape sample_shape;  // one sample, batch excluded
  // The job's data's channels, classes and size: a built-in model's
  // options (DataParallelOptions::model_options); the classes of a
  // hybridized step.
  nn::ModelOptions options;
  // Null: the built-in model config.model.
  std::function<absl::StatusOr<std::shared_ptr<nn::Module>>()> factory;
  // init "from_model": copies the file's parameters and buffers into a
  // replica (DataParallelOptions::restore's shape). Null otherwise.
  std::function<absl::Status(nn::Module*, nn::Sgd*)> init_from_model;
  // Per-sample FLOPs of a training step (graph/flops.h).
  std::function<absl::StatusOr<graph::TrainingFlops>()> flops;
  // The nn::Init for nn::InitParameters ("from_model" initializes first,
  // then the hook overwrites).
  std::string init;
};

// `options`: a built-in model's input channels, classes and size (the
// job's data's); an ONNX file brings its own.
absl::StatusOr<JobModel> OpenJobModel(const JobConfig& config,
                                      const nn::ModelOptions& options = {});

}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_JOB_MODEL_H_
