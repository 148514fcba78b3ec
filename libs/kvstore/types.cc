#include "libs/kvstore/types.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace dtrain {
namespace kvstore {

const char* ConsistencyName(Consistency c) {
  switch (c) {
    case Consistency::kSync:
      return "sync";
    case Consistency::kAsync:
      return "async";
    case Consistency::kBoundedDelay:
      return "bounded_delay";
  }
  return "?";
}

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "none";
    case Compression::kF16:
      return "f16";
    case Compression::kBF16:
      return "bf16";
    case Compression::kTopK:
      return "topk";
  }
  return "?";
}

bool operator==(const CompressionSpec& a, const CompressionSpec& b) {
  return a.method == b.method && a.topk_ratio == b.topk_ratio;
}

int64_t TopKCount(double ratio, int64_t n) {
  if (n <= 0) return 0;
  const double want = std::ceil(ratio * static_cast<double>(n));
  if (!(want < static_cast<double>(n))) return n;  // also NaN
  return std::max<int64_t>(1, static_cast<int64_t>(want));
}

std::string DescribeCompression(const CompressionSpec& c) {
  if (c.method != Compression::kTopK) return CompressionName(c.method);
  return absl::StrCat("topk:", c.topk_ratio);
}

absl::Status ValidateCompression(const CompressionSpec& c) {
  if (c.method == Compression::kTopK) {
    if (!(c.topk_ratio > 0 && c.topk_ratio <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("top-k ratio ", c.topk_ratio,
                       " is outside (0, 1] (the fraction of each slice a push sends)"));
    }
  } else if (c.topk_ratio != 0) {
    return absl::InvalidArgumentError(absl::StrCat("compression ", CompressionName(c.method),
                                                   " takes no ratio (got ", c.topk_ratio, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CompressionSpec> ParseCompression(absl::string_view name) {
  for (Compression c : {Compression::kNone, Compression::kF16, Compression::kBF16}) {
    if (name == CompressionName(c)) return CompressionSpec(c);
  }
  if (name.empty()) return CompressionSpec();
  if (name == "topk") return CompressionSpec(Compression::kTopK, kDefaultTopKRatio);
  if (absl::ConsumePrefix(&name, "topk:")) {
    double ratio = 0;
    if (!absl::SimpleAtod(name, &ratio) || !(ratio > 0 && ratio <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("top-k ratio '", name,
                       "' must be a number in (0, 1], the fraction of each slice a push sends "
                       "(e.g. topk:0.01)"));
    }
    return CompressionSpec(Compression::kTopK, ratio);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown gradient compression '", name,
                   "' (accepted: none, f16, bf16, topk, topk:<ratio> with ratio in (0, 1])"));
}

const char* OptimizerName(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kNone:
      return "none";
    case OptimizerKind::kSgd:
      return "sgd";
  }
  return "?";
}

bool JobConfig::operator==(const JobConfig& o) const {
  return job == o.job && num_workers == o.num_workers && consistency == o.consistency &&
         max_staleness == o.max_staleness && optimizer == o.optimizer &&
         learning_rate == o.learning_rate && momentum == o.momentum &&
         weight_decay == o.weight_decay && gradient_scale == o.gradient_scale &&
         placement == o.placement;
}

absl::Status ValidateJobConfig(const JobConfig& c) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("job '", c.job, "': ", parts...));
  };
  if (c.job.empty() || c.job.size() > kMaxJobNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("job name must have 1 to ", kMaxJobNameLength, " bytes, got ", c.job.size()));
  }
  if (c.num_workers < 1 || c.num_workers > kMaxWorkers) {
    return bad("num_workers must be 1 to ", kMaxWorkers, ", got ", c.num_workers);
  }
  if (c.consistency == Consistency::kBoundedDelay) {
    if (c.max_staleness < 0) return bad("max_staleness must be >= 0, got ", c.max_staleness);
  } else if (c.max_staleness != 0) {
    return bad("max_staleness=", c.max_staleness,
               " is only meaningful with bounded_delay consistency");
  }
  if (c.placement.size() > kMaxPlacementLength) {
    return bad("placement must have at most ", kMaxPlacementLength, " bytes, got ",
               c.placement.size());
  }
  if (!(c.gradient_scale > 0) || !std::isfinite(c.gradient_scale)) {
    return bad("gradient_scale must be positive and finite, got ", c.gradient_scale);
  }
  if (c.optimizer == OptimizerKind::kNone) {
    if (c.learning_rate != 0 || c.momentum != 0 || c.weight_decay != 0) {
      return bad("learning_rate, momentum and weight_decay need optimizer=sgd");
    }
  } else {
    if (!(c.learning_rate > 0) || !std::isfinite(c.learning_rate)) {
      return bad("learning_rate must be positive and finite, got ", c.learning_rate);
    }
    if (!(c.momentum >= 0 && c.momentum < 1)) {
      return bad("momentum must be in [0, 1), got ", c.momentum);
    }
    if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay)) {
      return bad("weight_decay must be >= 0 and finite, got ", c.weight_decay);
    }
  }
  return absl::OkStatus();
}

std::string DescribeJobConfig(const JobConfig& c) {
  std::string s = absl::StrCat("job=", c.job, " workers=", c.num_workers,
                               " consistency=", ConsistencyName(c.consistency));
  if (c.consistency == Consistency::kBoundedDelay)
    absl::StrAppend(&s, " max_staleness=", c.max_staleness);
  absl::StrAppend(&s, " optimizer=", OptimizerName(c.optimizer));
  if (c.optimizer == OptimizerKind::kSgd) {
    absl::StrAppend(&s, " lr=", c.learning_rate, " momentum=", c.momentum,
                    " weight_decay=", c.weight_decay);
  }
  if (c.gradient_scale != 1) absl::StrAppend(&s, " gradient_scale=", c.gradient_scale);
  if (!c.placement.empty()) absl::StrAppend(&s, " placement=(", c.placement, ")");
  return s;
}

bool SliceSpec::operator==(const SliceSpec& o) const {
  return key == o.key && slice == o.slice && num_slices == o.num_slices && dtype == o.dtype &&
         shape == o.shape && offset == o.offset && count == o.count;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string DescribeSlice(const SliceSpec& s) {
  return absl::StrCat("key '", s.key, "' slice ", s.slice, "/", s.num_slices, " ",
                      DTypeName(s.dtype), ShapeString(s.shape), " elements [", s.offset, ", ",
                      s.offset + s.count, ")");
}

absl::StatusOr<int64_t> CheckedNumElements(const std::vector<int64_t>& shape) {
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(shape), " has rank ", shape.size(), " > ", kMaxRank));
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 8 / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has too many elements"));
    }
    n *= d;
  }
  return n;
}

absl::Status CheckFloatDType(DType dtype) {
  if (dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype ", DTypeName(dtype), " is not supported: the kvstore holds f32, f16 or bf16 keys"));
}

absl::Status ValidateSliceSpec(const SliceSpec& s) {
  if (s.key.empty() || s.key.size() > kMaxKeyLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("key name must have 1 to ", kMaxKeyLength, " bytes, got ", s.key.size()));
  }
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("key '", s.key, "': ", parts...));
  };
  if (s.num_slices < 1 || s.num_slices > kMaxSlicesPerKey) {
    return bad("num_slices must be 1 to ", kMaxSlicesPerKey, ", got ", s.num_slices);
  }
  if (s.slice < 0 || s.slice >= s.num_slices) {
    return bad("slice ", s.slice, " is outside 0..", s.num_slices - 1);
  }
  absl::Status dtype_ok = CheckFloatDType(s.dtype);
  if (!dtype_ok.ok()) return bad(dtype_ok.message());
  absl::StatusOr<int64_t> n = CheckedNumElements(s.shape);
  if (!n.ok()) return bad(n.status().message());
  if (s.offset < 0 || s.count < 0 || s.offset > *n || s.count > *n - s.offset) {
    return bad("slice elements [", s.offset, ", ", s.offset + s.count, ") are outside the key's ",
               *n, " elements");
  }
  return absl::OkStatus();
}

DType WireDType(DType key_dtype, Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return key_dtype;
    case Compression::kF16:
      return DType::kF16;
    case Compression::kBF16:
      return DType::kBF16;
    case Compression::kTopK:
      return DType::kF32;
  }
  return key_dtype;
}

}  // namespace kvstore
}  // namespace dtrain
