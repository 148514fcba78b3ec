#include "libs/kvstore/replicator.h"

#include <sched.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/kvstore/proto_convert.h"
#include "libs/kvstore/shard_map.h"
#include "libs/kvstore/snapshot.h"

namespace dtrain {
namespace kvstore {

absl::StatusOr<MutationResult> ApplyMutation(Store* store, const v1::Mutation& m,
                                             const absl::string_view* values) {
  MutationResult result;
  switch (m.op_case()) {
    case v1::Mutation::kCreateJob: {
      DT_ASSIGN_OR_RETURN(JobConfig config, FromProto(m.create_job().config()));
      DT_ASSIGN_OR_RETURN(result.created, store->CreateJob(config));
      return result;
    }
    case v1::Mutation::kDeleteJob: {
      const v1::DeleteJobRequest& d = m.delete_job();
      if (d.leave()) {
        DT_ASSIGN_OR_RETURN(result.deleted, store->LeaveJob(d.job(), d.worker()));
      } else {
        DT_RETURN_IF_ERROR(store->DeleteJob(d.job()));
        result.deleted = true;
      }
      return result;
    }
    case v1::Mutation::kInit: {
      const v1::InitRequest& init = m.init();
      std::vector<InitItem> items(static_cast<size_t>(init.slices_size()));
      for (int i = 0; i < init.slices_size(); ++i) {
        DT_ASSIGN_OR_RETURN(items[static_cast<size_t>(i)].spec, FromProto(init.slices(i)));
      }
      for (const v1::Chunk& c : init.chunks()) {
        if (c.item() < 0 || c.item() >= init.slices_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("replicated Init: chunk of item ", c.item()));
        }
        items[static_cast<size_t>(c.item())].data.push_back(c.data());
      }
      DT_ASSIGN_OR_RETURN(result.init, store->Init(init.job(), items));
      return result;
    }
    case v1::Mutation::kPush: {
      const v1::ReplicatedPush& p = m.push();
      const bool apart = p.data_bytes_size() > 0;
      if (apart && values == nullptr) {
        return absl::InvalidArgumentError("replicated push: its values travel apart but none came");
      }
      if ((apart ? p.data_bytes_size() : p.data_size()) != p.items_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("replicated push: ", apart ? p.data_bytes_size() : p.data_size(),
                         " values for ", p.items_size(), " items"));
      }
      DT_ASSIGN_OR_RETURN(CompressionSpec compression,
                          CompressionFromProto(p.compression(), p.topk_ratio()));
      std::vector<PushItem> items;
      for (int i = 0; i < p.items_size(); ++i) {
        const v1::PushItem& proto = p.items(i);
        PushItem item;
        item.key = proto.key();
        item.slice = proto.slice();
        item.round = proto.round();
        DT_ASSIGN_OR_RETURN(item.dtype, DTypeFromWire(proto.dtype()));
        item.shape.assign(proto.shape().begin(), proto.shape().end());
        item.data = {apart ? values[i] : absl::string_view(p.data(i))};
        items.push_back(std::move(item));
      }
      DT_ASSIGN_OR_RETURN(result.push, store->Push(p.job(), p.worker(), compression, items));
      return result;
    }
    case v1::Mutation::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("replicated mutation with no operation");
}

namespace {

// Values a push carrying data_bytes takes: its items' count.
int ApartValues(const v1::Mutation& m) {
  return m.op_case() == v1::Mutation::kPush ? m.push().data_bytes_size() : 0;
}

// Checks that `values` are exactly the bytes the batch's data_bytes name.
absl::Status CheckApartValues(const v1::ReplicateBatch& batch,
                              const std::vector<absl::string_view>& values) {
  DT_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, ApartValueSizes(batch));
  if (sizes.size() != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("replicated batch: ", values.size(),
                                                   " values for pushes that name ", sizes.size()));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (static_cast<uint64_t>(sizes[i]) != values[i].size()) {
      return absl::InvalidArgumentError(absl::StrCat("replicated batch: value ", i, " should have ",
                                                     sizes[i], " bytes, ", values[i].size(),
                                                     " came"));
    }
  }
  return absl::OkStatus();
}

// `m` with `values` (its ApartValues) moved inside it.
void InlineInto(v1::Mutation* m, const absl::string_view* values) {
  v1::ReplicatedPush* p = m->mutable_push();
  for (int i = 0; i < p->data_bytes_size(); ++i) p->add_data(values[i].data(), values[i].size());
  p->clear_data_bytes();
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ApartValueSizes(const v1::ReplicateBatch& batch) {
  std::vector<int64_t> sizes;
  for (const v1::Mutation& m : batch.mutations()) {
    for (int i = 0; i < ApartValues(m); ++i) {
      const int64_t n = m.push().data_bytes(i);
      if (n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("replicated batch: value ", sizes.size(), " has ", n, " bytes"));
      }
      sizes.push_back(n);
    }
  }
  return sizes;
}

absl::StatusOr<v1::ReplicateBatch> InlineValues(absl::string_view bytes,
                                                const std::vector<absl::string_view>& values) {
  v1::ReplicateBatch batch;
  if (!batch.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("replicated batch: does not parse");
  }
  DT_RETURN_IF_ERROR(CheckApartValues(batch, values));
  size_t at = 0;
  for (v1::Mutation& m : *batch.mutable_mutations()) {
    const int n = ApartValues(m);
    if (n == 0) continue;
    InlineInto(&m, &values[at]);
    at += static_cast<size_t>(n);
  }
  return batch;
}

// A mutation applied here and queued for the successor.
struct Replicator::Pending {
  std::shared_ptr<const v1::Mutation> mutation;
  // A push applied with referenced values (Apply's `values`): its items'
  // bytes, in `owned` once Detach copied them.
  std::vector<absl::string_view> values;
  std::vector<std::string> owned;
  bool being_sent = false;  // its values are being read, unlocked (mu_)
  absl::Notification done;
  absl::Status status;  // written once, before done
};

Replicator::Replicator(Store* store, ReplicaLink* link, ReplicatorOptions options)
    : store_(store), link_(link), options_(options) {
  forwarder_ = std::thread([this] { Forward(); });
}

Replicator::~Replicator() {
  Stop();
  forwarder_.join();
}

void Replicator::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  const absl::Status stopped = absl::UnavailableError(
      absl::StrCat(WhoLocked(), " is shutting down; the write may not have reached every replica"));
  CompleteLocked(&inflight_, stopped);
  CompleteLocked(&queue_, stopped);
}

std::string Replicator::WhoLocked() const {
  return absl::StrCat("kvstore shard ", options_.shard, " replica ", options_.replica,
                      " (map version ", map_.version(), ")");
}

bool Replicator::IsMemberLocked() const {
  const v1::ChainMember* me = FindMember(map_, options_.shard, options_.replica);
  return me != nullptr && me->incarnation() == options_.incarnation;
}

void Replicator::CompleteLocked(std::deque<std::shared_ptr<Pending>>* entries,
                                const absl::Status& status) {
  for (const std::shared_ptr<Pending>& p : *entries) {
    p->status = status;
    p->done.Notify();
  }
  entries->clear();
}

void Replicator::RequeueInflightLocked() {
  while (!inflight_.empty()) {
    queue_.push_front(std::move(inflight_.back()));
    inflight_.pop_back();
  }
}

void Replicator::SetMap(const v1::ShardMap& map) {
  absl::MutexLock lock(&mu_);
  if (map.version() <= map_.version()) return;
  map_ = map;
  const bool member = IsMemberLocked();
  const v1::ChainMember* me = FindMember(map_, options_.shard, options_.replica);
  if (!member) {
    if (has_state_)
      DT_LOG(WARNING) << WhoLocked() << " is no longer in its chain; it serves nothing";
    has_state_ = false;
  } else if (me->state() == v1::REPLICA_ACTIVE) {
    has_state_ = true;
  }
  Peer next;
  if (member) {
    if (const v1::ChainMember* s = Successor(map_, options_.shard, options_.replica)) {
      next = {s->replica(), s->incarnation(), s->address()};
    }
  }
  if (next.replica == successor_.replica && next.incarnation == successor_.incarnation &&
      next.address == successor_.address) {
    return;
  }
  DT_LOG(INFO) << WhoLocked() << ": " << DescribeChain(map_, options_.shard);
  successor_ = next;
  ++successor_epoch_;
  retry_at_ = absl::InfinitePast();
  caught_up_ = {-1, 0};
  // Writes sent to the old successor and not acknowledged go again, inside
  // the state transfer to the new one.
  RequeueInflightLocked();
  if (next.replica < 0) {
    // The tail now (every live replica applied them), or out of the chain.
    CompleteLocked(&queue_, member ? absl::OkStatus()
                                   : absl::UnavailableError(
                                         absl::StrCat(WhoLocked(),
                                                      " left its chain before the write was "
                                                      "replicated; retry on the new head")));
    need_transfer_ = false;
  } else {
    need_transfer_ = true;
  }
}

v1::ShardMap Replicator::map() const {
  absl::MutexLock lock(&mu_);
  return map_;
}

bool Replicator::has_state() const {
  absl::MutexLock lock(&mu_);
  return has_state_;
}

std::pair<int, uint64_t> Replicator::caught_up() const {
  absl::MutexLock lock(&mu_);
  return caught_up_;
}

ReplicatorStats Replicator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status Replicator::CheckServesReads() const {
  absl::MutexLock lock(&mu_);
  const v1::ChainMember* me = FindMember(map_, options_.shard, options_.replica);
  if (!IsMemberLocked() || me->state() != v1::REPLICA_ACTIVE || !has_state_) {
    return absl::UnavailableError(absl::StrCat(
        WhoLocked(), " is not an active member of its chain yet; refresh the shard map"));
  }
  return absl::OkStatus();
}

absl::Status Replicator::CheckIsHeadLocked() const {
  const v1::ChainMember* head = ChainHead(map_, options_.shard);
  if (!IsMemberLocked() || head == nullptr || head->replica() != options_.replica || !has_state_) {
    return absl::UnavailableError(
        absl::StrCat(WhoLocked(), " is not the head of its chain; refresh the shard map"));
  }
  return absl::OkStatus();
}

absl::Status Replicator::CheckIsHead() const {
  absl::MutexLock lock(&mu_);
  return CheckIsHeadLocked();
}

bool Replicator::has_successor() const {
  absl::MutexLock lock(&mu_);
  return successor_.replica >= 0;
}

std::string Replicator::Role() const {
  absl::MutexLock lock(&mu_);
  if (!IsMemberLocked()) return "none";
  const v1::ChainMember* me = FindMember(map_, options_.shard, options_.replica);
  if (me->state() != v1::REPLICA_ACTIVE) return "joining";
  const v1::ChainMember* head = ChainHead(map_, options_.shard);
  if (head != nullptr && head->replica() == options_.replica) return "head";
  const v1::ChainMember* tail = ChainTail(map_, options_.shard);
  if (tail != nullptr && tail->replica() == options_.replica) return "tail";
  return "middle";
}

absl::StatusOr<MutationResult> Replicator::ApplyAndQueueLocked(
    std::shared_ptr<const v1::Mutation> mutation, std::shared_ptr<Pending>* queued,
    const absl::string_view* values) {
  DT_ASSIGN_OR_RETURN(MutationResult result, ApplyMutation(store_, *mutation, values));
  if (successor_.replica >= 0) {
    auto p = std::make_shared<Pending>();
    p->mutation = std::move(mutation);
    queue_.push_back(p);
    last_queued_ = p;
    *queued = std::move(p);
  } else {
    last_queued_ = nullptr;  // the tail: applied here is applied everywhere
  }
  return result;
}

absl::Status Replicator::Ack::Wait(absl::Time deadline) const {
  if (pending_ == nullptr) return absl::OkStatus();
  // A small batch's acknowledgement comes within tens of microseconds:
  // poll for it before sleeping (a sleeping thread's wakeup costs as much).
  const absl::Time end = absl::Now() + spin_;
  while (!pending_->done.HasBeenNotified() && absl::Now() < end) sched_yield();
  if (!pending_->done.WaitForNotificationWithDeadline(deadline)) {
    return absl::DeadlineExceededError(
        "the write was applied at the head but not yet acknowledged by every replica; retry (a "
        "retried push is not applied twice)");
  }
  return pending_->status;
}

absl::StatusOr<MutationResult> Replicator::Apply(v1::Mutation mutation, Ack* ack,
                                                 std::vector<absl::string_view> values,
                                                 bool hold_incomplete) {
  if (static_cast<size_t>(ApartValues(mutation)) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Replicator::Apply: ", values.size(),
                                                   " values for ", ApartValues(mutation),
                                                   " items sent apart"));
  }
  auto shared = std::make_shared<const v1::Mutation>(std::move(mutation));
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError(absl::StrCat(WhoLocked(), " is shutting down"));
  DT_RETURN_IF_ERROR(CheckIsHeadLocked());
  std::shared_ptr<Pending> unheld = last_queued_;
  DT_ASSIGN_OR_RETURN(MutationResult result,
                      ApplyAndQueueLocked(std::move(shared), &ack->pending_,
                                          values.empty() ? nullptr : values.data()));
  if (ack->pending_ != nullptr) ack->pending_->values = std::move(values);
  ack->spin_ = options_.ack_spin;
  // Only a push that completes no round (every item it applied waits for
  // other workers) is held: a completed round's values must reach the
  // chain before anyone reads them.
  if (hold_incomplete && ack->pending_ != nullptr && result.push.applied > 0 &&
      result.push.incomplete == result.push.applied && options_.round_hold > absl::ZeroDuration()) {
    hold_until_ = absl::Now() + options_.round_hold;
    // Reads need not wait for it: it left its round incomplete, and a read
    // sees only completed rounds (whose last push, sent with or after this
    // one, is what AppliedSoFar then waits for). Waiting would hold the
    // round's other workers' answers for the hold.
    last_queued_ = std::move(unheld);
    ack->held_ = true;
    return result;
  }
  hold_until_ = absl::InfinitePast();
  SendInlineLocked();
  return result;
}

absl::Status Replicator::WaitHeld(const Ack& ack, absl::Time deadline) {
  if (ack.pending_ == nullptr) return absl::OkStatus();
  // A held write waits for another worker's push, not for a reply already
  // on its way: sleep at once, leaving the CPUs to the threads that do the
  // round's work.
  Ack quiet = ack;
  quiet.spin_ = absl::ZeroDuration();
  const absl::Time held = std::min(deadline, absl::Now() + options_.round_hold);
  if (absl::Status s = quiet.Wait(held); !absl::IsDeadlineExceeded(s)) return s;
  ReleaseHold(ack);  // the round did not complete within the hold
  return ack.Wait(deadline);
}

void Replicator::ReleaseHold(const Ack& ack) {
  if (ack.pending_ == nullptr) return;
  absl::MutexLock lock(&mu_);
  if (ack.pending_->done.HasBeenNotified()) return;
  // Only while it is still queued: once sent (in flight, its batch being
  // acknowledged) the hold now in force is a later write's.
  if (std::find(queue_.begin(), queue_.end(), ack.pending_) == queue_.end()) return;
  hold_until_ = absl::InfinitePast();
  SendInlineLocked();
}

void Replicator::Detach(const Ack& ack, bool keep_hold) {
  Pending* p = ack.pending_.get();
  if (p == nullptr) return;
  absl::MutexLock lock(&mu_);
  if (!keep_hold && !p->done.HasBeenNotified()) {
    hold_until_ = absl::InfinitePast();  // its caller is leaving
  }
  if (p->values.empty() || !p->owned.empty()) return;
  auto settled = [p]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !p->being_sent; };
  mu_.Await(absl::Condition(&settled));
  if (p->done.HasBeenNotified()) return;  // never read again
  // Still to be sent (queued, or to go again): it needs its own bytes.
  for (absl::string_view v : p->values) p->owned.emplace_back(v);
  for (size_t i = 0; i < p->values.size(); ++i) p->values[i] = p->owned[i];
}

absl::StatusOr<MutationResult> Replicator::Submit(v1::Mutation mutation, absl::Time deadline) {
  Ack ack;
  DT_ASSIGN_OR_RETURN(MutationResult result, Apply(std::move(mutation), &ack));
  DT_RETURN_IF_ERROR(ack.Wait(deadline));
  return result;
}

Replicator::Ack Replicator::AppliedSoFar() const {
  absl::MutexLock lock(&mu_);
  Ack ack;
  ack.pending_ = last_queued_;
  ack.spin_ = options_.ack_spin;
  return ack;
}

absl::StatusOr<v1::ReplicateReply> Replicator::Receive(
    v1::ReplicateBatch batch, absl::Time deadline, const std::vector<absl::string_view>& values) {
  DT_RETURN_IF_ERROR(CheckApartValues(batch, values));
  std::vector<Ack> queued;
  v1::ReplicateReply reply;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError(absl::StrCat(WhoLocked(), " is shutting down"));
    const v1::ChainMember* pred = Predecessor(map_, options_.shard, options_.replica);
    if (!IsMemberLocked() || batch.map_version() != map_.version() || pred == nullptr ||
        pred->replica() != batch.from_replica() ||
        pred->incarnation() != batch.from_incarnation() || batch.shard() != options_.shard) {
      return absl::UnavailableError(
          absl::StrCat(WhoLocked(), " does not take batches from shard ", batch.shard(),
                       " replica ", batch.from_replica(), " at map version ", batch.map_version(),
                       pred == nullptr ? " (it has no predecessor)" : ""));
    }
    if (batch.has_state()) {
      checkpoint::Checkpoint ckpt;
      ckpt.metadata.insert(batch.state().metadata().begin(), batch.state().metadata().end());
      for (const v1::TensorBytes& t : batch.state().tensors()) {
        checkpoint::TensorRecord r;
        r.name = t.name();
        r.dtype = static_cast<int32_t>(DType::kF32);
        r.shape = {static_cast<int64_t>(t.data().size() / sizeof(float))};
        r.data = t.data();
        ckpt.tensors.push_back(std::move(r));
      }
      const std::string what = absl::StrCat("state transfer to ", WhoLocked());
      DT_ASSIGN_OR_RETURN(std::vector<JobState> jobs, DecodeState(ckpt, options_.shard, what));
      const size_t job_count = jobs.size();
      DT_RETURN_IF_ERROR(store_->ReplaceAll(std::move(jobs)));
      has_state_ = true;
      DT_LOG(INFO) << WhoLocked() << ": took over the state of " << job_count
                   << " jobs from replica " << batch.from_replica();
      // Whatever follows this replica must get the new state too.
      if (successor_.replica >= 0) need_transfer_ = true;
    }
    if (!has_state_ && batch.mutations_size() > 0) {
      return absl::UnavailableError(
          absl::StrCat(WhoLocked(), " has no state yet; send the state first"));
    }
    size_t at = 0;  // into values
    for (v1::Mutation& m : *batch.mutable_mutations()) {
      const absl::string_view* apart = nullptr;
      if (const int n = ApartValues(m); n > 0) {
        // Applied from where they arrived; copied in only to go on.
        if (successor_.replica >= 0) {
          InlineInto(&m, &values[at]);
        } else {
          apart = &values[at];
        }
        at += static_cast<size_t>(n);
      }
      Ack ack;
      absl::StatusOr<MutationResult> r = ApplyAndQueueLocked(
          std::make_shared<const v1::Mutation>(std::move(m)), &ack.pending_, apart);
      reply.add_codes(static_cast<int32_t>(r.status().code()));
      if (ack.pending_ != nullptr) {
        ack.spin_ = options_.ack_spin;
        queued.push_back(std::move(ack));
      }
      ++stats_.received;
    }
    SendInlineLocked();
  }
  for (const Ack& ack : queued) DT_RETURN_IF_ERROR(ack.Wait(deadline));
  return reply;
}

namespace {

// Past this, a batch's bytes travel as one message even where pushes' values
// could travel apart (a data port frame's header holds at most 1 MiB).
constexpr size_t kMaxApartHeaderBytes = 512 << 10;

void AppendMessage(int field, const google::protobuf::MessageLite& m, std::string* out) {
  const size_t size = m.ByteSizeLong();
  out->push_back(static_cast<char>((field << 3) | 2));
  for (size_t v = size;; v >>= 7) {
    if (v < 0x80) {
      out->push_back(static_cast<char>(v));
      break;
    }
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
  }
  const size_t at = out->size();
  out->resize(at + size);
  m.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&(*out)[at]));
}

// The batch's bytes: its header, then each mutation as field 7
// (concatenated messages merge), without copying the mutations into a batch
// message first. With `apart`, pushes carry data_bytes and their values go
// to `values` (views into the entries).
struct BatchEntry {
  const v1::Mutation* mutation;
  const std::vector<absl::string_view>* values;  // referenced values (Apply's)
};
std::string SerializeBatch(const v1::ReplicateBatch& header, const std::vector<BatchEntry>& entries,
                           bool apart, std::vector<absl::string_view>* values) {
  std::string bytes = header.SerializeAsString();
  for (const BatchEntry& e : entries) {
    const v1::Mutation* m = e.mutation;
    if (!e.values->empty()) {  // a push whose values are referenced
      if (apart) {
        AppendMessage(v1::ReplicateBatch::kMutationsFieldNumber, *m, &bytes);
        values->insert(values->end(), e.values->begin(), e.values->end());
      } else {
        v1::Mutation whole = *m;
        InlineInto(&whole, e.values->data());
        AppendMessage(v1::ReplicateBatch::kMutationsFieldNumber, whole, &bytes);
      }
      continue;
    }
    if (!apart || m->op_case() != v1::Mutation::kPush || m->push().data_size() == 0) {
      AppendMessage(v1::ReplicateBatch::kMutationsFieldNumber, *m, &bytes);
      continue;
    }
    const v1::ReplicatedPush& p = m->push();
    v1::Mutation stripped;
    v1::ReplicatedPush* s = stripped.mutable_push();
    s->set_job(p.job());
    s->set_worker(p.worker());
    s->set_compression(p.compression());
    s->set_topk_ratio(p.topk_ratio());
    *s->mutable_items() = p.items();
    for (const std::string& d : p.data()) {
      s->add_data_bytes(static_cast<int64_t>(d.size()));
      values->push_back(d);
    }
    AppendMessage(v1::ReplicateBatch::kMutationsFieldNumber, stripped, &bytes);
  }
  return bytes;
}

}  // namespace

void Replicator::SendInlineLocked() {
  // A few batches at most: the caller has its own request to answer.
  for (int i = 0; i < 4; ++i) {
    // Nor what is held (a write that waits for its round's other pushes,
    // which may have come while this thread waited for the last batch).
    if (stop_ || sending_ || successor_.replica < 0 || need_transfer_ || queue_.empty() ||
        absl::Now() < retry_at_ || absl::Now() < hold_until_) {
      return;
    }
    sending_ = true;
    const bool sent = SendBatchLocked();
    sending_ = false;
    if (!sent) return;
  }
}

void Replicator::Forward() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    // Held writes (Apply's hold_incomplete) are not this thread's to send
    // until their hold ran out: waking it for them would cost a wakeup per
    // round. WaitHeld or the write that completes the round sends them.
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (!sending_ && successor_.replica >= 0 &&
                       (need_transfer_ || (!queue_.empty() && hold_until_ <= absl::Now())));
    };
    mu_.Await(absl::Condition(&ready));
    if (stop_) return;
    const uint64_t epoch = successor_epoch_;
    auto woken = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || epoch != successor_epoch_;
    };
    if (const absl::Time now = absl::Now(); now < retry_at_) {
      mu_.AwaitWithTimeout(absl::Condition(&woken), retry_at_ - now);
      continue;
    }
    sending_ = true;
    SendBatchLocked();
    sending_ = false;
  }
}

bool Replicator::SendBatchLocked() {
  const uint64_t epoch = successor_epoch_;
  const Peer to = successor_;
  v1::ReplicateBatch batch;
  batch.set_map_version(map_.version());
  batch.set_shard(options_.shard);
  batch.set_from_replica(options_.replica);
  batch.set_from_incarnation(options_.incarnation);
  const bool transfer = need_transfer_;
  std::vector<JobState> jobs;
  std::vector<std::shared_ptr<Pending>> mutations;
  if (transfer) {
    // Everything queued is in the store already: the state covers it.
    jobs = store_->Export();
    need_transfer_ = false;
    while (!queue_.empty()) {
      inflight_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
  } else {
    for (int i = 0; i < options_.max_batch && !queue_.empty(); ++i) {
      mutations.push_back(queue_.front());
      mutations.back()->being_sent = true;
      inflight_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
  }
  const size_t sent = inflight_.size();
  int64_t state_bytes = 0;
  absl::StatusOr<v1::ReplicateReply> reply;
  {
    mu_.Unlock();
    if (transfer) {
      checkpoint::Checkpoint ckpt = EncodeState(jobs, options_.shard);
      jobs.clear();
      v1::StateTransfer* state = batch.mutable_state();
      state->mutable_metadata()->insert(ckpt.metadata.begin(), ckpt.metadata.end());
      for (checkpoint::TensorRecord& t : ckpt.tensors) {
        v1::TensorBytes* out = state->add_tensors();
        out->set_name(std::move(t.name));
        state_bytes += static_cast<int64_t>(t.data.size());
        out->set_data(std::move(t.data));
      }
    }
    std::vector<BatchEntry> entries;
    for (const std::shared_ptr<Pending>& p : mutations) {
      entries.push_back({p->mutation.get(), &p->values});
    }
    std::vector<absl::string_view> values;
    std::string bytes = SerializeBatch(batch, entries, /*apart=*/!transfer, &values);
    if (!values.empty() && bytes.size() > kMaxApartHeaderBytes) {
      // Big values inside the mutations (an Init): all of it as one message.
      values.clear();
      bytes = SerializeBatch(batch, entries, /*apart=*/false, &values);
    }
    batch.Clear();
    reply = link_->Replicate(to.address, bytes, values);
    values.clear();
    mu_.Lock();
    for (const std::shared_ptr<Pending>& p : mutations) p->being_sent = false;
    mutations.clear();
  }
  if (stop_) return false;                     // Stop completed inflight_
  if (epoch != successor_epoch_) return true;  // SetMap took care of inflight_
  if (reply.ok()) {
    if (transfer) {
      ++stats_.transfers;
      stats_.transfer_bytes += state_bytes;
      caught_up_ = {to.replica, to.incarnation};
      DT_LOG(INFO) << WhoLocked() << ": replica " << to.replica << " at " << to.address
                   << " took over this replica's state (" << state_bytes << " value bytes)";
    } else {
      stats_.forwarded += static_cast<int64_t>(sent);
    }
    CompleteLocked(&inflight_, absl::OkStatus());
    return true;
  }
  ++stats_.send_failures;
  if (stats_.send_failures % 50 == 1) {
    DT_LOG(WARNING) << WhoLocked() << ": sending to replica " << to.replica << " at " << to.address
                    << " failed (retrying until the map changes): " << reply.status();
  }
  RequeueInflightLocked();
  if (transfer) need_transfer_ = true;
  retry_at_ = absl::Now() + options_.retry_backoff;
  return false;
}

}  // namespace kvstore
}  // namespace dtrain
