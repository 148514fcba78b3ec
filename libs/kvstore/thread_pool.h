// ElasticThreadPool: runs every task at once, on an idle thread or a new one,
// so a task that blocks (a pull waiting for its round) never delays another.
// Threads stay for later tasks; the pool never shrinks. Meant for the
// kvstore's workers, whose tasks are few and long (at most one per shard
// and operation in flight).
//
//   ElasticThreadPool pool;
//   pool.Schedule([&] { state->Finish(RunOnShard(...)); });
//
// Thread-safety: Schedule is thread-safe. The destructor runs the tasks
// already scheduled, then joins the threads.
#ifndef DTRAIN_LIBS_KVSTORE_THREAD_POOL_H_
#define DTRAIN_LIBS_KVSTORE_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {
namespace kvstore {

class ElasticThreadPool {
 public:
  ElasticThreadPool() = default;
  ~ElasticThreadPool();
  ElasticThreadPool(const ElasticThreadPool&) = delete;
  ElasticThreadPool& operator=(const ElasticThreadPool&) = delete;

  void Schedule(std::function<void()> fn);

  // Threads started so far.
  int num_threads() const;

 private:
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_THREAD_POOL_H_
