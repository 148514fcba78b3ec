#include "libs/kvstore/proto_convert.h"

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"

namespace dtrain {
namespace kvstore {

v1::JobConfig ToProto(const JobConfig& c) {
  v1::JobConfig p;
  p.set_job(c.job);
  p.set_num_workers(c.num_workers);
  switch (c.consistency) {
    case Consistency::kSync:
      p.set_consistency(v1::CONSISTENCY_SYNC);
      break;
    case Consistency::kAsync:
      p.set_consistency(v1::CONSISTENCY_ASYNC);
      break;
    case Consistency::kBoundedDelay:
      p.set_consistency(v1::CONSISTENCY_BOUNDED_DELAY);
      break;
  }
  p.set_max_staleness(c.max_staleness);
  p.set_optimizer(c.optimizer == OptimizerKind::kSgd ? v1::OPTIMIZER_SGD : v1::OPTIMIZER_NONE);
  p.set_learning_rate(c.learning_rate);
  p.set_momentum(c.momentum);
  p.set_weight_decay(c.weight_decay);
  p.set_gradient_scale(c.gradient_scale);
  p.set_placement(c.placement);
  return p;
}

absl::StatusOr<JobConfig> FromProto(const v1::JobConfig& p) {
  JobConfig c;
  c.job = p.job();
  c.num_workers = p.num_workers();
  switch (p.consistency()) {
    case v1::CONSISTENCY_SYNC:
      c.consistency = Consistency::kSync;
      break;
    case v1::CONSISTENCY_ASYNC:
      c.consistency = Consistency::kAsync;
      break;
    case v1::CONSISTENCY_BOUNDED_DELAY:
      c.consistency = Consistency::kBoundedDelay;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "job '", p.job(), "': consistency ", static_cast<int>(p.consistency()),
          " is not one of CONSISTENCY_SYNC, CONSISTENCY_ASYNC, CONSISTENCY_BOUNDED_DELAY"));
  }
  c.max_staleness = p.max_staleness();
  switch (p.optimizer()) {
    case v1::OPTIMIZER_NONE:
      c.optimizer = OptimizerKind::kNone;
      break;
    case v1::OPTIMIZER_SGD:
      c.optimizer = OptimizerKind::kSgd;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("job '", p.job(), "': unknown optimizer ", static_cast<int>(p.optimizer())));
  }
  c.learning_rate = p.learning_rate();
  c.momentum = p.momentum();
  c.weight_decay = p.weight_decay();
  c.gradient_scale = p.gradient_scale() == 0 ? 1 : p.gradient_scale();
  c.placement = p.placement();
  return c;
}

absl::StatusOr<DType> DTypeFromWire(int32_t code) {
  absl::StatusOr<DType> d = DTypeFromCode(code);
  if (!d.ok()) return absl::InvalidArgumentError(d.status().message());
  return d;
}

v1::SliceSpec ToProto(const SliceSpec& s) {
  v1::SliceSpec p;
  p.set_key(s.key);
  p.set_slice(s.slice);
  p.set_num_slices(s.num_slices);
  p.set_dtype(static_cast<int32_t>(s.dtype));
  for (int64_t d : s.shape) p.add_shape(d);
  p.set_offset(s.offset);
  p.set_count(s.count);
  return p;
}

absl::StatusOr<SliceSpec> FromProto(const v1::SliceSpec& p) {
  SliceSpec s;
  s.key = p.key();
  s.slice = p.slice();
  s.num_slices = p.num_slices();
  absl::StatusOr<DType> d = DTypeFromWire(p.dtype());
  if (!d.ok()) return Annotate(d.status(), absl::StrCat("key '", p.key(), "'"));
  s.dtype = *d;
  s.shape.assign(p.shape().begin(), p.shape().end());
  s.offset = p.offset();
  s.count = p.count();
  return s;
}

v1::Compression ToProto(Compression c) {
  switch (c) {
    case Compression::kNone:
      return v1::COMPRESSION_NONE;
    case Compression::kF16:
      return v1::COMPRESSION_F16;
    case Compression::kBF16:
      return v1::COMPRESSION_BF16;
    case Compression::kTopK:
      return v1::COMPRESSION_TOPK;
  }
  return v1::COMPRESSION_NONE;
}

absl::StatusOr<Compression> FromProto(v1::Compression p) {
  switch (p) {
    case v1::COMPRESSION_NONE:
      return Compression::kNone;
    case v1::COMPRESSION_F16:
      return Compression::kF16;
    case v1::COMPRESSION_BF16:
      return Compression::kBF16;
    case v1::COMPRESSION_TOPK:
      return Compression::kTopK;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown compression ", static_cast<int>(p)));
  }
}

absl::StatusOr<CompressionSpec> CompressionFromProto(v1::Compression method, double topk_ratio) {
  absl::StatusOr<Compression> m = FromProto(method);
  if (!m.ok()) return m.status();
  CompressionSpec c(*m, topk_ratio);
  absl::Status valid = ValidateCompression(c);
  if (!valid.ok()) return valid;
  return c;
}

v1::GetJobResponse ToProto(const JobStatus& s) {
  v1::GetJobResponse p;
  *p.mutable_config() = ToProto(s.config);
  p.set_shard_index(s.shard_index);
  p.set_num_keys(s.num_keys);
  p.set_num_slices(s.num_slices);
  p.set_held_bytes(s.held_bytes);
  p.set_quota_bytes(s.quota_bytes);
  p.set_rounds_completed(s.rounds_completed);
  for (const SliceStatus& slice : s.slices) {
    v1::SliceState* out = p.add_slices();
    *out->mutable_spec() = ToProto(slice.spec);
    out->set_completed_round(slice.completed_round);
    out->set_pushed_round(slice.pushed_round);
  }
  return p;
}

absl::StatusOr<JobStatus> FromProto(const v1::GetJobResponse& p) {
  JobStatus s;
  DT_ASSIGN_OR_RETURN(s.config, FromProto(p.config()));
  s.shard_index = p.shard_index();
  s.num_keys = p.num_keys();
  s.num_slices = p.num_slices();
  s.held_bytes = p.held_bytes();
  s.quota_bytes = p.quota_bytes();
  s.rounds_completed = p.rounds_completed();
  for (const v1::SliceState& slice : p.slices()) {
    SliceStatus out;
    DT_ASSIGN_OR_RETURN(out.spec, FromProto(slice.spec()));
    out.completed_round = slice.completed_round();
    out.pushed_round = slice.pushed_round();
    s.slices.push_back(std::move(out));
  }
  return s;
}

}  // namespace kvstore
}  // namespace dtrain
