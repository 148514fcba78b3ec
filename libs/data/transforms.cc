#include "libs/data/transforms.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "libs/data/sampler.h"

namespace dtrain::data {
namespace {

// p / 255 for every byte: the IDX reader's table (DataLoader), so that the
// two paths agree bit for bit.
struct PixelTable {
  float value[256];
  PixelTable() {
    for (int p = 0; p < 256; ++p) value[p] = static_cast<float>(p) / 255.0f;
  }
};
const PixelTable& Pixels() {
  static const PixelTable* table = new PixelTable;
  return *table;
}

// Float C x H x W, bilinear (half-pixel centers, edges clamped), from either
// representation of `image`.
std::vector<float> Resize(const Image& image, int out_h, int out_w) {
  const int c = image.channels, h = image.height, w = image.width;
  const float* table = Pixels().value;
  auto at = [&](int ch, int y, int x) -> float {
    if (!image.u8.empty()) return table[image.u8[(static_cast<size_t>(y) * w + x) * c + ch]];
    return image.f32[(static_cast<size_t>(ch) * h + y) * w + x];
  };
  std::vector<float> out(static_cast<size_t>(c) * out_h * out_w);
  const float sy = static_cast<float>(h) / out_h, sx = static_cast<float>(w) / out_w;
  for (int y = 0; y < out_h; ++y) {
    const float fy = std::clamp((y + 0.5f) * sy - 0.5f, 0.0f, static_cast<float>(h - 1));
    const int y0 = static_cast<int>(fy), y1 = std::min(y0 + 1, h - 1);
    const float wy = fy - y0;
    for (int x = 0; x < out_w; ++x) {
      const float fx = std::clamp((x + 0.5f) * sx - 0.5f, 0.0f, static_cast<float>(w - 1));
      const int x0 = static_cast<int>(fx), x1 = std::min(x0 + 1, w - 1);
      const float wx = fx - x0;
      for (int ch = 0; ch < c; ++ch) {
        const float top = at(ch, y0, x0) * (1 - wx) + at(ch, y0, x1) * wx;
        const float bottom = at(ch, y1, x0) * (1 - wx) + at(ch, y1, x1) * wx;
        out[(static_cast<size_t>(ch) * out_h + y) * out_w + x] = top * (1 - wy) + bottom * wy;
      }
    }
  }
  return out;
}

}  // namespace

Transforms Transforms::Deterministic() const {
  Transforms t = *this;
  t.random_crop = false;
  t.random_flip = false;
  t.crop_padding = 0;
  return t;
}

absl::Status ValidateTransforms(const Transforms& t, int channels) {
  auto bad = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("transforms.", field, ": ", why));
  };
  if (t.resize < 0 || t.resize > kMaxImageSide) {
    return bad("resize", absl::StrCat("must be in 0..", kMaxImageSide, ", got ", t.resize));
  }
  if (t.crop_height < 0 || t.crop_width < 0 || t.crop_height > kMaxImageSide ||
      t.crop_width > kMaxImageSide || (t.crop_height > 0) != (t.crop_width > 0)) {
    return bad("crop", "crop_height and crop_width must both be positive (or both 0)");
  }
  if (t.crop_padding < 0 || t.crop_padding > 1024) {
    return bad("crop_padding", absl::StrCat("must be in 0..1024, got ", t.crop_padding));
  }
  if ((t.crop_padding > 0 || t.random_crop) && t.crop_height == 0) {
    return bad("crop_padding", "padding and random_crop need crop_height and crop_width");
  }
  if (t.mean.size() != t.std.size()) {
    return bad("mean", absl::StrCat("mean has ", t.mean.size(), " values and std ", t.std.size(),
                                    "; give both, one per channel"));
  }
  if (!t.mean.empty() && static_cast<int>(t.mean.size()) != channels) {
    return bad("mean",
               absl::StrCat("one value per channel: ", channels, " expected, got ", t.mean.size()));
  }
  for (size_t i = 0; i < t.std.size(); ++i) {
    if (!(t.std[i] > 0) || !std::isfinite(t.std[i]) || !std::isfinite(t.mean[i])) {
      return bad("std", absl::StrCat("std[", i, "] must be a finite number > 0 and mean[", i,
                                     "] finite, got ", t.std[i], " and ", t.mean[i]));
    }
  }
  return absl::OkStatus();
}

uint64_t SampleSeed(uint64_t job_seed, int64_t epoch, int64_t index) {
  uint64_t state = job_seed ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull);
  SplitMix64Next(&state);
  state ^= static_cast<uint64_t>(index) * 0xA24BAED4963EE407ull;
  return SplitMix64Next(&state);
}

absl::Status ApplyTransforms(const Image& image, const Transforms& t, uint64_t seed, int channels,
                             int height, int width, float* out) {
  if (image.channels != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("image has ", image.channels, " channels, expected ", channels));
  }
  // The geometry after resizing.
  int h = image.height, w = image.width;
  std::vector<float> resized;
  if (t.resize > 0) {
    const int shorter = std::min(h, w);
    int rh = t.resize, rw = t.resize;
    if (h < w) {
      rw = static_cast<int>(std::lround(static_cast<double>(w) * t.resize / shorter));
    } else if (w < h) {
      rh = static_cast<int>(std::lround(static_cast<double>(h) * t.resize / shorter));
    }
    if (rh != h || rw != w) {
      resized = Resize(image, rh, rw);
      h = rh;
      w = rw;
    }
  }
  const int out_h = t.crop_height > 0 ? t.crop_height : h;
  const int out_w = t.crop_width > 0 ? t.crop_width : w;
  if (out_h != height || out_w != width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", image.height, " x ", image.width, " pixels gives ", out_h, " x ", out_w,
        " after the transforms, but the dataset's shape is ", height, " x ", width,
        "; set height and width to the images' size, or add resize and crop transforms"));
  }
  // The crop window in the padded image.
  const int pad = t.crop_padding;
  const int range_y = h + 2 * pad - out_h, range_x = w + 2 * pad - out_w;
  if (range_y < 0 || range_x < 0) {
    return absl::InvalidArgumentError(absl::StrCat("crop of ", out_h, " x ", out_w,
                                                   " is larger than the (padded) image of ",
                                                   h + 2 * pad, " x ", w + 2 * pad));
  }
  uint64_t state = seed;
  int top = range_y / 2, left = range_x / 2;
  if (t.random_crop) {
    top = static_cast<int>(SplitMix64Next(&state) % static_cast<uint64_t>(range_y + 1));
    left = static_cast<int>(SplitMix64Next(&state) % static_cast<uint64_t>(range_x + 1));
  }
  const bool flip = t.random_flip && (SplitMix64Next(&state) >> 63) != 0;
  const int y_off = top - pad, x_off = left - pad;

  const float* table = Pixels().value;
  const float* planar =
      resized.empty() ? (image.f32.empty() ? nullptr : image.f32.data()) : resized.data();
  // Output column x reads source column sx = x0 + step * x (step -1 when
  // flipped); the columns inside the image are one contiguous range.
  const int x0 = flip ? out_w - 1 + x_off : x_off;
  const int step = flip ? -1 : 1;
  int lo = 0, hi = out_w;  // x in [lo, hi) reads inside the image
  if (!flip) {
    lo = std::max(0, -x_off);
    hi = std::min(out_w, w - x_off);
  } else {
    lo = std::max(0, x0 - (w - 1));
    hi = std::min(out_w, x0 + 1);
  }
  if (hi < lo) hi = lo;
  const bool normalize = !t.mean.empty();
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  if (planar == nullptr) {
    // 8-bit pixels: one table per channel maps a byte straight to its
    // output value (the same arithmetic as below, done 256 times), and each
    // source row is read once for all channels.
    thread_local std::vector<float> tables;
    tables.resize(static_cast<size_t>(channels) * 256);
    std::vector<float> pad(channels);
    for (int c = 0; c < channels; ++c) {
      const float mean = normalize ? t.mean[c] : 0.0f;
      const float inv_std = normalize ? 1.0f / t.std[c] : 1.0f;
      for (int p = 0; p < 256; ++p) {
        tables[c * 256 + p] = normalize ? (table[p] - mean) * inv_std : table[p];
      }
      pad[c] = normalize ? (0.0f - mean) * inv_std : 0.0f;
    }
    for (int y = 0; y < out_h; ++y) {
      const int sy = y + y_off;
      const bool inside = sy >= 0 && sy < h;
      for (int c = 0; c < channels; ++c) {
        float* row = out + c * plane + static_cast<size_t>(y) * out_w;
        if (!inside) {
          std::fill(row, row + out_w, pad[c]);
          continue;
        }
        std::fill(row, row + lo, pad[c]);
        std::fill(row + hi, row + out_w, pad[c]);
      }
      if (!inside) continue;
      const uint8_t* src = image.u8.data() + static_cast<size_t>(sy) * w * channels;
      if (channels == 3) {
        float* r0 = out + static_cast<size_t>(y) * out_w;
        float* r1 = r0 + plane;
        float* r2 = r1 + plane;
        const float* t0 = tables.data();
        const float* t1 = t0 + 256;
        const float* t2 = t1 + 256;
        for (int x = lo; x < hi; ++x) {
          const uint8_t* p = src + (x0 + step * x) * 3;
          r0[x] = t0[p[0]];
          r1[x] = t1[p[1]];
          r2[x] = t2[p[2]];
        }
      } else {
        for (int c = 0; c < channels; ++c) {
          float* row = out + c * plane + static_cast<size_t>(y) * out_w;
          const float* tc = tables.data() + c * 256;
          for (int x = lo; x < hi; ++x) row[x] = tc[src[(x0 + step * x) * channels + c]];
        }
      }
    }
    return absl::OkStatus();
  }
  for (int c = 0; c < channels; ++c) {
    const float mean = normalize ? t.mean[c] : 0.0f;
    const float inv_std = normalize ? 1.0f / t.std[c] : 1.0f;
    const float pad_value = normalize ? (0.0f - mean) * inv_std : 0.0f;
    float* dst = out + c * plane;
    for (int y = 0; y < out_h; ++y) {
      const int sy = y + y_off;
      float* row = dst + static_cast<size_t>(y) * out_w;
      if (sy < 0 || sy >= h) {
        std::fill(row, row + out_w, pad_value);
        continue;
      }
      std::fill(row, row + lo, pad_value);
      std::fill(row + hi, row + out_w, pad_value);
      const float* src = planar + (static_cast<size_t>(c) * h + sy) * w;
      for (int x = lo; x < hi; ++x) {
        const float v = src[x0 + step * x];
        row[x] = normalize ? (v - mean) * inv_std : v;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain::data
