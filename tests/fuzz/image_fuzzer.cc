// Fuzz target: the PNG and JPEG decoder wrappers (libs/data/image.h) on any
// bytes, with a small pixel cap (so a decompression bomb is refused, not a
// finding) and each channel request.
//
// Checks beyond "no crash": a decoded image has the requested channels, its
// size within the cap and exactly height x width x channels bytes; errors
// say which codec refused.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "libs/data/image.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "image_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int channels = data[0] % 3 == 2 ? 3 : data[0] % 3;  // 0, 1 or 3
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  dtrain::data::DecodeOptions o;
  o.channels = channels;
  o.max_pixels = 1 << 18;
  for (int which = 0; which < 3; ++which) {
    absl::StatusOr<dtrain::data::Image> im = which == 0   ? dtrain::data::DecodeImage(bytes, o)
                                             : which == 1 ? dtrain::data::DecodePng(bytes, o)
                                                          : dtrain::data::DecodeJpeg(bytes, o);
    if (!im.ok()) {
      Check(!im.status().message().empty(), "errors say something");
      continue;
    }
    Check(channels == 0 ? (im->channels == 1 || im->channels == 3) : im->channels == channels,
          "requested channels");
    Check(im->height > 0 && im->width > 0 && int64_t{im->height} * im->width <= o.max_pixels,
          "size within the cap");
    Check(im->u8.size() == static_cast<size_t>(im->height) * im->width * im->channels,
          "pixel count");
  }
  return 0;
}
