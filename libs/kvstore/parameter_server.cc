#include "libs/kvstore/parameter_server.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace kvstore {

void Work::State::Finish(const absl::Status& s) {
  absl::MutexLock lock(&mu);
  if (status.ok() && !s.ok()) status = s;
  --remaining;
}

void Work::State::WaitTasks() {
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->remaining == 0; }, this));
}

const char* CallKindName(CallKind kind) {
  switch (kind) {
    case CallKind::kPush:
      return "push";
    case CallKind::kPull:
      return "pull";
    case CallKind::kPushPull:
      return "push-pull";
  }
  return "?";
}

std::vector<CallItem> CallItems(std::vector<PushSource> items) {
  std::vector<CallItem> out;
  out.reserve(items.size());
  for (PushSource& item : items) out.push_back({std::move(item.key), item.data, nullptr});
  return out;
}

std::vector<CallItem> CallItems(std::vector<PullTarget> items) {
  std::vector<CallItem> out;
  out.reserve(items.size());
  for (PullTarget& item : items) {
    out.push_back({std::move(item.key), nullptr, item.data, item.round});
  }
  return out;
}

std::vector<CallItem> CallItems(std::vector<PushPullItem> items) {
  std::vector<CallItem> out;
  out.reserve(items.size());
  for (PushPullItem& item : items) out.push_back({std::move(item.key), item.src, item.dst});
  return out;
}

absl::Status CheckCallItems(CallKind kind, const std::vector<CallItem>& items) {
  const char* what = CallKindName(kind);
  absl::flat_hash_set<absl::string_view> names;
  for (const CallItem& item : items) {
    if ((kind != CallKind::kPull && item.src == nullptr) ||
        (kind != CallKind::kPush && item.dst == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " of key '", item.key, "': ",
                                                     kind == CallKind::kPush ? "no data"
                                                     : kind == CallKind::kPull
                                                         ? "no destination buffer"
                                                         : "missing source or destination"));
    }
    if (kind != CallKind::kPull && !names.insert(item.key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", item.key, "' appears twice in one ", what));
    }
    if (kind == CallKind::kPull && item.round < kLastPushedRound) {
      return absl::InvalidArgumentError(
          absl::StrCat("pull of key '", item.key, "': round ", item.round, " is invalid"));
    }
  }
  return absl::OkStatus();
}

absl::Status LostJobStateError(const absl::Status& not_found) {
  return absl::AbortedError(absl::StrCat(not_found.message(),
                                         " (the shard no longer has this job's state: it was "
                                         "dropped, or the shard restarted; the job must start a "
                                         "new attempt)"));
}

Work Work::Done(absl::Status status) {
  auto state = std::make_shared<State>();
  {
    absl::MutexLock lock(&state->mu);
    state->status = std::move(status);
  }
  return Work(std::move(state));
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (state_) (void)Wait();
    state_ = std::move(other.state_);
  }
  return *this;
}

Work::~Work() {
  if (state_) (void)Wait();
}

absl::Status Work::Wait() {
  if (!state_) return absl::OkStatus();
  absl::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(
      +[](State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->remaining == 0 && s->pins == 0; },
      state_.get()));
  return state_->status;
}

bool Work::IsCompleted() const {
  if (!state_) return true;
  absl::MutexLock lock(&state_->mu);
  return state_->remaining == 0 && state_->pins == 0;
}

Work ParameterServerBase::PushAsync(std::vector<PushSource> items) {
  return Issue(CallKind::kPush, CallItems(std::move(items)), /*run_one_inline=*/false);
}

Work ParameterServerBase::PullAsync(std::vector<PullTarget> items) {
  return Issue(CallKind::kPull, CallItems(std::move(items)), /*run_one_inline=*/false);
}

Work ParameterServerBase::PushPullAsync(std::vector<PushPullItem> items) {
  return Issue(CallKind::kPushPull, CallItems(std::move(items)), /*run_one_inline=*/false);
}

absl::Status ParameterServerBase::Push(std::vector<PushSource> items) {
  return Issue(CallKind::kPush, CallItems(std::move(items)), /*run_one_inline=*/true).Wait();
}

absl::Status ParameterServerBase::Pull(std::vector<PullTarget> items) {
  return Issue(CallKind::kPull, CallItems(std::move(items)), /*run_one_inline=*/true).Wait();
}

absl::Status ParameterServerBase::PushPull(std::vector<PushPullItem> items) {
  return Issue(CallKind::kPushPull, CallItems(std::move(items)), /*run_one_inline=*/true).Wait();
}

}  // namespace kvstore
}  // namespace dtrain
