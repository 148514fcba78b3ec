// Binomial-tree broadcast and the barrier, over the same hypercube as
// halving-doubling (rank XOR 2^k among the largest power of two p <= n, and
// rank +- p for the other ranks), so they need no extra connections.
#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/collective/algorithms.h"

namespace dtrain {
namespace collective {
namespace internal {

absl::Status TreeBroadcast(const AlgorithmContext& ctx, void* data, size_t bytes, int root) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1 || bytes == 0) return absl::OkStatus();
  const int p = FloorPowerOfTwo(n);
  // A root among the extra ranks first hands the data to its partner.
  int tree_root = root;
  if (root >= p) {
    tree_root = root - p;
    if (rank == root) DT_RETURN_IF_ERROR(SendTo(ctx, tree_root, data, bytes));
    if (rank == tree_root) DT_RETURN_IF_ERROR(RecvFrom(ctx, root, data, bytes, nullptr));
  }
  if (rank < p) {
    // Binomial tree over virtual ranks v = rank XOR tree_root: in round
    // `mask`, ranks with v < mask send to v | mask.
    const int v = rank ^ tree_root;
    for (int mask = 1; mask < p; mask <<= 1) {
      if (v < mask) {
        DT_RETURN_IF_ERROR(SendTo(ctx, rank ^ mask, data, bytes));
      } else if (v < 2 * mask) {
        DT_RETURN_IF_ERROR(RecvFrom(ctx, rank ^ mask, data, bytes, nullptr));
      }
    }
    if (rank + p < n && rank + p != root) DT_RETURN_IF_ERROR(SendTo(ctx, rank + p, data, bytes));
  } else if (rank != root) {
    DT_RETURN_IF_ERROR(RecvFrom(ctx, rank - p, data, bytes, nullptr));
  }
  return absl::OkStatus();
}

absl::Status Barrier(const AlgorithmContext& ctx) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1) return absl::OkStatus();
  const int p = FloorPowerOfTwo(n);
  const char token = 1;
  char in = 0;
  if (rank >= p) {
    DT_RETURN_IF_ERROR(SendTo(ctx, rank - p, &token, 1));
    return RecvFrom(ctx, rank - p, &in, 1, nullptr);
  }
  if (rank + p < n) DT_RETURN_IF_ERROR(RecvFrom(ctx, rank + p, &in, 1, nullptr));
  for (int mask = 1; mask < p; mask <<= 1) {
    DT_ASSIGN_OR_RETURN(Pair * pair, GetPair(ctx, rank ^ mask));
    DT_RETURN_IF_ERROR(Exchange(ctx, pair, &token, 1, &in, 1, nullptr));
  }
  if (rank + p < n) DT_RETURN_IF_ERROR(SendTo(ctx, rank + p, &token, 1));
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace collective
}  // namespace dtrain
