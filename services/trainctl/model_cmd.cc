#include "services/trainctl/model_cmd.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/files.h"
#include "libs/base/grpc_status.h"
#include "libs/base/sha256.h"
#include "libs/base/status.h"
#include "libs/nn/models.h"
#include "libs/onnx/export.h"
#include "libs/onnx/model.h"
#include "libs/scheduler/model_check.h"
#include "libs/scheduler/model_store.h"
#include "libs/train/state_io.h"

namespace dtrain {
namespace trainctl {

namespace v1 = scheduler::v1;

namespace {

constexpr size_t kChunkBytes = 1 << 20;

// Model files are large: their streams get at least this long.
absl::Duration StreamTimeout(absl::Duration timeout) {
  return std::max(timeout, absl::Minutes(10));
}

}  // namespace

absl::Status UploadModelFile(v1::JobService::Stub* stub, const std::string& path, v1::JobSpec* spec,
                             absl::Duration timeout) {
  if (!spec->model().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "give either --model (a built-in model) or --model_file (your own), not both; got "
        "model ",
        spec->model(), " and model_file ", path));
  }
  // The scheduler's check, here first: a bad file fails before the upload.
  onnx::ImportOptions o = scheduler::ImportOptionsFor(*spec);
  DT_RETURN_IF_ERROR(onnx::ImportModelFile(path, o).status());
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model_file: cannot read ", path));
  }
  DT_ASSIGN_OR_RETURN(std::string hex, Sha256OfFile(path));
  const std::string digest = absl::StrCat(scheduler::kModelDigestPrefix, hex);

  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + StreamTimeout(timeout)));
  v1::PutModelReply reply;
  std::unique_ptr<grpc::ClientWriter<v1::ModelChunk>> writer = stub->PutModel(&ctx, &reply);
  v1::ModelChunk header;
  header.set_digest(digest);
  header.set_total_bytes(st.st_size);
  bool sent = writer->Write(header);
  std::ifstream f(path, std::ios::binary);
  std::vector<char> buf(kChunkBytes);
  while (sent && f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (f.gcount() <= 0) break;
    v1::ModelChunk c;
    c.set_data(buf.data(), static_cast<size_t>(f.gcount()));
    sent = writer->Write(c);
  }
  // A refused stream (the cap) ends early: Finish has the scheduler's why.
  writer->WritesDone();
  DT_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish(), "JobService.PutModel"));
  spec->clear_model();
  spec->set_model_digest(reply.digest());
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::string> FetchJobModel(v1::JobService::Stub* stub, const std::string& job_id,
                                          const std::string& digest, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + StreamTimeout(timeout)));
  v1::GetJobModelRequest req;
  req.set_id(job_id);
  std::unique_ptr<grpc::ClientReader<v1::ModelChunk>> reader = stub->GetJobModel(&ctx, req);
  std::string bytes;
  v1::ModelChunk chunk;
  while (reader->Read(&chunk)) bytes += chunk.data();
  DT_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish(), "JobService.GetJobModel"));
  if (scheduler::ModelDigestOf(bytes) != digest) {
    return absl::DataLossError(absl::StrCat("the model file the scheduler sent has the digest ",
                                            scheduler::ModelDigestOf(bytes), ", not the job's ",
                                            digest));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<ExportResult> ExportJob(v1::JobService::Stub* stub, const std::string& job_id,
                                       const std::string& out, int epoch, absl::Duration timeout) {
  v1::JobStatus job;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    v1::GetRequest req;
    req.set_id(job_id);
    DT_RETURN_IF_ERROR(FromGrpcStatus(stub->Get(&ctx, req, &job), "JobService.Get"));
  }
  if (job.checkpoint_path().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        job_id, " has no checkpoint to export (submit it with --checkpoint_interval_epochs=N)"));
  }
  ExportResult r;
  r.job_id = job_id;
  r.out = out;
  r.checkpoint = job.checkpoint_path();
  r.epoch = job.checkpoint_epoch();
  if (epoch != 0 && (epoch != job.checkpoint_epoch() || job.checkpoint_step() != 0)) {
    r.checkpoint = train::EpochCheckpointPath(job.checkpoint_path(), epoch);
    r.epoch = epoch;
    if (!job.spec().keep_epoch_checkpoints() || access(r.checkpoint.c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          job_id, " has no checkpoint of epoch ", epoch, " (the newest holds epoch ",
          job.checkpoint_epoch(), "; submit with --keep_epoch_checkpoints to keep every epoch's)"));
    }
  }
  const v1::JobSpec& spec = job.spec();
  std::string bytes;
  if (!spec.model_digest().empty()) {
    r.model = spec.model_digest();
    DT_ASSIGN_OR_RETURN(std::string file, FetchJobModel(stub, job_id, r.model, timeout));
    onnx::ImportOptions o = scheduler::ImportOptionsFor(spec);
    o.from_model = true;  // buffers and anything the checkpoint lacks keep the file's
    DT_ASSIGN_OR_RETURN(std::shared_ptr<onnx::OnnxModel> net, onnx::ImportModel(file, o));
    DT_RETURN_IF_ERROR(
        train::LoadTrainingState(r.checkpoint, r.model, net.get(), nullptr).status());
    DT_ASSIGN_OR_RETURN(bytes, net->Export());
  } else {
    r.model = spec.model();
    const v1::DataSpec& d = spec.data();
    nn::ModelOptions mo;
    if (d.num_classes() > 0) mo.num_classes = d.num_classes();
    if (d.channels() > 0) mo.in_channels = d.channels();
    DT_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> net, nn::MakeModel(r.model, mo));
    DT_ASSIGN_OR_RETURN(Shape sample, nn::ModelInputShape(r.model));
    if (d.channels() > 0 && d.height() > 0 && d.width() > 0) {
      sample = {d.channels(), d.height(), d.width()};
    }
    DT_RETURN_IF_ERROR(
        train::LoadTrainingState(r.checkpoint, r.model, net.get(), nullptr).status());
    DT_ASSIGN_OR_RETURN(bytes, onnx::ExportModule(net.get(), sample, r.model));
  }
  r.bytes = static_cast<int64_t>(bytes.size());
  DT_RETURN_IF_ERROR(WriteFileAtomically(out, bytes));
  return r;
}

}  // namespace trainctl
}  // namespace dtrain
