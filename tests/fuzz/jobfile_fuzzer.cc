// Fuzz target: a job file as `trainctl submit -f` reads it (JSON, or the YAML
// subset of services/trainctl/yaml.h turned into JSON), or a JobSpec as the
// scheduler receives it (protobuf binary, input starting with a 0 byte),
// then spec validation and defaults (libs/scheduler/spec.h).
//
// Checks beyond "no crash": a spec that validates still validates after
// ApplyDefaults, and validation errors stay small (Quote cuts values).
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/json_util.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "libs/scheduler/spec.h"
#include "services/trainctl/yaml.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "jobfile_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs each string field that is not UTF-8; expected here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  dtrain::scheduler::JobSpec spec;
  if (!text.empty() && text[0] == '\0') {
    if (!spec.ParseFromString(text.substr(1))) return 0;
  } else {
    // As trainctl's BuildSpec: JSON when it starts with '{', else YAML.
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || text[first] != '{') {
      absl::StatusOr<std::string> json = dtrain::trainctl::YamlToJson(text);
      if (!json.ok()) {
        Check(absl::IsInvalidArgument(json.status()), "YamlToJson error is InvalidArgument");
        Check(absl::StartsWith(json.status().message(), "line ") ||
                  absl::StartsWith(json.status().message(), "empty document"),
              "YamlToJson error names a line");
        return 0;
      }
      text = *std::move(json);
      // What YamlToJson produces must be JSON protobuf can at least read.
      google::protobuf::Struct any;
      Check(google::protobuf::util::JsonStringToMessage(text, &any).ok(),
            "YamlToJson output is valid JSON");
    }
    if (!google::protobuf::util::JsonStringToMessage(text, &spec).ok()) return 0;
  }
  absl::Status valid = dtrain::scheduler::ValidateJobSpec(spec);
  if (!valid.ok()) {
    Check(absl::IsInvalidArgument(valid), "validation error is InvalidArgument");
    Check(valid.message().size() < 1024, "validation error is small");
    return 0;
  }
  dtrain::scheduler::ApplyDefaults(&spec);
  Check(dtrain::scheduler::ValidateJobSpec(spec).ok(), "a valid spec stays valid after defaults");
  return 0;
}
