// The transport interface: how bytes move between two ranks.
//
// Algorithms (ring allreduce, halving-doubling, ...) are written against
// these two small interfaces and never see a socket or a shared-memory
// segment, as in gloo's transport/pair.h. Three implementations exist:
//
//   inprocess_transport.h  ranks are threads of one process; a receive copies
//                          (or reduces) straight out of the sender's buffer;
//   shm_transport.h        ranks are processes on one host; one ring buffer in
//                          POSIX shared memory per direction of every pair;
//   tcp_transport.h        ranks anywhere; one TCP connection per pair and
//                          channel, non-blocking sockets.
//
// A Pair is one peer and one channel: an ordered, reliable byte stream in
// each direction. Operations are posted and then waited for:
//
//   Pair* right = transport->GetPair(rank + 1, /*channel=*/0);
//   Pair* left = transport->GetPair(rank - 1, 0);
//   right->PostSend(out, bytes);
//   left->PostRecv(in, bytes, &sum);      // in[i] += incoming[i]
//   DT_RETURN_IF_ERROR(left->WaitRecv(deadline));
//   DT_RETURN_IF_ERROR(right->WaitSend(deadline));
//
// Stream semantics: the receiver's posted receives are filled, in the order
// posted, from the bytes the sender posted, in the order posted. Sizes need
// not match one to one; algorithms simply post the same sequence on both
// sides. Zero-byte operations complete at once and carry no signal.
//
// Progress: a transport moves data only while some thread is inside a Wait
// call of that transport (any pair), which advances every pending operation
// of the transport, not only the one waited for. So a rank may post a send to
// its right and wait for a receive from its left without deadlock.
//
// Threading: one Transport object (with all its pairs) is driven by one
// thread at a time; the Communicator guarantees that. Different Transport
// objects (different ranks in one process) are independent.
#ifndef DTRAIN_LIBS_COLLECTIVE_TRANSPORT_H_
#define DTRAIN_LIBS_COLLECTIVE_TRANSPORT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "libs/collective/store.h"

namespace dtrain {
namespace collective {

// How a receive puts incoming bytes into its buffer when it is not a plain
// copy: element-wise combination, dst = dst (op) incoming. Transports call
// Combine only on whole elements, possibly in many pieces, in stream order.
class Combiner {
 public:
  virtual ~Combiner() = default;
  // Bytes per element (1 to 8).
  virtual size_t element_size() const = 0;
  // Combines `count` elements from `src` into `dst`. `src` may be unaligned.
  virtual void Combine(void* dst, const void* src, size_t count) const = 0;
};

// One peer and one channel. Owned by its Transport; valid until it is gone.
// Not thread-safe (see the file comment).
class Pair {
 public:
  virtual ~Pair() = default;

  virtual int peer() const = 0;
  virtual int channel() const = 0;

  // Queues a send of [data, data + bytes). The memory must stay valid and
  // unchanged until the send completes: until WaitSend returns for it, or the
  // transport is aborted or destroyed.
  virtual void PostSend(const void* data, size_t bytes) = 0;

  // Queues a receive of exactly `bytes` into `data`: a copy when `combiner` is
  // null, otherwise data = combine(data, incoming). `data` (and `combiner`)
  // must stay valid until the receive completes. REQUIRES: bytes is a
  // multiple of combiner->element_size().
  virtual void PostRecv(void* data, size_t bytes, const Combiner* combiner = nullptr) = 0;

  // Waits until the oldest send (receive) posted and not yet waited for has
  // completed. Errors:
  //   DEADLINE_EXCEEDED  `deadline` passed first (the message names the peer
  //                      and how many bytes moved);
  //   UNAVAILABLE        the peer's process died or its connection closed
  //                      while this rank still had operations with it;
  //   ABORTED            this transport or a peer's was aborted.
  // After an error the transport is unusable (streams are out of step):
  // callers abort it. REQUIRES: such an operation was posted.
  virtual absl::Status WaitSend(absl::Time deadline) = 0;
  virtual absl::Status WaitRecv(absl::Time deadline) = 0;
};

// All the connections of one rank of one communicator.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual const char* name() const = 0;  // "inprocess", "shm", "tcp"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int num_channels() const = 0;

  // The pair for `peer` and `channel`, or null when `peer` is not connected
  // (see TransportOptions::peers) or the arguments are out of range.
  virtual Pair* GetPair(int peer, int channel) = 0;

  // Fails every pending and future operation of this rank with ABORTED and
  // makes peers that have (or later post) operations with this rank fail too:
  // sockets are closed, shared state is marked. Idempotent; `reason` is kept
  // for messages. After Abort the memory of pending operations is no longer
  // touched.
  virtual void Abort(const absl::Status& reason) = 0;
};

// What every transport needs at creation.
struct TransportOptions {
  int rank = 0;
  int size = 1;
  // Where ranks publish their addresses; keys are made unique by `job_id`.
  Store* store = nullptr;
  // A string all ranks of this communicator share and no other communicator
  // uses (Communicator::Create makes one); names sockets' handshakes and
  // shared-memory segments.
  std::string job_id;
  // The ranks to connect to. Must be symmetric: q is in rank p's list exactly
  // when p is in rank q's list. Other ranks get no pair.
  std::vector<int> peers;
  // Independent streams per peer (the bidirectional ring uses two).
  int channels = 2;
  // Creation fails with DEADLINE_EXCEEDED if the peers are not all
  // connected by then.
  absl::Time deadline = absl::InfiniteFuture();
};

}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_TRANSPORT_H_
