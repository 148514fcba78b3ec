// trainctl's model files (docs/models.md): `submit --model_file=net.onnx`
// uploads the file before the job is submitted, `export JOB --out=FILE`
// writes a finished job's trained weights as ONNX.
//
// Upload: the file is checked here first (onnx::ImportModel for the job's
// input shape and classes: the scheduler's own check, without the round
// trip), its SHA-256 computed, and it is streamed to JobService.PutModel in
// 1 MiB chunks (header: digest and size); the spec then names the digest
// (JobSpec.model_digest) instead of a built-in model.
//
// Export: the job's checkpoint (JobStatus.checkpoint_path, the newest; the
// trainers' shared checkpoint directory must be readable here, as it is on
// a `cluster up` cluster) is loaded into the job's model, which for a model
// file is the file fetched back from the scheduler (JobService.GetJobModel:
// the job's owner and admins, verified against the digest) and written with
// the trained weights in its graph (OnnxModel::Export); a built-in model is
// written with onnx::ExportModule. --epoch=E: the newest checkpoint if it
// holds epoch E, else <checkpoint>.epoch<E> of a job submitted with
// keep_epoch_checkpoints (NOT_FOUND otherwise).
#ifndef DTRAIN_SERVICES_TRAINCTL_MODEL_CMD_H_
#define DTRAIN_SERVICES_TRAINCTL_MODEL_CMD_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "protos/scheduler.grpc.pb.h"

namespace dtrain {
namespace trainctl {

// Checks and uploads `path` for `spec`; sets spec->model_digest (and
// clears spec->model). Errors: the importer's ("model_file: ..."), NotFound
// for an unreadable file, the PutModel call's.
absl::Status UploadModelFile(scheduler::v1::JobService::Stub* stub, const std::string& path,
                             scheduler::v1::JobSpec* spec, absl::Duration timeout);

struct ExportResult {
  std::string job_id;
  std::string out;
  std::string model;  // the built-in name or the digest
  std::string checkpoint;
  int epoch = 0;
  int64_t bytes = 0;
};

// `epoch` 0: the newest checkpoint. Writes `out` atomically.
absl::StatusOr<ExportResult> ExportJob(scheduler::v1::JobService::Stub* stub,
                                       const std::string& job_id, const std::string& out, int epoch,
                                       absl::Duration timeout);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_MODEL_CMD_H_
