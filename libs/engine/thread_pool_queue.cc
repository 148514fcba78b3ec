#include "libs/engine/thread_pool_queue.h"

#include <pthread.h>

#include <utility>

#include "libs/base/logging.h"

namespace dtrain {
namespace engine {
namespace engine_internal {

ThreadPoolQueue::ThreadPoolQueue(std::string name, int threads, std::function<void()> thread_init)
    : name_(std::move(name)), thread_init_(std::move(thread_init)) {
  DT_CHECK(threads >= 1) << "queue '" << name_ << "' with " << threads << " threads";
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPoolQueue::~ThreadPoolQueue() { Shutdown(); }

void ThreadPoolQueue::Enqueue(ReadyOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  DT_CHECK(!stopping_) << "op '" << op.name() << "' enqueued on stopped queue '" << name_ << "'";
  ready_.push_back(std::move(op));
  cv_.notify_one();
}

void ThreadPoolQueue::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void ThreadPoolQueue::Loop() {
  // Linux limits thread names to 15 characters.
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  if (thread_init_) thread_init_();
  while (true) {
    ReadyOp op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !ready_.empty(); });
      if (ready_.empty()) return;  // stopping and drained
      op = std::move(ready_.front());
      ready_.pop_front();
    }
    absl::Status status = op.Run();
    op.Finish(std::move(status));
  }
}

}  // namespace engine_internal
}  // namespace engine
}  // namespace dtrain
