// Placement of keys on kvstore shards, computed by every client from the
// server list alone (no coordination): the same key, shape, dtype and
// number of servers always give the same slices on the same shards.
//
//   DT_ASSIGN_OR_RETURN(std::vector<PlacedSlice> slices,
//                       PlaceKey("fc1.weight", {256, 784}, DType::kF32, /*num_servers=*/4,
//                                PlacementOptions()));
//
// A key smaller than slice_threshold_bytes is one slice on the shard
// Fnv1a(key) % num_servers, which spreads many small keys evenly. A larger key
// is cut into min(num_servers, elements) slices of nearly equal element
// counts (so equal bytes, within one element), slice i on shard
// (Fnv1a(key) + i) % num_servers: each shard holds 1/n of the key and
// serves 1/n of its traffic.
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

// The slices of a key. kInvalidArgument for num_servers < 1, a bad key name,
// shape or dtype (as ValidateSliceSpec).
absl::StatusOr<std::vector<PlacedSlice>> PlaceKey(const std::string& key,
                                                  const std::vector<int64_t>& shape, DType dtype,
                                                  int num_servers, const PlacementOptions& options);

// What every ParameterServer's Init checks before it creates anything: the
// slices of each of `keys` (in order), or kInvalidArgument for a key named
// twice or one PlaceKey refuses, kAlreadyExists for a key that `known`
// (this worker's earlier Init of that name, or null) gave another shape or
// dtype.
absl::StatusOr<std::vector<std::vector<PlacedSlice>>> PlaceInitKeys(
    const std::vector<KeySpec>& keys, int num_servers, const PlacementOptions& options,
    const std::function<const KeySpec*(const std::string& key)>& known);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_PLACEMENT_H_
