// The model a job names, checked at submit (docs/models.md "Validate at
// submit"): a JobSpec.model_digest must name a file of the model store, and
// that file must import (libs/onnx) for the job's input shape and classes.
//
//   DT_RETURN_IF_ERROR(CheckJobModel(spec, store));   // before Scheduler::Submit
//
// Errors: FAILED_PRECONDITION "... upload the model first" for a digest
// the store does not hold (or no store: a scheduler without a data
// directory); the importer's INVALID_ARGUMENT ("model_file: node ... (op
// LSTM, opset 17) is not supported; supported: ...") or RESOURCE_EXHAUSTED
// (a cap); INVALID_ARGUMENT naming the ops when a hybridize or cuda job's
// model has ops that run only eagerly on the CPU. OK for a built-in model.
// The import allocates at most the importer's capped initializer bytes and
// keeps nothing. Thread-safe.
#ifndef DTRAIN_LIBS_SCHEDULER_MODEL_CHECK_H_
#define DTRAIN_LIBS_SCHEDULER_MODEL_CHECK_H_

#include "absl/status/status.h"
#include "libs/onnx/model.h"
#include "libs/scheduler/model_store.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace scheduler {

// The import options of the job's data: one sample's shape (DataSpec's
// channels x height x width; Fashion-MNIST's 1x28x28 for idx data; empty
// when the data's own shape is not known before training: the model's
// input is then taken as it is) and classes (DataSpec.num_classes; 10 for
// Fashion-MNIST; 0: unknown).
onnx::ImportOptions ImportOptionsFor(const v1::JobSpec& spec);

// `store` may be null (no model store).
absl::Status CheckJobModel(const v1::JobSpec& spec, ModelStore* store);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_MODEL_CHECK_H_
