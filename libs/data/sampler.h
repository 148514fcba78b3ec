// Deterministic sample orders for data-parallel training.
//
//   std::vector<int64_t> order = EpochOrder(dataset.size, seed, epoch, /*shuffle=*/true);
//   DT_ASSIGN_OR_RETURN(std::vector<int64_t> mine, ShardOrder(order, rank, world_size));
//
// The order depends only on (n, seed, epoch, shuffle): it is identical on
// every machine, compiler and platform, and libs/data/epoch_order.py
// reproduces it in Python so that reference scripts (PyTorch) visit the
// samples in exactly the same order. Any change to the algorithm below breaks
// that agreement and must be made in both places.
//
// The shuffle is a Fisher-Yates shuffle driven by SplitMix64, with all
// arithmetic on uint64 wrapping modulo 2^64:
//
//   a = [0, 1, ..., n-1]
//   state = seed ^ (uint64(epoch) * 0xD1B54A32D192ED03)
//   next():
//     state += 0x9E3779B97F4A7C15
//     z = state
//     z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//     z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//     return z ^ (z >> 31)
//   for i = n-1 down to 1:
//     j = next() % (i + 1)
//     swap(a[i], a[j])
//
// uint64(epoch) is the two's-complement reinterpretation, so negative epochs
// are valid (and distinct). next() is the reference SplitMix64 generator
// (Steele, Lea and Flood; Vigna's splitmix64.c). The modulo has a bias of at
// most n / 2^64, which is irrelevant at dataset sizes.
//
// Thread-safe: the functions have no shared state.
#ifndef DTRAIN_LIBS_DATA_SAMPLER_H_
#define DTRAIN_LIBS_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain::data {

// Advances `*state` and returns the next SplitMix64 output, exactly next()
// above. Exposed for tests and for other code that must match Python.
uint64_t SplitMix64Next(uint64_t* state);

// Returns the order in which to visit the samples 0..n-1 in `epoch`: 0..n-1
// itself when !shuffle, otherwise the permutation described at the top of
// this file. n <= 0 gives an empty order.
std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// Returns this rank's part of `order`: order[rank], order[rank + W],
// order[rank + 2W], ... (W = world_size), truncated to floor(n / W) items so
// that every rank gets exactly the same number and therefore takes the same
// number of steps, which collective training needs. The last n mod W items
// of `order` (at most W-1 samples per epoch) are dropped for all ranks; with
// shuffling they are different samples every epoch. The ranks' shards are
// disjoint.
//
// Returns InvalidArgument unless world_size >= 1 and 0 <= rank < world_size.
absl::StatusOr<std::vector<int64_t>> ShardOrder(const std::vector<int64_t>& order, int rank,
                                                int world_size);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_SAMPLER_H_
