// The asynchronous dependency engine: runs operations as soon as the data
// they read and write is ready, on per-device worker queues, so independent
// work overlaps without the user asking (two devices, compute and copies,
// compute and gradient communication).
//
//   std::unique_ptr<engine::Engine> eng = engine::Engine::Create({});
//   engine::QueueId cpu0 = eng->AddQueue("cpu:0", 1, [] { ops::SetCpuThreads(1); });
//   engine::QueueId copy = eng->AddQueue("copy", 1);
//   engine::VarHandle vx = eng->NewVar("x"), vy = eng->NewVar("y");
//   Tensor x = ..., y;
//   eng->Push([&] { y = ops::MatMul(x, x); return absl::OkStatus(); },
//             /*reads=*/{vx}, /*writes=*/{vy}, cpu0, "matmul");
//   ...                                         // Push returns at once
//   DT_RETURN_IF_ERROR(eng->WaitToRead(vy));    // now y may be read
//
// Model. A variable (VarHandle) is a token standing for a piece of state the
// caller owns (a tensor, a buffer, a counter); the engine never looks at the
// state. Each operation is pushed with the variables it reads and writes, and
// the engine gives exactly the results of running the operations one by one
// in push order:
//  - an operation that reads v runs after every earlier operation writing v;
//  - an operation that writes v runs after every earlier operation reading or
//    writing v;
//  - operations that only read v may run at the same time.
// Nothing else is ordered: operations on different queues run in parallel,
// and operations of one queue as far as its threads allow. A variable listed
// in both `reads` and `writes` counts as written; duplicates are ignored.
// The function must touch only state covered by its variables (or state it
// synchronizes itself).
//
// Errors. An operation fails when its function returns an error (or throws).
// Failure is sticky on the variables it writes: every later operation that
// reads or writes such a variable is skipped (its function is not called) and
// fails in turn, with a message naming the original failed operation, e.g.
// "op 'loss' skipped: op 'forward' failed: shape mismatch". WaitToRead(v)
// returns the error that poisoned v; WaitAll() returns the first error (in
// push order) not yet returned by an earlier WaitAll. A poisoned variable
// stays poisoned: use a new variable for fresh state.
//
// Bound. Push blocks while Options::max_pending operations pushed by the
// frontend are unfinished, so a fast frontend cannot run arbitrarily far
// ahead of the workers and fill memory with pending work and its tensors.
// Pushes made from inside a running operation of this engine never block
// (they could deadlock otherwise) but still count as pending.
//
// Threads. All methods are thread-safe; several frontend threads may push
// concurrently (push order is then the order in which their Push calls
// register, one at a time). Functions run on the threads of their queue.
// WaitToRead and WaitAll must not be called from inside an operation of the
// same engine (they would wait for themselves): they return
// FailedPrecondition there. Destroying the engine waits for all pushed work,
// then stops the queues.
//
// Queues. AddQueue(name, threads, init) creates a CPU thread pool. Device
// backends plug in their own queue kind (a CUDA stream that completes an
// operation when its event fires) through AddQueue(unique_ptr<WorkQueue>); see
// work_queue.h for that contract.
#ifndef DTRAIN_LIBS_ENGINE_ENGINE_H_
#define DTRAIN_LIBS_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "libs/engine/work_queue.h"

namespace dtrain {
namespace engine {

namespace engine_internal {
struct Var;
}  // namespace engine_internal

// A dependency token created by Engine::NewVar. A cheap, copyable handle
// (shared ownership): the engine keeps the variable alive while operations
// use it, so dropping all handles after a Push is safe. Handles of different
// engines must not be mixed.
class VarHandle {
 public:
  VarHandle() = default;  // a null handle; invalid in every Engine call

  bool valid() const { return var_ != nullptr; }
  // The name given to NewVar ("" for a null handle).
  const std::string& name() const;
  // A number unique among the variables of one process (0 for a null handle).
  uint64_t id() const;

  friend bool operator==(const VarHandle& a, const VarHandle& b) { return a.var_ == b.var_; }
  friend bool operator!=(const VarHandle& a, const VarHandle& b) { return a.var_ != b.var_; }

 private:
  friend struct engine_internal::Access;
  explicit VarHandle(std::shared_ptr<engine_internal::Var> var) : var_(std::move(var)) {}
  std::shared_ptr<engine_internal::Var> var_;
};

// Names a queue of one engine; returned by Engine::AddQueue.
struct QueueId {
  int index = -1;  // -1: no queue
  bool valid() const { return index >= 0; }
};

// Counters since the engine was created. A snapshot: values read together
// are consistent with each other.
struct EngineStats {
  int64_t ops_pushed = 0;
  int64_t ops_completed = 0;         // finished in any way (ok, failed or skipped)
  int64_t ops_failed = 0;            // whose function returned an error
  int64_t ops_skipped = 0;           // not run because an input came from a failed op
  int64_t max_in_flight = 0;         // most operations pushed and unfinished at once
  int64_t pushes_blocked = 0;        // Push calls that waited for the bound
  int frontends_blocked = 0;         // Push calls waiting for the bound now
  absl::Duration push_blocked_time;  // total time Push calls spent waiting
  std::string ToString() const;      // "pushed=10 completed=10 ..."
};

class Engine {
 public:
  struct Options {
    // Push blocks while this many frontend-pushed operations are unfinished.
    // 1024 keeps a training step or two of per-layer operations in flight
    // (enough to overlap everything that can overlap) while bounding the
    // memory their captured tensors hold. REQUIRES: > 0.
    int max_pending = 1024;
  };

  // The threaded engine. Has no queues until AddQueue is called.
  static std::unique_ptr<Engine> Create(Options options);

  // Waits for every pushed operation, then shuts down the queues. Errors not
  // yet returned by WaitAll are logged. REQUIRES: not called from inside an
  // operation of this engine; no concurrent calls on other threads.
  virtual ~Engine() = default;

  // A new variable with no pending operations. `name` appears in debug output.
  virtual VarHandle NewVar(std::string name = "") = 0;

  // Registers a CPU worker queue ("cpu:0", "copy", "comm") of `threads`
  // threads; each thread first calls `thread_init` (if set), for example
  // [] { ops::SetCpuThreads(1); } to give each device one core. Ops of the
  // queue run on its threads in the order they become ready; with more than
  // one thread, independent ops of the queue run at the same time.
  // Thread names are set to `name` (truncated to 15 characters).
  // REQUIRES: threads >= 1.
  virtual QueueId AddQueue(std::string name, int threads,
                           std::function<void()> thread_init = {}) = 0;

  // Registers a queue of any kind (see work_queue.h); the engine owns it and
  // calls its Shutdown() on destruction. REQUIRES: queue != nullptr.
  virtual QueueId AddQueue(std::unique_ptr<WorkQueue> queue) = 0;

  // Schedules `fn` to run on `queue` once every earlier operation it depends
  // on through `reads` and `writes` (see the file comment) has finished.
  // Returns without waiting for it, except that it blocks while
  // Options::max_pending frontend operations are unfinished. `name` names the
  // operation in error messages. `fn` and everything it captures are
  // destroyed after it ran (or was skipped), before the operation counts as
  // finished. REQUIRES: fn is set; queue comes from this engine's AddQueue;
  // every variable is valid, from this engine and not deleted.
  virtual void Push(std::function<absl::Status()> fn, std::vector<VarHandle> reads,
                    std::vector<VarHandle> writes, QueueId queue, std::string name) = 0;

  // Blocks until every operation pushed so far that writes `v` has finished.
  // The caller may then read v's state until it pushes another operation that
  // writes v. Does not wait for operations that only read v, nor for others.
  // Returns OK, or the error of the failed operation whose failure reached v
  // (the earliest in push order, when several did), naming that operation.
  virtual absl::Status WaitToRead(const VarHandle& v) = 0;

  // Blocks until every operation pushed before the call has finished. Returns
  // the first error (in push order) of those operations that no earlier
  // WaitAll returned, or OK. (Errors are kept for WaitAll up to 1000; beyond
  // that the latest ones are dropped, with a warning in the log.)
  virtual absl::Status WaitAll() = 0;

  // Marks `v` deleted: pending operations on it still run, and its memory goes
  // away once they and all handles are gone. Later use of `v` in Push is a
  // fatal error. Returns at once.
  virtual void DeleteVar(const VarHandle& v) = 0;

  virtual EngineStats stats() const = 0;
};

}  // namespace engine
}  // namespace dtrain

#endif  // DTRAIN_LIBS_ENGINE_ENGINE_H_
