#include "services/trainctl/jobfile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "services/trainctl/yaml.h"

namespace dtrain {
namespace trainctl {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Struct;
using google::protobuf::Value;

// trainctl submit's flags whose names are not the JobSpec's: the flag's name
// and the field's path.
struct Alias {
  const char* flag;
  const char* field;
};
constexpr Alias kAliases[] = {
    {"batch_size", "global_batch_size"},
    {"sync", "sync.mode"},  // only when given a string: `sync: KVSTORE`
    {"consistency", "sync.consistency"},
    {"max_staleness", "sync.max_staleness"},
    {"gradient_compression", "sync.gradient_compression"},
};

// The line of every key of a JSON text by its dotted path (the first
// occurrence; array elements share their array's path).
std::map<std::string, int> JsonKeyLines(absl::string_view text) {
  struct Frame {
    bool object;
    bool expect_key;
    std::string key;
  };
  std::map<std::string, int> lines;
  std::vector<Frame> stack;
  int line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
    } else if (c == '{' || c == '[') {
      stack.push_back({c == '{', c == '{', ""});
    } else if ((c == '}' || c == ']') && !stack.empty()) {
      stack.pop_back();
    } else if (c == ',' && !stack.empty() && stack.back().object) {
      stack.back().expect_key = true;
    } else if (c == '"') {
      std::string s;
      size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size()) ++j;
        s += text[j];
      }
      if (!stack.empty() && stack.back().object && stack.back().expect_key) {
        stack.back().key = s;
        stack.back().expect_key = false;
        std::vector<std::string> path;
        for (const Frame& f : stack) {
          if (f.object) path.push_back(f.key);
        }
        lines.emplace(absl::StrJoin(path, "."), line);
      }
      i = j;
    }
  }
  return lines;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

class Parser {
 public:
  Parser(absl::string_view name, std::map<std::string, int> key_lines)
      : name_(name), key_lines_(std::move(key_lines)) {}

  absl::Status Error(const std::string& path, absl::string_view what) const {
    auto it = key_lines_.find(path);
    if (it == key_lines_.end()) return absl::InvalidArgumentError(absl::StrCat(name_, ": ", what));
    return absl::InvalidArgumentError(absl::StrCat(name_, ":", it->second, ": ", what));
  }

  // Rewrites the flag names of kAliases at the top level into their fields.
  absl::Status ApplyAliases(Struct* top) {
    auto& fields = *top->mutable_fields();
    for (const Alias& alias : kAliases) {
      auto it = fields.find(alias.flag);
      if (it == fields.end()) continue;
      const std::string flag = alias.flag;
      if (flag == "sync" && it->second.kind_case() != Value::kStringValue) continue;
      Value value = it->second;
      fields.erase(it);
      const std::string field = alias.field;
      const size_t dot = field.find('.');
      Struct* parent = top;
      if (dot != std::string::npos) {
        const std::string outer = field.substr(0, dot);
        Value& sync = fields[outer];
        if (sync.kind_case() == Value::KIND_NOT_SET) sync.mutable_struct_value();
        if (sync.kind_case() != Value::kStructValue) {
          return Error(flag, absl::StrCat("\"", flag, "\" sets ", field, ", but \"", outer,
                                          "\" is not a mapping here"));
        }
        parent = sync.mutable_struct_value();
      }
      const std::string leaf = dot == std::string::npos ? field : field.substr(dot + 1);
      if (parent->fields().count(leaf) > 0) {
        auto other = key_lines_.find(field);
        return Error(
            flag, absl::StrCat(
                      "\"", flag, "\" and \"", field, "\"",
                      other == key_lines_.end() ? "" : absl::StrCat(" (line ", other->second, ")"),
                      " set the same field; keep one"));
      }
      (*parent->mutable_fields())[leaf] = std::move(value);
      if (auto line = key_lines_.find(flag); line != key_lines_.end()) {
        key_lines_.emplace(field, line->second);
      }
      shown_[field] = flag;
    }
    return absl::OkStatus();
  }

  // Checks every key of `s` against `d` and each value against its field's
  // type, so that errors name the line and the closest known field.
  absl::Status Check(const Struct& s, const Descriptor* d, const std::string& path) const {
    for (const auto& [key, value] : s.fields()) {
      const std::string here = path.empty() ? key : absl::StrCat(path, ".", key);
      const FieldDescriptor* f = d->FindFieldByName(key);
      for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
        if (d->field(i)->json_name() == key) f = d->field(i);  // lowerCamelCase
      }
      if (f == nullptr) return Unknown(key, d, path, here);
      absl::Status st = CheckValue(f, value, here, /*element=*/false);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  std::string Shown(const std::string& path) const {
    auto it = shown_.find(path);
    return it == shown_.end() ? path : it->second;
  }

  absl::Status Unknown(const std::string& key, const Descriptor* d, const std::string& path,
                       const std::string& here) const {
    std::vector<std::string> names;
    for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
    if (path.empty()) {
      for (const Alias& a : kAliases) names.push_back(a.flag);
    }
    std::string best;
    size_t best_distance = std::string::npos;
    const std::string lower = absl::AsciiStrToLower(key);
    for (const std::string& n : names) {
      size_t distance = EditDistance(lower, n);
      // "batch" for "global_batch_size": a part of the name counts as close.
      if (lower.size() >= 4 && n.find(lower) != std::string::npos)
        distance = std::min<size_t>(distance, 2);
      if (distance < best_distance) {
        best_distance = distance;
        best = n;
      }
    }
    const std::string where = path.empty() ? "" : absl::StrCat(" in \"", Shown(path), "\"");
    if (best_distance <= std::max<size_t>(2, key.size() / 3)) {
      return Error(here, absl::StrCat("unknown field \"", key, "\"", where, "; did you mean \"",
                                      best, "\"?"));
    }
    std::sort(names.begin(), names.end());
    return Error(here, absl::StrCat("unknown field \"", key, "\"", where, "; the fields of ",
                                    d->name(), " are: ", absl::StrJoin(names, ", ")));
  }

  absl::Status CheckValue(const FieldDescriptor* f, const Value& v, const std::string& here,
                          bool element) const {
    const std::string field = Shown(here);
    if (v.kind_case() == Value::kNullValue) return absl::OkStatus();  // the default
    if (f->is_repeated() && !element) {
      if (v.kind_case() != Value::kListValue) {
        return Error(here, absl::StrCat("\"", field, "\" expects a list"));
      }
      for (const Value& e : v.list_value().values()) {
        absl::Status st = CheckValue(f, e, here, /*element=*/true);
        if (!st.ok()) return st;
      }
      return absl::OkStatus();
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (v.kind_case() != Value::kStructValue) {
          return Error(here, absl::StrCat("\"", field, "\" expects a mapping of ",
                                          f->message_type()->name(), " fields"));
        }
        return Check(v.struct_value(), f->message_type(), here);
      case FieldDescriptor::CPPTYPE_ENUM: {
        std::vector<std::string> values;
        for (int i = 0; i < f->enum_type()->value_count(); ++i) {
          const std::string n = f->enum_type()->value(i)->name();
          if (f->enum_type()->value(i)->number() != 0) values.push_back(n);
        }
        if (v.kind_case() == Value::kStringValue &&
            f->enum_type()->FindValueByName(v.string_value()) != nullptr) {
          return absl::OkStatus();
        }
        return Error(here, absl::StrCat("\"", field, "\" must be one of ",
                                        absl::StrJoin(values, ", "), ", got ", Describe(v)));
      }
      case FieldDescriptor::CPPTYPE_BOOL:
        if (v.kind_case() == Value::kBoolValue) return absl::OkStatus();
        return Error(here,
                     absl::StrCat("\"", field, "\" expects true or false, got ", Describe(v)));
      case FieldDescriptor::CPPTYPE_STRING:
        if (v.kind_case() == Value::kStringValue) return absl::OkStatus();
        return Error(here, absl::StrCat("\"", field, "\" expects a string, got ", Describe(v),
                                        "; quote it"));
      default:
        break;
    }
    // Numbers (a quoted number is allowed: protobuf's JSON mapping reads it).
    const bool integer = f->cpp_type() != FieldDescriptor::CPPTYPE_DOUBLE &&
                         f->cpp_type() != FieldDescriptor::CPPTYPE_FLOAT;
    if (v.kind_case() == Value::kStringValue) {
      double d;
      if (absl::SimpleAtod(v.string_value(), &d)) return absl::OkStatus();
    } else if (v.kind_case() == Value::kNumberValue) {
      const double d = v.number_value();
      if (!integer) return absl::OkStatus();
      if (d != std::floor(d)) {
        return Error(here, absl::StrCat("\"", field, "\" expects an integer, got ", Describe(v)));
      }
      if (std::fabs(d) >= 9007199254740992.0) {  // 2^53
        return Error(here, absl::StrCat("\"", field, "\": ", Describe(v),
                                        " is too large to be read exactly; quote it"));
      }
      return absl::OkStatus();
    }
    return Error(here, absl::StrCat("\"", field, "\" expects ", integer ? "an integer" : "a number",
                                    ", got ", Describe(v)));
  }

  static std::string Describe(const Value& v) {
    switch (v.kind_case()) {
      case Value::kStringValue:
        return absl::StrCat("\"", v.string_value(), "\"");
      case Value::kNumberValue:
        return absl::StrCat(v.number_value());
      case Value::kBoolValue:
        return v.bool_value() ? "true" : "false";
      case Value::kStructValue:
        return "a mapping";
      case Value::kListValue:
        return "a list";
      default:
        return "null";
    }
  }

  const std::string name_;
  std::map<std::string, int> key_lines_;
  std::map<std::string, std::string> shown_;  // field path -> the name the file used
};

}  // namespace

absl::Status ParseJobFile(absl::string_view name, absl::string_view text,
                          scheduler::v1::JobSpec* spec, std::string* model_file) {
  spec->Clear();
  if (model_file != nullptr) model_file->clear();
  std::string json;
  std::map<std::string, int> key_lines;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != absl::string_view::npos && text[first] == '{') {
    json = std::string(text);
    key_lines = JsonKeyLines(text);
  } else {
    absl::StatusOr<std::string> converted = YamlToJson(text, &key_lines);
    if (!converted.ok()) {
      // "line N: ..." becomes "<name>:N: ...".
      absl::string_view m = converted.status().message();
      if (absl::ConsumePrefix(&m, "line ")) {
        return absl::InvalidArgumentError(absl::StrCat(name, ":", m));
      }
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", m));
    }
    json = *std::move(converted);
  }
  Struct top;
  if (auto st = google::protobuf::util::JsonStringToMessage(json, &top); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not valid JSON: ", std::string(st.message())));
  }
  Parser parser(name, std::move(key_lines));
  if (auto it = top.fields().find("model_file");
      model_file != nullptr && it != top.fields().end()) {
    if (it->second.kind_case() != Value::kStringValue || it->second.string_value().empty()) {
      return parser.Error("model_file", "\"model_file\" expects the path of an ONNX file");
    }
    *model_file = it->second.string_value();
    top.mutable_fields()->erase("model_file");
  }
  absl::Status st = parser.ApplyAliases(&top);
  if (st.ok()) st = parser.Check(top, spec->GetDescriptor(), "");
  if (!st.ok()) return st;
  std::string normalized;
  (void)google::protobuf::util::MessageToJsonString(top, &normalized);
  if (auto pst = google::protobuf::util::JsonStringToMessage(normalized, spec); !pst.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a JobSpec: ", std::string(pst.message())));
  }
  return absl::OkStatus();
}

absl::Status ReadJobFile(const std::string& path, scheduler::v1::JobSpec* spec,
                         std::string* model_file) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::Status s = ParseJobFile(path, ss.str(), spec, model_file);
  const size_t slash = path.rfind('/');
  if (s.ok() && model_file != nullptr && !model_file->empty() && (*model_file)[0] != '/' &&
      slash != std::string::npos) {
    *model_file = absl::StrCat(path.substr(0, slash + 1), *model_file);
  }
  return s;
}

}  // namespace trainctl
}  // namespace dtrain
