// DeviceCommSlot: the NCCL communicator a regroup offer aborts, shared by a
// job's thread (which sets it when it connects one and clears it before the
// communicator goes) and the agent's heartbeat thread (which aborts it: a
// collective waiting for a dead peer over shared memory or NVLink may never
// fail by itself).
//
//   slot.Set(comm.get(), 1);       // job thread, generation 1's communicator
//   slot.Abort("regrouping", 2);   // heartbeat thread, no lock held: aborts it
//   slot.Set(nullptr, 0);          // job thread, before the communicator goes
//
// A communicator is aborted only for a later generation's offer: an offer
// that crosses the communicator of its own generation (set by the job
// thread between the offer's check and the abort) leaves it alone.
//
// Abort runs under the slot's own mutex and under no lock of its caller's
// (the agent calls it after releasing Agent::mu_), so a slow Abort delays
// neither heartbeats nor the agent's other work. Set waits for an Abort in
// flight, so the communicator outlives every Abort of it. Thread-safe.
#ifndef DTRAIN_LIBS_AGENT_DEVICE_COMM_SLOT_H_
#define DTRAIN_LIBS_AGENT_DEVICE_COMM_SLOT_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "libs/collective/communicator.h"

namespace dtrain {
namespace agent {

class DeviceCommSlot {
 public:
  // The communicator of `generation` that Abort aborts from now on
  // (nullptr: none). Waits for an Abort in flight.
  void Set(collective::Communicator* comm, int64_t generation) {
    absl::MutexLock lock(&mu_);
    comm_ = comm;
    generation_ = generation;
  }

  // Aborts the communicator set now (collective::Communicator::Abort) if it
  // belongs to a generation before `generation`; false when none was.
  bool Abort(const std::string& reason, int64_t generation) {
    absl::MutexLock lock(&mu_);
    if (comm_ == nullptr || generation_ >= generation) return false;
    comm_->Abort(reason);
    return true;
  }

 private:
  absl::Mutex mu_;
  collective::Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace agent
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AGENT_DEVICE_COMM_SLOT_H_
