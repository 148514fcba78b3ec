#include "libs/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// The image's size after t.resize: (h, w) when there is nothing to resize.
std::pair<int, int> ResizedSize(int h, int w, const Transforms& t) {
  if (t.resize <= 0) return {h, w};
  const int shorter = std::min(h, w);
  int rh = t.resize, rw = t.resize;
  if (h < w) {
    rw = static_cast<int>(std::lround(static_cast<double>(w) * t.resize / shorter));
  } else if (w < h) {
    rh = static_cast<int>(std::lround(static_cast<double>(h) * t.resize / shorter));
  }
  return {rh, rw};
}

// Float C x H x W into `*out`, bilinear (half-pixel centers, edges
// clamped), from either representation of `image`.
void Resize(const Image& image, int out_h, int out_w, std::vector<float>* resized) {
  const int c = image.channels, h = image.height, w = image.width;
  const float* table = Pixels().value;
  auto at = [&](int ch, int y, int x) -> float {
    if (!image.u8.empty()) return table[image.u8[(static_cast<size_t>(y) * w + x) * c + ch]];
    return image.f32[(static_cast<size_t>(ch) * h + y) * w + x];
  };
  std::vector<float>& out = *resized;
  out.resize(static_cast<size_t>(c) * out_h * out_w);
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
}

#if defined(__x86_64__)
// SIMD kernels for PixelRow::Convert: output columns from lo on, 4 (SSE4.1,
// x86-64-v2's baseline) or 8 (AVX2) at a time, for 1 or 3 channels.
struct Span {
  const uint8_t* src;  // the source row
  size_t avail;        // bytes readable from src
  int x0, step, lo, hi;
  const float* mean;  // per channel; read only when normalizing
  const float* inv_std;
  float* dst;
  size_t plane;
};

// pshufb masks: byte c of the 4 pixels loaded (in memory order) to the low
// byte of 32-bit lanes 0..3, in reverse order when flipped; zeros
// elsewhere. [channels == 3][flip][c], 16 bytes.
struct Masks {
  alignas(16) int8_t m[2][2][3][16];
  Masks() {
    for (int rgb = 0; rgb < 2; ++rgb) {
      const int channels = rgb ? 3 : 1;
      for (int flip = 0; flip < 2; ++flip) {
        for (int c = 0; c < 3; ++c) {
          int8_t* mask = m[rgb][flip][c];
          for (int j = 0; j < 4; ++j) {
            mask[4 * j] = static_cast<int8_t>((flip ? 3 - j : j) * channels + c);
            mask[4 * j + 1] = mask[4 * j + 2] = mask[4 * j + 3] = -1;
          }
        }
      }
    }
  }
};
const Masks& ShuffleMasks() {
  static const Masks* masks = new Masks;
  return *masks;
}

// Returns the first column not written: the rest go through the tables.
template <int C, bool kNormalize>
__attribute__((target("sse4.1"))) int ConvertSse(const Span& s) {
  const bool flip = s.step < 0;
  __m128i mask[C];
  __m128 mean[C], inv_std[C];
  for (int c = 0; c < C; ++c) {
    mask[c] = _mm_load_si128(reinterpret_cast<const __m128i*>(ShuffleMasks().m[C == 3][flip][c]));
    mean[c] = _mm_set1_ps(kNormalize ? s.mean[c] : 0.0f);
    inv_std[c] = _mm_set1_ps(kNormalize ? s.inv_std[c] : 1.0f);
  }
  const __m128 k255 = _mm_set1_ps(255.0f);
  // Locals, not s's fields: the stores below may alias anything.
  const uint8_t* const src = s.src;
  float* const dst = s.dst;
  const size_t avail = s.avail, plane = s.plane;
  const int x0 = s.x0, hi = s.hi;
  int x = s.lo;
  for (; x + 4 <= hi; x += 4) {
    const int leftmost = flip ? x0 - x - 3 : x0 + x;
    const size_t first = static_cast<size_t>(leftmost) * C;
    __m128i v;
    if (C == 3) {
      if (first + 16 > avail) break;
      v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + first));
    } else {
      int32_t four;
      std::memcpy(&four, src + first, 4);
      v = _mm_cvtsi32_si128(four);
    }
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) {
      __m128 f = _mm_div_ps(_mm_cvtepi32_ps(_mm_shuffle_epi8(v, mask[c])), k255);
      if (kNormalize) f = _mm_mul_ps(_mm_sub_ps(f, mean[c]), inv_std[c]);
      _mm_storeu_ps(dst + c * plane + x, f);
    }
  }
  return x;
}

// The same 8 at a time: the low 128-bit lane takes columns x..x+3, the
// high lane x+4..x+7, each from its own 4-pixel load.
template <int C, bool kNormalize>
__attribute__((target("avx2"))) int ConvertAvx2(const Span& s) {
  const bool flip = s.step < 0;
  __m256i mask[C];
  __m256 mean[C], inv_std[C];
  for (int c = 0; c < C; ++c) {
    const __m128i m =
        _mm_load_si128(reinterpret_cast<const __m128i*>(ShuffleMasks().m[C == 3][flip][c]));
    mask[c] = _mm256_set_m128i(m, m);
    mean[c] = _mm256_set1_ps(kNormalize ? s.mean[c] : 0.0f);
    inv_std[c] = _mm256_set1_ps(kNormalize ? s.inv_std[c] : 1.0f);
  }
  const __m256 k255 = _mm256_set1_ps(255.0f);
  const uint8_t* const src = s.src;
  float* const dst = s.dst;
  const size_t avail = s.avail, plane = s.plane;
  const int x0 = s.x0, hi = s.hi;
  int x = s.lo;
  for (; x + 8 <= hi; x += 8) {
    const int leftmost = flip ? x0 - x - 7 : x0 + x;
    const size_t left = static_cast<size_t>(leftmost) * C;
    // Source pixels of columns x..x+3 (low) and x+4..x+7 (high).
    const size_t low = flip ? left + 4 * C : left;
    const size_t high = flip ? left : left + 4 * C;
    __m256i v;
    if (C == 3) {
      if (left + 4 * 3 + 16 > avail) break;
      v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(src + high),
                              reinterpret_cast<const __m128i*>(src + low));
    } else {
      int32_t a, b;
      std::memcpy(&a, src + low, 4);
      std::memcpy(&b, src + high, 4);
      v = _mm256_set_m128i(_mm_cvtsi32_si128(b), _mm_cvtsi32_si128(a));
    }
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) {
      __m256 f = _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(v, mask[c])), k255);
      if (kNormalize) f = _mm256_mul_ps(_mm256_sub_ps(f, mean[c]), inv_std[c]);
      _mm256_storeu_ps(dst + c * plane + x, f);
    }
  }
  return x;
}

using KernelFn = int (*)(const Span&);

// The kernel for `channels` (1 or 3): AVX2 when the CPU has it. (Their
// stores bound them: a divide-free p / 255 measured no faster.)
KernelFn Kernel(int channels, bool normalize) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    if (channels == 3) return normalize ? ConvertAvx2<3, true> : ConvertAvx2<3, false>;
    return normalize ? ConvertAvx2<1, true> : ConvertAvx2<1, false>;
  }
  if (channels == 3) return normalize ? ConvertSse<3, true> : ConvertSse<3, false>;
  return normalize ? ConvertSse<1, true> : ConvertSse<1, false>;
}
#endif

// One output row of the 8-bit path: output column x in [lo, hi) of channel c
// is value(c, p) for byte c of source pixel x0 + step * x, where
// value(c, p) = (p / 255 - mean[c]) * (1 / std[c]) (or p / 255 without
// normalization), and the columns outside [lo, hi) hold the padding value.
// The scalar loop reads value from per-channel tables; the SIMD kernels
// compute it with the same IEEE single-precision operations in the same
// order (divide, subtract, multiply; no FMA), so both give the same bits.
class PixelRow {
 public:
  // Reuses its buffers: a thread converting image after image allocates
  // nothing after the first (and rebuilds its tables only when the
  // normalization changes).
  void Set(const Transforms& t, int channels, int x0, int step, int lo, int hi) {
    x0_ = x0;
    step_ = step;
    lo_ = lo;
    hi_ = hi;
    const bool normalize = !t.mean.empty();
    if (channels == channels_ && normalize == normalize_ && t.mean == mean_ && t.std == std_) {
      return;
    }
    channels_ = channels;
    normalize_ = normalize;
    mean_ = t.mean;
    std_ = t.std;
    const float* table = Pixels().value;
    tables_.resize(static_cast<size_t>(channels) * 256);
    pad_.resize(channels);
    mean_v_.resize(channels);
    inv_std_v_.resize(channels);
    for (int c = 0; c < channels; ++c) {
      const float mean = normalize ? t.mean[c] : 0.0f;
      const float inv_std = normalize ? 1.0f / t.std[c] : 1.0f;
      mean_v_[c] = mean;
      inv_std_v_[c] = inv_std;
      for (int p = 0; p < 256; ++p) {
        tables_[c * 256 + p] = normalize ? (table[p] - mean) * inv_std : table[p];
      }
      pad_[c] = normalize ? (0.0f - mean) * inv_std : 0.0f;
    }
  }

  // Writes an output row that lies wholly in the padding (above or below
  // the image): every channel's out_w floats at dst + c * plane.
  void FillPadding(float* dst, size_t plane, int out_w) const {
    for (int c = 0; c < channels_; ++c) {
      std::fill(dst + c * plane, dst + c * plane + out_w, pad_[c]);
    }
  }

  // Writes channel c of the row to dst + c * plane, out_w floats, from the
  // source row `src`, of which `avail` bytes may be read (to the image's
  // end: the SIMD loads read a few bytes past the pixels they use).
  void Convert(const uint8_t* src, size_t avail, float* dst, size_t plane, int out_w) const {
    for (int c = 0; c < channels_; ++c) {
      std::fill(dst + c * plane, dst + c * plane + lo_, pad_[c]);
      std::fill(dst + c * plane + hi_, dst + c * plane + out_w, pad_[c]);
    }
    int x = lo_;
#if defined(__x86_64__)
    if (channels_ == 1 || channels_ == 3) {
      const Span span = {src, avail, x0_, step_, lo_, hi_, mean_v_.data(), inv_std_v_.data(),
                         dst, plane};
      x = Kernel(channels_, normalize_)(span);
    }
#endif
    if (channels_ == 3) {
      const float* t0 = tables_.data();
      const float* t1 = t0 + 256;
      const float* t2 = t1 + 256;
      for (; x < hi_; ++x) {
        const uint8_t* p = src + (x0_ + step_ * x) * 3;
        dst[x] = t0[p[0]];
        dst[plane + x] = t1[p[1]];
        dst[2 * plane + x] = t2[p[2]];
      }
      return;
    }
    for (int c = 0; c < channels_; ++c) {
      const float* tc = tables_.data() + c * 256;
      float* row = dst + c * plane;
      for (int xc = x; xc < hi_; ++xc) row[xc] = tc[src[(x0_ + step_ * xc) * channels_ + c]];
    }
  }

 private:
  int channels_ = 0;
  bool normalize_ = false;
  std::vector<float> mean_, std_;  // the Transforms' (to see a change)
  int x0_ = 0, step_ = 1, lo_ = 0, hi_ = 0;
  std::vector<float> tables_;  // channels x 256 values
  std::vector<float> pad_, mean_v_, inv_std_v_;
};

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

absl::Status CheckTransforms(const Image& image, const Transforms& t, int channels, int height,
                             int width) {
  if (image.channels != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("image has ", image.channels, " channels, expected ", channels));
  }
  const auto [h, w] = ResizedSize(image.height, image.width, t);
  const int out_h = t.crop_height > 0 ? t.crop_height : h;
  const int out_w = t.crop_width > 0 ? t.crop_width : w;
  if (out_h != height || out_w != width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", image.height, " x ", image.width, " pixels gives ", out_h, " x ", out_w,
        " after the transforms, but the dataset's shape is ", height, " x ", width,
        "; set height and width to the images' size, or add resize and crop transforms"));
  }
  const int pad = t.crop_padding;
  if (h + 2 * pad < out_h || w + 2 * pad < out_w) {
    return absl::InvalidArgumentError(absl::StrCat("crop of ", out_h, " x ", out_w,
                                                   " is larger than the (padded) image of ",
                                                   h + 2 * pad, " x ", w + 2 * pad));
  }
  return absl::OkStatus();
}

namespace {

PixelRow& ThreadPixelRow() {
  thread_local PixelRow row;  // reused: no allocation per image
  return row;
}

// Where the output comes from in an h x w image (after any resize): output
// row y reads source row y + y_off, output column x source column
// x0 + step * x (step -1 when flipped); columns [lo, hi) lie inside the
// image, the rest is padding.
struct CropWindow {
  int y_off, x0, step, lo, hi;
};

CropWindow Window(int h, int w, const Transforms& t, uint64_t seed, int out_h, int out_w) {
  // The crop window in the padded image.
  const int pad = t.crop_padding;
  const int range_y = h + 2 * pad - out_h, range_x = w + 2 * pad - out_w;
  uint64_t state = seed;
  int top = range_y / 2, left = range_x / 2;
  if (t.random_crop) {
    top = static_cast<int>(SplitMix64Next(&state) % static_cast<uint64_t>(range_y + 1));
    left = static_cast<int>(SplitMix64Next(&state) % static_cast<uint64_t>(range_x + 1));
  }
  const bool flip = t.random_flip && (SplitMix64Next(&state) >> 63) != 0;
  const int y_off = top - pad, x_off = left - pad;
  // The columns inside the image are one contiguous range.
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
  lo = std::min(lo, out_w);  // a crop window entirely in the padding
  if (hi < lo) hi = lo;
  return {y_off, x0, step, lo, hi};
}

// DecodeAndTransform's JPEG path: ApplyTransforms's 8-bit loop, a decoded
// row at a time.
class TransformRows : public JpegRowSink {
 public:
  TransformRows(const Transforms& t, uint64_t seed, int channels, int height, int width, float* out)
      : t_(t), seed_(seed), channels_(channels), out_h_(height), out_w_(width), out_(out) {}

  absl::StatusOr<int> Begin(int width, int height, int channels) override {
    Image shape;
    shape.channels = channels;
    shape.height = height;
    shape.width = width;
    if (absl::Status s = CheckTransforms(shape, t_, channels_, out_h_, out_w_); !s.ok()) return s;
    w_ = width;
    const CropWindow win = Window(height, width, t_, seed_, out_h_, out_w_);
    y_off_ = win.y_off;
    row_ = &ThreadPixelRow();
    row_->Set(t_, channels_, win.x0, win.step, win.lo, win.hi);
    // Output rows in the padding above and below the image.
    const size_t plane = static_cast<size_t>(out_h_) * out_w_;
    for (int y = 0; y < out_h_; ++y) {
      const int sy = y + y_off_;
      if (sy < 0 || sy >= height)
        row_->FillPadding(out_ + static_cast<size_t>(y) * out_w_, plane, out_w_);
    }
    // The source rows down to the window's last.
    return std::max(0, std::min(height, out_h_ + y_off_));
  }

  void Row(int sy, const uint8_t* pixels) override {
    const int y = sy - y_off_;
    if (y < 0 || y >= out_h_) return;
    row_->Convert(pixels, static_cast<size_t>(w_) * channels_ + kJpegRowSlack,
                  out_ + static_cast<size_t>(y) * out_w_, static_cast<size_t>(out_h_) * out_w_,
                  out_w_);
  }

 private:
  const Transforms& t_;
  const uint64_t seed_;
  const int channels_, out_h_, out_w_;
  float* const out_;
  int w_ = 0, y_off_ = 0;
  PixelRow* row_ = nullptr;
};

}  // namespace

absl::Status ApplyTransforms(const Image& image, const Transforms& t, uint64_t seed, int channels,
                             int height, int width, float* out) {
  if (absl::Status s = CheckTransforms(image, t, channels, height, width); !s.ok()) return s;
  int h = image.height, w = image.width;
  thread_local std::vector<float> resized_buffer;  // reused: no allocation per image
  const float* resized = nullptr;
  const auto [rh, rw] = ResizedSize(h, w, t);
  if (rh != h || rw != w) {
    Resize(image, rh, rw, &resized_buffer);
    resized = resized_buffer.data();
    h = rh;
    w = rw;
  }
  const int out_h = height, out_w = width;
  const CropWindow win = Window(h, w, t, seed, out_h, out_w);
  const int y_off = win.y_off, x0 = win.x0, step = win.step, lo = win.lo, hi = win.hi;

  const float* planar =
      resized == nullptr ? (image.f32.empty() ? nullptr : image.f32.data()) : resized;
  const bool normalize = !t.mean.empty();
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  if (planar == nullptr) {
    // 8-bit pixels: each source row is read once for all channels.
    PixelRow& row = ThreadPixelRow();
    row.Set(t, channels, x0, step, lo, hi);
    const size_t image_bytes = image.u8.size();
    for (int y = 0; y < out_h; ++y) {
      const int sy = y + y_off;
      float* dst = out + static_cast<size_t>(y) * out_w;
      if (sy < 0 || sy >= h) {
        row.FillPadding(dst, plane, out_w);
        continue;
      }
      const size_t offset = static_cast<size_t>(sy) * w * channels;
      row.Convert(image.u8.data() + offset, image_bytes - offset, dst, plane, out_w);
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

absl::Status DecodeAndTransform(absl::string_view bytes, const DecodeOptions& options,
                                const Transforms& t, uint64_t seed, int channels, int height,
                                int width, Image* scratch, float* out) {
  if (SniffImageFormat(bytes) == ImageFormat::kJpeg && t.resize == 0 &&
      (channels == 1 || channels == 3)) {
    TransformRows rows(t, seed, channels, height, width, out);
    return DecodeJpegRows(bytes, options, &rows);
  }
  if (absl::Status s = DecodeImageInto(bytes, options, scratch); !s.ok()) return s;
  return ApplyTransforms(*scratch, t, seed, channels, height, width, out);
}

}  // namespace dtrain::data
