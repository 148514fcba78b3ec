// Job spec validation and defaults.
//
//   JobSpec spec = ...;                       // from a user, over the network
//   DT_RETURN_IF_ERROR(ValidateJobSpec(spec)); // InvalidArgument naming the field
//   ApplyDefaults(&spec);                      // zero values -> documented defaults
//
// Messages read "<field>: <reason>, got <value>" so trainctl can show them
// as they are. Thread-safe (pure functions).
#ifndef DTRAIN_LIBS_SCHEDULER_SPEC_H_
#define DTRAIN_LIBS_SCHEDULER_SPEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace scheduler {

using v1::JobSpec;

// Upper bounds of the SGD hyperparameters. lr, momentum and weight_decay
// are checked as the float32 values the trainers use: lr in (0, kMaxLr] and
// a normal float32, momentum in [0, 1), weight_decay in [0, kMaxWeightDecay].
inline constexpr double kMaxLr = 1000;
inline constexpr double kMaxWeightDecay = 1;

// Checks every field; the first problem found is returned.
absl::Status ValidateJobSpec(const JobSpec& spec);

// `value` in single quotes for an error message, cut to 64 bytes (followed by
// its length) so that a huge value from the network cannot make the error
// larger than a gRPC reply may be.
std::string Quote(absl::string_view value);

// Fills zero values with defaults: num_trainers and devices_per_trainer 1,
// device_kind "cpu", sync ALLREDUCE/SYNCHRONOUS, init "normal".
void ApplyDefaults(JobSpec* spec);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_SPEC_H_
