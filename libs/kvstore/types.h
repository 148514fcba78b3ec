// Plain data types of the kvstore: job configurations and slice specs, with
// their validation. Shared by the store, the client and the gRPC service
// (which converts them to and from protos/kvstore.proto); no gRPC here.
//
// A job's keys are tensors of floating-point elements (f32, f16 or bf16). A
// key may be cut into slices, each holding a contiguous range of the
// flattened key's elements; each slice lives on one shard.
//
// Thread-safety: plain values; the functions are thread-safe.
#ifndef DTRAIN_LIBS_KVSTORE_TYPES_H_
#define DTRAIN_LIBS_KVSTORE_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/dtype.h"

namespace dtrain {
namespace kvstore {

// Limits on names and sizes, checked for every request.
inline constexpr size_t kMaxJobNameLength = 256;
inline constexpr size_t kMaxKeyLength = 1024;
inline constexpr int kMaxWorkers = 4096;
inline constexpr int kMaxSlicesPerKey = 4096;
inline constexpr int kMaxRank = 8;

// See protos/kvstore.proto (Consistency) for the semantics.
enum class Consistency { kSync, kAsync, kBoundedDelay };

enum class OptimizerKind { kNone, kSgd };

// Wire encoding of pushed values (protos/kvstore.proto, Compression).
// kTopK: each push of a slice carries only its k largest-magnitude entries
// as (index, f32 value) pairs; the worker keeps what it did not send and
// adds it to its next push of the slice (error feedback).
enum class Compression { kNone, kF16, kBF16, kTopK };

// A compression with its parameter: what a job spec names and what a push
// travels with.
struct CompressionSpec {
  Compression method = Compression::kNone;
  // kTopK only (0 otherwise): the fraction of a slice's elements a push
  // sends, in (0, 1]; a slice of n elements sends TopKCount(ratio, n).
  double topk_ratio = 0;

  CompressionSpec() = default;
  // Implicit: a method without parameters (kNone, kF16, kBF16).
  CompressionSpec(Compression m) : method(m) {}  // NOLINT(runtime/explicit)
  CompressionSpec(Compression m, double ratio) : method(m), topk_ratio(ratio) {}
};
bool operator==(const CompressionSpec& a, const CompressionSpec& b);
inline bool operator!=(const CompressionSpec& a, const CompressionSpec& b) { return !(a == b); }

// The ratio `topk` alone means.
inline constexpr double kDefaultTopKRatio = 0.01;

// k = max(1, ceil(ratio * n)), at most n; 0 for an empty slice.
int64_t TopKCount(double ratio, int64_t n);

const char* ConsistencyName(Consistency c);  // "sync", "async", "bounded_delay"
const char* CompressionName(Compression c);  // "none", "f16", "bf16", "topk"
// "none", "f16", "bf16", "topk:0.01": what ParseCompression reads back.
std::string DescribeCompression(const CompressionSpec& c);
// The compression a job spec names (JobSpec sync.gradient_compression,
// `trainctl submit --gradient_compression`): "" or "none", "f16", "bf16",
// "topk" (ratio kDefaultTopKRatio) or "topk:<ratio>" with ratio in (0, 1];
// kInvalidArgument naming the accepted forms otherwise.
absl::StatusOr<CompressionSpec> ParseCompression(absl::string_view name);
// kInvalidArgument unless kTopK has a finite ratio in (0, 1] and the other
// methods have none (a push's header is checked with it).
absl::Status ValidateCompression(const CompressionSpec& c);
const char* OptimizerName(OptimizerKind o);  // "none", "sgd"

struct JobConfig {
  std::string job;
  int num_workers = 1;
  Consistency consistency = Consistency::kSync;
  // tau for kBoundedDelay; 0 otherwise.
  int max_staleness = 0;
  OptimizerKind optimizer = OptimizerKind::kNone;
  // kSgd only.
  double learning_rate = 0;
  double momentum = 0;
  double weight_decay = 0;
  // Multiplies gradients before they are applied (e.g. 1/num_workers).
  double gradient_scale = 1;
  // How the job's workers place keys on the shards (DescribePlacement,
  // placement.h), stamped by the client's CreateJob: a worker placing keys
  // otherwise would never meet the others' rounds, so its CreateJob is
  // refused instead. Empty: not stated (a client from before the field).
  std::string placement;

  bool operator==(const JobConfig& other) const;
  bool operator!=(const JobConfig& other) const { return !(*this == other); }
};

// kInvalidArgument naming the offending field: empty or long job name,
// num_workers outside 1..kMaxWorkers, max_staleness set outside kBoundedDelay or
// negative, SGD settings with kNone, a learning rate that is not positive
// and finite, momentum outside [0, 1), negative or non-finite weight decay,
// a gradient scale that is not positive and finite, a placement of more
// than kMaxPlacementLength bytes.
absl::Status ValidateJobConfig(const JobConfig& config);
inline constexpr size_t kMaxPlacementLength = 128;

// "job=j workers=2 consistency=sync optimizer=sgd lr=0.1 momentum=0.9 ..."
std::string DescribeJobConfig(const JobConfig& config);

// Where one slice of a key lives and what it holds: elements
// [offset, offset + count) of the flattened key.
struct SliceSpec {
  std::string key;
  int32_t slice = 0;
  int32_t num_slices = 1;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // the whole key's shape
  int64_t offset = 0;
  int64_t count = 0;

  bool operator==(const SliceSpec& other) const;
  bool operator!=(const SliceSpec& other) const { return !(*this == other); }
};

// "key 'w' slice 1/2 f32[1024, 1024] elements [524288, 1048576)".
std::string DescribeSlice(const SliceSpec& spec);

// Elements of `shape`; kInvalidArgument for a negative dimension, rank above
// kMaxRank, or a product overflowing int64.
absl::StatusOr<int64_t> CheckedNumElements(const std::vector<int64_t>& shape);

// "[2, 3]".
std::string ShapeString(const std::vector<int64_t>& shape);

// kInvalidArgument unless `dtype` is f32, f16 or bf16.
absl::Status CheckFloatDType(DType dtype);

// kInvalidArgument naming the problem: empty or long key, slice index out of
// range, num_slices outside 1..kMaxSlicesPerKey, a non-float dtype, a bad
// shape, or a range outside the key.
absl::Status ValidateSliceSpec(const SliceSpec& spec);

// Per-slice state as a shard reports it (Store::GetJob, KVStore.GetJob).
struct SliceStatus {
  SliceSpec spec;
  int64_t completed_round = 0;
  int64_t pushed_round = 0;  // of the worker asked about
};

// A job's configuration and usage on one shard.
struct JobStatus {
  JobConfig config;
  int shard_index = 0;
  int64_t num_keys = 0;
  int64_t num_slices = 0;
  int64_t held_bytes = 0;
  int64_t quota_bytes = 0;          // 0: none
  int64_t rounds_completed = 0;     // slice-rounds completed since the shard started
  std::vector<SliceStatus> slices;  // filled on request
};

// The dtype values travel in for a push of a `key_dtype` key (kTopK: the
// pairs' values are f32).
DType WireDType(DType key_dtype, Compression compression);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_TYPES_H_
