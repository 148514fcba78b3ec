// ParseQueueYaml: the small YAML subset a queues file (queue_config.h) is
// written in, parsed into a tree whose every node knows its line.
//
//   DT_ASSIGN_OR_RETURN(YamlNode root, ParseQueueYaml(text));
//   const YamlNode* queues = root.Find("queues");   // a sequence
//
// Supported: block mappings (`key: value`, `key:` then a deeper block),
// block sequences (`- item`, `- name: x` starting a mapping whose further
// keys line up under `name`), flow mappings (`{trainers: 1, cpu_devices: 4}`)
// and flow sequences (`[alice, bob]`), nested flows, plain, "double" and
// 'single' quoted scalars, `#` comments and blank lines. Not supported
// (an error naming the line): tabs in indentation, anchors and aliases,
// multi-line scalars and documents (`---`), duplicate keys.
//
// It lives here and not in services/trainctl/yaml.h because libs/ must not
// depend on services/ and that one has neither lists nor flow mappings.
//
// Pure functions, thread-compatible.
#ifndef DTRAIN_LIBS_SCHEDULER_QUEUE_YAML_H_
#define DTRAIN_LIBS_SCHEDULER_QUEUE_YAML_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace scheduler {

struct YamlNode {
  enum class Kind { kScalar, kMap, kSeq };
  Kind kind = Kind::kScalar;
  int line = 0;                                         // 1-based
  std::string scalar;                                   // kScalar ("" for an empty value)
  std::vector<std::pair<std::string, YamlNode>> items;  // kMap, in file order
  std::vector<YamlNode> elements;                       // kSeq

  bool is_scalar() const { return kind == Kind::kScalar; }
  bool is_map() const { return kind == Kind::kMap; }
  bool is_seq() const { return kind == Kind::kSeq; }
  // The value of `key` in a mapping; nullptr when absent or not a mapping.
  const YamlNode* Find(absl::string_view key) const;
};

// Parses `text`. InvalidArgument naming the line (and what was expected) on
// anything outside the subset.
absl::StatusOr<YamlNode> ParseQueueYaml(absl::string_view text);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_QUEUE_YAML_H_
