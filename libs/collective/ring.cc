// Ring algorithms: chunked, pipelined ring allreduce (one direction and both
// directions), ring reduce-scatter and allgather, and the chain broadcast.
//
// The ring schedule. Number ring positions 0..n-1 so that position q sends to
// q+1 and receives from q-1 (mod n), and split the buffer into n blocks. At
// step t a rank sends block start-t and receives block start-t-1; what it
// receives at step t is what it sends at step t+1, so every block travels
// around the ring. Receives of the first n-1 steps are combined into place
// (reduce-scatter: afterwards position q owns the full reduction of block
// start-(n-1)); later receives are copies (allgather).
//
// Pipelining. Blocks are cut into chunks of AlgorithmContext::chunk_bytes.
// All receives are posted up front, the sends of step 0 too, and as soon as
// chunk c of step t has arrived (and been reduced, by the transport, while
// later bytes are still in flight) the send of chunk c at step t+1 is
// posted. So transfer, reduction and forwarding overlap at chunk
// granularity instead of step granularity.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/collective/algorithms.h"

namespace dtrain {
namespace collective {
namespace internal {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// One rank's side of one ring over `blocks` of `base`.
class RingPipeline {
 public:
  struct Config {
    char* base;
    std::vector<Range> blocks;  // in elements
    size_t element_size;
    Pair* to_next;
    Pair* from_prev;
    size_t chunk_elements;
    int start_block;               // sent at step 0
    int steps;                     // total steps
    int combine_steps;             // the first combine_steps receives are combined
    const Combiner* combine;       // for combining steps but the last
    const Combiner* last_combine;  // for the last combining step
  };

  explicit RingPipeline(Config config) : c_(std::move(config)), n_(c_.blocks.size()) {}

  void Start() {
    for (int t = 0; t < c_.steps; ++t) {
      const Combiner* combiner = nullptr;
      if (t < c_.combine_steps) combiner = t + 1 == c_.combine_steps ? c_.last_combine : c_.combine;
      const int b = RecvBlock(t);
      for (size_t k = 0; k < Chunks(b); ++k) {
        Range r = Chunk(b, k);
        c_.from_prev->PostRecv(Ptr(r), r.count * c_.element_size, combiner);
      }
    }
    if (c_.steps > 0) PostSends(Mod(c_.start_block, n_));
    t_ = 0;
    k_ = 0;
    SkipEmpty();
  }

  bool done() const { return t_ >= c_.steps; }

  // Waits for the next receive; posts the send that forwards it.
  absl::Status Advance(absl::Time deadline) {
    DT_RETURN_IF_ERROR(c_.from_prev->WaitRecv(deadline));
    const int b = RecvBlock(t_);
    if (t_ + 1 < c_.steps) {
      Range r = Chunk(b, k_);
      c_.to_next->PostSend(Ptr(r), r.count * c_.element_size);
      ++sends_posted_;
    }
    if (++k_ == Chunks(b)) {
      ++t_;
      k_ = 0;
      SkipEmpty();
    }
    return absl::OkStatus();
  }

  // Waits for all sends.
  absl::Status Finish(absl::Time deadline) {
    for (; sends_waited_ < sends_posted_; ++sends_waited_) {
      DT_RETURN_IF_ERROR(c_.to_next->WaitSend(deadline));
    }
    return absl::OkStatus();
  }

 private:
  int RecvBlock(int t) const { return Mod(c_.start_block - t - 1, n_); }
  size_t Chunks(int b) const {
    return (c_.blocks[b].count + c_.chunk_elements - 1) / c_.chunk_elements;
  }
  Range Chunk(int b, size_t k) const {
    Range r;
    r.offset = c_.blocks[b].offset + k * c_.chunk_elements;
    r.count = std::min(c_.chunk_elements, c_.blocks[b].count - k * c_.chunk_elements);
    return r;
  }
  char* Ptr(const Range& r) const { return c_.base + r.offset * c_.element_size; }
  void PostSends(int b) {
    for (size_t k = 0; k < Chunks(b); ++k) {
      Range r = Chunk(b, k);
      c_.to_next->PostSend(Ptr(r), r.count * c_.element_size);
      ++sends_posted_;
    }
  }
  void SkipEmpty() {
    while (t_ < c_.steps && Chunks(RecvBlock(t_)) == 0) ++t_;
  }

  Config c_;
  const int n_;
  int t_ = 0;
  size_t k_ = 0;
  size_t sends_posted_ = 0;
  size_t sends_waited_ = 0;
};

size_t ChunkElements(const AlgorithmContext& ctx, size_t element_size) {
  return std::max<size_t>(1, ctx.chunk_bytes / element_size);
}

// Runs pipelines to completion, advancing them in turn.
absl::Status RunPipelines(const AlgorithmContext& ctx, std::vector<RingPipeline*> pipes) {
  for (RingPipeline* p : pipes) p->Start();
  bool more = true;
  while (more) {
    more = false;
    for (RingPipeline* p : pipes) {
      if (p->done()) continue;
      DT_RETURN_IF_ERROR(p->Advance(ctx.deadline));
      more = more || !p->done();
    }
  }
  for (RingPipeline* p : pipes) DT_RETURN_IF_ERROR(p->Finish(ctx.deadline));
  return absl::OkStatus();
}

}  // namespace

absl::Status RingAllreduce(const AlgorithmContext& ctx, void* data, size_t count, DType dtype,
                           ReduceOp op) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1 || count == 0) return absl::OkStatus();
  DT_ASSIGN_OR_RETURN(Pair * next, GetPair(ctx, (rank + 1) % n, 0));
  DT_ASSIGN_OR_RETURN(Pair * prev, GetPair(ctx, (rank + n - 1) % n, 0));
  ReduceCombiner sum(dtype, false, 1.0f);
  ReduceCombiner last(dtype, op == ReduceOp::kAverage, static_cast<float>(n));
  const size_t es = DTypeSize(dtype);
  RingPipeline pipe({static_cast<char*>(data), SplitEven(count, n), es, next, prev,
                     ChunkElements(ctx, es), rank, 2 * (n - 1), n - 1, &sum, &last});
  return RunPipelines(ctx, {&pipe});
}

absl::Status BidirectionalRingAllreduce(const AlgorithmContext& ctx, void* data, size_t count,
                                        DType dtype, ReduceOp op) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1 || count == 0) return absl::OkStatus();
  if (ctx.transport->num_channels() < 2) {
    return absl::FailedPreconditionError("the bidirectional ring needs two channels");
  }
  DT_ASSIGN_OR_RETURN(Pair * next0, GetPair(ctx, (rank + 1) % n, 0));
  DT_ASSIGN_OR_RETURN(Pair * prev0, GetPair(ctx, (rank + n - 1) % n, 0));
  DT_ASSIGN_OR_RETURN(Pair * next1, GetPair(ctx, (rank + n - 1) % n, 1));
  DT_ASSIGN_OR_RETURN(Pair * prev1, GetPair(ctx, (rank + 1) % n, 1));
  ReduceCombiner sum(dtype, false, 1.0f);
  ReduceCombiner last(dtype, op == ReduceOp::kAverage, static_cast<float>(n));
  const size_t es = DTypeSize(dtype);
  char* base = static_cast<char*>(data);
  std::vector<Range> halves = SplitEven(count, 2);
  // Clockwise over the first half: position = rank.
  RingPipeline cw({base + halves[0].offset * es, SplitEven(halves[0].count, n), es, next0, prev0,
                   ChunkElements(ctx, es), rank, 2 * (n - 1), n - 1, &sum, &last});
  // Counter-clockwise over the second half: position (n - rank) % n makes
  // "next" the rank below.
  const int position = (n - rank) % n;
  RingPipeline ccw({base + halves[1].offset * es, SplitEven(halves[1].count, n), es, next1, prev1,
                    ChunkElements(ctx, es), position, 2 * (n - 1), n - 1, &sum, &last});
  return RunPipelines(ctx, {&cw, &ccw});
}

absl::Status RingReduceScatter(const AlgorithmContext& ctx, void* data, size_t block_count,
                               DType dtype, ReduceOp op) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1 || block_count == 0) {
    if (op == ReduceOp::kAverage) {
      DivideInPlace(dtype, static_cast<char*>(data) + rank * block_count * DTypeSize(dtype),
                    block_count, static_cast<float>(n));
    }
    return absl::OkStatus();
  }
  DT_ASSIGN_OR_RETURN(Pair * next, GetPair(ctx, (rank + 1) % n, 0));
  DT_ASSIGN_OR_RETURN(Pair * prev, GetPair(ctx, (rank + n - 1) % n, 0));
  ReduceCombiner sum(dtype, false, 1.0f);
  ReduceCombiner last(dtype, op == ReduceOp::kAverage, static_cast<float>(n));
  const size_t es = DTypeSize(dtype);
  std::vector<Range> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = Range{i * block_count, block_count};
  // The last combining step receives block start-(n-1), which must be rank.
  RingPipeline pipe({static_cast<char*>(data), blocks, es, next, prev, ChunkElements(ctx, es),
                     rank - 1 + n, n - 1, n - 1, &sum, &last});
  return RunPipelines(ctx, {&pipe});
}

absl::Status RingAllgather(const AlgorithmContext& ctx, void* data, size_t block_bytes) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1 || block_bytes == 0) return absl::OkStatus();
  DT_ASSIGN_OR_RETURN(Pair * next, GetPair(ctx, (rank + 1) % n, 0));
  DT_ASSIGN_OR_RETURN(Pair * prev, GetPair(ctx, (rank + n - 1) % n, 0));
  std::vector<Range> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = Range{i * block_bytes, block_bytes};
  RingPipeline pipe({static_cast<char*>(data), blocks, 1, next, prev, ChunkElements(ctx, 1), rank,
                     n - 1, 0, nullptr, nullptr});
  return RunPipelines(ctx, {&pipe});
}

absl::Status ChainBroadcast(const AlgorithmContext& ctx, void* data, size_t bytes, int root) {
  const int n = ctx.transport->size();
  const int rank = ctx.transport->rank();
  if (n == 1 || bytes == 0) return absl::OkStatus();
  const int v = Mod(rank - root, n);  // position in the chain
  char* base = static_cast<char*>(data);
  const size_t chunk = std::max<size_t>(1, ctx.chunk_bytes);
  const size_t chunks = (bytes + chunk - 1) / chunk;
  Pair* prev = nullptr;
  Pair* next = nullptr;
  if (v > 0) {
    DT_ASSIGN_OR_RETURN(prev, GetPair(ctx, (rank + n - 1) % n, 0));
    for (size_t k = 0; k < chunks; ++k) {
      prev->PostRecv(base + k * chunk, std::min(chunk, bytes - k * chunk));
    }
  }
  if (v < n - 1) {
    DT_ASSIGN_OR_RETURN(next, GetPair(ctx, (rank + 1) % n, 0));
  }
  for (size_t k = 0; k < chunks; ++k) {
    if (prev != nullptr) DT_RETURN_IF_ERROR(prev->WaitRecv(ctx.deadline));
    if (next != nullptr) next->PostSend(base + k * chunk, std::min(chunk, bytes - k * chunk));
  }
  if (next != nullptr) {
    for (size_t k = 0; k < chunks; ++k) DT_RETURN_IF_ERROR(next->WaitSend(ctx.deadline));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace collective
}  // namespace dtrain
