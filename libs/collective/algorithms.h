// Internal: the collective algorithms, written against transport.h only.
//
// Every function runs one rank's part of one collective: it posts sends and
// receives on the pairs of `ctx.transport` and waits for them until
// `ctx.deadline`. All ranks of a communicator must call the same function
// with matching arguments. The functions do not annotate errors; the
// Communicator adds which operation failed.
//
// Algorithms and the pairs they use (see PeersNeeded):
//   ring (reduce-scatter then allgather, chunked and pipelined): rank±1;
//   bidirectional ring (half the buffer each way around): rank±1, 2 channels;
//   halving-doubling (Rabenseifner) and recursive doubling: rank XOR 2^k
//     among the largest power of two p <= n, plus rank±p to fold the other
//     n-p ranks in and out;
//   binomial-tree broadcast and the barrier: the same hypercube pairs;
//   chain (pipelined) broadcast: rank±1.
#ifndef DTRAIN_LIBS_COLLECTIVE_ALGORITHMS_H_
#define DTRAIN_LIBS_COLLECTIVE_ALGORITHMS_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/collective/reduce.h"
#include "libs/collective/transport.h"
#include "libs/tensor/dtype.h"

namespace dtrain {
namespace collective {
namespace internal {

struct AlgorithmContext {
  Transport* transport = nullptr;
  absl::Time deadline = absl::InfiniteFuture();
  // Pipelining granularity of the ring and chain algorithms.
  size_t chunk_bytes = 256 << 10;
};

// The ranks that `rank` must be connected to for every algorithm above.
std::vector<int> PeersNeeded(int rank, int size);

// Largest power of two <= n (n >= 1).
int FloorPowerOfTwo(int n);

// A range of elements.
struct Range {
  size_t offset = 0;
  size_t count = 0;
};

// Splits `count` elements into `n` contiguous ranges whose sizes differ by at
// most one (the first count % n ranges get the extra element).
std::vector<Range> SplitEven(size_t count, int n);

// Combiner that adds (and optionally divides by `divisor`) elements of a
// reducible dtype.
class ReduceCombiner final : public Combiner {
 public:
  ReduceCombiner(DType dtype, bool divide, float divisor)
      : dtype_(dtype), size_(DTypeSize(dtype)), divide_(divide), divisor_(divisor) {}
  size_t element_size() const override { return size_; }
  void Combine(void* dst, const void* src, size_t count) const override;

 private:
  DType dtype_;
  size_t size_;
  bool divide_;
  float divisor_;
};

// The pair to `peer` on `channel`; INTERNAL if the transport has none (the
// peer set and the algorithm disagree).
absl::StatusOr<Pair*> GetPair(const AlgorithmContext& ctx, int peer, int channel = 0);

// Posts a receive of `recv_bytes` into `recv` (combined when `combiner` is
// set) and a send of `send_bytes` from `send` on `pair`, then waits for both.
absl::Status Exchange(const AlgorithmContext& ctx, Pair* pair, const void* send, size_t send_bytes,
                      void* recv, size_t recv_bytes, const Combiner* combiner);

// One send to (receive from) `peer` on channel 0, waited for.
absl::Status SendTo(const AlgorithmContext& ctx, int peer, const void* data, size_t bytes);
absl::Status RecvFrom(const AlgorithmContext& ctx, int peer, void* data, size_t bytes,
                      const Combiner* combiner);

// Allreduce, in place on `data` (count elements of dtype).
absl::Status RingAllreduce(const AlgorithmContext& ctx, void* data, size_t count, DType dtype,
                           ReduceOp op);
absl::Status BidirectionalRingAllreduce(const AlgorithmContext& ctx, void* data, size_t count,
                                        DType dtype, ReduceOp op);
absl::Status HalvingDoublingAllreduce(const AlgorithmContext& ctx, void* data, size_t count,
                                      DType dtype, ReduceOp op);
// Uses `scratch` (count elements) for the partner's data.
absl::Status RecursiveDoublingAllreduce(const AlgorithmContext& ctx, void* data, size_t count,
                                        DType dtype, ReduceOp op, void* scratch);

// Reduce-scatter in place over `data`, which holds size blocks of
// `block_count` elements; afterwards block `rank` holds the reduction (other
// blocks hold partial sums).
absl::Status RingReduceScatter(const AlgorithmContext& ctx, void* data, size_t block_count,
                               DType dtype, ReduceOp op);

// Allgather in place over `data`, which holds size blocks of `block_bytes`;
// block `rank` is this rank's contribution, the others are filled in.
absl::Status RingAllgather(const AlgorithmContext& ctx, void* data, size_t block_bytes);

// Broadcast of `bytes` at `data` from `root`.
absl::Status ChainBroadcast(const AlgorithmContext& ctx, void* data, size_t bytes, int root);
absl::Status TreeBroadcast(const AlgorithmContext& ctx, void* data, size_t bytes, int root);

// Returns when every rank has entered it (dissemination over the hypercube).
absl::Status Barrier(const AlgorithmContext& ctx);

}  // namespace internal
}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_ALGORITHMS_H_
