// kvstore_server: one shard of the kvstore (sharded parameter server).
//
//   kvstore_server --listen=0.0.0.0:7070 --shard_index=0 --data_dir=/var/lib/kvstore
//                  --metrics_listen=:9100 --snapshot_interval_s=60
//                  --quota_bytes_per_job=8589934592 --max_message_bytes=4194304
//                  --job_ttl_s=3600
//   kvstore_server ... --scheduler=scheduler:7000 --num_shards=2 --shard_index=1
//                  --replica_index=0 --advertise=kvstore-2.kvstore:7070   # replicated
//
// Defaults that keep a shard from growing without bound: a job may hold
// --quota_bytes_per_job (4 GiB: ResNet-18's 11.7M f32 parameters with SGD
// momentum and a round accumulator are 140 MB, so this is room for models
// ~30x larger while one runaway job cannot take a 16 GiB node; 0 lifts the
// limit), and a job no call named for --job_ttl_s (1 h, far above the
// longest pull wait of 10 min) is dropped as an orphan. Trainers delete
// their jobs when an attempt ends; the TTL catches the ones they could not.
//
// Serves dtrain.kvstore.v1.KVStore and KVStoreData, the data port (--data_listen,
// --data_socket), dtrain.admin.Admin, gRPC
// health checking and reflection (see server.h). Resumes from the snapshot
// in --data_dir if there is one. SIGTERM or SIGINT: stops taking calls, lets
// calls in flight finish (--shutdown_grace_s), writes a final snapshot and
// exits 0 (1 if that snapshot failed). Exit status 2 for bad flags, 1 when
// the server cannot start (the reason on stderr).
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "libs/base/logging.h"
#include "libs/base/signals.h"
#include "libs/kvstore/malloc_tuning.h"
#include "libs/rpc/credential_flags.h"
#include "libs/rpc/server.h"
#include "libs/security/job_token.h"
#include "services/kvstore/server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7070", "gRPC address (port 0: any free port)");
ABSL_FLAG(std::string, data_dir, "", "snapshot directory (empty: no snapshots)");
ABSL_FLAG(int, shard_index, 0, "this shard's index in the clients' server list");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus /metrics address, e.g. :9100 (empty: no endpoint)");
ABSL_FLAG(double, snapshot_interval_s, 60, "seconds between snapshots (<= 0: only at shutdown)");
ABSL_FLAG(int64_t, quota_bytes_per_job, int64_t{4} << 30,
          "bytes a job may hold on this shard (0: no limit); an Init over it fails with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_jobs, 64,
          "jobs this shard holds at once (0: no limit); a CreateJob beyond it fails with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(double, job_ttl_s, 3600,
          "drop a job no call named for this many seconds (orphans of dead workers; "
          "<= 0: never)");
ABSL_FLAG(bool, callback_data, false,
          "serve the unary data calls (small pushes and pulls) on gRPC's callback API: no thread "
          "hand-off, and a pull waiting for its round holds no thread (unreplicated shards only)");
ABSL_FLAG(std::string, data_listen, "auto",
          "the data port's TCP address (Push, Pull and PushPull outside gRPC, mutual TLS unless "
          "--insecure; libs/kvstore/data_port.h); auto: the --listen host, any free port; "
          "empty: no TCP data port");
ABSL_FLAG(std::string, data_socket, "auto",
          "the data port's Unix socket for clients on this host (shared memory); auto: "
          "kvstore-<pid>-<n>.sock in a private directory of this uid ($XDG_RUNTIME_DIR/"
          "dtrain-kvstore or /tmp/dtrain-kvstore-<uid>); empty: none");
ABSL_FLAG(int, data_max_connections, 256,
          "data port connections served at once; more are refused (their clients use gRPC)");
ABSL_FLAG(int, data_max_connections_per_job, 128,
          "data port connections of one job (a trainer's token) at once, or 4 per trainer its "
          "token names if more; more are refused (their clients use gRPC), so one job cannot "
          "take them all (0: no cap)");
ABSL_FLAG(int, max_calls_per_job, 128,
          "gRPC calls of one job (a trainer's token) served at once, a held pull included, or 4 "
          "per trainer its token names if more; more fail with RESOURCE_EXHAUSTED, so one job "
          "cannot take every serving thread (256) from the others (0: no cap)");
ABSL_FLAG(int, replica_round_hold_us, 2000,
          "with --scheduler (replicated): microseconds a push-pull whose push completes no SYNC "
          "round waits for the round's last push, so that the round goes down the chain in one "
          "batch (0: every push goes alone)");
ABSL_FLAG(int, replica_spin_us, 0,
          "with --scheduler (replicated): microseconds a thread polls for the chain's reply or "
          "next batch before sleeping (saves a wakeup per hop; costs that much CPU); 0: never "
          "(small push-pulls are answered by the tail, so those waits are off their path)");
ABSL_FLAG(int64_t, max_message_bytes, 4 << 20, "gRPC send/receive limit per message");
ABSL_FLAG(double, shutdown_grace_s, 10, "seconds calls in flight get to finish at shutdown");
ABSL_FLAG(std::string, scheduler, "",
          "replicated shard: the scheduler (host:port) that owns the shard map; this server is "
          "replica --replica_index of shard --shard_index (empty: an unreplicated shard)");
ABSL_FLAG(int, replica_index, 0, "this replica's index within its shard (with --scheduler)");
ABSL_FLAG(int, num_shards, 1, "shards of the kvstore (with --scheduler)");
ABSL_FLAG(std::string, advertise, "",
          "host:port peers and clients dial (with --scheduler; default 127.0.0.1:<port>)");
ABSL_FLAG(std::string, cluster_secret_file, "",
          "the cluster secret (`trainctl certs init` writes cluster.secret): trainers' calls "
          "then need the kvstore token of the job they name (empty: not checked)");
ABSL_FLAG(std::string, health_listen, "",
          "a plain-text port that serves only gRPC health checking (grpc.health.v1), for "
          "probes that cannot speak mutual TLS (the kubelet's); empty: none");
ABSL_FLAG(std::string, port_file, "",
          "write the bound gRPC port here once serving (for scripts and tests)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("One shard of the dtrain kvstore (sharded parameter server).");
  absl::ParseCommandLine(argc, argv);
  dtrain::kvstore::TuneMallocForBulkTransfers();
  // Debian's Abseil is built with mutex deadlock detection on, which gRPC's
  // many short-lived mutexes pay for on every call.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status s = dtrain::rpc::UseCredentialsFromFlags("kvstore_server"); !s.ok()) {
    std::fprintf(stderr, "kvstore_server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  dtrain::kvstore::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.shard_index = absl::GetFlag(FLAGS_shard_index);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  if (!absl::GetFlag(FLAGS_cluster_secret_file).empty()) {
    absl::StatusOr<std::string> secret =
        dtrain::security::ReadClusterSecret(absl::GetFlag(FLAGS_cluster_secret_file));
    if (!secret.ok()) {
      std::fprintf(stderr, "kvstore_server: --cluster_secret_file: %s\n",
                   std::string(secret.status().message()).c_str());
      return 2;
    }
    options.job_token_secret = *secret;
  }
  options.snapshot_interval = absl::Seconds(absl::GetFlag(FLAGS_snapshot_interval_s));
  options.quota_bytes_per_job = absl::GetFlag(FLAGS_quota_bytes_per_job);
  options.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.callback_data = absl::GetFlag(FLAGS_callback_data);
  options.data_listen = absl::GetFlag(FLAGS_data_listen);
  options.data_socket = absl::GetFlag(FLAGS_data_socket);
  options.data_max_connections = absl::GetFlag(FLAGS_data_max_connections);
  options.data_max_connections_per_job = absl::GetFlag(FLAGS_data_max_connections_per_job);
  options.max_calls_per_job = absl::GetFlag(FLAGS_max_calls_per_job);
  options.replica_spin = absl::Microseconds(absl::GetFlag(FLAGS_replica_spin_us));
  options.replica_round_hold = absl::Microseconds(absl::GetFlag(FLAGS_replica_round_hold_us));
  options.job_ttl = absl::Seconds(absl::GetFlag(FLAGS_job_ttl_s));
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.replica_index = absl::GetFlag(FLAGS_replica_index);
  options.num_shards = absl::GetFlag(FLAGS_num_shards);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  if (options.shard_index < 0 || options.max_message_bytes <= 0 ||
      options.quota_bytes_per_job < 0 || options.max_jobs < 0 ||
      options.replica_round_hold < absl::ZeroDuration()) {
    std::fprintf(stderr,
                 "kvstore_server: --shard_index, --max_message_bytes, --quota_bytes_per_job, "
                 "--max_jobs and --replica_round_hold_us must not be negative\n");
    return 2;
  }

  dtrain::ShutdownSignal::Install();  // before Start: an early signal is not lost
  absl::StatusOr<std::unique_ptr<dtrain::kvstore::KVStoreServer>> server =
      dtrain::kvstore::KVStoreServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "kvstore_server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  // Probes: health only, plain text, SERVING while the shard serves.
  dtrain::rpc::ServerOptions probe_options;
  probe_options.service = "kvstore-health";
  probe_options.listen = absl::GetFlag(FLAGS_health_listen);
  probe_options.credentials = dtrain::rpc::Credentials::Insecure();
  dtrain::rpc::Server probe(probe_options);
  if (!probe_options.listen.empty()) {
    if (absl::Status s = probe.Start(); !s.ok()) {
      std::fprintf(stderr, "kvstore_server: --health_listen: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return dtrain::rpc::RunUntilShutdownSignal("kvstore_server", [&] {
    probe.Shutdown(absl::ZeroDuration());
    return (*server)->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_s)));
  });
}
