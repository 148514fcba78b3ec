#include "libs/data/image.h"

#include <png.h>
#include <turbojpeg.h>

#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dtrain::data {
namespace {

absl::Status CheckSize(const char* format, int64_t width, int64_t height,
                       const DecodeOptions& options) {
  if (width <= 0 || height <= 0 || width > kMaxImageSide || height > kMaxImageSide) {
    return absl::InvalidArgumentError(absl::StrCat(format, " image of ", width, " x ", height,
                                                   " pixels: each side must be in 1..",
                                                   kMaxImageSide));
  }
  if (width * height > options.max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        format, " image of ", width, " x ", height, " = ", width * height,
        " pixels exceeds the cap of ", options.max_pixels,
        " pixels per image (a decompression bomb?); raise max_image_pixels if it is genuine"));
  }
  return absl::OkStatus();
}

absl::Status CheckChannels(int channels) {
  if (channels != 0 && channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be 1 (gray), 3 (RGB) or 0 (the file's), got ", channels));
  }
  return absl::OkStatus();
}

struct PngImage {
  png_image image;
  PngImage() {
    std::memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&image); }
};

struct TjHandle {
  tjhandle handle;
  explicit TjHandle(tjhandle h) : handle(h) {}
  ~TjHandle() {
    if (handle != nullptr) tjDestroy(handle);
  }
};

std::string TjError(tjhandle handle) { return tjGetErrorStr2(handle); }

}  // namespace

ImageFormat SniffImageFormat(absl::string_view bytes) {
  static constexpr unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return ImageFormat::kPng;
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xff &&
      static_cast<unsigned char>(bytes[1]) == 0xd8 &&
      static_cast<unsigned char>(bytes[2]) == 0xff) {
    return ImageFormat::kJpeg;
  }
  return ImageFormat::kUnknown;
}

absl::Status DecodePngInto(absl::string_view bytes, const DecodeOptions& options, Image* out) {
  if (absl::Status s = CheckChannels(options.channels); !s.ok()) return s;
  PngImage png;
  if (!png_image_begin_read_from_memory(&png.image, bytes.data(), bytes.size())) {
    return absl::DataLossError(absl::StrCat("corrupt PNG: ", png.image.message));
  }
  if (absl::Status s = CheckSize("PNG", png.image.width, png.image.height, options); !s.ok()) {
    return s;
  }
  int channels = options.channels;
  if (channels == 0) channels = (png.image.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
  png.image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  out->channels = channels;
  out->height = static_cast<int>(png.image.height);
  out->width = static_cast<int>(png.image.width);
  out->f32.clear();
  out->u8.resize(PNG_IMAGE_SIZE(png.image));
  if (!png_image_finish_read(&png.image, /*background=*/nullptr, out->u8.data(), /*row_stride=*/0,
                             /*colormap=*/nullptr)) {
    return absl::DataLossError(absl::StrCat("corrupt PNG: ", png.image.message));
  }
  // libpng reports a warning (not an error) for some damage; be strict.
  if (png.image.warning_or_error != 0) {
    return absl::DataLossError(absl::StrCat("corrupt PNG: ", png.image.message));
  }
  return absl::OkStatus();
}

absl::StatusOr<Image> DecodePng(absl::string_view bytes, const DecodeOptions& options) {
  Image out;
  if (absl::Status s = DecodePngInto(bytes, options, &out); !s.ok()) return s;
  return out;
}

absl::Status DecodeJpegInto(absl::string_view bytes, const DecodeOptions& options, Image* out) {
  if (absl::Status s = CheckChannels(options.channels); !s.ok()) return s;
  // One decompressor per thread: creating one costs about as much as
  // decoding a small image.
  thread_local TjHandle tj(tjInitDecompress());
  if (tj.handle == nullptr) return absl::InternalError("tjInitDecompress failed");
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
  if (tjDecompressHeader3(tj.handle, src, bytes.size(), &width, &height, &subsamp, &colorspace) !=
      0) {
    return absl::DataLossError(absl::StrCat("corrupt JPEG: ", TjError(tj.handle)));
  }
  if (absl::Status s = CheckSize("JPEG", width, height, options); !s.ok()) return s;
  int channels = options.channels;
  if (channels == 0) channels = colorspace == TJCS_GRAY ? 1 : 3;
  out->channels = channels;
  out->height = height;
  out->width = width;
  out->f32.clear();
  out->u8.resize(static_cast<size_t>(width) * height * channels);
  if (tjDecompress2(tj.handle, src, bytes.size(), out->u8.data(), width, /*pitch=*/0, height,
                    channels == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_STOPONWARNING) != 0) {
    return absl::DataLossError(absl::StrCat("corrupt JPEG: ", TjError(tj.handle)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Image> DecodeJpeg(absl::string_view bytes, const DecodeOptions& options) {
  Image out;
  if (absl::Status s = DecodeJpegInto(bytes, options, &out); !s.ok()) return s;
  return out;
}

absl::Status DecodeImageInto(absl::string_view bytes, const DecodeOptions& options, Image* out) {
  switch (SniffImageFormat(bytes)) {
    case ImageFormat::kPng:
      return DecodePngInto(bytes, options, out);
    case ImageFormat::kJpeg:
      return DecodeJpegInto(bytes, options, out);
    case ImageFormat::kUnknown:
      break;
  }
  return absl::DataLossError(
      absl::StrCat("not a PNG or JPEG image (", bytes.size(), " bytes, unrecognized signature)"));
}

absl::StatusOr<Image> DecodeImage(absl::string_view bytes, const DecodeOptions& options) {
  Image out;
  if (absl::Status s = DecodeImageInto(bytes, options, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> EncodePng(const Image& image) {
  if ((image.channels != 1 && image.channels != 3) || image.width <= 0 || image.height <= 0 ||
      image.u8.size() != static_cast<size_t>(image.width) * image.height * image.channels) {
    return absl::InvalidArgumentError("EncodePng: needs u8 pixels, 1 or 3 channels, non-empty");
  }
  PngImage png;
  png.image.width = image.width;
  png.image.height = image.height;
  png.image.format = image.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png.image, nullptr, &size, 0, image.u8.data(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encoding failed: ", png.image.message));
  }
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&png.image, out.data(), &size, 0, image.u8.data(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encoding failed: ", png.image.message));
  }
  out.resize(size);
  return out;
}

absl::StatusOr<std::string> EncodeJpeg(const Image& image, int quality) {
  if ((image.channels != 1 && image.channels != 3) || image.width <= 0 || image.height <= 0 ||
      image.u8.size() != static_cast<size_t>(image.width) * image.height * image.channels) {
    return absl::InvalidArgumentError("EncodeJpeg: needs u8 pixels, 1 or 3 channels, non-empty");
  }
  TjHandle tj(tjInitCompress());
  if (tj.handle == nullptr) return absl::InternalError("tjInitCompress failed");
  unsigned char* buffer = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int): the API's type
  if (tjCompress2(tj.handle, image.u8.data(), image.width, 0, image.height,
                  image.channels == 1 ? TJPF_GRAY : TJPF_RGB, &buffer, &size,
                  image.channels == 1 ? TJSAMP_GRAY : TJSAMP_420, quality, 0) != 0) {
    std::string error = TjError(tj.handle);
    tjFree(buffer);
    return absl::InternalError(absl::StrCat("JPEG encoding failed: ", error));
  }
  std::string out(reinterpret_cast<const char*>(buffer), size);
  tjFree(buffer);
  return out;
}

}  // namespace dtrain::data
