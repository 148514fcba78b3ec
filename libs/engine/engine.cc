// The threaded dependency engine.
//
// Bookkeeping, after MXNet's ThreadedEngine:
//  - Each variable keeps the operations waiting for it in a FIFO, in push
//    order, and the grant it has handed out: some readers, or one writer.
//    A waiting reader is granted when no writer is active and it is at the
//    front; a waiting writer when nothing is active and it is at the front.
//    Grants therefore follow push order on every variable, which is what
//    makes the outcome equal to serial execution.
//  - Each operation counts the variables it has not been granted yet, plus
//    one held by Push until registration is over. Whoever brings the count to
//    zero (Push, or the thread releasing the last variable) hands the
//    operation to its queue.
//  - Push registers an operation on all its variables under one mutex
//    (push_mu_), so concurrent frontends produce one total order shared by
//    all variables. Without it, two threads pushing ops on {a, b} could be
//    ordered a: X<Y but b: Y<X, and each would wait for the other forever.
//    Finishing an operation takes only the variables' own mutexes.
//
// Lock order: push_mu_ -> Var::mu; push_mu_ -> mu_. Var::mu and mu_ are never
// held together, and no lock is held while calling into a WorkQueue.
//
// std::mutex rather than absl::Mutex: the system Abseil is not built with
// ThreadSanitizer, which would then not see its happens-before edges.
#include "libs/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/engine/thread_pool_queue.h"

namespace dtrain {
namespace engine {
namespace engine_internal {

class ThreadedEngine;

// An error as plain data. Statuses that cross threads are kept this way and
// turned into a fresh absl::Status by whoever returns one: absl::Status shares
// its message by a reference count that lives in the (uninstrumented) system
// Abseil, which ThreadSanitizer cannot follow.
struct Error {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;

  absl::Status ToStatus() const { return absl::Status(code, message); }
};

// The failed operation behind a poisoned variable.
struct Failure {
  uint64_t seq;  // push order of the failed operation
  Error error;   // "op 'name' failed: ..."
};

struct Var {
  Var(const void* owner, std::string name, uint64_t id)
      : owner(owner), name(std::move(name)), id(id) {}

  const void* const owner;  // the engine that created it
  const std::string name;
  const uint64_t id;
  std::atomic<bool> deleted{false};

  struct Waiter {
    Op* op;
    bool write;
  };

  std::mutex mu;
  std::condition_variable written;  // writes_done grew (for WaitToRead)
  // Everything below is guarded by mu.
  int active_readers = 0;
  bool active_writer = false;
  std::deque<Waiter> waiting;  // push order
  uint64_t writes_pushed = 0;
  uint64_t writes_done = 0;  // writes finish in push order
  int frontend_waiters = 0;  // threads in WaitToRead
  std::shared_ptr<const Failure> failure;
};

struct Op {
  ThreadedEngine* engine = nullptr;
  std::function<absl::Status()> fn;
  // Sorted by address, duplicate-free, disjoint.
  std::vector<std::shared_ptr<Var>> reads;
  std::vector<std::shared_ptr<Var>> writes;
  WorkQueue* queue = nullptr;
  std::string name;
  uint64_t seq = 0;
  bool bounded = false;  // counts against Options::max_pending
  // Variables not granted yet, plus one held by Push while registering.
  std::atomic<int> wait{0};
  // Touched only by the thread that holds the ReadyOp.
  bool ran = false;
  std::shared_ptr<const Failure> skip_cause;  // set when skipped
};

struct Access {
  static ReadyOp MakeReadyOp(Op* op) { return ReadyOp(op); }
  static const std::shared_ptr<Var>& GetVar(const VarHandle& v) { return v.var_; }
  static VarHandle MakeHandle(std::shared_ptr<Var> v) { return VarHandle(std::move(v)); }
};

namespace {

// The engine whose operation the current thread is running, if any.
thread_local const void* tls_running_engine = nullptr;

// Errors kept for WaitAll; beyond this, the latest (in push order) are dropped
// so a loop that keeps failing and never calls WaitAll uses bounded memory.
constexpr size_t kMaxUnreportedErrors = 1000;

Error SkipError(const std::string& op_name, const Failure& cause) {
  return Error{cause.error.code, absl::StrCat("op '", op_name, "' skipped: ", cause.error.message)};
}

}  // namespace

class ThreadedEngine final : public Engine {
 public:
  explicit ThreadedEngine(Options options) : options_(options) {}
  ~ThreadedEngine() override;

  VarHandle NewVar(std::string name) override;
  QueueId AddQueue(std::string name, int threads, std::function<void()> thread_init) override;
  QueueId AddQueue(std::unique_ptr<WorkQueue> queue) override;
  void Push(std::function<absl::Status()> fn, std::vector<VarHandle> reads,
            std::vector<VarHandle> writes, QueueId queue, std::string name) override;
  absl::Status WaitToRead(const VarHandle& v) override;
  absl::Status WaitAll() override;
  void DeleteVar(const VarHandle& v) override;
  EngineStats stats() const override;

  // For ReadyOp.
  absl::Status RunOp(Op* op);
  void FinishOp(Op* op, const absl::Status& status);

 private:
  WorkQueue* LookupQueue(QueueId id, const std::string& op_name);
  std::vector<std::shared_ptr<Var>> CheckedVars(std::vector<VarHandle>* handles,
                                                const std::string& op_name);
  // Registers `op` on `v`; true if granted at once. REQUIRES: push_mu_ held.
  static bool Acquire(Var* v, Op* op, bool write);
  // Gives up `op`'s grant on `v` and grants waiters that may now run; those
  // whose last dependency this was are appended to `ready`.
  static void Release(Var* v, bool write, const std::shared_ptr<const Failure>& poison,
                      std::vector<Op*>* ready);
  static void Dispatch(Op* op) { op->queue->Enqueue(Access::MakeReadyOp(op)); }

  const Options options_;

  std::mutex queues_mu_;
  std::vector<std::unique_ptr<WorkQueue>> queues_;  // guarded by queues_mu_

  std::mutex push_mu_;  // serializes registration: defines push order

  mutable std::mutex mu_;
  std::condition_variable bound_cv_;  // pending_bounded_ fell
  std::condition_variable idle_cv_;   // the oldest in-flight op finished
  // Guarded by mu_:
  uint64_t next_seq_ = 0;
  std::set<uint64_t> in_flight_;  // seqs of unfinished ops
  int64_t pending_bounded_ = 0;
  int idle_waiters_ = 0;
  std::map<uint64_t, Error> errors_;  // not yet returned by WaitAll
  bool errors_dropped_ = false;
  EngineStats stats_;
};

ThreadedEngine::~ThreadedEngine() {
  DT_CHECK(tls_running_engine != this) << "engine destroyed from inside one of its operations";
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++idle_waiters_;
    idle_cv_.wait(lock, [this] { return in_flight_.empty(); });
    --idle_waiters_;
    if (!errors_.empty()) {
      DT_LOG(WARNING) << "engine destroyed with " << errors_.size()
                      << " error(s) no WaitAll returned; first: "
                      << errors_.begin()->second.message;
    }
  }
  std::vector<std::unique_ptr<WorkQueue>> queues;
  {
    std::lock_guard<std::mutex> lock(queues_mu_);
    queues.swap(queues_);
  }
  for (auto& q : queues) q->Shutdown();
}

VarHandle ThreadedEngine::NewVar(std::string name) {
  static std::atomic<uint64_t> next_id{1};
  return Access::MakeHandle(std::make_shared<Var>(this, std::move(name),
                                                  next_id.fetch_add(1, std::memory_order_relaxed)));
}

QueueId ThreadedEngine::AddQueue(std::string name, int threads, std::function<void()> thread_init) {
  DT_CHECK(threads >= 1) << "AddQueue('" << name << "', " << threads << " threads)";
  return AddQueue(
      std::make_unique<ThreadPoolQueue>(std::move(name), threads, std::move(thread_init)));
}

QueueId ThreadedEngine::AddQueue(std::unique_ptr<WorkQueue> queue) {
  DT_CHECK(queue != nullptr) << "AddQueue(nullptr)";
  std::lock_guard<std::mutex> lock(queues_mu_);
  queues_.push_back(std::move(queue));
  return QueueId{static_cast<int>(queues_.size()) - 1};
}

WorkQueue* ThreadedEngine::LookupQueue(QueueId id, const std::string& op_name) {
  std::lock_guard<std::mutex> lock(queues_mu_);
  DT_CHECK(id.index >= 0 && id.index < static_cast<int>(queues_.size()))
      << "op '" << op_name << "' pushed to unknown queue " << id.index;
  return queues_[id.index].get();
}

std::vector<std::shared_ptr<Var>> ThreadedEngine::CheckedVars(std::vector<VarHandle>* handles,
                                                              const std::string& op_name) {
  std::vector<std::shared_ptr<Var>> vars;
  vars.reserve(handles->size());
  for (VarHandle& h : *handles) {
    const std::shared_ptr<Var>& v = Access::GetVar(h);
    DT_CHECK(v != nullptr) << "op '" << op_name << "' uses a null VarHandle";
    DT_CHECK(v->owner == this) << "op '" << op_name << "' uses variable '" << v->name
                               << "' of another engine";
    DT_CHECK(!v->deleted.load(std::memory_order_relaxed))
        << "op '" << op_name << "' uses deleted variable '" << v->name << "'";
    vars.push_back(v);
  }
  std::sort(vars.begin(), vars.end());
  vars.erase(std::unique(vars.begin(), vars.end()), vars.end());
  return vars;
}

bool ThreadedEngine::Acquire(Var* v, Op* op, bool write) {
  std::lock_guard<std::mutex> lock(v->mu);
  if (write) ++v->writes_pushed;
  if (v->waiting.empty() && !v->active_writer && (!write || v->active_readers == 0)) {
    if (write) {
      v->active_writer = true;
    } else {
      ++v->active_readers;
    }
    return true;
  }
  v->waiting.push_back(Var::Waiter{op, write});
  return false;
}

void ThreadedEngine::Release(Var* v, bool write, const std::shared_ptr<const Failure>& poison,
                             std::vector<Op*>* ready) {
  std::lock_guard<std::mutex> lock(v->mu);
  if (write) {
    v->active_writer = false;
    // A poisoned variable is only written by skipped ops, whose cause is the
    // earliest failure among their variables, this one's included: the
    // failure kept here only moves to earlier ones.
    if (poison != nullptr) v->failure = poison;
    ++v->writes_done;
    if (v->frontend_waiters > 0) v->written.notify_all();
  } else {
    --v->active_readers;
  }
  while (!v->waiting.empty()) {
    const Var::Waiter w = v->waiting.front();
    if (w.write) {
      if (v->active_writer || v->active_readers > 0) break;
      v->active_writer = true;
    } else {
      if (v->active_writer) break;
      ++v->active_readers;
    }
    v->waiting.pop_front();
    if (w.op->wait.fetch_sub(1, std::memory_order_acq_rel) == 1) ready->push_back(w.op);
  }
}

void ThreadedEngine::Push(std::function<absl::Status()> fn, std::vector<VarHandle> reads,
                          std::vector<VarHandle> writes, QueueId queue, std::string name) {
  DT_CHECK(fn != nullptr) << "op '" << name << "' pushed without a function";
  auto op = std::make_unique<Op>();
  op->engine = this;
  op->queue = LookupQueue(queue, name);
  op->writes = CheckedVars(&writes, name);
  op->reads = CheckedVars(&reads, name);
  // A variable both read and written counts as written.
  op->reads.erase(std::remove_if(op->reads.begin(), op->reads.end(),
                                 [&](const std::shared_ptr<Var>& v) {
                                   return std::binary_search(op->writes.begin(), op->writes.end(),
                                                             v);
                                 }),
                  op->reads.end());
  op->fn = std::move(fn);
  op->name = std::move(name);
  op->bounded = tls_running_engine != this;

  {
    std::unique_lock<std::mutex> lock(mu_);
    if (op->bounded && pending_bounded_ >= options_.max_pending) {
      ++stats_.frontends_blocked;
      ++stats_.pushes_blocked;
      const absl::Time start = absl::Now();
      bound_cv_.wait(lock, [this] { return pending_bounded_ < options_.max_pending; });
      stats_.push_blocked_time += absl::Now() - start;
      --stats_.frontends_blocked;
    }
    if (op->bounded) ++pending_bounded_;
    ++stats_.ops_pushed;
  }

  const int deps = static_cast<int>(op->reads.size() + op->writes.size());
  op->wait.store(deps + 1, std::memory_order_relaxed);
  Op* raw = op.release();  // owned by the engine until FinishOp
  int granted = 0;
  {
    std::lock_guard<std::mutex> push_lock(push_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      raw->seq = next_seq_++;
      in_flight_.insert(raw->seq);
      stats_.max_in_flight =
          std::max(stats_.max_in_flight, static_cast<int64_t>(in_flight_.size()));
    }
    for (const auto& v : raw->reads) granted += Acquire(v.get(), raw, /*write=*/false);
    for (const auto& v : raw->writes) granted += Acquire(v.get(), raw, /*write=*/true);
  }
  if (raw->wait.fetch_sub(granted + 1, std::memory_order_acq_rel) == granted + 1) Dispatch(raw);
}

absl::Status ThreadedEngine::RunOp(Op* op) {
  DT_CHECK(!op->ran) << "op '" << op->name << "' run twice";
  op->ran = true;
  // Every earlier writer of these variables has finished, so their failure
  // state is final.
  std::shared_ptr<const Failure> cause;
  auto consider = [&cause](Var* v) {
    std::lock_guard<std::mutex> lock(v->mu);
    if (v->failure != nullptr && (cause == nullptr || v->failure->seq < cause->seq)) {
      cause = v->failure;
    }
  };
  for (const auto& v : op->reads) consider(v.get());
  for (const auto& v : op->writes) consider(v.get());
  if (cause != nullptr) {
    op->skip_cause = cause;
    return SkipError(op->name, *cause).ToStatus();
  }

  const void* outer = tls_running_engine;
  tls_running_engine = this;
  absl::Status status;
  try {
    status = op->fn();
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("exception: ", e.what()));
  } catch (...) {
    status = absl::InternalError("unknown exception");
  }
  tls_running_engine = outer;
  return status;
}

void ThreadedEngine::FinishOp(Op* op, const absl::Status& status) {
  DT_CHECK(op->ran) << "op '" << op->name << "' finished without Run()";
  std::shared_ptr<const Failure> poison;
  Error error;  // kOk unless failed or skipped
  bool failed = false;
  if (op->skip_cause != nullptr) {
    poison = op->skip_cause;
    error = SkipError(op->name, *poison);
  } else if (!status.ok()) {
    failed = true;
    error = Error{status.code(), absl::StrCat("op '", op->name, "' failed: ", status.message())};
    poison = std::make_shared<const Failure>(Failure{op->seq, error});
  }
  // What the function captured (tensors, buffers) goes before the op counts
  // as finished, so WaitAll() also means "released".
  op->fn = nullptr;

  std::vector<Op*> ready;
  for (const auto& v : op->writes) Release(v.get(), /*write=*/true, poison, &ready);
  for (const auto& v : op->reads) Release(v.get(), /*write=*/false, nullptr, &ready);
  const uint64_t seq = op->seq;
  const bool bounded = op->bounded;
  const bool skipped = op->skip_cause != nullptr;
  delete op;

  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool was_oldest = *in_flight_.begin() == seq;
    in_flight_.erase(seq);
    ++stats_.ops_completed;
    if (failed) ++stats_.ops_failed;
    if (skipped) ++stats_.ops_skipped;
    if (error.code != absl::StatusCode::kOk) {
      errors_.emplace(seq, std::move(error));
      if (errors_.size() > kMaxUnreportedErrors) {
        errors_.erase(std::prev(errors_.end()));
        if (!errors_dropped_) {
          errors_dropped_ = true;
          DT_LOG(WARNING) << "engine: over " << kMaxUnreportedErrors
                          << " failed ops and no WaitAll; dropping the latest errors";
        }
      }
    }
    if (bounded) {
      --pending_bounded_;
      if (stats_.frontends_blocked > 0) bound_cv_.notify_all();
    }
    // Notified under the lock: once in_flight_ is empty the destructor may
    // proceed, and nothing of the engine may be touched after unlocking.
    if (was_oldest && idle_waiters_ > 0) idle_cv_.notify_all();
  }
  // The ready ops are still in flight, so the engine is alive here.
  for (Op* r : ready) Dispatch(r);
}

absl::Status ThreadedEngine::WaitToRead(const VarHandle& handle) {
  if (tls_running_engine == this) {
    return absl::FailedPreconditionError(
        "Engine::WaitToRead called from inside an operation of the same engine");
  }
  Var* v = Access::GetVar(handle).get();
  DT_CHECK(v != nullptr) << "WaitToRead of a null VarHandle";
  DT_CHECK(v->owner == this) << "WaitToRead of variable '" << v->name << "' of another engine";
  std::unique_lock<std::mutex> lock(v->mu);
  const uint64_t target = v->writes_pushed;
  ++v->frontend_waiters;
  v->written.wait(lock, [v, target] { return v->writes_done >= target; });
  --v->frontend_waiters;
  return v->failure != nullptr ? v->failure->error.ToStatus() : absl::OkStatus();
}

absl::Status ThreadedEngine::WaitAll() {
  if (tls_running_engine == this) {
    return absl::FailedPreconditionError(
        "Engine::WaitAll called from inside an operation of the same engine");
  }
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = next_seq_;
  ++idle_waiters_;
  idle_cv_.wait(lock,
                [this, target] { return in_flight_.empty() || *in_flight_.begin() >= target; });
  --idle_waiters_;
  if (errors_.empty() || errors_.begin()->first >= target) return absl::OkStatus();
  absl::Status first = errors_.begin()->second.ToStatus();
  errors_.erase(errors_.begin(), errors_.lower_bound(target));
  return first;
}

void ThreadedEngine::DeleteVar(const VarHandle& handle) {
  Var* v = Access::GetVar(handle).get();
  DT_CHECK(v != nullptr) << "DeleteVar of a null VarHandle";
  DT_CHECK(v->owner == this) << "DeleteVar of variable '" << v->name << "' of another engine";
  const bool was_deleted = v->deleted.exchange(true);
  DT_CHECK(!was_deleted) << "variable '" << v->name << "' deleted twice";
}

EngineStats ThreadedEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace engine_internal

// ---- ReadyOp ----

ReadyOp& ReadyOp::operator=(ReadyOp&& other) noexcept {
  if (this != &other) {
    DT_CHECK(op_ == nullptr) << "unfinished op '" << name() << "' overwritten";
    op_ = other.op_;
    other.op_ = nullptr;
  }
  return *this;
}

ReadyOp::~ReadyOp() {
  DT_CHECK(op_ == nullptr) << "op '" << op_->name << "' dropped by its queue without Finish()";
}

const std::string& ReadyOp::name() const {
  DT_CHECK(op_ != nullptr) << "name() of an empty ReadyOp";
  return op_->name;
}

absl::Status ReadyOp::Run() {
  DT_CHECK(op_ != nullptr) << "Run() of an empty ReadyOp";
  return op_->engine->RunOp(op_);
}

void ReadyOp::Finish(absl::Status status) {
  DT_CHECK(op_ != nullptr) << "Finish() of an empty ReadyOp";
  engine_internal::Op* op = op_;
  op_ = nullptr;
  op->engine->FinishOp(op, status);
}

// ---- VarHandle, EngineStats, Engine ----

const std::string& VarHandle::name() const {
  static const std::string* const kEmpty = new std::string();
  return var_ != nullptr ? var_->name : *kEmpty;
}

uint64_t VarHandle::id() const { return var_ != nullptr ? var_->id : 0; }

std::string EngineStats::ToString() const {
  return absl::StrCat("pushed=", ops_pushed, " completed=", ops_completed, " failed=", ops_failed,
                      " skipped=", ops_skipped, " max_in_flight=", max_in_flight,
                      " pushes_blocked=", pushes_blocked, " frontends_blocked=", frontends_blocked,
                      " push_blocked_ms=", absl::ToDoubleMilliseconds(push_blocked_time));
}

std::unique_ptr<Engine> Engine::Create(Options options) {
  DT_CHECK(options.max_pending > 0) << "Engine::Options::max_pending=" << options.max_pending;
  return std::make_unique<engine_internal::ThreadedEngine>(options);
}

}  // namespace engine
}  // namespace dtrain
