#include "libs/agent/job_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/base/status.h"
#include "libs/data/data_spec.h"
#include "libs/scheduler/spec.h"
#include "libs/security/job_token.h"

namespace dtrain {
namespace agent {
namespace {

namespace v1 = scheduler::v1;

// The job's devices: cpu:0..k-1, or the first k CUDA devices offered.
absl::StatusOr<std::vector<Device>> ChooseDevices(const v1::JobSpec& spec,
                                                  const TrainerResources& r) {
  const int k = spec.devices_per_trainer();
  std::vector<Device> devices;
  if (spec.device_kind() == "cpu") {
    for (int i = 0; i < k; ++i) devices.push_back(Device::Cpu(i));
    return devices;
  }
  for (const std::string& d : r.devices) {
    if (static_cast<int>(devices.size()) == k) break;
    if (!absl::StartsWith(d, "cuda")) continue;
    absl::StatusOr<Device> parsed = Device::Parse(d == "cuda" ? "cuda:0" : d);
    if (!parsed.ok()) return Annotate(parsed.status(), "this trainer's devices");
    devices.push_back(*parsed);
  }
  if (static_cast<int>(devices.size()) < k) {
    return absl::FailedPreconditionError(absl::StrCat("the job needs ", k, " ", spec.device_kind(),
                                                      " devices; this trainer has ",
                                                      absl::StrJoin(r.devices, ",")));
  }
  return devices;
}

// The registered strategy `name` (libs/train/sync/, linked with //libs/train:job).
absl::StatusOr<const train::SyncStrategy*> Strategy(absl::string_view name) {
  const train::SyncStrategy* s = train::FindSyncStrategy(name);
  if (s == nullptr) {
    return absl::InternalError(absl::StrCat("no sync strategy \"", name, "\" is registered"));
  }
  return s;
}

}  // namespace

absl::StatusOr<CudaCollective> ParseCudaCollective(absl::string_view name) {
  if (name == "auto") return CudaCollective::kAuto;
  if (name == "nccl") return CudaCollective::kNccl;
  if (name == "tcp") return CudaCollective::kTcp;
  return absl::InvalidArgumentError(
      absl::StrCat("cuda collective must be auto, nccl or tcp, got ", scheduler::Quote(name)));
}

namespace {

// OK if `dir` (a job's data_dir) is one of `roots` or lies under one.
absl::Status CheckDataDir(const std::string& dir, const std::vector<std::string>& roots) {
  const std::string listed = roots.empty() ? "none" : absl::StrJoin(roots, ", ");
  auto denied = [&](absl::string_view why) {
    return absl::PermissionDeniedError(
        absl::StrCat("spec.data_dir: '", dir, "' ", why,
                     "; this trainer reads data only under its --data_roots (", listed, ")"));
  };
  if (dir.empty() || dir[0] != '/') return denied("is not an absolute path");
  std::vector<absl::string_view> parts = absl::StrSplit(dir, '/', absl::SkipEmpty());
  for (absl::string_view p : parts) {
    if (p == ".." || p == ".") return denied("has '.' or '..' components");
  }
  for (const std::string& root : roots) {
    std::vector<absl::string_view> rp = absl::StrSplit(root, '/', absl::SkipEmpty());
    if (rp.size() <= parts.size() && std::equal(rp.begin(), rp.end(), parts.begin())) {
      return absl::OkStatus();
    }
  }
  return denied("is outside them");
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(const v1::Assignment& a, const TrainerResources& r) {
  if (a.job_id().empty()) return absl::InvalidArgumentError("assignment.job_id: required");
  if (a.world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment.world_size: must be >= 1, got ", a.world_size()));
  }
  if (a.rank() < 0 || a.rank() >= a.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment.rank: must be in 0..", a.world_size() - 1, ", got ", a.rank()));
  }
  if (a.attempt() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment.attempt: must be >= 0, got ", a.attempt()));
  }
  if (absl::Status s = scheduler::ValidateJobSpec(a.spec()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }
  v1::JobSpec spec = a.spec();
  scheduler::ApplyDefaults(&spec);
  // An elastic job's ranks keep the batch of its placement whatever the
  // membership (train::JobConfig::local_batch_size).
  const bool elastic =
      spec.min_trainers() < spec.num_trainers() || spec.max_trainers() > spec.num_trainers();
  if (!elastic && spec.global_batch_size() % a.world_size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.global_batch_size: must be divisible by assignment.world_size (",
                     a.world_size(), "), got ", spec.global_batch_size()));
  }

  JobPlan plan;
  train::JobConfig& c = plan.config;
  c.name = a.job_id();
  c.model = spec.model();
  if (!spec.model_digest().empty()) {  // its form checked by ValidateJobSpec above
    if (r.model_cache_dir.empty()) {
      return absl::FailedPreconditionError(
          "spec.model_digest: this trainer has no model cache directory for model files");
    }
    c.model = spec.model_digest();
    c.model_file = absl::StrCat(r.model_cache_dir, "/",
                                spec.model_digest().substr(spec.model_digest().find(':') + 1));
  }
  if (!spec.data_dir().empty()) DT_RETURN_IF_ERROR(CheckDataDir(spec.data_dir(), r.data_roots));
  c.data_dir = spec.data_dir();
  if (spec.has_data()) {  // checked by ValidateJobSpec above
    DT_ASSIGN_OR_RETURN(c.data, data::DataConfigFromSpec(spec.data()));
    DT_RETURN_IF_ERROR(data::CheckDataRoots(c.data, r.data_roots));
  }
  c.epochs = spec.epochs();
  c.global_batch_size = spec.global_batch_size();
  if (elastic) c.local_batch_size = spec.global_batch_size() / spec.num_trainers();
  c.sgd = {.lr = static_cast<float>(spec.lr()),
           .momentum = static_cast<float>(spec.momentum()),
           .weight_decay = static_cast<float>(spec.weight_decay())};
  c.init = spec.init();
  c.seed = spec.seed();
  c.threads = spec.threads();
  c.bucket_bytes = spec.bucket_bytes();
  c.train_limit = spec.train_limit();
  c.test_limit = spec.test_limit();
  c.hybridize = spec.hybridize();
  c.sync_batch_norm = spec.sync_batch_norm();
  c.checkpoint_interval_epochs = spec.checkpoint_interval_epochs();
  c.keep_epoch_checkpoints = spec.keep_epoch_checkpoints();
  c.rank = a.rank();
  c.world_size = a.world_size();
  c.checkpoint_path = absl::StrCat(r.checkpoint_dir, "/", a.job_id(), ".ckpt");
  c.checkpoint_metadata = {{"job_id", a.job_id()}, {"attempt", absl::StrCat(a.attempt())}};
  c.resume_from = a.resume_checkpoint();
  DT_ASSIGN_OR_RETURN(c.devices, ChooseDevices(spec, r));

  if (spec.sync().mode() == v1::KVSTORE) {
    if (!r.has_parameter_server) {
      return absl::FailedPreconditionError(
          "sync mode KVSTORE, but this trainer was started without --kvstore servers");
    }
    switch (spec.sync().consistency()) {
      case v1::ASYNCHRONOUS:
        c.kvstore_consistency = kvstore::Consistency::kAsync;
        break;
      case v1::BOUNDED_DELAY:
        c.kvstore_consistency = kvstore::Consistency::kBoundedDelay;
        c.kvstore_max_staleness = spec.sync().max_staleness();
        break;
      default:
        c.kvstore_consistency = kvstore::Consistency::kSync;
    }
    DT_ASSIGN_OR_RETURN(plan.strategy, Strategy(c.kvstore_consistency == kvstore::Consistency::kSync
                                                    ? "kvstore_sync"
                                                    : "kvstore_weights"));
    // A generation after a recovery in place meets in a kvstore job of its
    // own (its token names it) in synchronous rounds; with kvstore-held
    // weights every generation trains in the attempt's (a replacement
    // continues the lost worker's rounds there).
    const bool rounds = c.kvstore_consistency == kvstore::Consistency::kSync;
    plan.kvstore_job =
        security::KvstoreJobName(a.job_id(), a.attempt(), rounds ? a.generation() : 0);
    plan.kvstore_token = a.kvstore_token();
    // Validated at submit (libs/scheduler/spec.cc); a spec from elsewhere
    // that names no known compression fails the job here.
    absl::StatusOr<kvstore::CompressionSpec> compression =
        kvstore::ParseCompression(spec.sync().gradient_compression());
    if (!compression.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sync.gradient_compression: ", compression.status().message()));
    }
    c.kvstore_compression = *compression;
    // A recovery in place exchanges the survivors' state over a host
    // communicator (the rounds continue in the kvstore).
    collective::CommunicatorOptions& co = plan.communicator_options;
    co.transport = collective::TransportKind::kTcp;
    co.timeout = r.collective_timeout;
    co.key_prefix = "regroup";
    co.tcp.host = r.collective_host;
    co.tcp.secret = a.collective_secret();
    return plan;
  }
  if (a.world_size() == 1) {
    DT_ASSIGN_OR_RETURN(plan.strategy, Strategy("local"));
    return plan;
  }

  const bool cuda = spec.device_kind() == "cuda";
  const bool nccl =
      cuda && spec.devices_per_trainer() == 1 && r.cuda_collective != CudaCollective::kTcp;
  DT_ASSIGN_OR_RETURN(plan.strategy, Strategy(nccl ? "nccl_allreduce" : "allreduce"));
  collective::CommunicatorOptions& co = plan.communicator_options;
  co.transport = nccl ? collective::TransportKind::kNccl : collective::TransportKind::kTcp;
  if (nccl) co.cuda_device = c.devices[0].index;
  co.timeout = r.collective_timeout;
  co.key_prefix = "allreduce";
  co.tcp.host = r.collective_host;
  co.tcp.secret = a.collective_secret();
  co.tcp.tls = spec.collective_tls();
  return plan;
}

}  // namespace agent
}  // namespace dtrain
