// Internal: the operation queues and the wait loop shared by all transports.
//
// Each transport derives its pairs from EnginePair (which keeps the FIFO
// queues of posted sends and receives and the completion counters) and
// itself from EngineTransport (which runs the loop behind every Wait: make
// progress on all pairs, and when nothing moves, block until something may
// have changed or the deadline passes). A transport supplies only how bytes
// move (EnginePair::Progress) and how to sleep (EngineTransport::Block).
#ifndef DTRAIN_LIBS_COLLECTIVE_ENGINE_H_
#define DTRAIN_LIBS_COLLECTIVE_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "libs/collective/transport.h"

namespace dtrain {
namespace collective {
namespace internal {

struct SendOp {
  const char* data;
  size_t bytes;
  size_t done = 0;  // bytes handed over so far
};

struct RecvOp {
  char* data;
  size_t bytes;
  size_t done = 0;  // bytes of the stream consumed so far
  const Combiner* combiner = nullptr;
  // Bytes of an element split between two deliveries (combining receives).
  unsigned char carry[8];
  size_t carry_len = 0;
};

// Puts `n` stream bytes from `src` into `op` at position op.done (a copy, or a
// combination for whole elements; partial elements wait in op.carry).
// REQUIRES: n <= op.bytes - op.done.
void Deliver(RecvOp& op, const char* src, size_t n);

class EngineTransport;

class EnginePair : public Pair {
 public:
  EnginePair(EngineTransport* transport, int peer, int channel)
      : transport_(transport), peer_(peer), channel_(channel) {}

  int peer() const final { return peer_; }
  int channel() const final { return channel_; }
  void PostSend(const void* data, size_t bytes) final;
  void PostRecv(void* data, size_t bytes, const Combiner* combiner) final;
  absl::Status WaitSend(absl::Time deadline) final;
  absl::Status WaitRecv(absl::Time deadline) final;

  bool has_pending() const { return !sends_.empty() || !recvs_.empty(); }
  bool has_pending_sends() const { return !sends_.empty(); }
  bool has_pending_recvs() const { return !recvs_.empty(); }

  // Moves as many bytes as possible without blocking; true when anything
  // changed. Reports failures with Fail().
  virtual bool Progress() = 0;

  // Drops all queued operations (their memory is not touched afterwards).
  void DropAll();

 protected:
  friend class EngineTransport;

  // Hook for transports that publish a send when it is posted (in-process).
  virtual void OnPostSend(const SendOp& op) {}

  void CompleteFrontSend();
  void CompleteFrontRecv();
  // Records a failure of this pair; the transport's waits all fail with it.
  void Fail(const absl::Status& status);

  EngineTransport* const transport_;
  const int peer_;
  const int channel_;
  std::deque<SendOp> sends_;  // incomplete sends, oldest first
  std::deque<RecvOp> recvs_;  // incomplete receives, oldest first
  uint64_t sends_completed_ = 0;
  uint64_t sends_waited_ = 0;
  uint64_t recvs_completed_ = 0;
  uint64_t recvs_waited_ = 0;
};

class EngineTransport : public Transport {
 public:
  // The loop behind Pair::WaitSend/WaitRecv.
  absl::Status Wait(EnginePair* pair, bool send, absl::Time deadline);

  void Abort(const absl::Status& reason) final;

  // The first failure seen (OK while healthy).
  const absl::Status& error() const { return error_; }

 protected:
  // Registers a pair with the progress loop (the transport owns it).
  void AddPair(EnginePair* pair) { pairs_.push_back(pair); }
  const std::vector<EnginePair*>& pairs() const { return pairs_; }

  // A value that changes whenever a peer may have made progress possible;
  // read before a progress pass so Block can tell whether to sleep.
  virtual uint64_t ActivityToken() { return 0; }

  // Sleeps until ActivityToken() differs from `token`, some pending
  // operation may move, or `deadline`; may return early. May call Fail on
  // pairs whose peer is found dead.
  virtual void Block(uint64_t token, absl::Time deadline) = 0;

  // Makes peers notice that this rank stopped (called once, by Abort).
  virtual void OnAbort(const absl::Status& reason) = 0;

  // Records the first error.
  void SetError(const absl::Status& status);

  bool aborted() const { return aborted_; }

 private:
  friend class EnginePair;
  std::vector<EnginePair*> pairs_;
  absl::Status error_;
  bool aborted_ = false;
};

// An EngineTransport with one PairT per (peer, channel) of its options: the
// grid behind rank(), size(), num_channels() and GetPair(). Slots stay empty
// (GetPair returns null) until the transport connects them with SetPair.
template <class PairT>
class PairGridTransport : public EngineTransport {
 public:
  int rank() const final { return rank_; }
  int size() const final { return size_; }
  int num_channels() const final { return channels_; }
  Pair* GetPair(int peer, int channel) final { return pair(peer, channel); }

 protected:
  explicit PairGridTransport(const TransportOptions& options)
      : rank_(options.rank),
        size_(options.size),
        channels_(options.channels),
        by_peer_(options.size) {
    for (auto& row : by_peer_) row.resize(channels_);
  }

  // The pair with `peer` on `channel`; null when out of range or not set.
  PairT* pair(int peer, int channel) const {
    if (peer < 0 || peer >= size_ || channel < 0 || channel >= channels_) return nullptr;
    return by_peer_[peer][channel].get();
  }

  // Owns `p` as the pair with `peer` on `channel` and registers it with the
  // progress loop (AddPair).
  PairT* SetPair(int peer, int channel, std::unique_ptr<PairT> p) {
    by_peer_[peer][channel] = std::move(p);
    AddPair(by_peer_[peer][channel].get());
    return by_peer_[peer][channel].get();
  }

  // Calls f(PairT&) for every pair that is set.
  template <class F>
  void ForEachPair(F f) {
    for (auto& row : by_peer_) {
      for (auto& p : row) {
        if (p) f(*p);
      }
    }
  }

  const int rank_;
  const int size_;
  const int channels_;

 private:
  std::vector<std::vector<std::unique_ptr<PairT>>> by_peer_;
};

}  // namespace internal
}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_ENGINE_H_
