#include "libs/scheduler/queue_yaml.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dtrain {
namespace scheduler {
namespace {

struct Line {
  int number;           // 1-based
  int indent;           // spaces before content
  std::string content;  // comment and trailing blanks removed
};

absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

// Removes a `#` comment that starts outside quotes (at the start or after a
// blank) and trailing blanks.
std::string StripComment(absl::string_view s) {
  char quote = 0;
  size_t end = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || s[i - 1] == ' ')) {
      end = i;
      break;
    }
  }
  return std::string(absl::StripTrailingAsciiWhitespace(s.substr(0, end)));
}

// The position of the `:` that ends a mapping key in `s` (followed by a
// blank or the end), outside quotes and flows; npos if none.
size_t KeyColon(absl::string_view s) {
  char quote = 0;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ':' && depth == 0 && (i + 1 == s.size() || s[i + 1] == ' ')) {
      return i;
    }
  }
  return absl::string_view::npos;
}

bool IsSeqItem(absl::string_view s) { return s == "-" || absl::StartsWith(s, "- "); }

// Flow values and scalars on one line: a recursive descent over `s`.
class FlowParser {
 public:
  FlowParser(absl::string_view s, int line) : s_(s), line_(line) {}

  absl::StatusOr<YamlNode> ParseAll() {
    absl::StatusOr<YamlNode> v = Value(/*in_flow=*/false);
    if (!v.ok()) return v;
    SkipBlanks();
    if (pos_ != s_.size()) return Error(absl::StrCat("unexpected '", s_.substr(pos_), "'"));
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return LineError(line_, absl::StrCat(what, " (column ", pos_ + 1, ")"));
  }
  void SkipBlanks() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }

  absl::StatusOr<YamlNode> Value(bool in_flow) {
    SkipBlanks();
    if (pos_ < s_.size() && s_[pos_] == '{') return Map();
    if (pos_ < s_.size() && s_[pos_] == '[') return Seq();
    return Scalar(in_flow);
  }

  absl::StatusOr<YamlNode> Scalar(bool in_flow) {
    SkipBlanks();
    YamlNode n;
    n.line = line_;
    if (pos_ < s_.size() && (s_[pos_] == '"' || s_[pos_] == '\'')) {
      const char q = s_[pos_++];
      const size_t end = s_.find(q, pos_);
      if (end == absl::string_view::npos) return Error("unterminated quoted string");
      n.scalar = std::string(s_.substr(pos_, end - pos_));
      pos_ = end + 1;
      return n;
    }
    const size_t start = pos_;
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (in_flow && (c == ',' || c == '}' || c == ']')) break;
      if (in_flow && c == ':' && (pos_ + 1 == s_.size() || s_[pos_ + 1] == ' ')) break;
      if (c == '&' || c == '*') {
        if (pos_ == start) return Error("anchors and aliases are not supported");
      }
      ++pos_;
    }
    n.scalar = std::string(absl::StripTrailingAsciiWhitespace(s_.substr(start, pos_ - start)));
    if (!in_flow && (n.scalar == "|" || n.scalar == ">")) {
      return Error("multi-line scalars are not supported");
    }
    return n;
  }

  absl::StatusOr<YamlNode> Map() {
    YamlNode n;
    n.kind = YamlNode::Kind::kMap;
    n.line = line_;
    ++pos_;  // '{'
    SkipBlanks();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return n;
    }
    std::set<std::string> keys;
    while (true) {
      absl::StatusOr<YamlNode> key = Scalar(/*in_flow=*/true);
      if (!key.ok()) return key.status();
      if (key->scalar.empty()) return Error("expected a key in '{...}'");
      SkipBlanks();
      if (pos_ >= s_.size() || s_[pos_] != ':') {
        return Error(absl::StrCat("expected ':' after key '", key->scalar, "' in '{...}'"));
      }
      ++pos_;
      absl::StatusOr<YamlNode> value = Value(/*in_flow=*/true);
      if (!value.ok()) return value.status();
      if (!keys.insert(key->scalar).second) {
        return Error(absl::StrCat("duplicate key '", key->scalar, "'"));
      }
      n.items.emplace_back(key->scalar, *std::move(value));
      SkipBlanks();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return n;
      }
      return Error("expected ',' or '}'");
    }
  }

  absl::StatusOr<YamlNode> Seq() {
    YamlNode n;
    n.kind = YamlNode::Kind::kSeq;
    n.line = line_;
    ++pos_;  // '['
    SkipBlanks();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return n;
    }
    while (true) {
      absl::StatusOr<YamlNode> value = Value(/*in_flow=*/true);
      if (!value.ok()) return value.status();
      n.elements.push_back(*std::move(value));
      SkipBlanks();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return n;
      }
      return Error("expected ',' or ']'");
    }
  }

  absl::string_view s_;
  int line_;
  size_t pos_ = 0;
};

class BlockParser {
 public:
  explicit BlockParser(std::vector<Line> lines) : lines_(std::move(lines)) {}

  absl::StatusOr<YamlNode> ParseDocument() {
    if (lines_.empty()) {
      YamlNode n;
      n.kind = YamlNode::Kind::kMap;
      return n;
    }
    if (lines_[0].indent != 0) return LineError(lines_[0].number, "the first line is indented");
    absl::StatusOr<YamlNode> root = Block(0);
    if (!root.ok()) return root;
    if (i_ < lines_.size()) return LineError(lines_[i_].number, "unexpected indentation");
    return root;
  }

 private:
  absl::StatusOr<YamlNode> Block(int indent) {
    if (IsSeqItem(lines_[i_].content)) return Sequence(indent);
    return Mapping(indent);
  }

  absl::StatusOr<YamlNode> Mapping(int indent) {
    YamlNode n;
    n.kind = YamlNode::Kind::kMap;
    n.line = lines_[i_].number;
    std::set<std::string> keys;
    while (i_ < lines_.size() && lines_[i_].indent == indent) {
      const Line& l = lines_[i_];
      if (IsSeqItem(l.content)) return LineError(l.number, "a '- ' item where a key was expected");
      const size_t colon = KeyColon(l.content);
      if (colon == absl::string_view::npos) {
        return LineError(l.number, absl::StrCat("expected 'key: value', got '", l.content, "'"));
      }
      std::string key(absl::StripAsciiWhitespace(absl::string_view(l.content).substr(0, colon)));
      if (key.size() >= 2 && (key[0] == '"' || key[0] == '\'') && key.back() == key[0]) {
        key = key.substr(1, key.size() - 2);
      }
      if (key.empty()) return LineError(l.number, "empty key");
      if (!keys.insert(key).second) {
        return LineError(l.number, absl::StrCat("duplicate key '", key, "'"));
      }
      const std::string rest(
          absl::StripLeadingAsciiWhitespace(absl::string_view(l.content).substr(colon + 1)));
      const int number = l.number;
      ++i_;
      YamlNode value;
      if (!rest.empty()) {
        absl::StatusOr<YamlNode> v = FlowParser(rest, number).ParseAll();
        if (!v.ok()) return v.status();
        value = *std::move(v);
      } else if (i_ < lines_.size() && lines_[i_].indent > indent) {
        absl::StatusOr<YamlNode> v = Block(lines_[i_].indent);
        if (!v.ok()) return v.status();
        value = *std::move(v);
      } else if (i_ < lines_.size() && lines_[i_].indent == indent &&
                 IsSeqItem(lines_[i_].content)) {
        // `key:` with its `- ` items at the key's own indentation.
        absl::StatusOr<YamlNode> v = Sequence(indent);
        if (!v.ok()) return v.status();
        value = *std::move(v);
      } else {
        value.line = number;  // an empty value
      }
      n.items.emplace_back(std::move(key), std::move(value));
    }
    if (i_ < lines_.size() && lines_[i_].indent > indent) {
      return LineError(lines_[i_].number, "unexpected indentation");
    }
    return n;
  }

  absl::StatusOr<YamlNode> Sequence(int indent) {
    YamlNode n;
    n.kind = YamlNode::Kind::kSeq;
    n.line = lines_[i_].number;
    while (i_ < lines_.size() && lines_[i_].indent == indent && IsSeqItem(lines_[i_].content)) {
      Line& l = lines_[i_];
      const std::string rest(absl::StripLeadingAsciiWhitespace(l.content.substr(1)));
      if (rest.empty()) {
        ++i_;
        if (i_ >= lines_.size() || lines_[i_].indent <= indent) {
          return LineError(l.number, "an empty '-' item");
        }
        absl::StatusOr<YamlNode> v = Block(lines_[i_].indent);
        if (!v.ok()) return v.status();
        n.elements.push_back(*std::move(v));
        continue;
      }
      const bool flow = rest[0] == '{' || rest[0] == '[';
      if (!flow && (KeyColon(rest) != absl::string_view::npos || IsSeqItem(rest))) {
        // `- name: x`: a block whose first line starts after the "- ".
        const int inner = indent + static_cast<int>(l.content.size() - rest.size());
        l.indent = inner;
        l.content = rest;
        absl::StatusOr<YamlNode> v = Block(inner);
        if (!v.ok()) return v.status();
        n.elements.push_back(*std::move(v));
        continue;
      }
      absl::StatusOr<YamlNode> v = FlowParser(rest, l.number).ParseAll();
      if (!v.ok()) return v.status();
      n.elements.push_back(*std::move(v));
      ++i_;
      if (i_ < lines_.size() && lines_[i_].indent > indent) {
        return LineError(lines_[i_].number, "unexpected indentation");
      }
    }
    return n;
  }

  std::vector<Line> lines_;
  size_t i_ = 0;
};

}  // namespace

const YamlNode* YamlNode::Find(absl::string_view key) const {
  if (kind != Kind::kMap) return nullptr;
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

absl::StatusOr<YamlNode> ParseQueueYaml(absl::string_view text) {
  std::vector<Line> lines;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    size_t indent = 0;
    while (indent < raw.size() && raw[indent] == ' ') ++indent;
    if (indent < raw.size() && raw[indent] == '\t') {
      return LineError(number, "a tab in the indentation (use spaces)");
    }
    std::string content = StripComment(raw.substr(indent));
    if (content.empty()) continue;
    if (content == "---" || content == "...") {
      return LineError(number, "several documents ('---') are not supported");
    }
    lines.push_back(Line{number, static_cast<int>(indent), std::move(content)});
  }
  return BlockParser(std::move(lines)).ParseDocument();
}

}  // namespace scheduler
}  // namespace dtrain
