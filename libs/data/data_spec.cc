#include "libs/data/data_spec.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dtrain::data {
namespace {

absl::StatusOr<std::vector<float>> Numbers(const std::string& field, const std::string& text) {
  std::vector<float> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    float v = 0;
    if (!absl::SimpleAtof(absl::StripAsciiWhitespace(part), &v) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat("data.transforms.", field, ": '", text,
                                                     "' is not a comma-separated list of numbers"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

absl::StatusOr<DataConfig> DataConfigFromSpec(const scheduler::v1::DataSpec& spec) {
  DataConfig c;
  c.format = spec.format();
  c.train = spec.train();
  c.test = spec.test();
  c.channels = spec.channels();
  c.height = spec.height();
  c.width = spec.width();
  c.num_classes = spec.num_classes();
  c.skip_corrupt = spec.skip_corrupt();
  c.data_threads = spec.data_threads();
  if (spec.max_image_pixels() != 0) c.max_image_pixels = spec.max_image_pixels();
  const scheduler::v1::TransformSpec& t = spec.transforms();
  c.transforms.resize = t.resize();
  c.transforms.crop_height = t.crop_height();
  c.transforms.crop_width = t.crop_width();
  c.transforms.crop_padding = t.crop_padding();
  c.transforms.random_crop = t.random_crop();
  c.transforms.random_flip = t.random_flip();
  absl::StatusOr<std::vector<float>> mean = Numbers("mean", t.mean());
  if (!mean.ok()) return mean.status();
  absl::StatusOr<std::vector<float>> std = Numbers("std", t.std());
  if (!std.ok()) return std.status();
  c.transforms.mean = *std::move(mean);
  c.transforms.std = *std::move(std);
  if (absl::Status s = ValidateDataConfig(c); !s.ok()) return s;
  return c;
}

}  // namespace dtrain::data
