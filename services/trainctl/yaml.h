// The YAML that job files use, turned into JSON for protobuf's JSON parser
// (`trainctl submit -f job.yaml`):
//
//   # LeNet on two trainers through the kvstore
//   name: lenet-kv
//   model: lenet
//   epochs: 10
//   global_batch_size: 256
//   lr: 0.2
//   num_trainers: 2
//   sync:
//     mode: KVSTORE
//     consistency: BOUNDED_DELAY
//     max_staleness: 2
//     gradient_compression: bf16
//
// Supported: block mappings nested by indentation (spaces), scalars plain,
// 'single-' or "double-quoted" (with \" \\ \n \t escapes), comments, blank
// lines, one optional leading "---". Plain scalars true/false, null/~ and
// numbers map to JSON's; anything else is a string (protobuf then rejects a
// string where it wants a number, naming the field). Not supported, with an
// error naming the line: sequences, flow collections ({...} / [...]),
// anchors, tags, multi-line scalars, tabs in indentation, duplicate keys.
#ifndef DTRAIN_SERVICES_TRAINCTL_YAML_H_
#define DTRAIN_SERVICES_TRAINCTL_YAML_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace trainctl {

// InvalidArgument "line N: what is wrong" for text outside the subset.
// With `key_lines`, also records the line (1-based) of every key, by its
// dotted path ("sync.mode"), so that later checks can name the line.
absl::StatusOr<std::string> YamlToJson(absl::string_view yaml,
                                       std::map<std::string, int>* key_lines = nullptr);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_YAML_H_
