// Decoded images and the PNG and JPEG codecs (Debian's libpng and
// libjpeg-turbo) behind them.
//
//   DecodeOptions options;
//   options.channels = 3;             // gray images are expanded to RGB
//   options.max_pixels = 1 << 24;     // a decompression bomb is refused
//   DT_ASSIGN_OR_RETURN(Image image, DecodeImage(bytes, options));
//   // image.u8 holds image.height x image.width x 3 bytes, row-major
//
// The input is untrusted (a user's files): every defect, including a
// truncated or corrupt stream, is a Status, never a crash or a longjmp past
// our frames. Images wider or taller than kMaxImageSide or with more than
// max_pixels pixels are refused after reading the header alone, before any
// pixel memory is allocated. Errors say what is wrong but not which file:
// callers add the file (see Source::Describe).
//
// Thread-safe: the functions have no shared state.
#ifndef DTRAIN_LIBS_DATA_IMAGE_H_
#define DTRAIN_LIBS_DATA_IMAGE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

inline constexpr int kMaxImageSide = 1 << 16;
inline constexpr int64_t kDefaultMaxImagePixels = int64_t{1} << 26;  // 64 Mpixel

// One image: either 8-bit pixels, height x width x channels (interleaved,
// row-major; what the decoders produce), or float values, channels x height
// x width (planar; what a float32 .npy holds). Exactly one of u8 and f32 is
// non-empty.
struct Image {
  int channels = 0;
  int height = 0;
  int width = 0;
  std::vector<uint8_t> u8;  // HWC
  std::vector<float> f32;   // CHW
};

struct DecodeOptions {
  // 1 (gray) or 3 (RGB): the decoder converts to it (RGB to gray with the
  // codec's luminance weights). 0: the file's own (1 or 3; alpha dropped).
  int channels = 0;
  // Images with more pixels are refused (decompression bombs).
  int64_t max_pixels = kDefaultMaxImagePixels;
};

enum class ImageFormat { kUnknown, kPng, kJpeg };

// Recognises PNG and JPEG by their first bytes.
ImageFormat SniffImageFormat(absl::string_view bytes);

absl::StatusOr<Image> DecodePng(absl::string_view bytes, const DecodeOptions& options);
absl::StatusOr<Image> DecodeJpeg(absl::string_view bytes, const DecodeOptions& options);
// Either of the above, by SniffImageFormat; DataLoss for neither.
absl::StatusOr<Image> DecodeImage(absl::string_view bytes, const DecodeOptions& options);
// The same into `*out`, reusing its pixel buffer (a loader decoding sample
// after sample allocates nothing after the first). On error *out is
// unspecified.
absl::Status DecodeImageInto(absl::string_view bytes, const DecodeOptions& options, Image* out);

// JPEG row by row, for a consumer that takes each row once, in order
// (DecodeAndTransform, transforms.h): the image is never held whole.
class JpegRowSink {
 public:
  virtual ~JpegRowSink() = default;
  // After the header (size checked against the cap): the image's size and
  // the channels its rows will have. Returns how many rows from the top the
  // sink needs (0..height), or an error that ends the decoding with it.
  virtual absl::StatusOr<int> Begin(int width, int height, int channels) = 0;
  // Row y (0, 1, ... up to the rows Begin asked for): width x channels
  // bytes, valid during the call, and kJpegRowSlack more that may be read
  // (for SIMD loads past the last pixel; their values are unspecified).
  virtual void Row(int y, const uint8_t* pixels) = 0;
};
inline constexpr size_t kJpegRowSlack = 32;
// Decodes a JPEG for `sink` with libjpeg's own API (one decompressor per
// thread): its rows are DecodeJpeg's, bit for bit (the same colour space,
// DCT and upsampling; a warning is an error, as DecodeJpeg's
// TJFLAG_STOPONWARNING makes it). The rows below those the sink needs, but
// the last, are skipped (jpeg_skip_scanlines: entropy-decoded, so a corrupt
// or truncated stream is still an error, but not transformed to pixels).
// Errors as DecodeJpeg's.
absl::Status DecodeJpegRows(absl::string_view bytes, const DecodeOptions& options,
                            JpegRowSink* sink);

// Encoders for tests, benchmarks and `trainctl data pack`: `image` must hold
// u8 pixels with 1 or 3 channels.
absl::StatusOr<std::string> EncodePng(const Image& image);
absl::StatusOr<std::string> EncodeJpeg(const Image& image, int quality);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_IMAGE_H_
