// Latency-oriented allreduce over a hypercube: halving-doubling
// (Rabenseifner) and recursive doubling.
//
// Both work on the largest power of two p <= n. The other n-p ranks
// ("extra" ranks, p..n-1) first fold their data into rank r-p and at the end
// get the result back from it, so a non-power-of-two world costs two more
// message latencies.
//
// Halving-doubling: log2(p) steps of recursive halving, in which partners
// rank XOR mask (mask = p/2, p/4, ..., 1) exchange the half of their current
// range that the other keeps and reduce the half they keep, leave each rank
// with 1/p of the buffer fully reduced; log2(p) steps of recursive doubling
// then gather the pieces. 2*log2(p) latencies and about 2 bytes moved per
// byte of buffer: good from a few KiB up to a few hundred KiB.
//
// Recursive doubling: log2(p) steps in which partners exchange their whole
// buffer and add. log2(p) latencies but log2(p) bytes moved per byte: for
// small messages. Both partners compute a + b and b + a, which IEEE
// arithmetic makes bitwise equal, so all ranks end with the same bits.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/collective/algorithms.h"

namespace dtrain {
namespace collective {
namespace internal {

absl::Status HalvingDoublingAllreduce(const AlgorithmContext& ctx, void* data, size_t count,
                                      DType dtype, ReduceOp op) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1 || count == 0) return absl::OkStatus();
  const int p = FloorPowerOfTwo(n);
  const size_t es = DTypeSize(dtype);
  const size_t bytes = count * es;
  char* base = static_cast<char*>(data);
  ReduceCombiner sum(dtype, false, 1.0f);
  ReduceCombiner last(dtype, op == ReduceOp::kAverage, static_cast<float>(n));

  if (rank >= p) {  // extra rank: fold in, get the result back
    DT_RETURN_IF_ERROR(SendTo(ctx, rank - p, base, bytes));
    return RecvFrom(ctx, rank - p, base, bytes, nullptr);
  }
  if (rank + p < n) DT_RETURN_IF_ERROR(RecvFrom(ctx, rank + p, base, bytes, &sum));

  if (p == 1) {  // n == 1 handled above; p == 1 means n == 1
    return absl::OkStatus();
  }
  // Recursive halving.
  struct Level {
    Range kept;
    Range given;
  };
  std::vector<Level> levels;
  Range current{0, count};
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    const int partner = rank ^ mask;
    const size_t half = current.count / 2;
    Range lower{current.offset, half};
    Range upper{current.offset + half, current.count - half};
    Level level = (rank & mask) == 0 ? Level{lower, upper} : Level{upper, lower};
    DT_ASSIGN_OR_RETURN(Pair * pair, GetPair(ctx, partner));
    const Combiner* combiner = mask == 1 ? &last : &sum;
    DT_RETURN_IF_ERROR(Exchange(ctx, pair, base + level.given.offset * es, level.given.count * es,
                                base + level.kept.offset * es, level.kept.count * es, combiner));
    levels.push_back(level);
    current = level.kept;
  }
  // Recursive doubling of the reduced pieces, in reverse order.
  for (int i = static_cast<int>(levels.size()) - 1; i >= 0; --i) {
    const int mask = p >> (i + 1);
    const Level& level = levels[i];
    DT_ASSIGN_OR_RETURN(Pair * pair, GetPair(ctx, rank ^ mask));
    DT_RETURN_IF_ERROR(Exchange(ctx, pair, base + level.kept.offset * es, level.kept.count * es,
                                base + level.given.offset * es, level.given.count * es, nullptr));
  }
  if (rank + p < n) DT_RETURN_IF_ERROR(SendTo(ctx, rank + p, base, bytes));
  return absl::OkStatus();
}

absl::Status RecursiveDoublingAllreduce(const AlgorithmContext& ctx, void* data, size_t count,
                                        DType dtype, ReduceOp op, void* scratch) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1 || count == 0) return absl::OkStatus();
  const int p = FloorPowerOfTwo(n);
  const size_t bytes = count * DTypeSize(dtype);
  ReduceCombiner sum(dtype, false, 1.0f);

  if (rank >= p) {
    DT_RETURN_IF_ERROR(SendTo(ctx, rank - p, data, bytes));
    return RecvFrom(ctx, rank - p, data, bytes, nullptr);
  }
  if (rank + p < n) DT_RETURN_IF_ERROR(RecvFrom(ctx, rank + p, data, bytes, &sum));
  for (int mask = 1; mask < p; mask <<= 1) {
    DT_ASSIGN_OR_RETURN(Pair * pair, GetPair(ctx, rank ^ mask));
    DT_RETURN_IF_ERROR(Exchange(ctx, pair, data, bytes, scratch, bytes, nullptr));
    ReduceSum(dtype, data, scratch, count);
  }
  if (op == ReduceOp::kAverage) DivideInPlace(dtype, data, count, static_cast<float>(n));
  if (rank + p < n) DT_RETURN_IF_ERROR(SendTo(ctx, rank + p, data, bytes));
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace collective
}  // namespace dtrain
