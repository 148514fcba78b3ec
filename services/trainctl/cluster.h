// trainctl cluster up|down|status: a whole cluster on one machine (the
// scheduler, kvstore shards and trainer daemons), each a process on loopback
// ports with its own data directory under --dir, under a supervisor process
// that restarts what exits (--restart=always, with backoff). See cluster.cc.
#ifndef DTRAIN_SERVICES_TRAINCTL_CLUSTER_H_
#define DTRAIN_SERVICES_TRAINCTL_CLUSTER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {
namespace trainctl {

// Options of `trainctl cluster`, from trainctl's flags.
struct ClusterOptions {
  std::string dir;         // required: the cluster's directory
  int trainers = 1;        // up: trainer daemons
  int kvstore_shards = 0;  // up: kvstore shards
  // up: replicas per kvstore shard (chain replication); 0: 2 when
  // kvstore_shards > 0. 1: unreplicated shards, as before replication.
  int kvstore_replicas = 0;
  int devices_per_trainer = 1;   // up: CPU devices each trainer offers
  std::string scheduler_binary;  // up: empty = next to trainctl
  std::string trainer_binary;
  std::string kvstore_binary;
  double start_timeout_s = 30;     // up: per process
  double heartbeat_timeout_s = 0;  // up: the scheduler's (0: its default)
  int max_attempts = 0;            // up: the scheduler's (0: its default)
  int64_t max_model_bytes = 0;     // up: the scheduler's (0: its default, 512 MiB)
  bool recover_in_place = true;    // up: the scheduler's --recover_in_place
  std::string queues_file;         // up: the scheduler's --queues (docs/queues.md)
  // up: the trainers' --kvstore_data_path (auto, tcp or grpc); "": their default.
  std::string kvstore_data_path;
  // up: the trainers' --data_roots (comma-separated directories a job's data
  // may lie under); "": their default (/usr/share/datasets).
  std::string data_roots;
  std::string restart = "always";  // up: always or never (restart what exits)
  double grace_s = 15;             // down: SIGTERM, then SIGKILL after this
  bool json = false;               // -o json
  bool insecure = false;           // up: plain text instead of mutual TLS
  std::string argv0;               // trainctl's argv[0] (finds the binaries)
};

// Runs `trainctl cluster <args...>` (args[0] is up, down or status; or
// supervise, the hidden mode `up` starts the supervisor in). Returns
// the exit status: 0 success, 1 failure, 2 bad usage.
int ClusterMain(const std::vector<std::string>& args, const ClusterOptions& options);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_CLUSTER_H_
