// The CPU WorkQueue behind Engine::AddQueue(name, threads, init): a fixed pool
// of threads taking ready operations in FIFO order and running each to
// completion (Finish(Run())). Internal to libs/engine.
#ifndef DTRAIN_LIBS_ENGINE_THREAD_POOL_QUEUE_H_
#define DTRAIN_LIBS_ENGINE_THREAD_POOL_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "libs/engine/work_queue.h"

namespace dtrain {
namespace engine {
namespace engine_internal {

class ThreadPoolQueue final : public WorkQueue {
 public:
  // Starts `threads` threads named `name`; each calls `thread_init` first.
  // REQUIRES: threads >= 1.
  ThreadPoolQueue(std::string name, int threads, std::function<void()> thread_init);
  ~ThreadPoolQueue() override;  // Shutdown()

  void Enqueue(ReadyOp op) override;
  // Lets the threads drain what is queued, then joins them. Idempotent.
  void Shutdown() override;

 private:
  void Loop();

  const std::string name_;
  const std::function<void()> thread_init_;
  std::mutex mu_;
  std::condition_variable cv_;  // work arrived or stopping
  std::deque<ReadyOp> ready_;   // guarded by mu_
  bool stopping_ = false;       // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace engine_internal
}  // namespace engine
}  // namespace dtrain

#endif  // DTRAIN_LIBS_ENGINE_THREAD_POOL_QUEUE_H_
