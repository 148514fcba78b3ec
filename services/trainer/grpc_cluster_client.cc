#include "services/trainer/grpc_cluster_client.h"

#include <utility>

#include "libs/base/grpc_status.h"
#include "services/trainer/scheduler_store.h"

namespace dtrain {
namespace trainer {

namespace v1 = scheduler::v1;

GrpcClusterClient::GrpcClusterClient(std::shared_ptr<grpc::Channel> channel,
                                     absl::Duration rpc_timeout)
    : stub_(v1::ClusterService::NewStub(std::move(channel))), rpc_timeout_(rpc_timeout) {}

std::unique_ptr<grpc::ClientContext> GrpcClusterClient::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  return ctx;
}

absl::StatusOr<v1::RegisterTrainerReply> GrpcClusterClient::RegisterTrainer(
    const v1::RegisterTrainerRequest& request) {
  v1::RegisterTrainerReply reply;
  auto ctx = Context();
  absl::Status s = FromGrpcStatus(stub_->RegisterTrainer(ctx.get(), request, &reply),
                                  "ClusterService.RegisterTrainer");
  if (!s.ok()) return s;
  return reply;
}

absl::StatusOr<v1::HeartbeatReply> GrpcClusterClient::Heartbeat(
    const v1::HeartbeatRequest& request) {
  v1::HeartbeatReply reply;
  auto ctx = Context();
  absl::Status s =
      FromGrpcStatus(stub_->Heartbeat(ctx.get(), request, &reply), "ClusterService.Heartbeat");
  if (!s.ok()) return s;
  return reply;
}

absl::StatusOr<v1::ReportProgressReply> GrpcClusterClient::ReportProgress(
    const v1::ProgressReport& report) {
  v1::ReportProgressReply reply;
  auto ctx = Context();
  absl::Status s = FromGrpcStatus(stub_->ReportProgress(ctx.get(), report, &reply),
                                  "ClusterService.ReportProgress");
  if (!s.ok()) return s;
  return reply;
}

std::unique_ptr<collective::Store> GrpcClusterClient::RendezvousStore(const std::string& trainer_id,
                                                                      const std::string& job_id,
                                                                      int attempt) {
  SchedulerStoreOptions o;
  o.rpc_timeout = rpc_timeout_;
  return std::make_unique<SchedulerStore>(stub_.get(), trainer_id, job_id, attempt, o);
}

absl::Status GrpcClusterClient::GetModel(
    const v1::GetModelRequest& request,
    const std::function<absl::Status(absl::string_view)>& sink) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kModelFetchTimeout));
  std::unique_ptr<grpc::ClientReader<v1::ModelChunk>> reader = stub_->GetModel(&ctx, request);
  v1::ModelChunk chunk;
  absl::Status status;
  while (status.ok() && reader->Read(&chunk)) {
    if (!chunk.data().empty()) status = sink(chunk.data());
  }
  if (!status.ok()) {
    ctx.TryCancel();
    reader->Finish();
    return status;
  }
  return FromGrpcStatus(reader->Finish(), "ClusterService.GetModel");
}

}  // namespace trainer
}  // namespace dtrain
