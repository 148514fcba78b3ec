#include "libs/agent/device_comm_slot.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace agent {
namespace {

// A communicator whose Abort blocks until released (an ncclCommAbort that
// takes long); it carries no operations.
class SlowAbort : public collective::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const collective::CommunicatorOptions& options() const override { return options_; }
  const char* transport_name() const override { return "slow-abort"; }
  absl::Status health() const override { return absl::OkStatus(); }
  collective::Algorithm AllreduceAlgorithmFor(size_t) const override {
    return collective::Algorithm::kAuto;
  }
  void Abort(const std::string& reason) override {
    {
      absl::MutexLock lock(&mu_);
      reasons_.push_back(reason);
    }
    entered_.Notify();
    release_.WaitForNotification();
  }
  std::vector<std::string> reasons() const {
    absl::MutexLock lock(&mu_);
    return reasons_;
  }

  absl::Notification entered_;
  absl::Notification release_;

 private:
  absl::Status Unsupported() const { return absl::UnimplementedError("slow-abort: no operations"); }
  std::shared_ptr<collective::Work> Failed() const {
    std::shared_ptr<collective::Work> w = NewWork("slow-abort");
    CompleteWork(*w, Unsupported());
    return w;
  }
  absl::Status DoAllreduce(void*, size_t, DType, collective::ReduceOp, absl::Duration) override {
    return Unsupported();
  }
  absl::Status DoReduceScatter(const void*, void*, size_t, DType, collective::ReduceOp,
                               absl::Duration) override {
    return Unsupported();
  }
  absl::Status DoAllgather(const void*, void*, size_t, DType, absl::Duration) override {
    return Unsupported();
  }
  absl::Status DoBroadcast(void*, size_t, DType, int, absl::Duration) override {
    return Unsupported();
  }
  absl::Status DoBarrier(absl::Duration) override { return Unsupported(); }
  std::shared_ptr<collective::Work> DoAllreduceAsync(void*, size_t, DType, collective::ReduceOp,
                                                     absl::Duration) override {
    return Failed();
  }
  std::shared_ptr<collective::Work> DoReduceScatterAsync(const void*, void*, size_t, DType,
                                                         collective::ReduceOp,
                                                         absl::Duration) override {
    return Failed();
  }
  std::shared_ptr<collective::Work> DoAllgatherAsync(const void*, void*, size_t, DType,
                                                     absl::Duration) override {
    return Failed();
  }
  std::shared_ptr<collective::Work> DoBroadcastAsync(void*, size_t, DType, int,
                                                     absl::Duration) override {
    return Failed();
  }
  std::shared_ptr<collective::Work> DoBarrierAsync(absl::Duration) override { return Failed(); }

  collective::CommunicatorOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::string> reasons_ ABSL_GUARDED_BY(mu_);
};

TEST(DeviceCommSlotTest, ClearingWaitsForAnAbortInFlightAndThenNothingIsAborted) {
  SlowAbort comm;
  DeviceCommSlot slot;
  EXPECT_FALSE(slot.Abort("nothing set", 1));
  slot.Set(&comm, 0);
  std::atomic<bool> aborted{false};
  std::thread heartbeat([&] { aborted = slot.Abort("regrouping in generation 1", 1); });
  comm.entered_.WaitForNotification();
  // The job thread's communicator is about to go: it waits for the abort.
  std::atomic<bool> cleared{false};
  std::thread job([&] {
    slot.Set(nullptr, 0);
    cleared = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(cleared.load()) << "the communicator was released while Abort ran on it";
  EXPECT_FALSE(aborted.load());
  comm.release_.Notify();
  heartbeat.join();
  job.join();
  EXPECT_TRUE(aborted.load());
  EXPECT_TRUE(cleared.load());
  // Cleared: a later offer aborts nothing.
  EXPECT_FALSE(slot.Abort("regrouping in generation 2", 2));
  EXPECT_EQ(comm.reasons(), std::vector<std::string>{"regrouping in generation 1"});
}

TEST(DeviceCommSlotTest, OnlyALaterGenerationsOfferAbortsTheCommunicator) {
  SlowAbort comm;
  comm.release_.Notify();
  DeviceCommSlot slot;
  slot.Set(&comm, 2);  // generation 2's communicator, connected after the offer of 2
  EXPECT_FALSE(slot.Abort("regrouping in generation 1", 1));
  EXPECT_FALSE(slot.Abort("regrouping in generation 2", 2));
  EXPECT_TRUE(comm.reasons().empty());
  EXPECT_TRUE(slot.Abort("regrouping in generation 3", 3));
  EXPECT_EQ(comm.reasons(), std::vector<std::string>{"regrouping in generation 3"});
}

}  // namespace
}  // namespace agent
}  // namespace dtrain
