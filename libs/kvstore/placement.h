// Placement of keys on kvstore shards, computed by every client from the
// job name and server list alone (no coordination): the same job, key,
// shape, dtype and number of servers always give the same slices on the
// same shards.
//
//   DT_ASSIGN_OR_RETURN(std::vector<PlacedSlice> slices,
//                       PlaceKey("resnet", "fc1.weight", {256, 784}, DType::kF32,
//                                /*num_servers=*/4, PlacementOptions()));
//
// Three sizes of key:
//   - under colocate_below_bytes (64 KiB): one slice on the job's home
//     shard, Fnv1a(job) % num_servers. Every shard a round touches costs a
//     message each way and a wakeup at each end (about 50 us on a virtual
//     machine, more than 64 KiB takes on a 10 Gb/s link), so a job's small
//     keys (biases, norms, small layers) travel together: a round of them is
//     one message to one shard, as in a fusion buffer. Jobs spread over the
//     shards by their names. The home shard holds the sum of the job's
//     small keys; a job with very many keys just under the limit lowers it.
//   - under slice_threshold_bytes (256 KiB): one slice on the shard
//     Fnv1a(key) % num_servers, which spreads such keys evenly.
//   - larger: cut into min(num_servers, elements) slices of nearly equal
//     element counts (so equal bytes, within one element), slice i on shard
//     (Fnv1a(key) + i) % num_servers: each shard holds 1/n of the key and
//     serves 1/n of its traffic.
// Every worker of a job must place keys alike: clients state their rule and
// options in the job's config (StatePlacement), and a shard refuses the
// CreateJob of a worker whose placement differs from the job's.
//
// Thread-safety: pure functions.
#ifndef DTRAIN_LIBS_KVSTORE_PLACEMENT_H_
#define DTRAIN_LIBS_KVSTORE_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/kvstore/types.h"

namespace dtrain {
namespace kvstore {

struct PlacementOptions {
  // Keys of fewer bytes live on their job's home shard (0: none do, every
  // key below slice_threshold_bytes is placed by its own name).
  int64_t colocate_below_bytes = 64 << 10;
  // Keys of at least this many bytes are sliced over all servers. 256 KiB
  // keeps per-message overheads small against the data moved.
  int64_t slice_threshold_bytes = 256 << 10;
};

struct PlacedSlice {
  int server = 0;  // index into the server list
  SliceSpec spec;
};

// 64-bit FNV-1a of `s` (stable across builds and platforms).
uint64_t Fnv1a(absl::string_view s);

// The placement rule and options, as clients state them in their jobs'
// JobConfig::placement ("v2 colocate_below_bytes=65536
// slice_threshold_bytes=262144"): workers of one job must agree on it.
std::string DescribePlacement(const PlacementOptions& options);

// `config` with this worker's placement stated, as a client's CreateJob
// sends it; kInvalidArgument when config.placement states another.
absl::StatusOr<JobConfig> StatePlacement(JobConfig config, const PlacementOptions& options);

// The job's home shard, where its small keys live.
int HomeShard(absl::string_view job, int num_servers);

// The slices of a key of `job`. kInvalidArgument for num_servers < 1, a bad
// key name, shape or dtype (as ValidateSliceSpec).
absl::StatusOr<std::vector<PlacedSlice>> PlaceKey(absl::string_view job, const std::string& key,
                                                  const std::vector<int64_t>& shape, DType dtype,
                                                  int num_servers, const PlacementOptions& options);

// What every ParameterServer's Init checks before it creates anything: the
// slices of each of `keys` (in order), or kInvalidArgument for a key named
// twice or one PlaceKey refuses, kAlreadyExists for a key that `known`
// (this worker's earlier Init of that name, or null) gave another shape or
// dtype.
absl::StatusOr<std::vector<std::vector<PlacedSlice>>> PlaceInitKeys(
    absl::string_view job, const std::vector<KeySpec>& keys, int num_servers,
    const PlacementOptions& options,
    const std::function<const KeySpec*(const std::string& key)>& known);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_PLACEMENT_H_
