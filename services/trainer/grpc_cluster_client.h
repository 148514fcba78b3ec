// GrpcClusterClient: agent::ClusterClient over the scheduler's
// ClusterService (protos/scheduler.proto), for the trainer daemon.
//
//   GrpcClusterClient cluster(grpc::CreateChannel(address, credentials), absl::Seconds(5));
//   agent::Agent agent(&cluster, options, &metrics);
//
// Every call has the deadline rpc_timeout and is tried once; errors are the
// server's status converted by libs/base/grpc_status.h and prefixed with the
// RPC's name ("ClusterService.Heartbeat: ..."). RendezvousStore is a
// SchedulerStore (which retries transient failures itself).
//
// Thread-safe (the gRPC stub is).
#ifndef DTRAIN_SERVICES_TRAINER_GRPC_CLUSTER_CLIENT_H_
#define DTRAIN_SERVICES_TRAINER_GRPC_CLUSTER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "libs/agent/cluster_client.h"
#include "protos/scheduler.grpc.pb.h"

namespace dtrain {
namespace trainer {

class GrpcClusterClient : public agent::ClusterClient {
 public:
  GrpcClusterClient(std::shared_ptr<grpc::Channel> channel, absl::Duration rpc_timeout);

  absl::StatusOr<scheduler::v1::RegisterTrainerReply> RegisterTrainer(
      const scheduler::v1::RegisterTrainerRequest& request) override;
  absl::StatusOr<scheduler::v1::HeartbeatReply> Heartbeat(
      const scheduler::v1::HeartbeatRequest& request) override;
  absl::StatusOr<scheduler::v1::ReportProgressReply> ReportProgress(
      const scheduler::v1::ProgressReport& report) override;
  std::unique_ptr<collective::Store> RendezvousStore(const std::string& trainer_id,
                                                     const std::string& job_id,
                                                     int attempt) override;
  // A stream with a deadline of kModelFetchTimeout (model files are large).
  absl::Status GetModel(const scheduler::v1::GetModelRequest& request,
                        const std::function<absl::Status(absl::string_view)>& sink) override;
  static constexpr absl::Duration kModelFetchTimeout = absl::Minutes(10);

 private:
  std::unique_ptr<grpc::ClientContext> Context() const;

  const std::unique_ptr<scheduler::v1::ClusterService::Stub> stub_;
  const absl::Duration rpc_timeout_;
};

}  // namespace trainer
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINER_GRPC_CLUSTER_CLIENT_H_
