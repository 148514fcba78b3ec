#include "libs/collective/inprocess_transport.h"

#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/base/status.h"
#include "libs/collective/engine.h"

namespace dtrain {
namespace collective {
namespace {

using internal::EnginePair;
using internal::EngineTransport;
using internal::PairGridTransport;

// Largest piece copied while holding a channel's lock (bounds how long a
// sender posting its next message can be held up).
constexpr size_t kPieceBytes = 256 << 10;

enum RankState : int { kAbsent = 0, kAlive = 1, kClosed = 2, kAborted = 3 };

struct SendDesc {
  const char* data;
  size_t bytes;
};

// One direction of one channel between two ranks.
struct Channel {
  absl::Mutex mu;
  std::deque<SendDesc> queue ABSL_GUARDED_BY(mu);  // published, not fully consumed
  size_t offset ABSL_GUARDED_BY(mu) = 0;           // consumed bytes of queue.front()
  std::atomic<uint64_t> consumed{0};               // sends fully consumed
};

// Per rank: state and a doorbell that peers ring when they change something
// this rank may be waiting for.
struct RankSlot {
  std::atomic<int> state{kAbsent};
  std::atomic<uint64_t> doorbell{0};
  std::atomic<bool> sleeping{false};
  absl::Mutex mu;
  absl::CondVar cv;
  std::string reason ABSL_GUARDED_BY(mu);

  void Ring() {
    doorbell.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_seq_cst)) {
      absl::MutexLock lock(&mu);
      cv.SignalAll();
    }
  }
};

struct Job {
  Job(int size, int channels) : size(size), channels(channels) {
    for (int i = 0; i < size; ++i) ranks.push_back(std::make_unique<RankSlot>());
    chans.resize(static_cast<size_t>(size) * size * channels);
    for (auto& c : chans) c = std::make_unique<Channel>();
  }
  Channel* chan(int from, int to, int c) {
    return chans[(static_cast<size_t>(from) * size + to) * channels + c].get();
  }
  const int size;
  const int channels;
  std::vector<std::unique_ptr<RankSlot>> ranks;
  std::vector<std::unique_ptr<Channel>> chans;
};

// CPUs this process may run on (spinning is pointless when ranks outnumber
// them).
int UsableCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
}

absl::Mutex registry_mu(absl::kConstInit);

std::map<std::string, std::weak_ptr<Job>>& Registry() {
  static auto* registry = new std::map<std::string, std::weak_ptr<Job>>();
  return *registry;
}

absl::StatusOr<std::shared_ptr<Job>> JoinJob(const std::string& id, int size, int channels) {
  absl::MutexLock lock(&registry_mu);
  auto& registry = Registry();
  for (auto it = registry.begin(); it != registry.end();) {
    it = it->second.expired() ? registry.erase(it) : std::next(it);
  }
  std::shared_ptr<Job> job = registry[id].lock();
  if (job == nullptr) {
    job = std::make_shared<Job>(size, channels);
    registry[id] = job;
  } else if (job->size != size || job->channels != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-process job ", id, " has size ", job->size, " and ", job->channels,
                     " channels; this rank asked for ", size, " and ", channels));
  }
  return job;
}

std::string StateReason(RankSlot* slot) {
  absl::MutexLock lock(&slot->mu);
  return slot->reason;
}

class InProcPair final : public EnginePair {
 public:
  InProcPair(EngineTransport* transport, int peer, int channel, Channel* out, Channel* in,
             RankSlot* peer_slot)
      : EnginePair(transport, peer, channel), out_(out), in_(in), peer_slot_(peer_slot) {}

  void Withdraw() {
    absl::MutexLock lock(&out_->mu);  // waits for a copy in progress
    out_->queue.clear();
    out_->offset = 0;
  }

  bool Progress() override {
    bool moved = false;
    const uint64_t consumed = out_->consumed.load(std::memory_order_acquire);
    while (acked_ < consumed) {
      CompleteFrontSend();
      ++acked_;
      moved = true;
    }
    while (!recvs_.empty()) {
      internal::RecvOp& op = recvs_.front();
      bool finished_send = false;
      {
        absl::MutexLock lock(&in_->mu);
        if (in_->queue.empty()) break;
        const SendDesc& desc = in_->queue.front();
        size_t take =
            std::min({desc.bytes - in_->offset, op.bytes - op.done - op.carry_len, kPieceBytes});
        internal::Deliver(op, desc.data + in_->offset, take);
        in_->offset += take;
        if (in_->offset == desc.bytes) {
          in_->queue.pop_front();
          in_->offset = 0;
          in_->consumed.fetch_add(1, std::memory_order_release);
          finished_send = true;
        }
      }
      moved = true;
      if (finished_send) peer_slot_->Ring();
      if (op.done == op.bytes) CompleteFrontRecv();
    }
    if (!moved && has_pending()) {
      int state = peer_slot_->state.load(std::memory_order_acquire);
      if (state == kClosed || state == kAborted) {
        Fail(absl::UnavailableError(absl::StrCat(
            "rank ", peer(), state == kAborted ? " aborted" : " closed its communicator",
            " while this rank still had operations with it",
            state == kAborted ? absl::StrCat(" (", StateReason(peer_slot_), ")") : "")));
      }
    }
    return moved;
  }

 protected:
  void OnPostSend(const internal::SendOp& op) override {
    if (op.bytes == 0) return;
    {
      absl::MutexLock lock(&out_->mu);
      out_->queue.push_back(SendDesc{op.data, op.bytes});
    }
    peer_slot_->Ring();
  }

 private:
  Channel* const out_;
  Channel* const in_;
  RankSlot* const peer_slot_;
  uint64_t acked_ = 0;  // consumed sends already completed here
};

class InProcessTransport final : public PairGridTransport<InProcPair> {
 public:
  InProcessTransport(const TransportOptions& options, std::shared_ptr<Job> job)
      : PairGridTransport(options),
        job_(std::move(job)),
        me_(job_->ranks[rank_].get()),
        spin_(options.size <= UsableCpus() ? 256 : 0) {
    for (int peer : options.peers) {
      for (int c = 0; c < channels_; ++c) {
        SetPair(peer, c,
                std::make_unique<InProcPair>(this, peer, c, job_->chan(rank_, peer, c),
                                             job_->chan(peer, rank_, c), job_->ranks[peer].get()));
      }
    }
  }

  ~InProcessTransport() override { Stop(kClosed, "closed"); }

  const char* name() const override { return "inprocess"; }

 protected:
  uint64_t ActivityToken() override { return me_->doorbell.load(std::memory_order_acquire); }

  void Block(uint64_t token, absl::Time deadline) override {
    for (int i = 0; i < spin_; ++i) {
      if (me_->doorbell.load(std::memory_order_acquire) != token) return;
      _mm_pause();
    }
    me_->sleeping.store(true, std::memory_order_seq_cst);
    if (me_->doorbell.load(std::memory_order_seq_cst) == token) {
      absl::MutexLock lock(&me_->mu);
      while (me_->doorbell.load(std::memory_order_seq_cst) == token) {
        if (me_->cv.WaitWithDeadline(&me_->mu, deadline)) break;
      }
    }
    me_->sleeping.store(false, std::memory_order_relaxed);
  }

  void OnAbort(const absl::Status& reason) override {
    Stop(kAborted, std::string(reason.message()));
  }

 private:
  void Stop(RankState state, const std::string& reason) {
    if (stopped_) return;
    stopped_ = true;
    {
      absl::MutexLock lock(&me_->mu);
      me_->reason = reason;
    }
    me_->state.store(state, std::memory_order_release);
    ForEachPair([](InProcPair& p) { p.Withdraw(); });
    for (int peer = 0; peer < size_; ++peer) {
      if (pair(peer, 0) != nullptr) job_->ranks[peer]->Ring();
    }
  }

  std::shared_ptr<Job> job_;
  RankSlot* const me_;
  const int spin_;  // pause iterations before sleeping
  bool stopped_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateInProcessTransport(
    const TransportOptions& options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("in-process transport needs a store");
  }
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                      JoinJob(options.job_id, options.size, options.channels));
  RankSlot* me = job->ranks[options.rank].get();
  int expected = kAbsent;
  if (!me->state.compare_exchange_strong(expected, kAlive)) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", options.rank, " of in-process job ",
                                                 options.job_id, " registered twice"));
  }
  auto transport = std::make_unique<InProcessTransport>(options, job);
  const std::string prefix = absl::StrCat("inproc/", options.job_id, "/");
  DT_RETURN_IF_ERROR(
      options.store->Set(absl::StrCat(prefix, options.rank), absl::StrCat(::getpid())));
  for (int peer : options.peers) {
    absl::Duration left = std::max(options.deadline - absl::Now(), absl::ZeroDuration());
    absl::StatusOr<std::string> pid = options.store->Get(absl::StrCat(prefix, peer), left);
    if (!pid.ok()) {
      return Annotate(pid.status(), absl::StrCat("waiting for rank ", peer, " to join"));
    }
    if (*pid != absl::StrCat(::getpid())) {
      return absl::FailedPreconditionError(
          absl::StrCat("the in-process transport needs all ranks in one process; rank ", peer,
                       " is in process ", *pid));
    }
  }
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace collective
}  // namespace dtrain
