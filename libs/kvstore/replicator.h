// Replicator: one replica of a chain-replicated kvstore shard
// (protos/replication.proto states the protocol).
//
//   Replicator r(&store, &link, {.shard = 0, .replica = 1, .incarnation = id});
//   r.SetMap(heartbeat_reply.map());              // whenever the owner answers
//   // at the head, for a client's write:
//   DT_ASSIGN_OR_RETURN(MutationResult done, r.Submit(mutation, deadline));
//   // or, to overlap the chain with other work (a PushPull's wait for its
//   // round), apply now and wait for the chain before answering:
//   Replicator::Ack ack;
//   DT_ASSIGN_OR_RETURN(MutationResult done, r.Apply(mutation, &ack));
//   ...
//   DT_RETURN_IF_ERROR(ack.Wait(deadline));
//   // a read at the head, answered once every replica holds what it read:
//   DT_RETURN_IF_ERROR(r.AppliedSoFar().Wait(deadline));
//   // on any replica, for a batch from its predecessor:
//   DT_ASSIGN_OR_RETURN(v1::ReplicateReply reply, r.Receive(batch, deadline));
//
// Order. Submit and Receive apply a mutation to the store and queue it for
// the successor under one lock, so the successor receives the mutations in
// exactly the order this replica applied them, and applies them in that
// order too. One batch is in flight at a time. The thread that applied a
// mutation sends the queue itself when no batch is in flight (no hand-off
// to another thread on the write path); a forwarder thread sends what is
// left, the state transfers and the retries. A write returns only when
// the successor (and so every replica after it) applied it. A mutation the store refuses changes
// nothing (the store is all or nothing) and is not forwarded: the other replicas would refuse it
// the same way.
//
// Failures. A batch that fails (the successor died, or its map is older or
// newer than ours) is sent again after a backoff until the map changes.
// When the successor changes (the owner removed a dead one, or one joined),
// this replica sends its whole state (Store::Export, as snapshot.h encodes
// it) before any further mutation; writes waiting for the old successor are
// covered by that transfer and complete when it is acknowledged, or at once
// when this replica became the tail. caught_up() then names the successor,
// which the heartbeat reports so the owner can make a joining replica
// ACTIVE. A client's retried push is a duplicate wherever it was applied
// already (the store's rounds): nothing is lost and nothing applied twice.
//
// Roles come from the map: Submit only at an ACTIVE head holding the state,
// Receive only from this replica's predecessor in a map of the same
// version; otherwise kUnavailable, which clients and predecessors retry
// after refreshing their map.
//
// Thread-safety: all methods are thread-safe.
#ifndef DTRAIN_LIBS_KVSTORE_REPLICATOR_H_
#define DTRAIN_LIBS_KVSTORE_REPLICATOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/kvstore/store.h"
#include "protos/replication.pb.h"

namespace dtrain {
namespace kvstore {

// What a mutation did (the fields of its kind).
struct MutationResult {
  bool created = false;  // CreateJob
  bool deleted = false;  // DeleteJob / LeaveJob
  InitResult init;
  PushResult push;
};

// Applies one mutation to `store`, as the client's call would have. A push
// with data_bytes takes its items' bytes from `values` (as many as it has
// items).
absl::StatusOr<MutationResult> ApplyMutation(Store* store, const v1::Mutation& mutation,
                                             const absl::string_view* values = nullptr);

// How a replica reaches its successor (services/kvstore: the data port, or
// gRPC).
class ReplicaLink {
 public:
  virtual ~ReplicaLink() = default;
  // Sends a serialized v1::ReplicateBatch to the replica at `address` and
  // returns its reply once it (and the replicas after it) applied the batch.
  // With `values`, the batch's pushes carry data_bytes instead of data and
  // `values` are their bytes, in order (a link that cannot send them apart
  // puts them back: InlineValues).
  virtual absl::StatusOr<v1::ReplicateReply> Replicate(
      const std::string& address, const std::string& batch,
      const std::vector<absl::string_view>& values) = 0;
};

// A batch whose pushes' values travel apart (ReplicatedPush.data_bytes) as
// one whose values are inside it: for links and receivers that take only
// those. kInvalidArgument when the sizes and the values disagree.
// The byte counts of the values a batch's pushes carry apart
// (ReplicatedPush.data_bytes), in the order they travel; kInvalidArgument
// for a negative one.
absl::StatusOr<std::vector<int64_t>> ApartValueSizes(const v1::ReplicateBatch& batch);

absl::StatusOr<v1::ReplicateBatch> InlineValues(absl::string_view batch,
                                                const std::vector<absl::string_view>& values);

struct ReplicatorOptions {
  int shard = 0;
  int replica = 0;
  // This process's random id: a restarted replica is a new member.
  uint64_t incarnation = 0;
  // Wait before sending a failed batch again.
  absl::Duration retry_backoff = absl::Milliseconds(20);
  // Mutations per batch.
  int max_batch = 256;
  // How long Ack::Wait polls before its thread sleeps.
  absl::Duration ack_spin = absl::Microseconds(50);
  // Apply(..., hold_incomplete = true) of a push that completes no SYNC
  // round stays queued until a write that completes one sends the queue, or
  // this long (then WaitHeld sends it): a round reaches the successor in one
  // batch instead of one per worker. 0: no holding.
  absl::Duration round_hold = absl::Milliseconds(2);
};

struct ReplicatorStats {
  int64_t forwarded = 0;       // mutations the successor acknowledged
  int64_t transfers = 0;       // state transfers the successor acknowledged
  int64_t transfer_bytes = 0;  // their value bytes
  int64_t send_failures = 0;   // batches sent again
  int64_t received = 0;        // mutations applied from the predecessor
};

class Replicator {
  struct Pending;

 public:
  // `store` and `link` must outlive the Replicator.
  Replicator(Store* store, ReplicaLink* link, ReplicatorOptions options);
  // Stops the forwarder; writes still waiting fail with kUnavailable.
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Follows `map` if it is newer than the current one.
  void SetMap(const v1::ShardMap& map);
  v1::ShardMap map() const;
  // Whether this replica holds the shard's state (an ACTIVE member, or a
  // joining one whose transfer arrived).
  bool has_state() const;
  // The successor (replica, incarnation) that acknowledged this replica's
  // state transfer and receives its mutations; (-1, 0) if none.
  std::pair<int, uint64_t> caught_up() const;

  // Completes once every replica applied the mutations it stands for.
  class Ack {
   public:
    Ack() = default;  // nothing to wait for
    // OK once the chain applied them; kDeadlineExceeded at `deadline`
    // (the client retries, and the retry is a duplicate); kUnavailable when
    // this replica stopped or left its chain first.
    absl::Status Wait(absl::Time deadline) const;
    // Whether Apply held the write (its `hold_incomplete`): it goes down the
    // chain with the write that completes its round, or once ReleaseHold
    // (or WaitHeld) sends it.
    bool held() const { return held_; }

   private:
    friend class Replicator;
    std::shared_ptr<Pending> pending_;
    absl::Duration spin_;
    bool held_ = false;
  };

  // A client's write, at the head: applies it, forwards it, and returns its
  // result once the chain applied it (Apply, then Ack::Wait).
  absl::StatusOr<MutationResult> Submit(v1::Mutation mutation, absl::Time deadline);
  // A client's write, at the head: applies it and queues it for the chain.
  // When no batch is in flight the calling thread sends the queue itself
  // (and returns with the acknowledgement in hand); otherwise it returns
  // at once and the thread that holds the connection sends it next. `ack`
  // completes when every replica applied it: answer the client only then.
  //
  // `values`: for a push whose items carry data_bytes instead of data, the
  // items' bytes, referenced and not copied (they go from there to the
  // successor). The caller keeps them valid and unchanged until it called
  // Detach(*ack), which it must before they go away.
  //
  // `hold_incomplete`: a push that completes no SYNC round (each item it
  // applied waits for other workers) is not sent now but with the write
  // that completes the round (or after options.round_hold): for a caller
  // that waits for the round anyway (a PushPull), so that the round costs
  // the chain one batch.
  absl::StatusOr<MutationResult> Apply(v1::Mutation mutation, Ack* ack,
                                       std::vector<absl::string_view> values = {},
                                       bool hold_incomplete = false);
  // For a write applied with hold_incomplete: waits for the chain like
  // ack.Wait(deadline), and sends the queue itself if the round did not
  // complete within options.round_hold.
  absl::Status WaitHeld(const Ack& ack, absl::Time deadline);
  // For a held write whose caller does not wait in WaitHeld (it waits for
  // its round without a thread): sends the queue now if the write is still
  // queued (not sent yet, nor acknowledged). Call it once the hold ran out,
  // or when the caller stops waiting.
  void ReleaseHold(const Ack& ack);
  // For a write applied with referenced values: returns once the chain no
  // longer needs them (acknowledged, or copied here if still queued; waits
  // while its batch is being sent). A held write's hold ends unless
  // `keep_hold` (for a caller that calls ReleaseHold itself).
  void Detach(const Ack& ack, bool keep_hold = false);
  // Completes once every mutation applied here so far is on every replica:
  // a read at the head waits for it before answering, so that it never
  // returns a value a replica that takes over could lack.
  Ack AppliedSoFar() const;

  // A batch from the predecessor: applies the state (if any) and the
  // mutations in order, forwards them, and replies once the successor
  // acknowledged them. `values`: the bytes of pushes that carry data_bytes
  // (applied from there; copied only to be forwarded); kInvalidArgument,
  // with nothing applied, when they do not add up.
  absl::StatusOr<v1::ReplicateReply> Receive(v1::ReplicateBatch batch, absl::Time deadline,
                                             const std::vector<absl::string_view>& values = {});

  // OK if this replica may serve reads (an ACTIVE member with the state);
  // kUnavailable naming the reason otherwise.
  absl::Status CheckServesReads() const;
  // OK if this replica is the ACTIVE head holding the state (where writes
  // go); kUnavailable otherwise. Submit checks it too.
  absl::Status CheckIsHead() const;
  // "head", "middle", "tail", "joining" or "none" (not in the map).
  std::string Role() const;
  // Whether this replica has a successor to forward writes to (it is not
  // the tail, or the whole chain).
  bool has_successor() const;

  ReplicatorStats stats() const;

  // Stops forwarding: writes and batches still waiting for the chain fail
  // with kUnavailable (their clients retry elsewhere), and so do later ones.
  // For a server shutting down. Irreversible.
  void Stop();

 private:
  struct Peer {
    int replica = -1;
    uint64_t incarnation = 0;
    std::string address;
  };

  bool IsMemberLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckIsHeadLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string WhoLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies and, with a successor, queues; returns the queued entry or null.
  // `values`: a push's items' bytes when they travel apart (the mutation
  // must then not be queued: it is inlined first when there is a successor).
  absl::StatusOr<MutationResult> ApplyAndQueueLocked(std::shared_ptr<const v1::Mutation> mutation,
                                                     std::shared_ptr<Pending>* queued,
                                                     const absl::string_view* values = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the next batch (or the state transfer) to the successor, with mu_
  // released while it travels; false when it failed (retry_at_ is then
  // set). Only the thread that set sending_.
  bool SendBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends queued batches from the calling thread while no other batch is in
  // flight, the successor holds this replica's state and no retry is due.
  void SendInlineLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts the batch in flight back at the front of the queue, in order.
  void RequeueInflightLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteLocked(std::deque<std::shared_ptr<Pending>>* entries, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forward();

  Store* const store_;
  ReplicaLink* const link_;
  const ReplicatorOptions options_;

  mutable absl::Mutex mu_;  // also the order of mutations
  v1::ShardMap map_ ABSL_GUARDED_BY(mu_);
  bool has_state_ ABSL_GUARDED_BY(mu_) = false;
  Peer successor_ ABSL_GUARDED_BY(mu_);
  uint64_t successor_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // raised when the successor changes
  bool need_transfer_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::shared_ptr<Pending>> queue_ ABSL_GUARDED_BY(mu_);     // not yet sent
  std::deque<std::shared_ptr<Pending>> inflight_ ABSL_GUARDED_BY(mu_);  // sent, unacknowledged
  std::shared_ptr<Pending> last_queued_ ABSL_GUARDED_BY(mu_);  // null: all applied is replicated
  bool sending_ ABSL_GUARDED_BY(mu_) = false;                  // a batch is in flight
  // Until then the queue waits for a write that completes a round
  // (options_.round_hold); InfinitePast: nothing held.
  absl::Time hold_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // after a failed batch
  std::pair<int, uint64_t> caught_up_ ABSL_GUARDED_BY(mu_) = {-1, 0};
  ReplicatorStats stats_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread forwarder_;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_REPLICATOR_H_
