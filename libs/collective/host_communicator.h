// The Communicator of the host transports (kInProcess, kShm, kTcp): the
// collective algorithms of algorithms.h over a Transport, on host memory.
// Private to //libs/collective:collective; use Communicator::Create.
//
// Execution: operations are validated into Tasks and run one at a time, in
// issue order, by the worker thread, except that a synchronous call made
// while nothing is queued runs on the calling thread (saving a thread switch
// per operation). An operation that fails aborts the transport (peers see
// the connection fail) and breaks the communicator.
#ifndef DTRAIN_LIBS_COLLECTIVE_HOST_COMMUNICATOR_H_
#define DTRAIN_LIBS_COLLECTIVE_HOST_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/collective/transport.h"

namespace dtrain {
namespace collective {
namespace internal {

class HostCommunicator final : public Communicator {
 public:
  // Communicator::Create for the host transports (arguments already checked).
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, int size, Store* store,
                                                              const CommunicatorOptions& options);

  ~HostCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const CommunicatorOptions& options() const override { return options_; }
  const char* transport_name() const override;
  absl::Status health() const override;
  Algorithm AllreduceAlgorithmFor(size_t bytes) const override;

 private:
  // One queued operation: validated arguments bound into `run`.
  struct Task {
    std::shared_ptr<Work> work;
    absl::Duration timeout;
    std::function<absl::Status(absl::Time deadline)> run;
  };

  HostCommunicator(int rank, int size, const CommunicatorOptions& options,
                   std::unique_ptr<Transport> transport);

  // Communicator's operations.
  absl::Status DoAllreduce(void* data, size_t count, DType dtype, ReduceOp op,
                           absl::Duration timeout) override;
  absl::Status DoReduceScatter(const void* input, void* output, size_t output_count, DType dtype,
                               ReduceOp op, absl::Duration timeout) override;
  absl::Status DoAllgather(const void* input, void* output, size_t input_count, DType dtype,
                           absl::Duration timeout) override;
  absl::Status DoBroadcast(void* data, size_t count, DType dtype, int root,
                           absl::Duration timeout) override;
  absl::Status DoBarrier(absl::Duration timeout) override;
  std::shared_ptr<Work> DoAllreduceAsync(void* data, size_t count, DType dtype, ReduceOp op,
                                         absl::Duration timeout) override;
  std::shared_ptr<Work> DoReduceScatterAsync(const void* input, void* output, size_t output_count,
                                             DType dtype, ReduceOp op,
                                             absl::Duration timeout) override;
  std::shared_ptr<Work> DoAllgatherAsync(const void* input, void* output, size_t input_count,
                                         DType dtype, absl::Duration timeout) override;
  std::shared_ptr<Work> DoBroadcastAsync(void* data, size_t count, DType dtype, int root,
                                         absl::Duration timeout) override;
  std::shared_ptr<Work> DoBarrierAsync(absl::Duration timeout) override;

  // Builds the task for an operation (or a Work that failed validation).
  Task MakeTask(std::string description, absl::Duration timeout, absl::Status validation,
                std::function<absl::Status(absl::Time)> run);
  std::shared_ptr<Work> Enqueue(Task task);
  absl::Status RunNowOrQueue(Task task);
  void Execute(Task& task);
  void WorkerLoop();

  // Operation bodies (run on the executing thread).
  absl::Status RunAllreduce(void* data, size_t count, DType dtype, ReduceOp op, Algorithm algorithm,
                            absl::Time deadline);
  absl::Status RunReduceScatter(const void* input, void* output, size_t count, DType dtype,
                                ReduceOp op, absl::Time deadline);
  absl::Status RunAllgather(const void* input, void* output, size_t bytes, absl::Time deadline);
  absl::Status RunBroadcast(void* data, size_t bytes, int root, absl::Time deadline);

  Task AllreduceTask(void* data, size_t count, DType dtype, ReduceOp op, absl::Duration timeout);
  Task ReduceScatterTask(const void* input, void* output, size_t count, DType dtype, ReduceOp op,
                         absl::Duration timeout);
  Task AllgatherTask(const void* input, void* output, size_t count, DType dtype,
                     absl::Duration timeout);
  Task BroadcastTask(void* data, size_t count, DType dtype, int root, absl::Duration timeout);
  Task BarrierTask(absl::Duration timeout);

  const int rank_;
  const int size_;
  const CommunicatorOptions options_;
  std::unique_ptr<Transport> transport_;  // used only by the executing thread
  std::vector<char> scratch_;             // likewise

  mutable absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // an operation is executing
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t issued_ ABSL_GUARDED_BY(mu_) = 0;  // operations issued, for descriptions
  std::thread worker_;
};

}  // namespace internal
}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_HOST_COMMUNICATOR_H_
