// scheduler_server: the dtrain job scheduler.
//
//   scheduler_server --listen=0.0.0.0:7000 --data_dir=/var/lib/dtrain-scheduler
//                    --metrics_listen=:9101 --heartbeat_timeout_s=10
//
// Serves dtrain.scheduler.v1.JobService (trainctl) and ClusterService
// (trainer daemons), gRPC health checking and reflection (see server.h).
// Jobs survive restarts through <data_dir>/jobs.wal. SIGTERM or SIGINT:
// stops taking calls, gives calls in flight --shutdown_grace_s and exits 0.
// Exit status 2 for bad flags, 1 when the server cannot start (the reason
// on stderr).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/base/logging.h"
#include "libs/base/signals.h"
#include "libs/rpc/credential_flags.h"
#include "libs/rpc/server.h"
#include "libs/scheduler/queue_config.h"
#include "libs/security/job_token.h"
#include "services/scheduler/server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7000", "gRPC address (port 0: any free port)");
ABSL_FLAG(std::string, data_dir, "", "where the job log lives (empty: jobs are not kept)");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus /metrics address, e.g. :9101 (empty: no endpoint)");
ABSL_FLAG(double, heartbeat_timeout_s, 10, "seconds without a heartbeat before a trainer is lost");
ABSL_FLAG(int, max_attempts, 5,
          "placements per job: a job whose trainer is lost is requeued (resuming from its newest "
          "checkpoint) until it has run this many times, then fails");
ABSL_FLAG(int, max_queued_jobs_per_user, 100,
          "QUEUED jobs a user may have; more submits are RESOURCE_EXHAUSTED (0: no limit)");
ABSL_FLAG(bool, recover_in_place, true,
          "when a trainer of a running job (ALLREDUCE or KVSTORE, CPU or CUDA) is lost and a free "
          "trainer exists, replace "
          "the lost rank within the same attempt (the survivors keep their state and send it to "
          "the replacement) instead of requeueing the job from its checkpoint");
ABSL_FLAG(absl::Duration, finished_job_retention, absl::Hours(7 * 24),
          "how long SUCCEEDED, FAILED and CANCELLED jobs are kept (e.g. 168h, 30m; inf: forever)");
ABSL_FLAG(double, kvstore_heartbeat_timeout_s, 2,
          "seconds without a heartbeat before a kvstore replica leaves its shard's chain");
ABSL_FLAG(int, kvstore_heartbeat_interval_ms, 200,
          "how often kvstore replicas heartbeat (told to them in every reply)");
ABSL_FLAG(double, shutdown_grace_s, 2, "seconds calls in flight get to finish at shutdown");
ABSL_FLAG(std::string, cluster_secret_file, "",
          "the cluster secret (`trainctl certs init` writes cluster.secret): KVSTORE "
          "assignments then carry a kvstore token the shards check (empty: none)");
ABSL_FLAG(std::string, health_listen, "",
          "a plain-text port that serves only gRPC health checking (grpc.health.v1), for "
          "probes that cannot speak mutual TLS (the kubelet's); empty: none");
ABSL_FLAG(std::string, queues, "",
          "a queues file (docs/queues.md): quotas per queue; empty: one queue, no quota");
ABSL_FLAG(int64_t, max_model_bytes, int64_t{512} << 20,
          "the largest model file (ONNX) trainctl submit --model_file may upload; larger ones "
          "are RESOURCE_EXHAUSTED (stored under <data_dir>/models)");
ABSL_FLAG(std::string, port_file, "",
          "write the bound gRPC port here once serving (for scripts and tests)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("The dtrain job scheduler.");
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status s = dtrain::rpc::UseCredentialsFromFlags("scheduler_server"); !s.ok()) {
    std::fprintf(stderr, "scheduler_server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  dtrain::scheduler::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  if (!absl::GetFlag(FLAGS_cluster_secret_file).empty()) {
    absl::StatusOr<std::string> secret =
        dtrain::security::ReadClusterSecret(absl::GetFlag(FLAGS_cluster_secret_file));
    if (!secret.ok()) {
      std::fprintf(stderr, "scheduler_server: --cluster_secret_file: %s\n",
                   std::string(secret.status().message()).c_str());
      return 2;
    }
    options.job_token_secret = *secret;
  }
  const double timeout_s = absl::GetFlag(FLAGS_heartbeat_timeout_s);
  if (!(timeout_s > 0)) {
    std::fprintf(stderr, "scheduler_server: --heartbeat_timeout_s must be > 0, got %g\n",
                 timeout_s);
    return 2;
  }
  options.heartbeat_timeout = absl::Seconds(timeout_s);
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  if (options.max_attempts < 1) {
    std::fprintf(stderr, "scheduler_server: --max_attempts must be >= 1, got %d\n",
                 options.max_attempts);
    return 2;
  }
  options.max_queued_jobs_per_user = absl::GetFlag(FLAGS_max_queued_jobs_per_user);
  options.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  if (options.max_model_bytes < 1) {
    std::fprintf(stderr, "scheduler_server: --max_model_bytes must be >= 1, got %lld\n",
                 static_cast<long long>(options.max_model_bytes));
    return 2;
  }
  options.recover_in_place = absl::GetFlag(FLAGS_recover_in_place);
  options.finished_job_retention = absl::GetFlag(FLAGS_finished_job_retention);
  if (options.finished_job_retention <= absl::ZeroDuration()) {
    std::fprintf(stderr, "scheduler_server: --finished_job_retention must be > 0, got %s\n",
                 absl::FormatDuration(options.finished_job_retention).c_str());
    return 2;
  }

  if (const std::string path = absl::GetFlag(FLAGS_queues); !path.empty()) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) {
      std::fprintf(stderr, "scheduler_server: cannot read --queues=%s: %s\n", path.c_str(),
                   std::strerror(errno));
      return 2;
    }
    absl::StatusOr<dtrain::scheduler::QueueConfig> queues =
        dtrain::scheduler::ParseQueueConfig(text.str());
    if (!queues.ok()) {
      std::fprintf(stderr, "scheduler_server: --queues=%s: %s\n", path.c_str(),
                   std::string(queues.status().message()).c_str());
      return 2;
    }
    options.queues = *std::move(queues);
    options.queues_yaml = text.str();
  }

  const double kv_timeout_s = absl::GetFlag(FLAGS_kvstore_heartbeat_timeout_s);
  const int kv_interval_ms = absl::GetFlag(FLAGS_kvstore_heartbeat_interval_ms);
  if (!(kv_interval_ms > 0) || !(kv_timeout_s * 1000 > kv_interval_ms)) {
    std::fprintf(stderr,
                 "scheduler_server: --kvstore_heartbeat_interval_ms must be > 0 and below "
                 "--kvstore_heartbeat_timeout_s, got %d ms and %g s\n",
                 kv_interval_ms, kv_timeout_s);
    return 2;
  }
  options.kvstore_heartbeat_interval = absl::Milliseconds(kv_interval_ms);
  options.kvstore_heartbeat_timeout = absl::Seconds(kv_timeout_s);

  if (!options.data_dir.empty() && mkdir(options.data_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "scheduler_server: cannot create --data_dir=%s: %s\n",
                 options.data_dir.c_str(), std::strerror(errno));
    return 1;
  }
  dtrain::ShutdownSignal::Install();  // before Start: an early signal is not lost
  auto server = dtrain::scheduler::SchedulerServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "scheduler_server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  // Probes: health only, plain text, SERVING while the scheduler serves.
  dtrain::rpc::ServerOptions probe_options;
  probe_options.service = "scheduler-health";
  probe_options.listen = absl::GetFlag(FLAGS_health_listen);
  probe_options.credentials = dtrain::rpc::Credentials::Insecure();
  dtrain::rpc::Server probe(probe_options);
  if (!probe_options.listen.empty()) {
    if (absl::Status s = probe.Start(); !s.ok()) {
      std::fprintf(stderr, "scheduler_server: --health_listen: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return dtrain::rpc::RunUntilShutdownSignal("scheduler_server", [&] {
    probe.Shutdown(absl::ZeroDuration());
    (*server)->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_s)));
    return absl::OkStatus();
  });
}
