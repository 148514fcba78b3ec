// Job files: the JobSpec that `trainctl submit -f FILE` sends, written as
// YAML (the subset of yaml.h) or protobuf JSON (when the file starts with
// '{'). A job file takes the JobSpec's field names and also the names of
// trainctl submit's flags, so a line can be moved between a command and a
// file unchanged:
//
//   name: lenet-kv             # JobSpec field names ...
//   model: lenet
//   batch_size: 256            # ... or the flag's name: global_batch_size
//   sync: KVSTORE              # the flag's form: sync.mode
//   consistency: BOUNDED_DELAY # sync.consistency (so max_staleness and
//   max_staleness: 2           # gradient_compression: sync.<name>)
//   model_file: net.onnx       # your own model instead of `model` (uploaded)
//
//   v1::JobSpec spec;
//   absl::Status s = ParseJobFile("job.yaml", text, &spec);
//   // s.message(): "job.yaml:4: unknown field \"batchsize\"; did you mean
//   //               \"batch_size\" (global_batch_size)?"
//
// Errors are InvalidArgument and start with "<name>:<line>:" where the line
// is known: an unknown field (with the closest known name, or the list of
// the mapping's fields), a value of the wrong type or out of the field's
// range, a field given twice under two names, or text outside the YAML
// subset. Integers beyond 2^53 must be quoted ("seed: '18446744073709551615'"),
// as protobuf's JSON mapping allows: written bare they would lose digits.
// Values are not range-checked here beyond their type; the scheduler's
// ValidateJobSpec does that at submit.
#ifndef DTRAIN_SERVICES_TRAINCTL_JOBFILE_H_
#define DTRAIN_SERVICES_TRAINCTL_JOBFILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace trainctl {

// Parses `text` (the contents of the file called `name`, used in errors)
// into `*spec` (cleared first). `model_file` non-null: the file may also
// say `model_file: net.onnx` (trainctl submit's --model_file, not a JobSpec
// field: the file is uploaded and the spec names its digest), which goes
// there ("" when absent).
absl::Status ParseJobFile(absl::string_view name, absl::string_view text,
                          scheduler::v1::JobSpec* spec, std::string* model_file = nullptr);

// ParseJobFile of the file at `path`; NotFound "cannot read <path>" when it
// cannot be read. A relative model_file is taken from the job file's
// directory.
absl::Status ReadJobFile(const std::string& path, scheduler::v1::JobSpec* spec,
                         std::string* model_file = nullptr);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_JOBFILE_H_
