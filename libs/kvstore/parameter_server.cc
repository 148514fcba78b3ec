#include "libs/kvstore/parameter_server.h"

#include <utility>

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

}  // namespace kvstore
}  // namespace dtrain
