#include "libs/cuda/engine_queue.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/stream.h"

namespace dtrain {
namespace cuda {
namespace {

// A blocking FIFO closed by Close(); Pop returns false once closed and empty.
template <typename T>
class Channel {
 public:
  void Push(T item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
  }
  bool Pop(T* out) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return closed_ || !items_.empty(); });
    if (items_.empty()) return false;
    *out = std::move(items_.front());
    items_.pop_front();
    return true;
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> items_;
  bool closed_ = false;
};

class StreamQueue final : public engine::WorkQueue {
 public:
  StreamQueue(int device, std::unique_ptr<CudaStream> stream)
      : device_(device), stream_(std::move(stream)) {
    dispatcher_ = std::thread([this] { Dispatch(); });
    completer_ = std::thread([this] { Complete(); });
  }
  ~StreamQueue() override { Shutdown(); }

  void Enqueue(engine::ReadyOp op) override { ready_.Push(std::move(op)); }

  void Shutdown() override {
    std::call_once(shutdown_once_, [this] {
      ready_.Close();
      if (dispatcher_.joinable()) dispatcher_.join();
      launched_.Close();
      if (completer_.joinable()) completer_.join();
    });
  }

 private:
  struct Launched {
    engine::ReadyOp op;
    std::unique_ptr<CudaEvent> event;
  };

  void Dispatch() {
    DeviceGuard device(device_);
    StreamGuard stream(stream_.get());
    engine::ReadyOp op;
    while (ready_.Pop(&op)) {
      absl::Status s = op.Run();
      if (!s.ok()) {
        op.Finish(s);
        continue;
      }
      absl::StatusOr<std::unique_ptr<CudaEvent>> event = CudaEvent::Create(device_);
      if (event.ok()) s = (*event)->Record(stream_.get());
      if (!event.ok() || !s.ok()) {
        // Without an event the only safe completion is a full stream sync.
        absl::Status sync = stream_->Synchronize();
        op.Finish(!event.ok() ? event.status() : (sync.ok() ? absl::OkStatus() : sync));
        continue;
      }
      launched_.Push(Launched{std::move(op), *std::move(event)});
    }
  }

  void Complete() {
    DeviceGuard device(device_);
    Launched item;
    while (launched_.Pop(&item)) {
      absl::Status s = item.event->Synchronize();
      if (!s.ok()) {
        s = absl::Status(s.code(), absl::StrCat("device work of op '", item.op.name(),
                                                "' failed on cuda:", device_, ": ", s.message()));
      }
      item.op.Finish(s);
      item.event.reset();
    }
  }

  const int device_;
  std::unique_ptr<CudaStream> stream_;
  Channel<engine::ReadyOp> ready_;
  Channel<Launched> launched_;
  std::thread dispatcher_, completer_;
  std::once_flag shutdown_once_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<engine::WorkQueue>> MakeStreamQueue(int device) {
  std::string reason;
  int count = DeviceCount(&reason);
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", device,
                                                      " for an engine queue (", count, " found",
                                                      reason.empty() ? "" : ": " + reason, ")"));
  }
  absl::StatusOr<std::unique_ptr<CudaStream>> stream = CudaStream::Create(device);
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<engine::WorkQueue>(new StreamQueue(device, *std::move(stream)));
}

}  // namespace cuda
}  // namespace dtrain
