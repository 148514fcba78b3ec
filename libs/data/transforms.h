// Per-sample image transforms: decoded Image -> float C x H x W.
//
//   Transforms t;
//   t.resize = 36;                 // shorter side to 36 pixels (bilinear)
//   t.crop_height = t.crop_width = 32;
//   t.crop_padding = 4;            // zero padding around before cropping
//   t.random_crop = t.random_flip = true;
//   t.mean = {0.49f, 0.48f, 0.45f};
//   t.std = {0.25f, 0.24f, 0.26f};
//   float out[3 * 32 * 32];
//   DT_RETURN_IF_ERROR(ApplyTransforms(image, t, SampleSeed(seed, epoch, index), 3, 32, 32, out));
//
// In order: 8-bit pixels become p / 255 (exactly the IDX reader's values:
// with no transforms an image comes out bit for bit as the IDX path would
// give it); float images are taken as they are. Then resize, crop (random
// or center; with padding), horizontal flip (probability 1/2), and
// normalize (v - mean[c]) / std[c]. Random choices come from `seed` alone
// (use SampleSeed), so a sample gets the same crop and flip on every
// machine and on a resumed or recovered rank. The result must have the
// requested shape: an image whose size differs with no resize or crop to
// bring it there is an error saying so.
//
// Thread-safe: the functions have no shared state.
#ifndef DTRAIN_LIBS_DATA_TRANSFORMS_H_
#define DTRAIN_LIBS_DATA_TRANSFORMS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "libs/data/image.h"

namespace dtrain::data {

struct Transforms {
  int resize = 0;       // > 0: scale so that the shorter side has this many pixels
  int crop_height = 0;  // > 0 with crop_width: crop to this size
  int crop_width = 0;
  int crop_padding = 0;      // zero pixels added on each side before cropping
  bool random_crop = false;  // false: center crop
  bool random_flip = false;  // horizontal flip with probability 1/2
  std::vector<float> mean;   // empty, or one per channel
  std::vector<float> std;    // empty, or one per channel (all > 0)

  bool any() const {
    return resize > 0 || crop_height > 0 || crop_padding > 0 || random_flip || !mean.empty();
  }
  // The same without its random parts (center crop, no flip): for test sets.
  Transforms Deterministic() const;
};

// InvalidArgument naming the field when `t` is inconsistent for `channels`.
absl::Status ValidateTransforms(const Transforms& t, int channels);

// A per-sample seed from the job's seed, the epoch and the sample's index
// in the dataset (SplitMix64 mixing).
uint64_t SampleSeed(uint64_t job_seed, int64_t epoch, int64_t index);

// OK when ApplyTransforms would succeed on `image` (its channels, its
// size after resize, crop and padding); its errors, without computing a
// pixel: for checking a whole dataset.
absl::Status CheckTransforms(const Image& image, const Transforms& t, int channels, int height,
                             int width);

// Writes channels x height x width floats to `out`. `image.channels` must
// equal `channels` (decoders convert; see DecodeOptions::channels).
absl::Status ApplyTransforms(const Image& image, const Transforms& t, uint64_t seed, int channels,
                             int height, int width, float* out);

// DecodeImageInto(bytes, options, scratch) then ApplyTransforms(*scratch,
// ...), the same floats bit for bit, in one pass where it can: a JPEG with
// no resize goes through crop, flip and normalize row by row as libjpeg
// decodes it (DecodeJpegRows: each row converted while it is in the cache,
// the decoded image never stored, the rows below the crop window not
// converted to pixels). Other images take the two steps (*scratch holds
// the decoded image). Errors are theirs.
absl::Status DecodeAndTransform(absl::string_view bytes, const DecodeOptions& options,
                                const Transforms& t, uint64_t seed, int channels, int height,
                                int width, Image* scratch, float* out);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_TRANSFORMS_H_
