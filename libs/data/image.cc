#include "libs/data/image.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

// (jpeglib.h needs <cstdio> first.)
#include <jpeglib.h>

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

// libjpeg's error manager: errors, and warnings (TurboJPEG's
// TJFLAG_STOPONWARNING), jump back to RunJpegRows with the message.
struct JpegError {
  jpeg_error_mgr mgr;  // first: libjpeg sees a jpeg_error_mgr*
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void JpegErrorExit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void JpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  JpegErrorExit(cinfo);    // a warning: corrupt data
}

// One decompressor per thread, reused image after image.
struct JpegDecoder {
  jpeg_decompress_struct cinfo;
  JpegError err;
  bool ok = false;
  JpegDecoder() {
    std::memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = JpegErrorExit;
    err.mgr.emit_message = JpegEmitMessage;
    if (setjmp(err.jump) != 0) return;
    jpeg_create_decompress(&cinfo);
    ok = true;
  }
  ~JpegDecoder() {
    if (ok) jpeg_destroy_decompress(&cinfo);
  }
};

// The C++ calls of RunJpegRows, each in a frame of its own: no object with
// a destructor is alive in RunJpegRows's frame when libjpeg jumps back to
// it. Each returns the rows needed (Begin) or 0, and -1 with *error set.
int JpegBegin(JpegRowSink* sink, const DecodeOptions& options, int width, int height, int channels,
              absl::Status* error) {
  if (absl::Status s = CheckSize("JPEG", width, height, options); !s.ok()) {
    *error = s;
    return -1;
  }
  absl::StatusOr<int> rows = sink->Begin(width, height, channels);
  if (!rows.ok()) {
    *error = rows.status();
    return -1;
  }
  return std::max(0, std::min(*rows, height));
}

uint8_t* JpegRowBuffer(size_t bytes) {
  thread_local std::vector<uint8_t> row;
  if (row.size() < bytes) row.resize(bytes);
  return row.data();
}

// 0: decoded; 1: libjpeg's error (d->err.message); -1: *error.
int RunJpegRows(JpegDecoder* d, const unsigned char* src, size_t size, const DecodeOptions& options,
                JpegRowSink* sink, absl::Status* error) {
  jpeg_decompress_struct* cinfo = &d->cinfo;
  if (setjmp(d->err.jump) != 0) {
    jpeg_abort_decompress(cinfo);
    return 1;
  }
  jpeg_mem_src(cinfo, src, static_cast<unsigned long>(size));  // NOLINT(runtime/int)
  if (jpeg_read_header(cinfo, TRUE) != JPEG_HEADER_OK) {
    std::snprintf(d->err.message, sizeof(d->err.message), "no image in the JPEG stream");
    jpeg_abort_decompress(cinfo);
    return 1;
  }
  int channels = options.channels;
  if (channels == 0) channels = cinfo->jpeg_color_space == JCS_GRAYSCALE ? 1 : 3;
  // TurboJPEG's TJPF_GRAY and TJPF_RGB; its defaults otherwise (no scaling,
  // JDCT_ISLOW, fancy upsampling).
  cinfo->out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_EXT_RGB;
  const int rows = JpegBegin(sink, options, static_cast<int>(cinfo->image_width),
                             static_cast<int>(cinfo->image_height), channels, error);
  if (rows < 0) {
    jpeg_abort_decompress(cinfo);
    return -1;
  }
  jpeg_start_decompress(cinfo);
  JSAMPROW row = JpegRowBuffer(static_cast<size_t>(cinfo->output_width) * channels + kJpegRowSlack);
  while (static_cast<int>(cinfo->output_scanline) < rows) {
    const int y = static_cast<int>(cinfo->output_scanline);
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
      std::snprintf(d->err.message, sizeof(d->err.message), "no scanline %d", y);
      jpeg_abort_decompress(cinfo);
      return 1;
    }
    sink->Row(y, row);
  }
  // The rest: skipped but for the last row (a skip to the end would read
  // no more data, and a stream damaged further down would pass), which is
  // decoded to bring libjpeg to the end of the data.
  if (cinfo->output_scanline < cinfo->output_height) {
    const JDIMENSION left = cinfo->output_height - cinfo->output_scanline;
    if (left > 1) jpeg_skip_scanlines(cinfo, left - 1);
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
      std::snprintf(d->err.message, sizeof(d->err.message), "no last scanline");
      jpeg_abort_decompress(cinfo);
      return 1;
    }
  }
  jpeg_finish_decompress(cinfo);
  return 0;
}

}  // namespace

absl::Status DecodeJpegRows(absl::string_view bytes, const DecodeOptions& options,
                            JpegRowSink* sink) {
  if (absl::Status s = CheckChannels(options.channels); !s.ok()) return s;
  thread_local JpegDecoder decoder;
  if (!decoder.ok) return absl::InternalError("jpeg_create_decompress failed");
  absl::Status error;
  const int rc = RunJpegRows(&decoder, reinterpret_cast<const unsigned char*>(bytes.data()),
                             bytes.size(), options, sink, &error);
  if (rc < 0) return error;
  if (rc > 0) return absl::DataLossError(absl::StrCat("corrupt JPEG: ", decoder.err.message));
  return absl::OkStatus();
}

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
