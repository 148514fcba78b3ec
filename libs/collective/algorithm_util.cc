// Helpers shared by the algorithms: peer sets, splitting, point-to-point
// steps, the reduce combiner.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/collective/algorithms.h"

namespace dtrain {
namespace collective {
namespace internal {

int FloorPowerOfTwo(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

std::vector<int> PeersNeeded(int rank, int size) {
  std::set<int> peers;
  if (size > 1) {
    peers.insert((rank + 1) % size);
    peers.insert((rank + size - 1) % size);
  }
  const int p = FloorPowerOfTwo(size);
  if (rank < p) {
    for (int mask = 1; mask < p; mask <<= 1) peers.insert(rank ^ mask);
    if (rank + p < size) peers.insert(rank + p);
  } else {
    peers.insert(rank - p);
  }
  peers.erase(rank);
  return std::vector<int>(peers.begin(), peers.end());
}

std::vector<Range> SplitEven(size_t count, int n) {
  std::vector<Range> out(n);
  const size_t base = count / n;
  const size_t extra = count % n;
  size_t offset = 0;
  for (int i = 0; i < n; ++i) {
    out[i].offset = offset;
    out[i].count = base + (static_cast<size_t>(i) < extra ? 1 : 0);
    offset += out[i].count;
  }
  return out;
}

absl::StatusOr<Pair*> GetPair(const AlgorithmContext& ctx, int peer, int channel) {
  Pair* pair = ctx.transport->GetPair(peer, channel);
  if (pair == nullptr) {
    return absl::InternalError(absl::StrCat("rank ", ctx.transport->rank(),
                                            " has no connection to rank ", peer, " (channel ",
                                            channel, ")"));
  }
  return pair;
}

absl::Status Exchange(const AlgorithmContext& ctx, Pair* pair, const void* send, size_t send_bytes,
                      void* recv, size_t recv_bytes, const Combiner* combiner) {
  pair->PostRecv(recv, recv_bytes, combiner);
  pair->PostSend(send, send_bytes);
  DT_RETURN_IF_ERROR(pair->WaitRecv(ctx.deadline));
  return pair->WaitSend(ctx.deadline);
}

absl::Status SendTo(const AlgorithmContext& ctx, int peer, const void* data, size_t bytes) {
  DT_ASSIGN_OR_RETURN(Pair * pair, GetPair(ctx, peer));
  pair->PostSend(data, bytes);
  return pair->WaitSend(ctx.deadline);
}

absl::Status RecvFrom(const AlgorithmContext& ctx, int peer, void* data, size_t bytes,
                      const Combiner* combiner) {
  DT_ASSIGN_OR_RETURN(Pair * pair, GetPair(ctx, peer));
  pair->PostRecv(data, bytes, combiner);
  return pair->WaitRecv(ctx.deadline);
}

void ReduceCombiner::Combine(void* dst, const void* src, size_t count) const {
  if (divide_) {
    ReduceSumDivide(dtype_, dst, src, count, divisor_);
  } else {
    ReduceSum(dtype_, dst, src, count);
  }
}

}  // namespace internal
}  // namespace collective
}  // namespace dtrain
