#include "libs/data/sampler.h"

#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dtrain::data {

uint64_t SplitMix64Next(uint64_t* state) {
  *state += 0x9E3779B97F4A7C15ULL;
  uint64_t z = *state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  if (n <= 0) return {};
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  uint64_t state = seed ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ULL);
  for (int64_t i = n - 1; i >= 1; --i) {
    const uint64_t j = SplitMix64Next(&state) % static_cast<uint64_t>(i + 1);
    std::swap(order[i], order[j]);
  }
  return order;
}

absl::StatusOr<std::vector<int64_t>> ShardOrder(const std::vector<int64_t>& order, int rank,
                                                int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be at least 1, got ", world_size));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be in [0, world_size) = [0, ", world_size, "), got ", rank));
  }
  const int64_t per_rank = static_cast<int64_t>(order.size()) / world_size;
  std::vector<int64_t> shard(per_rank);
  for (int64_t k = 0; k < per_rank; ++k) shard[k] = order[rank + k * world_size];
  return shard;
}

}  // namespace dtrain::data
