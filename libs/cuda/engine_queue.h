// A dependency-engine queue (libs/engine/work_queue.h) that runs operations
// on a CUDA stream.
//
//   engine::QueueId gpu = eng->AddQueue(*cuda::MakeStreamQueue(/*device=*/0));
//   eng->Push([&] { ops::Conv2d(...); return absl::OkStatus(); },  // launches only
//             {x}, {y}, gpu, "conv1");
//
// A dispatcher thread makes the queue's stream current (StreamGuard) and runs
// each ready operation's function, which only enqueues device work and
// returns; it then records an event on the stream and hands the operation to a
// completion thread, which waits for the event and reports the operation
// finished to the engine. So the engine releases an operation's variables
// only when its device work is really done, while the dispatcher already
// launches the next operation: host dispatch overlaps device execution.
//
// Thread-safety: as WorkQueue requires.
#ifndef DTRAIN_LIBS_CUDA_ENGINE_QUEUE_H_
#define DTRAIN_LIBS_CUDA_ENGINE_QUEUE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "libs/engine/work_queue.h"

namespace dtrain {
namespace cuda {

// A queue on a new stream of CUDA device `device`. FailedPrecondition when the
// device does not exist (for example on machines without a GPU).
absl::StatusOr<std::unique_ptr<engine::WorkQueue>> MakeStreamQueue(int device);

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_ENGINE_QUEUE_H_
