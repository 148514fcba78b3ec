// SchedulerServer: the scheduler (libs/scheduler) as a gRPC server.
//
//   ServerOptions options;
//   options.listen = "0.0.0.0:7000";
//   options.data_dir = "/var/lib/dtrain-scheduler";   // jobs.wal lives here
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<SchedulerServer> server, SchedulerServer::Start(options));
//   ...
//   server->Shutdown(absl::Seconds(5));
//
// Serves on one port:
//   dtrain.scheduler.v1.JobService      Submit, Get, List, Cancel, Watch, DrainTrainer,
//                                       ListTrainers, GetKvstoreMap, ListQueues,
//                                       ApplyQueues, PutModel, GetJobModel (trainctl)
//   dtrain.scheduler.v1.ClusterService  RegisterTrainer, Heartbeat, ReportProgress,
//                                       StoreSet, StoreGet, StoreAdd (rendezvous),
//                                       GetModel (a job's model file),
//                                       KvstoreHeartbeat (kvstore replicas: the
//                                       shard map, libs/scheduler/kvstore_map.h)
// and, through the server scaffold (libs/rpc/server.h), dtrain.admin.Admin
// (Ping), grpc.health.v1.Health (SERVING until shutdown starts),
// grpc.reflection, the port file, and, when metrics_listen is set,
// Prometheus metrics over HTTP: the scaffold's dtrain_rpc_server_* and
//   dtrain_scheduler_jobs{state}        jobs in each state
//   dtrain_scheduler_queue_length       jobs waiting for trainers
//   dtrain_scheduler_trainers_alive     registered, heartbeating trainers
//   dtrain_scheduler_trainers_busy      of those, working on a job
//   dtrain_scheduler_requests_total{method,code}
//   dtrain_scheduler_request_duration_seconds{method}   (histogram)
//   dtrain_scheduler_kvstore_map_version          the shard map's version
//   dtrain_scheduler_kvstore_replicas{shard,state}  chain members (ACTIVE, JOINING)
//   dtrain_scheduler_kvstore_map_changes_total    map changes since start
//   dtrain_scheduler_stragglers                   straggler ranks of running jobs now
//   dtrain_scheduler_stragglers_detected_total    ranks named stragglers since start
//   dtrain_scheduler_queue_{pending,admitted}_jobs{queue}          (with --queues)
//   dtrain_scheduler_queue_{quota,usage,borrowed,lent}{queue,resource}
//   dtrain_scheduler_queue_preemptions_total{queue,reason}
//   dtrain_scheduler_queue_admission_wait_seconds{queue}           (histogram)
//   dtrain_scheduler_queue_pending_within_quota_jobs{queue}, ..._oldest_seconds{queue}
// A thread declares silent trainers lost every heartbeat_timeout / 4, and
// silent kvstore replicas every kvstore_heartbeat_timeout / 4; once a minute
// (after the retention sweep) it deletes model files no retained job refers
// to (ModelStore::CollectGarbage). Submit checks a job's model file
// (libs/scheduler/model_check.h) before the scheduler takes the job.
//
// Thread-safety: Start, Shutdown and the destructor belong to the owner;
// the accessors are thread-safe.
#ifndef DTRAIN_SERVICES_SCHEDULER_SERVER_H_
#define DTRAIN_SERVICES_SCHEDULER_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/scheduler/kvstore_map.h"
#include "libs/scheduler/model_store.h"
#include "libs/scheduler/scheduler.h"

namespace dtrain {
namespace rpc {
class Server;
}  // namespace rpc

namespace scheduler {

struct ServerOptions {
  // The cluster secret (hex; libs/security/job_token.h); non-empty: KVSTORE
  // assignments carry a kvstore token.
  std::string job_token_secret;
  // gRPC address; port 0 picks a free one.
  std::string listen = "127.0.0.1:0";
  // The write-ahead log goes to <data_dir>/jobs.wal and the model store
  // (libs/scheduler/model_store.h) to <data_dir>/models; empty: no
  // persistence and no model store (PutModel is FAILED_PRECONDITION).
  std::string data_dir;
  // The largest model file PutModel accepts.
  int64_t max_model_bytes = kDefaultMaxModelBytes;
  // Where Start writes the bound gRPC port once serving; empty: nowhere.
  std::string port_file;
  // Prometheus endpoint ("127.0.0.1:0", ":9101"); empty: none.
  std::string metrics_listen;
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Placements per job before a lost trainer fails it (SchedulerOptions).
  int max_attempts = 5;
  // QUEUED jobs per user (SchedulerOptions); <= 0: no limit.
  int max_queued_jobs_per_user = 100;
  // Recovery in place of ALLREDUCE jobs on a spare trainer (SchedulerOptions).
  bool recover_in_place = true;
  // How long finished jobs are kept (SchedulerOptions).
  absl::Duration finished_job_retention = absl::Hours(7 * 24);
  // Queues with quotas (SchedulerOptions, docs/queues.md); nullopt: none.
  std::optional<QueueConfig> queues;
  std::string queues_yaml;  // the file `queues` was parsed from
  // The kvstore shard map (KvstoreMembershipOptions): how often replicas
  // heartbeat, when a silent one leaves its chain, and the startup grace
  // (negative: kvstore_heartbeat_timeout).
  absl::Duration kvstore_heartbeat_interval = absl::Milliseconds(200);
  absl::Duration kvstore_heartbeat_timeout = absl::Seconds(2);
  absl::Duration kvstore_startup_grace = absl::Seconds(-1);
};

class SchedulerServer {
 public:
  // Errors: those of Scheduler::Open (a damaged log), kUnavailable when a
  // port cannot be bound, the port file's (WriteFileAtomically).
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(const ServerOptions& options);
  ~SchedulerServer();
  SchedulerServer(const SchedulerServer&) = delete;
  SchedulerServer& operator=(const SchedulerServer&) = delete;

  // Reports NOT_SERVING, ends Watch streams, lets other calls finish within
  // `grace` and stops. Idempotent.
  void Shutdown(absl::Duration grace);

  int port() const;
  int metrics_port() const;
  Scheduler* scheduler() { return scheduler_.get(); }
  KvstoreMembership* kvstore_map() { return kvstore_map_.get(); }

  class Services;

 private:
  SchedulerServer() = default;

  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<KvstoreMembership> kvstore_map_;
  std::unique_ptr<ModelStore> models_;  // null without a data_dir
  std::unique_ptr<Services> services_;
  std::unique_ptr<rpc::Server> rpc_;
  absl::Notification stopping_;
  std::thread liveness_;
  bool shut_down_ = false;
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_SCHEDULER_SERVER_H_
