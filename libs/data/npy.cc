#include "libs/data/npy.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain::data {
namespace {

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("bad .npy header: ", what));
}

// A cursor over the header's dict literal.
class DictParser {
 public:
  explicit DictParser(absl::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Peek(char c) {
    SkipSpace();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  absl::StatusOr<std::string> String() {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Bad("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Bad("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    if (s.find('\\') != std::string::npos) return Bad("escapes in strings are not supported");
    pos_ = end + 1;
    return s;
  }
  absl::StatusOr<bool> Bool() {
    SkipSpace();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    return Bad("fortran_order must be True or False");
  }
  absl::StatusOr<std::vector<int64_t>> Tuple() {
    if (!Eat('(')) return Bad("shape must be a tuple");
    std::vector<int64_t> dims;
    while (!Eat(')')) {
      SkipSpace();
      int64_t v = 0;
      size_t digits = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (v > (int64_t{1} << 50)) return Bad("shape dimension too large");
        v = v * 10 + (text_[pos_++] - '0');
        ++digits;
      }
      if (digits == 0) return Bad("shape must hold non-negative integers");
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2's long
      dims.push_back(v);
      if (dims.size() > 32) return Bad("more than 32 dimensions");
      if (!Eat(',')) {
        if (!Eat(')')) return Bad("expected ',' or ')' in shape");
        // A 1-tuple needs its comma in Python; NumPy always writes it.
        if (dims.size() == 1) return Bad("a 1-dimensional shape must be written (n,)");
        break;
      }
    }
    return dims;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
};

struct DtypeName {
  const char* descr;
  NpyDtype dtype;
};
constexpr DtypeName kDtypes[] = {
    {"|u1", NpyDtype::kU8},  {"<u1", NpyDtype::kU8},  {"=u1", NpyDtype::kU8},
    {"|i1", NpyDtype::kI8},  {"<i1", NpyDtype::kI8},  {"=i1", NpyDtype::kI8},
    {"<i2", NpyDtype::kI16}, {"=i2", NpyDtype::kI16}, {"<u2", NpyDtype::kU16},
    {"=u2", NpyDtype::kU16}, {"<i4", NpyDtype::kI32}, {"=i4", NpyDtype::kI32},
    {"<u4", NpyDtype::kU32}, {"=u4", NpyDtype::kU32}, {"<i8", NpyDtype::kI64},
    {"=i8", NpyDtype::kI64}, {"<u8", NpyDtype::kU64}, {"=u8", NpyDtype::kU64},
    {"<f4", NpyDtype::kF32}, {"=f4", NpyDtype::kF32},
};

const char* Descr(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kU8:
      return "|u1";
    case NpyDtype::kI8:
      return "|i1";
    case NpyDtype::kI16:
      return "<i2";
    case NpyDtype::kU16:
      return "<u2";
    case NpyDtype::kI32:
      return "<i4";
    case NpyDtype::kU32:
      return "<u4";
    case NpyDtype::kI64:
      return "<i8";
    case NpyDtype::kU64:
      return "<u8";
    case NpyDtype::kF32:
      return "<f4";
  }
  return "?";
}

}  // namespace

int NpyItemSize(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kU8:
    case NpyDtype::kI8:
      return 1;
    case NpyDtype::kI16:
    case NpyDtype::kU16:
      return 2;
    case NpyDtype::kI32:
    case NpyDtype::kU32:
    case NpyDtype::kF32:
      return 4;
    case NpyDtype::kI64:
    case NpyDtype::kU64:
      return 8;
  }
  return 1;
}

const char* NpyDtypeName(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kU8:
      return "uint8";
    case NpyDtype::kI8:
      return "int8";
    case NpyDtype::kI16:
      return "int16";
    case NpyDtype::kU16:
      return "uint16";
    case NpyDtype::kI32:
      return "int32";
    case NpyDtype::kU32:
      return "uint32";
    case NpyDtype::kI64:
      return "int64";
    case NpyDtype::kU64:
      return "uint64";
    case NpyDtype::kF32:
      return "float32";
  }
  return "?";
}

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) {
    return absl::InvalidArgumentError("not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (minor != 0 || major < 1 || major > 3) {
    return Bad(
        absl::StrCat("unsupported format version ", major, ".", minor, " (1.0, 2.0 and 3.0 are)"));
  }
  int64_t header_len = 0;
  size_t prefix = 0;
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  if (major == 1) {
    header_len = u[8] | (u[9] << 8);
    prefix = 10;
  } else {
    if (bytes.size() < 12) return Bad("truncated");
    header_len =
        int64_t{u[8]} | (int64_t{u[9]} << 8) | (int64_t{u[10]} << 16) | (int64_t{u[11]} << 24);
    prefix = 12;
  }
  if (header_len > (1 << 20)) return Bad(absl::StrCat("header of ", header_len, " bytes"));
  if (static_cast<int64_t>(bytes.size()) < static_cast<int64_t>(prefix) + header_len) {
    return Bad(absl::StrCat("truncated: the header says ", header_len, " bytes"));
  }
  absl::string_view text = bytes.substr(prefix, header_len);
  if (text.empty() || text.back() != '\n') return Bad("the header must end with a newline");
  text.remove_suffix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
      return Bad("non-printable byte in the header");
    }
  }

  DictParser p(text);
  if (!p.Eat('{')) return Bad("the header must be a dict literal");
  bool have_descr = false, have_fortran = false, have_shape = false;
  NpyHeader h;
  while (!p.Eat('}')) {
    absl::StatusOr<std::string> key = p.String();
    if (!key.ok()) return key.status();
    if (!p.Eat(':')) return Bad(absl::StrCat("expected ':' after '", *key, "'"));
    if (*key == "descr" && !have_descr) {
      absl::StatusOr<std::string> descr = p.String();
      if (!descr.ok()) return descr.status();
      bool known = false;
      for (const DtypeName& d : kDtypes) {
        if (*descr == d.descr) {
          h.dtype = d.dtype;
          known = true;
        }
      }
      if (!known) {
        return Bad(absl::StrCat("dtype '", *descr,
                                "' is not supported (uint8 or float32 images; little-endian "
                                "integer labels)"));
      }
      have_descr = true;
    } else if (*key == "fortran_order" && !have_fortran) {
      absl::StatusOr<bool> fortran = p.Bool();
      if (!fortran.ok()) return fortran.status();
      if (*fortran) {
        return Bad("fortran_order is True; save a C-ordered array (numpy.ascontiguousarray)");
      }
      have_fortran = true;
    } else if (*key == "shape" && !have_shape) {
      absl::StatusOr<std::vector<int64_t>> shape = p.Tuple();
      if (!shape.ok()) return shape.status();
      h.shape = *std::move(shape);
      have_shape = true;
    } else {
      return Bad(absl::StrCat("unexpected or repeated key '", *key, "'"));
    }
    if (!p.Eat(',')) {
      if (!p.Peek('}')) return Bad("expected ',' or '}'");
    }
  }
  if (!p.AtEnd()) return Bad("text after the dict");
  if (!have_descr || !have_fortran || !have_shape) {
    return Bad("needs the keys 'descr', 'fortran_order' and 'shape'");
  }
  int64_t elements = 1;
  for (int64_t d : h.shape) {
    if (d != 0 && elements > (int64_t{1} << 56) / d) {
      return Bad(absl::StrCat("shape (", absl::StrJoin(h.shape, ", "), ") is too large"));
    }
    elements *= d;
  }
  h.data_offset = static_cast<int64_t>(prefix) + header_len;
  h.data_bytes = elements * NpyItemSize(h.dtype);
  return h;
}

std::string WriteNpy(NpyDtype dtype, const std::vector<int64_t>& shape, absl::string_view data) {
  std::string dims;
  for (int64_t d : shape) absl::StrAppend(&dims, d, ", ");
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  if (shape.size() == 1) dims.resize(dims.size() - 1);
  std::string dict = absl::StrCat("{'descr': '", Descr(dtype),
                                  "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Pad with spaces so that the data starts at a multiple of 64 bytes.
  const size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>(dict.size() >> 8));
  out += dict;
  out.append(data.data(), data.size());
  return out;
}

}  // namespace dtrain::data
