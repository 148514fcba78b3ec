// The one job schema: how an assignment from the scheduler (a JobSpec, a
// rank and an attempt) becomes what this trainer runs. Every JobSpec field
// is mapped here and nowhere else: the train::JobConfig of RunJob, the
// devices the job uses, and the strategy by which its gradients cross
// trainers (libs/train/gradient_sync.h: "local", "allreduce",
// "nccl_allreduce", "kvstore_sync" or "kvstore_weights").
//
//   TrainerResources r;
//   r.devices = {"cpu"};
//   r.checkpoint_dir = "/shared/checkpoints";
//   DT_ASSIGN_OR_RETURN(JobPlan plan, PlanJob(assignment, r));
//   // connect what plan.strategy uses (plan.communicator_options,
//   // plan.kvstore_job), then:
//   DT_RETURN_IF_ERROR(train::RunJob(plan.config, &observer, &progress));
//
// Devices. A cpu job with devices_per_trainer k runs on cpu:0..cpu:k-1; a
// cuda job on the first k CUDA devices the trainer offers (an offered "cuda"
// is cuda:0). Too few is FAILED_PRECONDITION naming both sides.
//
// Gradients between trainers. KVSTORE mode: through the parameter server,
// one kvstore job per attempt ("<job>-a<attempt>"), every rank a worker:
// "kvstore_sync" (SYNCHRONOUS) or "kvstore_weights" (ASYNCHRONOUS,
// BOUNDED_DELAY: the server holds the weights). Otherwise, with several
// trainers: "nccl_allreduce" in device memory when the job is cuda with one
// device per trainer (unless the trainer says kTcp), else "allreduce" over
// TCP (CUDA gradients staged through host memory). One trainer: "local".
//
// Errors: INVALID_ARGUMENT naming the field ("assignment.rank: ...",
// "spec.<field>: ..." as scheduler::ValidateJobSpec words it) for an
// assignment that cannot run; FAILED_PRECONDITION when this trainer lacks
// what the job needs (devices, a parameter server); PERMISSION_DENIED for a
// spec.data_dir outside TrainerResources::data_roots. Thread-safe (pure).
#ifndef DTRAIN_LIBS_AGENT_JOB_PLAN_H_
#define DTRAIN_LIBS_AGENT_JOB_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/collective/communicator.h"
#include "libs/train/gradient_sync.h"
#include "libs/train/job.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace agent {

// Between the trainers of a CUDA job (the trainer's --cuda_collective).
enum class CudaCollective {
  kAuto,  // NCCL when each trainer has one GPU, else TCP through host memory
  kNccl,  // the same as kAuto
  kTcp,   // always TCP through host memory
};
// "auto", "nccl", "tcp"; INVALID_ARGUMENT for anything else.
absl::StatusOr<CudaCollective> ParseCudaCollective(absl::string_view name);

// What this trainer brings to every job (set from its flags).
struct TrainerResources {
  // The devices offered to the scheduler: "cpu", "cuda:0", ... ("cuda" is
  // cuda:0).
  std::vector<std::string> devices;
  // Where checkpoints go: <checkpoint_dir>/<job id>.ckpt.
  std::string checkpoint_dir;
  // The cache of users' model files (model_cache.h): a job with a
  // spec.model_digest "sha256:<hex>" trains <model_cache_dir>/<hex>
  // (config.model_file). Empty: such jobs are FAILED_PRECONDITION.
  std::string model_cache_dir;
  CudaCollective cuda_collective = CudaCollective::kAuto;
  // The address peers reach this trainer at for TCP allreduce (empty: the
  // host name).
  std::string collective_host;
  // Time limit of the rendezvous and of each allreduce.
  absl::Duration collective_timeout = absl::Seconds(60);
  // Whether the trainer can reach a parameter server (KVSTORE jobs).
  bool has_parameter_server = false;
  // Directories a job's spec.data_dir must be (or lie under): a job names
  // any path, and the trainer reads what it names. An absolute path without
  // ".." components is compared by its components (symbolic links under a
  // root are followed as they are). The default: Debian's datasets.
  std::vector<std::string> data_roots = {"/usr/share/datasets"};
};

struct JobPlan {
  // Everything RunJob needs except the connections: config.communicator and
  // config.kvstore are null; the caller connects what the strategy uses.
  train::JobConfig config;
  // How the job's gradients cross trainers (libs/train/gradient_sync.h; one
  // of its registered strategies, never null in a plan): "local" (one
  // trainer), "allreduce" (a communicator over TCP, host buffers),
  // "nccl_allreduce" (a communicator over NCCL, device buffers),
  // "kvstore_sync" or "kvstore_weights" (the parameter server). It also says
  // how the job lives through a lost trainer.
  const train::SyncStrategy* strategy = nullptr;
  // Strategies that use a communicator: the one to create for (config.rank,
  // config.world_size) through the attempt's rendezvous store (NCCL: on the
  // job's one CUDA device, cuda_device). Kvstore strategies: the host
  // communicator a regroup (or a joiner) exchanges the state over.
  collective::CommunicatorOptions communicator_options;
  // Kvstore strategies: the parameter-server job of this attempt;
  // config.rank is the worker.
  std::string kvstore_job;
  // Its capability (Assignment.kvstore_token).
  std::string kvstore_token;
};

// Maps an assignment to the plan of this trainer's share (see the file
// comment). Zero spec values mean the documented defaults
// (scheduler::ApplyDefaults).
absl::StatusOr<JobPlan> PlanJob(const scheduler::v1::Assignment& assignment,
                                const TrainerResources& resources);

}  // namespace agent
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AGENT_JOB_PLAN_H_
