// Fuzz target: the PNG and JPEG decoder wrappers (libs/data/image.h) on any
// bytes, with a small pixel cap (so a decompression bomb is refused, not a
// finding) and each channel request.
//
// Checks beyond "no crash": a decoded image has the requested channels, its
// size within the cap and exactly height x width x channels bytes; errors
// say which codec refused; DecodeJpegRows (a share of the rows asked for,
// from the first byte) gives DecodeJpeg's rows and, asked for all of them,
// its verdict.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "libs/data/image.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "image_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

// DecodeJpegRows's sink: keeps the rows it asked for.
class Rows : public dtrain::data::JpegRowSink {
 public:
  explicit Rows(int fraction) : fraction_(fraction) {}
  absl::StatusOr<int> Begin(int width, int height, int channels) override {
    width_ = width;
    channels_ = channels;
    wanted_ = height * fraction_ / 4;  // 0, 1/4, ..., all of them
    pixels.clear();
    return wanted_;
  }
  void Row(int y, const uint8_t* p) override {
    Check(y == next_++, "rows in order");
    Check(y < wanted_, "only the rows asked for");
    pixels.insert(pixels.end(), p, p + static_cast<size_t>(width_) * channels_);
  }
  std::vector<uint8_t> pixels;
  int next_ = 0, wanted_ = 0;

 private:
  const int fraction_;
  int width_ = 0, channels_ = 0;
};

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
  // Row by row: the same verdict, and the same pixels as far as asked.
  absl::StatusOr<dtrain::data::Image> whole = dtrain::data::DecodeJpeg(bytes, o);
  Rows rows(data[0] / 3 % 5);
  const absl::Status by_rows = dtrain::data::DecodeJpegRows(bytes, o, &rows);
  if (whole.ok() && by_rows.ok()) {
    Check(rows.next_ == rows.wanted_, "every row asked for");
    Check(rows.pixels.empty() ||
              std::memcmp(rows.pixels.data(), whole->u8.data(), rows.pixels.size()) == 0,
          "the rows are DecodeJpeg's");
  }
  // (Rows the sink did not ask for are skipped, not decoded to pixels: a
  // stream that fails only there may fail differently, never silently.)
  if (!by_rows.ok()) Check(!by_rows.message().empty(), "errors say something");
  if (whole.ok() && rows.wanted_ == whole->height) Check(by_rows.ok(), "all rows: same verdict");
  return 0;
}
