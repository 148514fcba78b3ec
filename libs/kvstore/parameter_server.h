// ParameterServer: what a trainer needs from the kvstore, whatever carries it.
//
//   ParameterServer* ps = ...;   // a RemoteParameterServer (gRPC, client.h) or an
//                                // InProcessParameterServer (in_process.h)
//   DT_RETURN_IF_ERROR(ps->CreateJob(config));          // every worker may call it
//   DT_RETURN_IF_ERROR(ps->Init({{"w", {256}, DType::kF32, initial}}));
//   Work round = ps->PushPullAsync({{"w", grad, grad}});
//   ... other work ...
//   DT_RETURN_IF_ERROR(round.Wait());
//
// One object serves one worker of one job (job() and worker()). Rounds,
// buffers and errors follow the contract in client.h ("Rounds", "Buffers")
// and store.h (consistency modes): every implementation behaves the same to
// its caller, which is what lets library tests use the in-process one and
// services the gRPC one (the seam, like TensorFlow's WorkerInterface and its
// GrpcRemoteWorker).
//
// Thread-safety: implementations are thread-safe.
#ifndef DTRAIN_LIBS_KVSTORE_PARAMETER_SERVER_H_
#define DTRAIN_LIBS_KVSTORE_PARAMETER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/kvstore/types.h"

namespace dtrain {
namespace kvstore {

// A key to Init: `initial` (if not null) holds its value in `dtype`;
// Init copies it before returning. Without it the key starts at zero.
struct KeySpec {
  std::string key;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  const void* initial = nullptr;
};

struct PushSource {
  std::string key;
  const void* data = nullptr;  // the whole gradient, in the key's dtype
};

// Pull the round this worker pushed last (0, the initial value, if none).
inline constexpr int64_t kLastPushedRound = -1;

struct PullTarget {
  std::string key;
  void* data = nullptr;  // receives the whole key, in its dtype
  int64_t round = kLastPushedRound;
};

struct PushPullItem {
  std::string key;
  const void* src = nullptr;
  void* dst = nullptr;  // may equal src
};

// ---- For implementations: a call's items in one form ----

// What a Push, Pull or PushPull call does.
enum class CallKind { kPush, kPull, kPushPull };
const char* CallKindName(CallKind kind);  // "push", "pull", "push-pull"

// One item of a call, whatever its kind: src for what goes up (push,
// push-pull), dst for what comes back (pull, push-pull), round for a pull.
struct CallItem {
  std::string key;
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t round = kLastPushedRound;
};
std::vector<CallItem> CallItems(std::vector<PushSource> items);
std::vector<CallItem> CallItems(std::vector<PullTarget> items);
std::vector<CallItem> CallItems(std::vector<PushPullItem> items);

// The checks of a call's items that need no key: kInvalidArgument for a
// missing buffer the kind needs, a key twice in a call that pushes, a pull
// round below kLastPushedRound.
absl::Status CheckCallItems(CallKind kind, const std::vector<CallItem>& items);

// The result of an asynchronous operation, like a std::future<Status>: the
// one completion handle of every ParameterServer (named, and read, like
// collective::Work: Wait, IsCompleted). Destroying a Work that
// is not done waits for it (so buffers are never used after their owner gave
// them up).
class ABSL_MUST_USE_RESULT Work {
 public:
  // The shared state an implementation completes: `remaining` tasks each call
  // Finish once; `pins` count transport-held references to the caller's
  // buffers (the operation is done when both are zero).
  struct State {
    absl::Mutex mu;
    int remaining ABSL_GUARDED_BY(mu) = 0;
    int pins ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);

    // One task ended with `s` (the first error is kept).
    void Finish(const absl::Status& s);
    // Waits for the tasks only (not the pins): what a later operation on the
    // same keys needs.
    void WaitTasks();
  };

  // A finished, successful operation.
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // A finished operation with `status`.
  static Work Done(absl::Status status);
  Work(Work&&) noexcept = default;
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  // Blocks until the operation finished and the transport released the
  // caller's buffers; returns its first error. May be called more than once.
  absl::Status Wait();
  bool IsCompleted() const;

 private:
  std::shared_ptr<State> state_;
};

// What a push or pull answers when a shard no longer has the job or key the
// worker Init'ed (it was dropped, or the shard restarted without its state):
// `not_found` as ABORTED, a transient error (libs/base/retry.h), so the
// job's attempt ends and the job starts again from its checkpoint instead of
// failing for good. Both implementations use it.
absl::Status LostJobStateError(const absl::Status& not_found);

class ParameterServer {
 public:
  virtual ~ParameterServer() = default;

  virtual const std::string& job() const = 0;
  virtual int worker() const = 0;

  // Creates the job (idempotent; kAlreadyExists for a different config).
  // config.job must equal job().
  virtual absl::Status CreateJob(const JobConfig& config) = 0;
  // Drops the job now, on every shard (kNotFound if a shard does not have
  // it). Other workers' calls on it fail from then on.
  virtual absl::Status DeleteJob() = 0;
  // This worker is done with the job: a shard drops it once every worker of
  // the job has left, so no worker still reading its last round is cut off.
  // Leaving twice is harmless; kNotFound if the job is gone.
  virtual absl::Status LeaveJob() = 0;

  // Ends this worker's operations in flight and makes later ones fail at
  // once, with kCancelled carrying `reason`: for when the job's attempt
  // ended elsewhere while an operation waits for a round that will never
  // complete. DeleteJob and LeaveJob still work. Irreversible.
  virtual void Cancel(const std::string& reason) = 0;

  // Creates the keys (idempotent: a key that exists with the same spec keeps
  // its value). Every worker calls Init for the keys it uses.
  virtual absl::Status Init(const std::vector<KeySpec>& keys) = 0;

  // Pushes gradients as this worker's next round of each key. Pushes and
  // pulls of a job or key the shard no longer has are LostJobStateError.
  virtual Work PushAsync(std::vector<PushSource> items) = 0;
  // Copies values into the caller's buffers.
  virtual Work PullAsync(std::vector<PullTarget> items) = 0;
  // Push then pull of the pushed round.
  virtual Work PushPullAsync(std::vector<PushPullItem> items) = 0;

  // How later pushes encode values on their way to the shards (types.h,
  // Compression): f16 or bf16 halve push traffic (the shards widen them to
  // f32 before summing; keys of other dtypes travel in their own); top-k
  // sends each slice's largest entries and carries the rest into the
  // worker's next push of the slice (push_encoder.h). Pulls stay dense.
  // kInvalidArgument for an invalid spec; kUnimplemented from an
  // implementation without compression.
  virtual absl::Status SetPushCompression(const CompressionSpec& compression) {
    if (compression.method == Compression::kNone) return absl::OkStatus();
    return absl::UnimplementedError(absl::StrCat("this parameter server has no push compression (",
                                                 DescribeCompression(compression), ")"));
  }

  // A replacement for a lost worker (same worker id) of a running job with
  // kvstore-held weights: after its Init, sets this client's round counters
  // of the keys it Init'ed to the rounds the shards hold for this worker, so
  // that its next push of each key is the round after the lost worker's
  // last, and returns the lowest of them (0: the worker never pushed).
  // kUnimplemented from an implementation that cannot.
  virtual absl::StatusOr<int64_t> ResumeRounds() {
    return absl::UnimplementedError("this parameter server cannot resume a worker's rounds");
  }

  // Blocking forms (an implementation may run them without a hand-off).
  virtual absl::Status Push(std::vector<PushSource> items) {
    return PushAsync(std::move(items)).Wait();
  }
  virtual absl::Status Pull(std::vector<PullTarget> items) {
    return PullAsync(std::move(items)).Wait();
  }
  virtual absl::Status PushPull(std::vector<PushPullItem> items) {
    return PushPullAsync(std::move(items)).Wait();
  }
};

// For implementations: a ParameterServer whose six data calls (Push, Pull,
// PushPull, blocking and asynchronous) are one, Issue, given the call's
// items in one form (CallItems).
class ParameterServerBase : public ParameterServer {
 public:
  Work PushAsync(std::vector<PushSource> items) final;
  Work PullAsync(std::vector<PullTarget> items) final;
  Work PushPullAsync(std::vector<PushPullItem> items) final;
  absl::Status Push(std::vector<PushSource> items) final;
  absl::Status Pull(std::vector<PullTarget> items) final;
  absl::Status PushPull(std::vector<PushPullItem> items) final;

 protected:
  // Starts a call of `kind`. With `run_one_inline` (the blocking forms) the
  // implementation may run (a part of) it on the calling thread, which then
  // waits for the returned Work.
  virtual Work Issue(CallKind kind, std::vector<CallItem> items, bool run_one_inline) = 0;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_PARAMETER_SERVER_H_
