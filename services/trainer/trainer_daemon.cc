// trainer: the trainer daemon. Registers with the scheduler, heartbeats,
// and trains the jobs the scheduler assigns to it.
//
//   trainer --scheduler=scheduler:7000 --checkpoint_dir=/shared/checkpoints
//
// The trainer's life (register, heartbeat, run the assigned job on its own
// thread, report, cancel, shut down) is libs/agent's Agent (agent.h), and
// how a JobSpec becomes the job it runs (devices, NCCL or TCP, the kvstore)
// is its PlanJob (job_plan.h). This file holds the flags and main and what
// needs the network or Prometheus: the gRPC ClusterClient
// (grpc_cluster_client.h), the kvstore client and the Prometheus metrics
// (trainer_metrics.h).
//
// One job at a time. Progress goes to the scheduler with ReportProgress
// (at most once a second between epochs, and after every epoch with its
// accuracies).
//
// The training itself is libs/train's RunJob (job.h): this rank's shard of
// the training set (global_batch_size / world_size samples per step), the
// data-parallel step over devices_per_trainer devices (cpu:0..cpu:k-1 with
// threads/k kernel threads each, or the trainer's CUDA devices), or a
// hybridized step; rank 0 evaluates test accuracy after every epoch and
// every checkpoint_interval_epochs saves replica 0's parameters, buffers and
// momentum to <checkpoint_dir>/<job>.ckpt (atomically replaced; kept after
// the job). The epoch loss and training accuracy are averaged over the
// ranks (rank 0's share in ASYNCHRONOUS / BOUNDED_DELAY kvstore jobs; the
// running loss between epochs is rank 0's). Across trainers (the agent
// connects them): the trainers of a multi-trainer job meet through the scheduler's
// rendezvous store (SchedulerStore, keyed by job and attempt) and allreduce
// gradients over TCP (--collective_host is the address peers connect to),
// or, in KVSTORE mode, push and pull every gradient bucket through the
// kvstore shards given by --kvstore; rank 0 reports progress and each
// checkpoint to the scheduler. Cancellation takes effect at the next step;
// a rank that stops closes its communicator, which makes its peers' next
// allreduce fail at once, so all ranks stop within about a step; a rank
// whose peer failed reports a retryable failure and the scheduler requeues
// the job. A kvstore shard that dies fails the kvstore calls that need it
// within --kvstore_unavailable_timeout_s (5 s; the rank reports a retryable
// failure); the other ranks, which may wait on a live shard for a round that
// never completes, are cancelled by the scheduler at their next heartbeat,
// which also cancels their kvstore calls. When a rank's attempt ends its
// kvstore job is left (SUCCEEDED) or deleted. Every call to the scheduler
// has the deadline --rpc_timeout_s. A job of a user's model file
// (JobSpec.model_digest) trains <work_dir>/models/<hex>: fetched from the
// scheduler (ClusterService.GetModel) when missing, verified against the
// digest before every use (libs/agent/model_cache.h).
//
// Resume. When the scheduler places a job again after a lost trainer, the
// assignment names the newest checkpoint: every rank loads it (so
// --checkpoint_dir must be a directory all trainers share: a shared volume
// on Kubernetes, <cluster>/checkpoints for `trainctl cluster up`) and
// training continues with the epoch after the one it holds, with the same
// data order as an undisturbed run. A checkpoint that cannot be read fails
// the job with the reason. What restarts: in ASYNCHRONOUS / BOUNDED_DELAY
// kvstore jobs the shards' momentum (the weights come from the checkpoint);
// in hybridized jobs the compiled plan's momentum buffers.
//
// sync_batch_norm: batch norm normalizes over the global batch of every
// device and trainer (DataParallelOptions::sync_batch_norm).
//
// CUDA jobs use the first devices_per_trainer CUDA devices the trainer
// offers (--devices; by default every CUDA device found). Between trainers
// with one GPU each the gradients are allreduced by NCCL in device memory
// (the NCCL unique id travels through the scheduler's rendezvous store);
// otherwise CUDA gradients are staged through host memory and allreduced
// over TCP (--cuda_collective=tcp forces that). NOT YET RUN ON A GPU: the
// CUDA paths are built and their tests (tools/gpu-check) skip without one.
//
// Each epoch reports the training accuracy (predictions made during the
// epoch's steps, before each update) and the epoch's wall time.
//
// When the scheduler forgets the trainer (restart, or it was declared lost)
// the daemon registers again. SIGTERM or SIGINT drains (libs/agent/agent.h):
// the scheduler places no new work here, the running job stops at a step
// all its ranks agree on, rank 0 checkpoints it, it is reported drained and
// the scheduler resumes it elsewhere; then the daemon exits 0. A drain
// taking longer than --drain_timeout_s (0: do not drain) stops the job at
// its next step instead (FAILED, retryable: "trainer shutting down"; the
// scheduler requeues it from its newest checkpoint); a second signal
// exits at once. Kubernetes: terminationGracePeriodSeconds must cover
// --drain_timeout_s (k8s/base/trainer.yaml). Exit status 2 for bad flags.
//
// Observability. --metrics_listen (e.g. :9402) serves Prometheus /metrics:
//   dtrain_trainer_busy                  gauge, 1 while a job runs
//   dtrain_trainer_steps_total           counter {job_id, rank}
//   dtrain_trainer_step_seconds          histogram {job_id, rank, phase}, phase:
//     data_wait      time Next() waited for the loader's batch
//     communication  the comm queue's reduction work in the step
//                    (DataParallelTrainer::last_comm_work_seconds(); its wait
//                    for buckets is idle time and not counted). Reductions
//                    overlap backward, so this is an upper bound of the time
//                    communication cost the step.
//     compute        the rest of the step's wall time (never negative).
//     (train::StepTimes; a single-device job's communication is 0.)
//   dtrain_trainer_step_phase_seconds    histogram {job_id, rank, phase}: each
//     step cut into contiguous phases data_wait, forward_backward, comm_wait
//     (end of backward -> last bucket reduced), optimizer
//     (libs/train/step_phases.h)
//   dtrain_trainer_samples_total         counter {job_id, rank}, and
//   dtrain_trainer_samples_per_second    gauge {job_id, rank}: this rank's,
//     over its last 32 steps
//   dtrain_trainer_device_memory_bytes   gauge {device, state}: the job's devices'
//     allocators, state in_use / peak (since the job started) / cached;
//     updated about once a second while a job runs
//   dtrain_job_loss, dtrain_job_test_accuracy (-1 until the first epoch
//   ends; only rank 0 evaluates), dtrain_job_samples_per_second (the whole
//   job's), dtrain_job_epoch (epochs done), dtrain_job_achieved_flops (model
//   FLOPs per second of the whole job: libs/graph/flops.h per sample times
//   samples per second) and dtrain_job_mfu (that over every rank's measured
//   peak: --peak_gflops_per_thread)   gauges {job_id, rank}
// The series of a job stay until the next job starts (one job's worth of
// series at a time). --health_listen (e.g. :9403) serves grpc.health.v1,
// reflection and Admin.Ping only, SERVING while the daemon runs, and /metrics
// also has the calls to them (dtrain_rpc_server_*, libs/rpc/server.h: the
// scaffold every service shares); --metrics_port_file and --health_port_file
// receive the bound ports (for tests with port 0).
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "libs/agent/agent.h"
#include "libs/agent/job_plan.h"
#include "libs/base/logging.h"
#include "libs/base/signals.h"
#include "libs/base/status.h"
#include "libs/cuda/devices.h"
#include "libs/kvstore/client.h"
#include "libs/ops/peak.h"
#include "libs/rpc/credential_flags.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/server.h"
#include "services/trainer/grpc_cluster_client.h"
#include "services/trainer/trainer_metrics.h"

ABSL_FLAG(std::string, scheduler, "",
          "scheduler address host:port (default: $DTRAIN_SCHEDULER, else 127.0.0.1:7000)");
ABSL_FLAG(std::string, name, "", "this trainer's name for people (default: the host name)");
ABSL_FLAG(std::string, devices, "auto",
          "devices to offer: auto (every CUDA device found, else cpu, with a log line saying "
          "which), cuda (every CUDA device; an error without one), or a list: cpu, cpu:0,cpu:1, "
          "cuda:0,cuda:1, ...");
ABSL_FLAG(std::string, work_dir, "", "scratch directory (default: /tmp/dtrain-trainer-<pid>)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where jobs' checkpoints go; share it between trainers so a job can resume on another "
          "trainer (default: --work_dir)");
ABSL_FLAG(double, rpc_timeout_s, 5, "deadline of each call to the scheduler");
ABSL_FLAG(double, drain_timeout_s, 60,
          "on SIGTERM, how long the running job may take to drain (finish its step, "
          "checkpoint, report) before it is stopped; 0: stop it at once");
ABSL_FLAG(std::string, collective_host, "",
          "address other trainers reach this one at for allreduce (default: the host name)");
ABSL_FLAG(std::string, kvstore, "",
          "kvstore shard addresses host:port,... in shard order (for KVSTORE-mode jobs)");
ABSL_FLAG(std::string, data_roots, "/usr/share/datasets",
          "directories a job's data_dir may name (comma-separated; the job names the path, this "
          "trainer reads it): a data_dir outside them fails the job with PERMISSION_DENIED");
ABSL_FLAG(int, kvstore_replicas, 1,
          "replicas per kvstore shard; > 1: --kvstore lists every replica, shard-major (shard i "
          "replica j at index i * R + j), and the trainer follows the shard map they serve");
ABSL_FLAG(double, kvstore_unavailable_timeout_s, 5,
          "how long a kvstore shard may stay unreachable before the job's kvstore calls fail "
          "(the job then fails retryably); bounds failure detection of a dead shard");
ABSL_FLAG(std::string, kvstore_data_path, "auto",
          "how KVSTORE jobs' pushes and pulls travel: auto (the shards' data port: Unix socket and "
          "shared memory for a shard on this host, else TCP with mutual TLS; gRPC for a shard "
          "without one), tcp (the data port over TCP only), grpc");
ABSL_FLAG(std::string, cuda_collective, "auto",
          "between trainers of CUDA jobs: auto (NCCL when each trainer has one GPU, else TCP with "
          "gradients staged through host memory), nccl (the same), or tcp");
ABSL_FLAG(double, collective_timeout_s, 60,
          "time limit of the rendezvous and of each allreduce of multi-trainer jobs");
ABSL_FLAG(double, peak_gflops_per_thread, -1,
          "the peak GFLOP/s of one CPU kernel thread for jobs' MFU; -1: measure it at start (an "
          "f32 GEMM, libs/ops/peak.h; about 0.1 s on a quiet machine, more on a busy one, which "
          "then reads low; once per host and boot, shared by this uid's trainers through "
          "$XDG_RUNTIME_DIR/dtrain or /tmp/dtrain-<uid>, except a figure measured while other "
          "processes held the cores, which the next trainer measures again), 0: report no MFU");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus /metrics address, e.g. :9402 or 127.0.0.1:0 (empty: no endpoint)");
ABSL_FLAG(std::string, health_listen, "",
          "gRPC health-checking (grpc.health.v1) address, e.g. :9403, plain text (it serves no "
          "API; the kubelet's probes cannot speak mutual TLS) (empty: none)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the bound metrics port is written to this file");
ABSL_FLAG(std::string, health_port_file, "",
          "if set, the bound health port is written to this file");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("The dtrain trainer daemon: trains the jobs the scheduler assigns.");
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status s = dtrain::rpc::UseCredentialsFromFlags("trainer"); !s.ok()) {
    std::fprintf(stderr, "trainer: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  std::string address = absl::GetFlag(FLAGS_scheduler);
  if (address.empty()) {
    const char* env = std::getenv("DTRAIN_SCHEDULER");
    address = env != nullptr && *env ? env : "127.0.0.1:7000";
  }
  std::vector<std::string> devices;
  const std::string requested = absl::GetFlag(FLAGS_devices);
  if (requested == "auto" || requested == "cuda") {
    // One log line says which devices and why (no CUDA device: cpu).
    absl::StatusOr<std::vector<dtrain::Device>> chosen = dtrain::cuda::ChooseDevices(requested);
    if (!chosen.ok()) {
      std::fprintf(stderr, "trainer: --devices=%s: %s\n", requested.c_str(),
                   std::string(chosen.status().message()).c_str());
      return 2;
    }
    for (const dtrain::Device& d : *chosen) devices.push_back(d.ToString());
  } else {
    devices = absl::StrSplit(requested, ',', absl::SkipWhitespace());
  }
  if (devices.empty()) {
    std::fprintf(stderr, "trainer: --devices must name at least one device\n");
    return 2;
  }
  const double timeout_s = absl::GetFlag(FLAGS_rpc_timeout_s);
  if (!(timeout_s > 0)) {
    std::fprintf(stderr, "trainer: --rpc_timeout_s must be > 0\n");
    return 2;
  }
  const double kv_unavailable_s = absl::GetFlag(FLAGS_kvstore_unavailable_timeout_s);
  if (!(kv_unavailable_s > 0)) {
    std::fprintf(stderr, "trainer: --kvstore_unavailable_timeout_s must be > 0\n");
    return 2;
  }
  std::string name = absl::GetFlag(FLAGS_name);
  if (name.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    name = host;
  }
  std::string work_dir = absl::GetFlag(FLAGS_work_dir);
  if (work_dir.empty()) work_dir = absl::StrCat("/tmp/dtrain-trainer-", getpid());
  if (access(work_dir.c_str(), W_OK) != 0 && mkdir(work_dir.c_str(), 0755) != 0) {
    std::fprintf(stderr, "trainer: cannot use --work_dir=%s\n", work_dir.c_str());
    return 2;
  }
  dtrain::ShutdownSignal& shutdown = dtrain::ShutdownSignal::Install();
  DT_LOG(INFO) << "trainer " << name << " with devices " << absl::StrJoin(devices, ",")
               << "; scheduler at " << address;
  const double collective_timeout_s = absl::GetFlag(FLAGS_collective_timeout_s);
  if (!(collective_timeout_s > 0)) {
    std::fprintf(stderr, "trainer: --collective_timeout_s must be > 0\n");
    return 2;
  }
  dtrain::trainer::TrainerMetrics metrics;
  // /metrics, and a gRPC server with health, reflection and Admin.Ping only
  // (the kubelet's grpc probes): the services' common scaffold.
  dtrain::rpc::ServerOptions server_options;
  server_options.service = "trainer";
  server_options.listen = absl::GetFlag(FLAGS_health_listen);
  server_options.port_file = absl::GetFlag(FLAGS_health_port_file);
  server_options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  server_options.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  // Plain text: the port serves no API (health, reflection, Admin.Ping), and
  // the kubelet's gRPC probes cannot speak mutual TLS.
  server_options.credentials = dtrain::rpc::Credentials::Insecure();
  dtrain::rpc::Server server(server_options);
  server.Expose(metrics.registry());
  if (!server_options.listen.empty() || !server_options.metrics_listen.empty()) {
    if (absl::Status started = server.Start(); !started.ok()) {
      std::fprintf(stderr, "trainer: %s\n", started.ToString().c_str());
      return 2;
    }
  }
  dtrain::agent::AgentOptions options;
  options.name = name;
  if (double peak = absl::GetFlag(FLAGS_peak_gflops_per_thread); peak >= 0) {
    options.cpu_peak_flops_per_thread = peak * 1e9;
  } else {
    // Once per host: trainers that start together would measure each other.
    bool from_cache = false;
    absl::StatusOr<double> measured =
        dtrain::ops::HostGemmPeakFlops({.reps = 5, .threads = 1}, "", &from_cache);
    if (measured.ok()) {
      options.cpu_peak_flops_per_thread = *measured;
      DT_LOG(INFO) << (from_cache ? "CPU peak (measured on this host since boot): "
                                  : "measured CPU peak: ")
                   << *measured / 1e9
                   << " GFLOP/s per thread (f32 GEMM; --peak_gflops_per_thread overrides)";
    } else {
      DT_LOG(WARNING) << "no CPU peak, so no MFU: " << measured.status();
    }
  }
  options.resources.devices = devices;
  options.resources.collective_host = absl::GetFlag(FLAGS_collective_host);
  options.resources.data_roots =
      absl::StrSplit(absl::GetFlag(FLAGS_data_roots), ',', absl::SkipEmpty());
  options.resources.collective_timeout = absl::Seconds(collective_timeout_s);
  {
    std::vector<std::string> kv;
    for (absl::string_view a :
         absl::StrSplit(absl::GetFlag(FLAGS_kvstore), ',', absl::SkipEmpty())) {
      kv.emplace_back(a);
    }
    const int replicas = absl::GetFlag(FLAGS_kvstore_replicas);
    const absl::StatusOr<dtrain::kvstore::DataPath> data_path =
        dtrain::kvstore::ParseDataPath(absl::GetFlag(FLAGS_kvstore_data_path));
    if (!data_path.ok()) {
      std::fprintf(stderr, "trainer: --kvstore_data_path: %s\n",
                   std::string(data_path.status().message()).c_str());
      return 2;
    }
    if (replicas < 1 || kv.size() % static_cast<size_t>(replicas) != 0) {
      std::fprintf(stderr,
                   "trainer: --kvstore lists %zu addresses, not --kvstore_replicas=%d replicas of "
                   "each shard\n",
                   kv.size(), replicas);
      return 2;
    }
    if (!kv.empty()) {
      // Gradients of KVSTORE jobs go through the shards: one kvstore job per
      // attempt, every trainer a worker.
      options.connect_parameter_server = [kv, replicas, kv_unavailable_s, data_path = *data_path](
                                             const std::string& job, int worker,
                                             const std::string& token)
          -> absl::StatusOr<std::unique_ptr<dtrain::kvstore::ParameterServer>> {
        dtrain::kvstore::ClientOptions ko;
        ko.servers = kv;
        ko.replicas = replicas;
        ko.job = job;
        ko.worker = worker;
        ko.token = token;
        ko.unavailable_timeout = absl::Seconds(kv_unavailable_s);
        ko.data_path = data_path;
        DT_ASSIGN_OR_RETURN(std::unique_ptr<dtrain::kvstore::KVClient> client,
                            dtrain::kvstore::KVClient::Connect(ko));
        DT_LOG(INFO) << "kvstore job " << job << " worker " << worker << ": synchronizing through "
                     << kv.size() / static_cast<size_t>(replicas) << " kvstore shards"
                     << (replicas > 1 ? absl::StrCat(" of ", replicas, " replicas") : "");
        return client;
      };
    }
  }
  std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (checkpoint_dir.empty()) checkpoint_dir = work_dir;
  if (access(checkpoint_dir.c_str(), W_OK) != 0 && mkdir(checkpoint_dir.c_str(), 0755) != 0) {
    std::fprintf(stderr, "trainer: cannot use --checkpoint_dir=%s\n", checkpoint_dir.c_str());
    return 2;
  }
  options.resources.checkpoint_dir = checkpoint_dir;
  // Users' model files, by digest (libs/agent/model_cache.h).
  options.resources.model_cache_dir = work_dir + "/models";
  const std::string cuda_collective = absl::GetFlag(FLAGS_cuda_collective);
  absl::StatusOr<dtrain::agent::CudaCollective> parsed =
      dtrain::agent::ParseCudaCollective(cuda_collective);
  if (!parsed.ok()) {
    std::fprintf(stderr, "trainer: --cuda_collective must be auto, nccl or tcp, got %s\n",
                 cuda_collective.c_str());
    return 2;
  }
  options.resources.cuda_collective = *parsed;
  dtrain::trainer::GrpcClusterClient cluster(dtrain::rpc::NewChannel(address),
                                             absl::Seconds(timeout_s));
  dtrain::agent::Agent agent(&cluster, std::move(options), &metrics);
  // SIGTERM / SIGINT: the agent drains its job (at most drain_timeout),
  // reports it and returns.
  const absl::Duration drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  absl::Notification ran;
  std::thread on_signal([&shutdown, &agent, &ran, drain_timeout] {
    shutdown.Wait();
    if (drain_timeout > absl::ZeroDuration()) {
      DT_LOG(INFO) << "draining (at most " << drain_timeout << ")";
      agent.Drain();
      if (ran.WaitForNotificationWithTimeout(drain_timeout)) return;
      DT_LOG(WARNING) << "the drain took longer than " << drain_timeout << "; stopping the job";
    }
    agent.Shutdown();
  });
  agent.Run();
  ran.Notify();
  on_signal.join();
  server.Shutdown(absl::Seconds(1));
  DT_LOG(INFO) << "trainer exiting with status 0";
  return 0;
}
