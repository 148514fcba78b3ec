#include "libs/data/config.h"

#include <algorithm>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/base/status.h"

namespace dtrain::data {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("data.", field, ": ", why));
}

}  // namespace

absl::Status ValidateDataConfig(const DataConfig& c) {
  if (!c.is_idx() && c.format != "image_folder" && c.format != "webdataset" && c.format != "npy") {
    return Bad("format",
               absl::StrCat("must be idx, image_folder, webdataset or npy, got '", c.format, "'"));
  }
  if (!c.is_idx() && c.train.empty()) {
    return Bad("train", absl::StrCat("required for format ", c.format));
  }
  for (const auto& [field, location] :
       {std::pair<const char*, const std::string&>{"train", c.train}, {"test", c.test}}) {
    if (location.size() > 4096) return Bad(field, "at most 4096 bytes");
    if (location.empty()) continue;
    absl::StatusOr<std::vector<std::string>> paths = ExpandLocation(location);
    if (!paths.ok()) return Bad(field, paths.status().message());
    for (const std::string& p : *paths) {
      if (p.empty() || p[0] != '/') {
        return Bad(field, absl::StrCat("'", p,
                                       "' is a relative path; give an absolute path (the trainers "
                                       "resolve paths on their own machines)"));
      }
      for (absl::string_view part : absl::StrSplit(p, '/')) {
        if (part == "..") return Bad(field, absl::StrCat("'", p, "' has a '..' component"));
      }
    }
  }
  if (c.channels != 0 && c.channels != 1 && c.channels != 3) {
    return Bad("channels", absl::StrCat("must be 1 or 3 (0: the data's own), got ", c.channels));
  }
  if (c.height < 0 || c.width < 0 || c.height > kMaxImageSide || c.width > kMaxImageSide ||
      (c.height > 0) != (c.width > 0)) {
    return Bad("height",
               absl::StrCat("height and width must both be in 1..", kMaxImageSide,
                            " (or both 0: the data's own), got ", c.height, " x ", c.width));
  }
  if (c.num_classes < 0 || c.num_classes > 1000000) {
    return Bad("num_classes",
               absl::StrCat("must be in 1..1000000 (0: from the data), got ", c.num_classes));
  }
  if (c.data_threads < 0 || c.data_threads > 256) {
    return Bad("data_threads", absl::StrCat("must be in 0..256, got ", c.data_threads));
  }
  if (c.max_image_pixels < 1) {
    return Bad("max_image_pixels", absl::StrCat("must be positive, got ", c.max_image_pixels));
  }
  if (c.is_idx() && (c.transforms.any() || (c.channels > 1))) {
    return Bad("format", "idx data are 1 x 28 x 28 Fashion-MNIST images without transforms");
  }
  absl::Status t = ValidateTransforms(c.transforms, c.channels == 0 ? 1 : c.channels);
  if (!t.ok() && !(c.channels == 0 && !c.transforms.mean.empty() &&
                   (c.transforms.mean.size() == 1 || c.transforms.mean.size() == 3))) {
    return absl::InvalidArgumentError(absl::StrCat("data.", t.message()));
  }
  if (c.transforms.crop_height > 0 && c.height > 0 &&
      (c.transforms.crop_height != c.height || c.transforms.crop_width != c.width)) {
    return Bad("transforms.crop",
               absl::StrCat("a crop of ", c.transforms.crop_height, " x ", c.transforms.crop_width,
                            " cannot give the spec's ", c.height, " x ", c.width, " images"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ExpandLocation(const std::string& location) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(location, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    const size_t open = part.find('{');
    if (open == absl::string_view::npos) {
      if (part.find('}') != absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("'", part, "': '}' without '{'"));
      }
      out.emplace_back(part);
      continue;
    }
    const size_t close = part.find('}', open);
    const size_t dots = part.find("..", open);
    if (close == absl::string_view::npos || dots == absl::string_view::npos || dots > close) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", part, "': a brace pattern is {FIRST..LAST}, e.g. {000000..000127}"));
    }
    if (part.find('{', close) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", part, "': one brace pattern per path"));
    }
    const absl::string_view a = part.substr(open + 1, dots - open - 1);
    const absl::string_view b = part.substr(dots + 2, close - dots - 2);
    int64_t first = 0, last = 0;
    if (a.empty() || b.empty() || a.size() > 12 || b.size() > 12 ||
        !std::all_of(a.begin(), a.end(), absl::ascii_isdigit) ||
        !std::all_of(b.begin(), b.end(), absl::ascii_isdigit) || !absl::SimpleAtoi(a, &first) ||
        !absl::SimpleAtoi(b, &last) || last < first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", part, "': a brace range holds two decimal numbers, the first not above the last"));
    }
    if (last - first >= 1000000 || static_cast<int64_t>(out.size()) + last - first >= 1000000) {
      return absl::InvalidArgumentError(absl::StrCat("'", part, "': more than 1000000 paths"));
    }
    const size_t width = a.size() > 1 && a[0] == '0' ? a.size() : 0;
    for (int64_t v = first; v <= last; ++v) {
      std::string number = absl::StrCat(v);
      if (number.size() < width) number.insert(0, width - number.size(), '0');
      out.push_back(absl::StrCat(part.substr(0, open), number, part.substr(close + 1)));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("empty location");
  return out;
}

absl::Status CheckDataRoots(const DataConfig& c, const std::vector<std::string>& roots) {
  const std::string listed = roots.empty() ? "none" : absl::StrJoin(roots, ", ");
  for (const std::string* location : {&c.train, &c.test}) {
    if (location->empty()) continue;
    DT_ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandLocation(*location));
    for (const std::string& path : paths) {
      auto denied = [&](absl::string_view why) {
        return absl::PermissionDeniedError(
            absl::StrCat("spec.data: '", path, "' ", why,
                         "; this trainer reads data only under its --data_roots (", listed, ")"));
      };
      if (path.empty() || path[0] != '/') return denied("is not an absolute path");
      std::vector<absl::string_view> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
      for (absl::string_view p : parts) {
        if (p == ".." || p == ".") return denied("has '.' or '..' components");
      }
      bool inside = false;
      for (const std::string& root : roots) {
        std::vector<absl::string_view> rp = absl::StrSplit(root, '/', absl::SkipEmpty());
        if (rp.size() <= parts.size() && std::equal(rp.begin(), rp.end(), parts.begin())) {
          inside = true;
        }
      }
      if (!inside) return denied("is outside them");
    }
  }
  return absl::OkStatus();
}

int LoaderThreads(const DataConfig& c, int step_threads) {
  if (c.data_threads > 0) return c.data_threads;
  if (c.is_idx()) return 1;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores - std::max(0, step_threads));
}

}  // namespace dtrain::data
