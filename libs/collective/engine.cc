#include "libs/collective/engine.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"

namespace dtrain {
namespace collective {
namespace internal {

void Deliver(RecvOp& op, const char* src, size_t n) {
  if (n == 0) return;
  char* dst = op.data + op.done;
  if (op.combiner == nullptr) {
    std::memcpy(dst, src, n);
    op.done += n;
    return;
  }
  const size_t es = op.combiner->element_size();
  // Finish an element split by an earlier delivery.
  if (op.carry_len > 0) {
    size_t take = std::min(es - op.carry_len, n);
    std::memcpy(op.carry + op.carry_len, src, take);
    op.carry_len += take;
    src += take;
    n -= take;
    if (op.carry_len < es) return;
    op.combiner->Combine(op.data + op.done, op.carry, 1);
    op.done += es;
    op.carry_len = 0;
    dst = op.data + op.done;
  }
  size_t whole = n / es;
  if (whole > 0) {
    op.combiner->Combine(dst, src, whole);
    op.done += whole * es;
  }
  size_t rest = n - whole * es;
  if (rest > 0) {
    std::memcpy(op.carry, src + whole * es, rest);
    op.carry_len = rest;
  }
}

// Bytes of a receive consumed from the stream, counting a partial element.
static size_t Consumed(const RecvOp& op) { return op.done + op.carry_len; }

void EnginePair::PostSend(const void* data, size_t bytes) {
  if (bytes == 0) {
    // Completes at once; kept in order by completing only when nothing is
    // queued before it.
    if (sends_.empty()) {
      ++sends_completed_;
      return;
    }
  }
  sends_.push_back(SendOp{static_cast<const char*>(data), bytes});
  if (!transport_->aborted_) OnPostSend(sends_.back());
}

void EnginePair::PostRecv(void* data, size_t bytes, const Combiner* combiner) {
  if (bytes == 0 && recvs_.empty()) {
    ++recvs_completed_;
    return;
  }
  RecvOp op;
  op.data = static_cast<char*>(data);
  op.bytes = bytes;
  op.combiner = combiner;
  DT_CHECK(combiner == nullptr || bytes % combiner->element_size() == 0)
      << "receive of " << bytes << " bytes is not whole elements";
  recvs_.push_back(op);
}

absl::Status EnginePair::WaitSend(absl::Time deadline) {
  return transport_->Wait(this, /*send=*/true, deadline);
}

absl::Status EnginePair::WaitRecv(absl::Time deadline) {
  return transport_->Wait(this, /*send=*/false, deadline);
}

void EnginePair::CompleteFrontSend() {
  sends_.pop_front();
  ++sends_completed_;
  // Zero-byte sends queued behind it complete with it.
  while (!sends_.empty() && sends_.front().bytes == 0) {
    sends_.pop_front();
    ++sends_completed_;
  }
}

void EnginePair::CompleteFrontRecv() {
  recvs_.pop_front();
  ++recvs_completed_;
  while (!recvs_.empty() && recvs_.front().bytes == 0) {
    recvs_.pop_front();
    ++recvs_completed_;
  }
}

void EnginePair::Fail(const absl::Status& status) { transport_->SetError(status); }

void EnginePair::DropAll() {
  sends_.clear();
  recvs_.clear();
}

void EngineTransport::SetError(const absl::Status& status) {
  if (error_.ok() && !status.ok()) error_ = status;
}

absl::Status EngineTransport::Wait(EnginePair* pair, bool send, absl::Time deadline) {
  uint64_t& waited = send ? pair->sends_waited_ : pair->recvs_waited_;
  const uint64_t& completed = send ? pair->sends_completed_ : pair->recvs_completed_;
  while (true) {
    if (completed > waited) {
      ++waited;
      return absl::OkStatus();
    }
    if (!error_.ok()) return error_;
    const uint64_t token = ActivityToken();
    bool moved = false;
    for (EnginePair* p : pairs_) {
      if (p->has_pending()) moved |= p->Progress();
    }
    if (completed > waited || !error_.ok()) continue;
    // Checked even while bytes move: a transfer that is too slow fails too.
    if (absl::Now() >= deadline) {
      if (send) {
        const SendOp* op = pair->sends_.empty() ? nullptr : &pair->sends_.front();
        return absl::DeadlineExceededError(
            absl::StrCat("deadline passed while sending ", op ? op->bytes : 0, " bytes to rank ",
                         pair->peer(), " on ", name(), " channel ", pair->channel(), " (",
                         op ? op->done : 0, " bytes taken)"));
      }
      const RecvOp* op = pair->recvs_.empty() ? nullptr : &pair->recvs_.front();
      return absl::DeadlineExceededError(
          absl::StrCat("deadline passed while receiving ", op ? op->bytes : 0, " bytes from rank ",
                       pair->peer(), " on ", name(), " channel ", pair->channel(), " (",
                       op ? Consumed(*op) : 0, " bytes arrived)"));
    }
    if (!moved) Block(token, deadline);
  }
}

void EngineTransport::Abort(const absl::Status& reason) {
  if (aborted_) return;
  aborted_ = true;
  absl::Status status = reason.ok() ? absl::AbortedError("transport aborted") : reason;
  SetError(absl::Status(absl::StatusCode::kAborted,
                        absl::StrCat("rank ", rank(), " aborted: ", status.message())));
  OnAbort(status);
  for (EnginePair* p : pairs_) p->DropAll();
}

}  // namespace internal
}  // namespace collective
}  // namespace dtrain
