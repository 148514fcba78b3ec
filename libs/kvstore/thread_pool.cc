#include "libs/kvstore/thread_pool.h"

#include <utility>

namespace dtrain {
namespace kvstore {

ElasticThreadPool::~ElasticThreadPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    threads = std::move(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void ElasticThreadPool::Schedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(fn));
  if (tasks_.size() > static_cast<size_t>(idle_)) {
    threads_.emplace_back([this] { Loop(); });
  }
}

int ElasticThreadPool::num_threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

void ElasticThreadPool::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    ++idle_;
    mu_.Await(absl::Condition(
        +[](ElasticThreadPool* p)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return !p->tasks_.empty() || p->stop_; },
        this));
    --idle_;
    if (tasks_.empty()) return;  // stopping
    std::function<void()> fn = std::move(tasks_.front());
    tasks_.pop_front();
    mu_.Unlock();
    fn();
    fn = nullptr;
    mu_.Lock();
  }
}

}  // namespace kvstore
}  // namespace dtrain
