#include "libs/kvstore/job_limiter.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace kvstore {

JobLimiter::JobLimiter(int cap, std::string what, std::string knob)
    : cap_(cap), what_(std::move(what)), knob_(std::move(knob)) {}

JobLimiter::Hold::Hold(Hold&& other) noexcept
    : limiter_(std::exchange(other.limiter_, nullptr)), job_(std::move(other.job_)) {}

JobLimiter::Hold& JobLimiter::Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    if (limiter_ != nullptr) limiter_->Release(job_);
    limiter_ = std::exchange(other.limiter_, nullptr);
    job_ = std::move(other.job_);
  }
  return *this;
}

JobLimiter::Hold::~Hold() {
  if (limiter_ != nullptr) limiter_->Release(job_);
}

absl::StatusOr<JobLimiter::Hold> JobLimiter::Acquire(const std::string& job, int workers) {
  if (cap_ <= 0) return Hold();
  const int64_t cap = std::max<int64_t>(cap_, int64_t{kPerWorker} * std::max(workers, 0));
  absl::MutexLock lock(&mu_);
  int& n = in_use_[job];
  if (n >= cap) {
    const std::string per_trainer =
        workers > 0 ? absl::StrCat(", or ", kPerWorker, " per trainer of its ", workers) : "";
    return absl::ResourceExhaustedError(
        absl::StrCat("job '", job, "' has ", n, " ", what_, " on this kvstore shard, its cap (",
                     knob_, per_trainer, "); wait for them to end, or raise the cap"));
  }
  ++n;
  return Hold(this, job);
}

int JobLimiter::InUse(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = in_use_.find(job);
  return it == in_use_.end() ? 0 : it->second;
}

void JobLimiter::Release(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = in_use_.find(job);
  if (it != in_use_.end() && --it->second <= 0) in_use_.erase(it);
}

}  // namespace kvstore
}  // namespace dtrain
