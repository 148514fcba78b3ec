#include "services/trainctl/yaml.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dtrain {
namespace trainctl {
namespace {

struct Line {
  int number;  // 1-based
  int indent;  // leading spaces
  std::string key;
  std::string value;  // the JSON text of a scalar; empty: a nested mapping follows
};

absl::Status Error(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrCat("\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Whether `s` is well-formed UTF-8 (JSON text must be; protobuf's JSON
// parser rejects anything else with a message that names no line).
bool ValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char t = static_cast<unsigned char>(s[i + k]);
      if ((t & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and values past U+10FFFF.
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// Whether `s` is a number JSON accepts as is.
bool JsonNumber(absl::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  if (s[i] == '-') ++i;
  if (i == s.size() || !absl::ascii_isdigit(s[i])) return false;
  if (s[i] == '0' && i + 1 < s.size() && absl::ascii_isdigit(s[i + 1])) return false;
  double value;
  // Not a number past double's range (1e999): JSON parsers reject it.
  return absl::SimpleAtod(s, &value) && std::isfinite(value) &&
         s.find_first_of("xXnN") == absl::string_view::npos;
}

// Parses the scalar after "key:" (comment already allowed); sets *json.
absl::Status Scalar(int line, absl::string_view text, std::string* json) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty() || text[0] == '#') {
    *json = "";
    return absl::OkStatus();
  }
  const char c = text[0];
  if (c == '"' || c == '\'') {
    std::string out;
    size_t i = 1;
    for (; i < text.size(); ++i) {
      if (text[i] == c) {
        if (c == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {  // '' is a quote
          out += '\'';
          ++i;
          continue;
        }
        break;
      }
      if (c == '"' && text[i] == '\\' && i + 1 < text.size()) {
        const char e = text[++i];
        switch (e) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          default:
            return Error(line, absl::StrCat("unsupported escape \\", std::string(1, e)));
        }
      } else {
        out += text[i];
      }
    }
    if (i >= text.size()) return Error(line, "unterminated quoted string");
    absl::string_view rest = absl::StripAsciiWhitespace(text.substr(i + 1));
    if (!rest.empty() && rest[0] != '#') {
      return Error(line, absl::StrCat("unexpected text after the string: ", rest));
    }
    *json = JsonString(out);
    return absl::OkStatus();
  }
  if (c == '{' || c == '[') {
    return Error(line, "flow collections ({...} / [...]) are not supported; use block mappings");
  }
  if (c == '&' || c == '*' || c == '!' || c == '|' || c == '>') {
    return Error(line, "anchors, aliases, tags and block scalars are not supported");
  }
  // A plain scalar ends at " #".
  if (size_t hash = text.find(" #"); hash != absl::string_view::npos) {
    text = absl::StripAsciiWhitespace(text.substr(0, hash));
  }
  if (text == "true" || text == "false") {
    *json = std::string(text);
  } else if (text == "null" || text == "~") {
    *json = "null";
  } else if (JsonNumber(text)) {
    *json = std::string(text);
  } else {
    *json = JsonString(text);
  }
  return absl::OkStatus();
}

// Emits the mapping whose lines start at lines[*i] with indentation
// `indent`.
absl::Status Mapping(const std::vector<Line>& lines, size_t* i, int indent, const std::string& path,
                     std::map<std::string, int>* key_lines, std::string* out) {
  *out += "{";
  std::set<std::string> keys;
  bool first = true;
  while (*i < lines.size() && lines[*i].indent >= indent) {
    const Line& l = lines[*i];
    if (l.indent != indent) {
      return Error(l.number, absl::StrCat("indentation ", l.indent, " does not match ", indent));
    }
    if (!keys.insert(l.key).second) return Error(l.number, "duplicate key '" + l.key + "'");
    if (!first) *out += ",";
    first = false;
    *out += JsonString(l.key) + ":";
    const std::string key_path = path.empty() ? l.key : absl::StrCat(path, ".", l.key);
    if (key_lines != nullptr) (*key_lines)[key_path] = l.number;
    ++*i;
    if (!l.value.empty()) {
      *out += l.value;
      continue;
    }
    if (*i < lines.size() && lines[*i].indent > indent) {
      absl::Status s = Mapping(lines, i, lines[*i].indent, key_path, key_lines, out);
      if (!s.ok()) return s;
    } else {
      *out += "null";  // "key:" with nothing under it
    }
  }
  *out += "}";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> YamlToJson(absl::string_view yaml,
                                       std::map<std::string, int>* key_lines) {
  std::vector<Line> lines;
  int number = 0;
  bool seen_content = false;
  for (absl::string_view raw : absl::StrSplit(yaml, '\n')) {
    ++number;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    if (!ValidUtf8(raw)) return Error(number, "not valid UTF-8 text; save the file as UTF-8");
    size_t indent = 0;
    while (indent < raw.size() && raw[indent] == ' ') ++indent;
    absl::string_view rest = raw.substr(indent);
    if (!rest.empty() && rest[0] == '\t') {
      return Error(number, "tabs are not allowed in indentation; use spaces");
    }
    if (rest.empty() || rest[0] == '#') continue;
    if (absl::StripTrailingAsciiWhitespace(rest) == "---" && indent == 0) {
      if (seen_content) return Error(number, "only one document is supported");
      continue;
    }
    seen_content = true;
    if (rest[0] == '-' && (rest.size() == 1 || rest[1] == ' ')) {
      return Error(number, "sequences are not supported (job specs have no lists)");
    }
    // The key: up to the first ": " or a trailing ':'.
    size_t colon = std::string::npos;
    for (size_t j = 0; j < rest.size(); ++j) {
      if (rest[j] == ':' && (j + 1 == rest.size() || rest[j + 1] == ' ')) {
        colon = j;
        break;
      }
    }
    if (colon == std::string::npos || colon == 0) {
      return Error(number, absl::StrCat("expected 'key: value', got '",
                                        absl::StripTrailingAsciiWhitespace(rest), "'"));
    }
    Line l;
    l.number = number;
    l.indent = static_cast<int>(indent);
    l.key = std::string(absl::StripTrailingAsciiWhitespace(rest.substr(0, colon)));
    if (l.key.front() == '"' || l.key.front() == '\'') {
      if (l.key.size() < 2 || l.key.back() != l.key.front()) {
        return Error(number, "unterminated quoted key");
      }
      l.key = l.key.substr(1, l.key.size() - 2);
    }
    absl::Status s = Scalar(number, rest.substr(colon + 1), &l.value);
    if (!s.ok()) return s;
    lines.push_back(std::move(l));
  }
  if (lines.empty()) return absl::InvalidArgumentError("empty document: no 'key: value' lines");
  if (lines[0].indent != 0)
    return Error(lines[0].number, "the top-level mapping must not be indented");
  std::string out;
  size_t i = 0;
  absl::Status s = Mapping(lines, &i, 0, "", key_lines, &out);
  if (!s.ok()) return s;
  if (i != lines.size()) {
    return Error(lines[i].number, "indentation does not match any enclosing mapping");
  }
  return out;
}

}  // namespace trainctl
}  // namespace dtrain
