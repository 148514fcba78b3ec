#include "libs/kvstore/placement.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"

namespace dtrain {
namespace kvstore {

uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string DescribePlacement(const PlacementOptions& options) {
  // v1 placed every key under the slice threshold by its name.
  return absl::StrCat("v2 colocate_below_bytes=", options.colocate_below_bytes,
                      " slice_threshold_bytes=", options.slice_threshold_bytes);
}

absl::StatusOr<JobConfig> StatePlacement(JobConfig config, const PlacementOptions& options) {
  std::string mine = DescribePlacement(options);
  if (!config.placement.empty() && config.placement != mine) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", config.job, "': the config says placement (", config.placement,
                     ") but this client places keys by (", mine, ")"));
  }
  config.placement = std::move(mine);
  return config;
}

int HomeShard(absl::string_view job, int num_servers) {
  return static_cast<int>(Fnv1a(job) % static_cast<uint64_t>(num_servers));
}

absl::StatusOr<std::vector<PlacedSlice>> PlaceKey(absl::string_view job, const std::string& key,
                                                  const std::vector<int64_t>& shape, DType dtype,
                                                  int num_servers,
                                                  const PlacementOptions& options) {
  if (num_servers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement of key '", key, "' needs at least one server"));
  }
  SliceSpec whole;
  whole.key = key;
  whole.dtype = dtype;
  whole.shape = shape;
  DT_ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(shape));
  whole.count = n;
  DT_RETURN_IF_ERROR(ValidateSliceSpec(whole));
  const int64_t bytes = n * static_cast<int64_t>(DTypeSize(dtype));
  const bool sliced = num_servers > 1 && bytes >= options.slice_threshold_bytes;
  const int64_t slices = sliced ? std::min<int64_t>({num_servers, n, kMaxSlicesPerKey}) : 1;
  const int home = !sliced && bytes < options.colocate_below_bytes
                       ? HomeShard(job, num_servers)
                       : static_cast<int>(Fnv1a(key) % static_cast<uint64_t>(num_servers));
  std::vector<PlacedSlice> out;
  for (int64_t i = 0; i < slices; ++i) {
    PlacedSlice p;
    p.server = static_cast<int>((home + i) % num_servers);
    p.spec = whole;
    p.spec.slice = static_cast<int32_t>(i);
    p.spec.num_slices = static_cast<int32_t>(slices);
    // 128-bit products: n * i may not fit in 64 bits for huge keys.
    p.spec.offset = static_cast<int64_t>(static_cast<__int128>(n) * i / slices);
    p.spec.count =
        static_cast<int64_t>(static_cast<__int128>(n) * (i + 1) / slices) - p.spec.offset;
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<PlacedSlice>>> PlaceInitKeys(
    absl::string_view job, const std::vector<KeySpec>& keys, int num_servers,
    const PlacementOptions& options,
    const std::function<const KeySpec*(const std::string& key)>& known) {
  std::vector<std::vector<PlacedSlice>> placed;
  std::set<std::string> names;
  for (const KeySpec& spec : keys) {
    if (!names.insert(spec.key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", spec.key, "' appears twice in one Init"));
    }
    DT_ASSIGN_OR_RETURN(std::vector<PlacedSlice> slices,
                        PlaceKey(job, spec.key, spec.shape, spec.dtype, num_servers, options));
    const KeySpec* before = known(spec.key);
    if (before != nullptr && (before->shape != spec.shape || before->dtype != spec.dtype)) {
      return absl::AlreadyExistsError(absl::StrCat("key '", spec.key, "' was initialized as ",
                                                   DTypeName(before->dtype),
                                                   ShapeString(before->shape), "; this Init says ",
                                                   DTypeName(spec.dtype), ShapeString(spec.shape)));
    }
    placed.push_back(std::move(slices));
  }
  return placed;
}

}  // namespace kvstore
}  // namespace dtrain
