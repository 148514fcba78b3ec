// ClusterClient: what a trainer agent needs from the scheduler
// (protos/scheduler.proto's ClusterService), whatever carries it.
//
//   ClusterClient* cluster = ...;  // services/trainer's GrpcClusterClient, or
//                                  // a test's fake
//   DT_ASSIGN_OR_RETURN(RegisterTrainerReply r, cluster->RegisterTrainer(request));
//
// The messages are the protocol's; the errors are absl::Status with the
// codes ClusterService documents (NOT_FOUND from Heartbeat: the scheduler
// forgot the trainer, register again; NOT_FOUND or FAILED_PRECONDITION from
// ReportProgress: the job is no longer this trainer's; UNAVAILABLE or
// DEADLINE_EXCEEDED: the scheduler cannot be reached). Each call is bounded
// by the implementation's deadline and is tried once: retrying is the
// agent's business.
//
// Thread-safety: implementations are thread-safe (the agent calls them from
// its heartbeat thread and its job thread at once).
#ifndef DTRAIN_LIBS_AGENT_CLUSTER_CLIENT_H_
#define DTRAIN_LIBS_AGENT_CLUSTER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/collective/store.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace agent {

class ClusterClient {
 public:
  virtual ~ClusterClient() = default;

  virtual absl::StatusOr<scheduler::v1::RegisterTrainerReply> RegisterTrainer(
      const scheduler::v1::RegisterTrainerRequest& request) = 0;

  virtual absl::StatusOr<scheduler::v1::HeartbeatReply> Heartbeat(
      const scheduler::v1::HeartbeatRequest& request) = 0;

  virtual absl::StatusOr<scheduler::v1::ReportProgressReply> ReportProgress(
      const scheduler::v1::ProgressReport& report) = 0;

  // The rendezvous store of one job attempt, as trainer `trainer_id` sees it
  // (StoreSet / StoreGet / StoreAdd). The store may be used from any thread
  // and must not outlive this client.
  virtual std::unique_ptr<collective::Store> RendezvousStore(const std::string& trainer_id,
                                                             const std::string& job_id,
                                                             int attempt) = 0;

  // The model file of a job this trainer holds a rank of
  // (ClusterService.GetModel): `sink` gets the file's bytes in order, in
  // pieces. The default: UNIMPLEMENTED (a client without model files).
  virtual absl::Status GetModel(const scheduler::v1::GetModelRequest& request,
                                const std::function<absl::Status(absl::string_view)>& sink) {
    return absl::UnimplementedError("this cluster client cannot fetch model files");
  }
};

}  // namespace agent
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AGENT_CLUSTER_CLIENT_H_
