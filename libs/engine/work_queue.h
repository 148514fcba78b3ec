// Where ready operations run: the extension point of the dependency engine.
//
// The engine (engine.h) decides *when* an operation may run: once every
// earlier operation on its variables is done. A WorkQueue decides *where and
// how*: it receives each operation of its queue as a ReadyOp when the
// operation's dependencies are done, runs it, and reports when its effects are
// complete. Engine::AddQueue(name, threads, init) registers the built-in CPU
// thread pool; Engine::AddQueue(std::unique_ptr<WorkQueue>) registers
// any other kind, so a new device backend needs no change to engine.h.
//
// The contract between engine and queue:
//
//   void MyQueue::Enqueue(ReadyOp op) {           // any thread, no engine lock
//     hand `op` to a thread of the queue; return without waiting for it.
//   }
//   ... on a thread of the queue:
//     absl::Status s = op.Run();                  // the op's function, once
//     op.Finish(s);                               // when its effects are done
//
// Run() calls the pushed function on the calling thread (or, when an input
// of the operation was produced by a failed operation, skips it and returns
// that error). Finish() tells the engine that the operation's writes are
// visible to whoever runs next; the engine then releases its variables and
// enqueues the operations that were waiting for them, possibly on this same
// queue from inside Finish().
//
// Synchronous queues (the CPU thread pool) call Finish(Run()) back to back.
// Asynchronous devices separate the two. A CUDA stream queue, for instance:
//
//   - one dispatcher thread per stream that makes the stream current (a
//     thread-local the pushed functions use to launch kernels and copies);
//   - dispatcher: s = op.Run(); the function only *enqueues* device work and
//     returns. If !s.ok(), op.Finish(s) at once. Otherwise record a
//     cudaEvent on the stream and pass (op, event) to a completion thread;
//   - completion thread: cudaEventSynchronize(event) (or a host callback via
//     cudaLaunchHostFunc), then op.Finish(status of the event), so readers on
//     other queues (a host copy, the "comm" queue) start only after the device
//     work really finished. The dispatcher is free to launch the next ready op
//     meanwhile: kernels of consecutive ops overlap with host-side dispatch.
//   - Shutdown(): stop both threads after draining; destroy events and stream.
//
// Operations on two streams that depend on each other are ordered through the
// host here (the consumer is enqueued once the producer's event fired). Making
// the consumer's stream wait on the producer's event instead
// (cudaStreamWaitEvent) is a later optimization that needs the engine to
// release a variable early to an op of a queue that can order it on the
// device; it would extend ReadyOp, not this header's existing contract.
//
// Thread-safety: Enqueue is called concurrently from any thread (the pushing
// frontend, or whichever thread finished an operation's last dependency). A
// ReadyOp may be moved between threads; Run and Finish may be called from
// different threads, but not concurrently with each other.
#ifndef DTRAIN_LIBS_ENGINE_WORK_QUEUE_H_
#define DTRAIN_LIBS_ENGINE_WORK_QUEUE_H_

#include <string>

#include "absl/status/status.h"

namespace dtrain {
namespace engine {

namespace engine_internal {
struct Op;
struct Access;  // engine.cc's key to the private parts of handles
}  // namespace engine_internal

// An operation whose dependencies are done, handed to its WorkQueue. Move-only.
// Every ReadyOp must be finished exactly once: destroying one that holds an
// unfinished operation is a fatal programming error (its variables would stay
// locked forever).
class ReadyOp {
 public:
  ReadyOp() = default;
  ReadyOp(ReadyOp&& other) noexcept : op_(other.op_) { other.op_ = nullptr; }
  ReadyOp& operator=(ReadyOp&& other) noexcept;
  ReadyOp(const ReadyOp&) = delete;
  ReadyOp& operator=(const ReadyOp&) = delete;
  ~ReadyOp();

  // True if this holds an operation not yet finished.
  bool valid() const { return op_ != nullptr; }

  // The name given to Engine::Push. REQUIRES: valid().
  const std::string& name() const;

  // Runs the operation's function on the calling thread and returns its
  // status. If an operation that produced one of its variables failed, the
  // function is not called and the returned error names the failed
  // operation. Exceptions thrown by the function are caught and returned as
  // Internal errors. REQUIRES: valid(); called at most once, before Finish.
  absl::Status Run();

  // Reports that the operation is complete, with `status` the result of Run()
  // or, for an asynchronous device, of the work Run() launched. Releases the
  // operation's variables and may enqueue now-ready operations (on any queue,
  // this one included) before returning. Afterwards valid() is false.
  // REQUIRES: valid(); Run() was called.
  void Finish(absl::Status status);

 private:
  friend struct engine_internal::Access;
  explicit ReadyOp(engine_internal::Op* op) : op_(op) {}
  engine_internal::Op* op_ = nullptr;
};

// A place where operations run: a CPU thread pool, a device stream, a network
// sender. Implementations must be thread-safe (see the file comment).
class WorkQueue {
 public:
  virtual ~WorkQueue() = default;

  // Takes an operation that may run now. Called from any thread with no engine
  // lock held; must not wait for other operations to run (queue `op` and
  // return), since the caller may be a thread this queue needs.
  virtual void Enqueue(ReadyOp op) = 0;

  // Called once, by the engine's destructor after every operation has
  // finished. Returns when no thread of the queue will call into the engine
  // again (threads joined, callbacks drained).
  virtual void Shutdown() = 0;
};

}  // namespace engine
}  // namespace dtrain

#endif  // DTRAIN_LIBS_ENGINE_WORK_QUEUE_H_
