#include "libs/scheduler/spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/status.h"
#include "libs/data/data_spec.h"
#include "libs/kvstore/types.h"
#include "libs/scheduler/model_store.h"

namespace dtrain {
namespace scheduler {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", reason));
}

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

std::string Quote(absl::string_view value) {
  constexpr size_t kShown = 64;
  if (value.size() <= kShown) return absl::StrCat("'", value, "'");
  return absl::StrCat("'", value.substr(0, kShown), "...' (", value.size(), " bytes)");
}

absl::Status ValidateJobSpec(const JobSpec& s) {
  if (s.name().empty()) return Bad("name", "required");
  if (s.data_dir().size() > 4096) {
    return Bad("data_dir", absl::StrCat("at most 4096 bytes, got ", s.data_dir().size()));
  }
  if (!s.data_dir().empty() && s.data_dir()[0] != '/') {
    return Bad("data_dir", absl::StrCat(Quote(s.data_dir()),
                                        " is a relative path; give an absolute path (the "
                                        "trainers resolve it on their own machines)"));
  }
  if (s.has_data()) DT_RETURN_IF_ERROR(data::DataConfigFromSpec(s.data()).status());
  if (s.name().size() > 63) {
    return Bad("name", absl::StrCat("at most 63 characters, got ", s.name().size()));
  }
  for (char c : s.name()) {
    if (!NameChar(c)) {
      return Bad("name",
                 absl::StrCat("only letters, digits, '.', '_' and '-', got ", Quote(s.name())));
    }
  }
  if (!s.model_digest().empty()) {
    if (!s.model().empty()) {
      return Bad("model", absl::StrCat("give either model (a built-in: mlp, lenet or resnet18) or "
                                       "model_digest (your own model file), not both; got ",
                                       Quote(s.model()), " and a model_digest"));
    }
    DT_RETURN_IF_ERROR(ValidateModelDigest(s.model_digest(), "model_digest"));
  } else if (s.model() != "mlp" && s.model() != "lenet" && s.model() != "resnet18") {
    return Bad("model", absl::StrCat("must be mlp, lenet or resnet18 (or give model_digest: your "
                                     "own model file), got ",
                                     Quote(s.model())));
  }
  if (s.epochs() < 1 || s.epochs() > 10000) {
    return Bad("epochs", absl::StrCat("must be in 1..10000, got ", s.epochs()));
  }
  if (s.num_trainers() < 0 || s.num_trainers() > 1024) {
    return Bad("num_trainers", absl::StrCat("must be in 1..1024 (0 = 1), got ", s.num_trainers()));
  }
  const int trainers = s.num_trainers() == 0 ? 1 : s.num_trainers();
  if (s.devices_per_trainer() < 0 || s.devices_per_trainer() > 64) {
    return Bad("devices_per_trainer",
               absl::StrCat("must be in 1..64 (0 = 1), got ", s.devices_per_trainer()));
  }
  if (s.global_batch_size() <= 0 || s.global_batch_size() > (int64_t{1} << 20)) {
    return Bad("global_batch_size",
               absl::StrCat("must be in 1..1048576, got ", s.global_batch_size()));
  }
  if (s.global_batch_size() % trainers != 0) {
    return Bad("global_batch_size", absl::StrCat("must be divisible by num_trainers (", trainers,
                                                 "), got ", s.global_batch_size()));
  }
  // The trainers compute in float32 (ops::SgdParams): the hyperparameters
  // are checked as the float32 values they will use (lr 1e308 is finite as a
  // double but infinite as a float; momentum 0.9999999999 rounds to 1).
  const float lr = static_cast<float>(s.lr()), momentum = static_cast<float>(s.momentum()),
              weight_decay = static_cast<float>(s.weight_decay());
  if (!(s.lr() > 0) || !std::isnormal(lr) || lr > kMaxLr) {
    return Bad("lr", absl::StrCat("must be in (0, ", kMaxLr, "] and a normal float32 number, got ",
                                  s.lr()));
  }
  if (!(s.momentum() >= 0 && momentum < 1)) {
    return Bad("momentum",
               absl::StrFormat("must be in [0, 1) as a float32 number, got %.17g (float32 %.9g)",
                               s.momentum(), momentum));
  }
  if (!(s.weight_decay() >= 0) || !(weight_decay <= kMaxWeightDecay)) {
    return Bad("weight_decay", absl::StrCat("must be in [0, ", kMaxWeightDecay,
                                            "] as a float32 number, got ", s.weight_decay()));
  }
  if (!s.device_kind().empty() && s.device_kind() != "cpu" && s.device_kind() != "cuda") {
    return Bad("device_kind", absl::StrCat("must be cpu or cuda, got ", Quote(s.device_kind())));
  }
  if (s.sync_batch_norm() && trainers > 1 && s.sync().mode() == v1::KVSTORE) {
    return Bad("sync_batch_norm",
               "needs sync.mode ALLREDUCE when num_trainers > 1 (the statistics are exchanged "
               "with the trainers' collectives)");
  }
  if (s.collective_tls() && s.sync().mode() == v1::KVSTORE) {
    return Bad("collective_tls",
               "is for ALLREDUCE jobs' collectives; KVSTORE jobs' traffic is gRPC, always TLS");
  }
  if (s.hybridize() &&
      (trainers != 1 || s.devices_per_trainer() > 1 || s.device_kind() == "cuda")) {
    return Bad("hybridize",
               "compiled training steps run on one trainer with one CPU device; set "
               "num_trainers and devices_per_trainer to 1 and device_kind cpu, or turn "
               "hybridize off");
  }
  if (!v1::SyncMode_IsValid(s.sync().mode())) {
    return Bad("sync.mode", absl::StrCat("unknown value ", s.sync().mode()));
  }
  if (!v1::Consistency_IsValid(s.sync().consistency())) {
    return Bad("sync.consistency", absl::StrCat("unknown value ", s.sync().consistency()));
  }
  const bool kvstore = s.sync().mode() == v1::KVSTORE;
  if (!kvstore &&
      (s.sync().consistency() == v1::ASYNCHRONOUS || s.sync().consistency() == v1::BOUNDED_DELAY)) {
    return Bad("sync.consistency",
               absl::StrCat(v1::Consistency_Name(s.sync().consistency()),
                            " needs sync.mode KVSTORE (allreduce is always synchronous)"));
  }
  if (s.sync().consistency() == v1::BOUNDED_DELAY && s.sync().max_staleness() <= 0) {
    return Bad("sync.max_staleness",
               absl::StrCat("must be > 0 with BOUNDED_DELAY, got ", s.sync().max_staleness()));
  }
  if (s.sync().consistency() != v1::BOUNDED_DELAY && s.sync().max_staleness() != 0) {
    return Bad("sync.max_staleness", "only meaningful with consistency BOUNDED_DELAY");
  }
  if (!s.sync().gradient_compression().empty()) {
    absl::StatusOr<kvstore::CompressionSpec> c =
        kvstore::ParseCompression(s.sync().gradient_compression());
    if (!c.ok()) return Bad("sync.gradient_compression", std::string(c.status().message()));
    if (!kvstore && c->method != kvstore::Compression::kNone) {
      return Bad("sync.gradient_compression",
                 absl::StrCat(s.sync().gradient_compression(),
                              " needs sync.mode KVSTORE (allreduce sends f32 gradients)"));
    }
  }
  if (s.checkpoint_interval_epochs() < 0) {
    return Bad("checkpoint_interval_epochs",
               absl::StrCat("must be >= 0 (0 = none), got ", s.checkpoint_interval_epochs()));
  }
  if (s.priority() < -1000 || s.priority() > 1000) {
    return Bad("priority", absl::StrCat("must be in -1000..1000, got ", s.priority()));
  }
  if (s.train_limit() < 0) {
    return Bad("train_limit", absl::StrCat("must be >= 0 (0 = all), got ", s.train_limit()));
  }
  if (s.test_limit() < 0) {
    return Bad("test_limit", absl::StrCat("must be >= 0 (0 = all), got ", s.test_limit()));
  }
  if (s.init() == "from_model" && s.model_digest().empty()) {
    return Bad("init", "from_model (the model file's weights) needs model_digest (a model file)");
  }
  if (!s.init().empty() && s.init() != "normal" && s.init() != "kaiming" &&
      s.init() != "from_model") {
    return Bad("init",
               absl::StrCat("must be normal, kaiming or from_model, got ", Quote(s.init())));
  }
  if (s.bucket_bytes() != 0 && (s.bucket_bytes() < 1024 || s.bucket_bytes() > (int64_t{1} << 30))) {
    return Bad("bucket_bytes",
               absl::StrCat("must be 0 (1 MiB) or in 1024..1073741824, got ", s.bucket_bytes()));
  }
  if (s.min_trainers() < 0 || s.min_trainers() > trainers) {
    return Bad("min_trainers", absl::StrCat("must be in 1..num_trainers (", trainers,
                                            ") (0 = num_trainers), got ", s.min_trainers()));
  }
  if (s.max_trainers() != 0 && (s.max_trainers() < trainers || s.max_trainers() > 1024)) {
    return Bad("max_trainers", absl::StrCat("must be in num_trainers..1024 (", trainers,
                                            "..1024) (0 = num_trainers), got ", s.max_trainers()));
  }
  const bool elastic = (s.min_trainers() != 0 && s.min_trainers() < trainers) ||
                       (s.max_trainers() != 0 && s.max_trainers() > trainers);
  if (elastic && (kvstore || s.sync_batch_norm() || trainers < 2)) {
    return Bad(
        s.min_trainers() != 0 && s.min_trainers() < trainers ? "min_trainers" : "max_trainers",
        "elastic jobs (min_trainers < num_trainers or max_trainers > num_trainers) need "
        "sync.mode ALLREDUCE, no sync_batch_norm and num_trainers >= 2");
  }
  if (s.threads() < 0 || s.threads() > 1024) {
    return Bad("threads", absl::StrCat("must be in 0..1024 (0 = all cores), got ", s.threads()));
  }
  return absl::OkStatus();
}

void ApplyDefaults(JobSpec* s) {
  if (s->num_trainers() == 0) s->set_num_trainers(1);
  if (s->devices_per_trainer() == 0) s->set_devices_per_trainer(1);
  if (s->device_kind().empty()) s->set_device_kind("cpu");
  if (s->sync().mode() == v1::SYNC_MODE_UNSPECIFIED) s->mutable_sync()->set_mode(v1::ALLREDUCE);
  if (s->sync().consistency() == v1::CONSISTENCY_UNSPECIFIED) {
    s->mutable_sync()->set_consistency(v1::SYNCHRONOUS);
  }
  if (s->init().empty()) s->set_init("normal");
  if (s->min_trainers() == 0) s->set_min_trainers(s->num_trainers());
  if (s->max_trainers() == 0) s->set_max_trainers(s->num_trainers());
}

}  // namespace scheduler
}  // namespace dtrain
