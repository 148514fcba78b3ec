#include "libs/collective/shm_transport.h"

#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/collective/engine.h"
#include "libs/net/shared_memory.h"

namespace dtrain {
namespace collective {
namespace {

using internal::EnginePair;
using internal::EngineTransport;
using internal::PairGridTransport;

constexpr uint64_t kControlMagic = 0x4454524c43544c31ull;  // "DTRLCTL1"
constexpr uint64_t kPairMagic = 0x4454524c50414931ull;     // "DTRLPAI1"
// Bytes copied into a ring before the consumer is told (lets it start early).
constexpr size_t kPublishBytes = 64 << 10;

enum RankState : int32_t { kAlive = 1, kClosed = 2, kAborted = 3 };

struct alignas(64) RankControl {
  std::atomic<uint64_t> magic;
  int32_t pid;
  uint64_t start_time;  // field 22 of /proc/<pid>/stat, to detect pid reuse
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint32_t> sleeping;
  std::atomic<int32_t> state;
  char reason[256];
};

struct alignas(64) RingHeader {
  alignas(64) std::atomic<uint64_t> head;  // bytes ever written (producer)
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever read (consumer)
};

struct alignas(64) PairHeader {
  std::atomic<uint64_t> magic;
  uint64_t ring_bytes;
  uint64_t channels;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory atomics");

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t RingStride(size_t ring_bytes) { return sizeof(RingHeader) + RoundUp(ring_bytes, 64); }

size_t PairSegmentBytes(size_t ring_bytes, int channels) {
  return RoundUp(sizeof(PairHeader), 4096) + 2 * channels * RingStride(ring_bytes);
}

// Ring for direction `d` (0: lower rank -> higher rank, 1: back) of channel c.
RingHeader* RingAt(char* base, size_t ring_bytes, int channel, int d) {
  return reinterpret_cast<RingHeader*>(base + RoundUp(sizeof(PairHeader), 4096) +
                                       (2 * channel + d) * RingStride(ring_bytes));
}

char* RingData(RingHeader* ring) { return reinterpret_cast<char*>(ring) + sizeof(RingHeader); }

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void RingDoorbell(RankControl* ctl) {
  ctl->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (ctl->sleeping.load(std::memory_order_seq_cst) != 0) {
    Futex(&ctl->doorbell, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

// Reads state and start time of a process; false if it does not exist.
bool ReadProcStat(int pid, char* state, uint64_t* start_time) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return false;
  std::string line;
  std::getline(in, line);
  size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(line).substr(close + 2), ' ');
  // fields[0] is field 3 (state); field 22 (starttime) is fields[19].
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_time);
}

uint64_t OwnStartTime() {
  char state;
  uint64_t start = 0;
  ReadProcStat(::getpid(), &state, &start);
  return start;
}

// Whether the process that wrote `ctl` is still running (zombies count as
// dead: a killed child stays a zombie until its parent reaps it).
bool ProcessAlive(const RankControl* ctl) {
  if (ctl->pid == ::getpid()) return true;
  char state;
  uint64_t start = 0;
  if (!ReadProcStat(ctl->pid, &state, &start)) return false;
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  return start == ctl->start_time;
}

// CPUs this process may run on.
int UsableCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
}

// A mapped segment (libs/net/shared_memory.h); unmapped on destruction,
// and unlinked then if this rank created its name.
using Segment = net::SharedMemory;

absl::StatusOr<std::unique_ptr<Segment>> CreateSegment(const std::string& name, size_t bytes) {
  DT_ASSIGN_OR_RETURN(Segment seg, Segment::CreateNamed(name, bytes));
  return std::make_unique<Segment>(std::move(seg));
}

absl::StatusOr<std::unique_ptr<Segment>> OpenSegment(const std::string& name, size_t bytes) {
  absl::StatusOr<Segment> seg = Segment::OpenNamed(name, bytes);
  if (!seg.ok() && absl::StartsWith(seg.status().message(), "shm_open")) {
    return Annotate(seg.status(),
                    "the shm transport needs all ranks on one host and in one IPC namespace");
  }
  DT_RETURN_IF_ERROR(seg.status());
  return std::make_unique<Segment>(std::move(*seg));
}

class ShmPair final : public EnginePair {
 public:
  ShmPair(EngineTransport* transport, int peer, int channel, RingHeader* out, RingHeader* in,
          size_t ring_bytes, RankControl* peer_ctl)
      : EnginePair(transport, peer, channel),
        out_(out),
        in_(in),
        out_data_(RingData(out)),
        in_data_(RingData(in)),
        cap_(ring_bytes),
        peer_ctl_(peer_ctl) {}

  // Whether the peer's process can be looked up in /proc (not when it runs
  // in another pid namespace); without it only the peer's state word and the
  // timeout tell that it is gone.
  void set_pid_visible(bool visible) { pid_visible_ = visible; }

  bool Progress() override {
    bool moved = false;
    // Sends: copy into the ring, publishing every kPublishBytes.
    while (!sends_.empty()) {
      internal::SendOp& op = sends_.front();
      const uint64_t head = out_->head.load(std::memory_order_relaxed);
      const uint64_t tail = out_->tail.load(std::memory_order_acquire);
      size_t space = cap_ - static_cast<size_t>(head - tail);
      if (space == 0) break;
      size_t n = std::min({space, op.bytes - op.done, kPublishBytes});
      size_t at = static_cast<size_t>(head % cap_);
      size_t first = std::min(n, cap_ - at);
      std::memcpy(out_data_ + at, op.data + op.done, first);
      if (n > first) std::memcpy(out_data_, op.data + op.done + first, n - first);
      out_->head.store(head + n, std::memory_order_release);
      op.done += n;
      moved = true;
      RingDoorbell(peer_ctl_);
      if (op.done == op.bytes) CompleteFrontSend();
    }
    // Receives: copy or combine out of the ring.
    while (!recvs_.empty()) {
      internal::RecvOp& op = recvs_.front();
      const uint64_t tail = in_->tail.load(std::memory_order_relaxed);
      const uint64_t head = in_->head.load(std::memory_order_acquire);
      size_t avail = static_cast<size_t>(head - tail);
      if (avail == 0) break;
      size_t n = std::min({avail, op.bytes - op.done - op.carry_len, kPublishBytes});
      size_t at = static_cast<size_t>(tail % cap_);
      size_t first = std::min(n, cap_ - at);
      internal::Deliver(op, in_data_ + at, first);
      if (n > first) internal::Deliver(op, in_data_, n - first);
      in_->tail.store(tail + n, std::memory_order_release);
      moved = true;
      RingDoorbell(peer_ctl_);
      if (op.done == op.bytes) CompleteFrontRecv();
    }
    if (!moved && has_pending()) CheckPeerState();
    return moved;
  }

  // Fails pending operations if the peer closed or aborted; with
  // `check_process`, also if its process is gone.
  void CheckPeerState(bool check_process = false) {
    int32_t state = peer_ctl_->state.load(std::memory_order_acquire);
    if (state == kAborted || state == kClosed) {
      std::string reason(peer_ctl_->reason, strnlen(peer_ctl_->reason, sizeof(peer_ctl_->reason)));
      Fail(absl::UnavailableError(
          absl::StrCat("rank ", peer(), state == kAborted ? " aborted" : " closed its communicator",
                       " while this rank still had operations with it",
                       reason.empty() ? "" : absl::StrCat(" (", reason, ")"))));
      return;
    }
    if (check_process && pid_visible_ && !ProcessAlive(peer_ctl_)) {
      Fail(absl::UnavailableError(absl::StrCat("rank ", peer(), " (pid ", peer_ctl_->pid,
                                               ") exited while this rank still had operations "
                                               "with it")));
    }
  }

 private:
  RingHeader* const out_;
  RingHeader* const in_;
  char* const out_data_;
  char* const in_data_;
  const size_t cap_;
  RankControl* const peer_ctl_;
  bool pid_visible_ = true;
};

class ShmTransport final : public PairGridTransport<ShmPair> {
 public:
  ShmTransport(const TransportOptions& options, const ShmOptions& shm)
      : PairGridTransport(options),
        ring_bytes_(RoundUp(std::max<size_t>(shm.ring_bytes, 4096), 64)),
        spin_(options.size <= UsableCpus() ? 256 : 0),
        peer_controls_(options.size) {}

  ~ShmTransport() override {
    Stop(kClosed, "");
    // Segments unmap (and unlink if still named) as they are destroyed.
  }

  absl::Status Setup(const TransportOptions& options);

  const char* name() const override { return "shm"; }

 protected:
  uint64_t ActivityToken() override { return me()->doorbell.load(std::memory_order_acquire); }

  void Block(uint64_t token, absl::Time deadline) override {
    RankControl* ctl = me();
    const uint32_t seen = static_cast<uint32_t>(token);
    // Spin a few microseconds (a peer on another core answers within that;
    // pointless when ranks outnumber cores), then yield for a while (the
    // peer may be waiting for this core), then sleep on the doorbell.
    for (int i = 0; i < spin_; ++i) {
      if (ctl->doorbell.load(std::memory_order_acquire) != seen) return;
      _mm_pause();
    }
    for (int i = 0; i < 32; ++i) {
      ::sched_yield();
      if (ctl->doorbell.load(std::memory_order_acquire) != seen) return;
    }
    absl::Time now = absl::Now();
    if (now >= next_liveness_check_) {
      next_liveness_check_ = now + absl::Milliseconds(5);
      for (EnginePair* p : pairs()) {
        if (p->has_pending()) static_cast<ShmPair*>(p)->CheckPeerState(/*check_process=*/true);
      }
      if (!error().ok()) return;
    }
    ctl->sleeping.store(1, std::memory_order_seq_cst);
    if (ctl->doorbell.load(std::memory_order_seq_cst) == seen) {
      absl::Duration wait = std::min(deadline - now, absl::Milliseconds(5));
      if (wait > absl::ZeroDuration()) {
        timespec ts = absl::ToTimespec(wait);
        Futex(&ctl->doorbell, FUTEX_WAIT, seen, &ts);
      }
    }
    ctl->sleeping.store(0, std::memory_order_relaxed);
  }

  void OnAbort(const absl::Status& reason) override {
    Stop(kAborted, std::string(reason.message()));
  }

 private:
  RankControl* me() { return reinterpret_cast<RankControl*>(control_->data()); }

  void Stop(RankState state, const std::string& reason) {
    if (stopped_ || control_ == nullptr) return;
    stopped_ = true;
    RankControl* ctl = me();
    size_t n = std::min(reason.size(), sizeof(ctl->reason) - 1);
    std::memcpy(ctl->reason, reason.data(), n);
    ctl->reason[n] = '\0';
    ctl->state.store(state, std::memory_order_release);
    for (RankControl* peer : peer_controls_) {
      if (peer != nullptr) RingDoorbell(peer);
    }
  }

  const size_t ring_bytes_;
  const int spin_;  // pause iterations before yielding
  std::unique_ptr<Segment> control_;
  std::vector<std::unique_ptr<Segment>> segments_;  // peers' controls and pair segments
  std::vector<RankControl*> peer_controls_;
  absl::Time next_liveness_check_ = absl::InfinitePast();
  bool stopped_ = false;
};

std::string SafeName(const std::string& id) {
  std::string out;
  for (char c : id) {
    out.push_back((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                          c == '-' || c == '_'
                      ? c
                      : '_');
  }
  return out.substr(0, 160);
}

absl::Status ShmTransport::Setup(const TransportOptions& options) {
  const std::string base = absl::StrCat("/dtrain-", SafeName(options.job_id));
  const std::string key = absl::StrCat("shm/", options.job_id, "/");
  const size_t pair_bytes = PairSegmentBytes(ring_bytes_, channels_);
  auto left = [&] { return std::max(options.deadline - absl::Now(), absl::ZeroDuration()); };

  // This rank's control segment.
  DT_ASSIGN_OR_RETURN(control_,
                      CreateSegment(absl::StrCat(base, "-r", rank_), sizeof(RankControl)));
  RankControl* ctl = me();
  ctl->pid = ::getpid();
  ctl->start_time = OwnStartTime();
  ctl->doorbell.store(0);
  ctl->sleeping.store(0);
  ctl->state.store(kAlive);
  ctl->magic.store(kControlMagic, std::memory_order_release);
  DT_RETURN_IF_ERROR(options.store->Set(absl::StrCat(key, "rank/", rank_), "1"));

  // Pair segments toward higher-ranked peers.
  std::vector<char*> pair_base(size_, nullptr);
  for (int peer : options.peers) {
    if (peer < rank_) continue;
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Segment> seg,
                        CreateSegment(absl::StrCat(base, "-p", rank_, "-", peer), pair_bytes));
    auto* header = reinterpret_cast<PairHeader*>(seg->data());
    header->ring_bytes = ring_bytes_;
    header->channels = channels_;
    header->magic.store(kPairMagic, std::memory_order_release);
    pair_base[peer] = seg->data();
    segments_.push_back(std::move(seg));
    DT_RETURN_IF_ERROR(options.store->Set(absl::StrCat(key, "pair/", rank_, "/", peer), "1"));
  }

  // Map the peers' control segments and the pair segments they created.
  for (int peer : options.peers) {
    absl::Status ready = options.store->Get(absl::StrCat(key, "rank/", peer), left()).status();
    if (!ready.ok()) return Annotate(ready, absl::StrCat("waiting for rank ", peer, " to join"));
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Segment> seg,
                        OpenSegment(absl::StrCat(base, "-r", peer), sizeof(RankControl)));
    auto* peer_ctl = reinterpret_cast<RankControl*>(seg->data());
    if (peer_ctl->magic.load(std::memory_order_acquire) != kControlMagic) {
      return absl::FailedPreconditionError(
          absl::StrCat("control segment of rank ", peer, " is not initialized"));
    }
    peer_controls_[peer] = peer_ctl;
    segments_.push_back(std::move(seg));
    if (peer < rank_) {
      ready = options.store->Get(absl::StrCat(key, "pair/", peer, "/", rank_), left()).status();
      if (!ready.ok()) return Annotate(ready, absl::StrCat("waiting for rank ", peer));
      DT_ASSIGN_OR_RETURN(seg, OpenSegment(absl::StrCat(base, "-p", peer, "-", rank_), pair_bytes));
      auto* header = reinterpret_cast<PairHeader*>(seg->data());
      if (header->magic.load(std::memory_order_acquire) != kPairMagic ||
          header->ring_bytes != ring_bytes_ ||
          header->channels != static_cast<uint64_t>(channels_)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "pair segment with rank ", peer, " disagrees on ring size or channel count"));
      }
      pair_base[peer] = seg->data();
      segments_.push_back(std::move(seg));
    }
  }

  for (int peer : options.peers) {
    // A peer in another pid namespace has no /proc entry here.
    char state;
    uint64_t start;
    const bool pid_visible = peer_controls_[peer]->pid == ::getpid() ||
                             ReadProcStat(peer_controls_[peer]->pid, &state, &start);
    // Direction 0 carries lower -> higher.
    const int out_dir = rank_ < peer ? 0 : 1;
    for (int c = 0; c < channels_; ++c) {
      ShmPair* p = SetPair(
          peer, c,
          std::make_unique<ShmPair>(this, peer, c, RingAt(pair_base[peer], ring_bytes_, c, out_dir),
                                    RingAt(pair_base[peer], ring_bytes_, c, 1 - out_dir),
                                    ring_bytes_, peer_controls_[peer]));
      p->set_pid_visible(pid_visible);
    }
  }

  // Once everyone has mapped what it needs, the names can go.
  DT_RETURN_IF_ERROR(StoreBarrier(*options.store, absl::StrCat(key, "mapped"), size_, left()));
  control_->Unlink();
  for (auto& seg : segments_) seg->Unlink();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateShmTransport(const TransportOptions& options,
                                                              const ShmOptions& shm) {
  if (options.store == nullptr) return absl::InvalidArgumentError("shm transport needs a store");
  auto transport = std::make_unique<ShmTransport>(options, shm);
  DT_RETURN_IF_ERROR(transport->Setup(options));
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace collective
}  // namespace dtrain
