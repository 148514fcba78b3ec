// The decoders, the tar parser, the .npy header parser and the transforms,
// on bytes the test makes (including a PNG assembled by hand with zlib, as
// Python's standard library would write it).
#include <turbojpeg.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/data/image.h"
#include "libs/data/npy.h"
#include "libs/data/sampler.h"
#include "libs/data/tar.h"
#include "libs/data/transforms.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;

Image Gradient(int h, int w, int c) {
  Image im;
  im.channels = c;
  im.height = h;
  im.width = w;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int k = 0; k < c; ++k) im.u8.push_back(static_cast<uint8_t>((y * 7 + x * 13 + k * 50)));
    }
  }
  return im;
}

// A minimal PNG written by hand (what Python's stdlib can do): signature,
// IHDR, one IDAT of zlib-compressed filter-0 rows, IEND.
std::string HandPng(const Image& im) {
  auto chunk = [](const std::string& type, const std::string& data) {
    std::string out;
    const uint32_t n = data.size();
    out.push_back(n >> 24), out.push_back(n >> 16), out.push_back(n >> 8), out.push_back(n);
    std::string body = type + data;
    out += body;
    const uint32_t crc = crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size());
    out.push_back(crc >> 24), out.push_back(crc >> 16), out.push_back(crc >> 8), out.push_back(crc);
    return out;
  };
  std::string ihdr(13, '\0');
  ihdr[0] = im.width >> 24, ihdr[1] = im.width >> 16, ihdr[2] = im.width >> 8, ihdr[3] = im.width;
  ihdr[4] = im.height >> 24, ihdr[5] = im.height >> 16, ihdr[6] = im.height >> 8,
  ihdr[7] = im.height;
  ihdr[8] = 8;
  ihdr[9] = im.channels == 1 ? 0 : 2;
  std::string raw;
  for (int y = 0; y < im.height; ++y) {
    raw.push_back(0);
    raw.append(reinterpret_cast<const char*>(im.u8.data()) + y * im.width * im.channels,
               im.width * im.channels);
  }
  uLongf size = compressBound(raw.size());
  std::string z(size, '\0');
  compress(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(raw.data()),
           raw.size());
  z.resize(size);
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", z) +
         chunk("IEND", "");
}

TEST(ImageTest, PngRoundTripsExactlyGrayAndRgb) {
  for (int c : {1, 3}) {
    const Image im = Gradient(5, 7, c);
    absl::StatusOr<std::string> png = EncodePng(im);
    ASSERT_TRUE(png.ok()) << png.status();
    EXPECT_EQ(SniffImageFormat(*png), ImageFormat::kPng);
    absl::StatusOr<Image> back = DecodeImage(*png, {});
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->channels, c);
    EXPECT_EQ(back->height, 5);
    EXPECT_EQ(back->width, 7);
    EXPECT_EQ(back->u8, im.u8);
    // A hand-made PNG (no libpng on the writing side) decodes the same.
    absl::StatusOr<Image> hand = DecodePng(HandPng(im), {});
    ASSERT_TRUE(hand.ok()) << hand.status();
    EXPECT_EQ(hand->u8, im.u8);
  }
}

TEST(ImageTest, GrayIsExpandedToRgbOnRequest) {
  const Image im = Gradient(3, 4, 1);
  absl::StatusOr<Image> rgb = DecodePng(*EncodePng(im), {.channels = 3});
  ASSERT_TRUE(rgb.ok()) << rgb.status();
  ASSERT_EQ(rgb->channels, 3);
  for (size_t p = 0; p < im.u8.size(); ++p) {
    EXPECT_EQ(rgb->u8[3 * p], im.u8[p]);
    EXPECT_EQ(rgb->u8[3 * p + 2], im.u8[p]);
  }
}

TEST(ImageTest, JpegDecodesCloseToTheOriginal) {
  Image im = Gradient(16, 16, 3);
  for (uint8_t& v : im.u8) v = 128;  // flat: JPEG keeps it within a step
  absl::StatusOr<std::string> jpg = EncodeJpeg(im, 95);
  ASSERT_TRUE(jpg.ok()) << jpg.status();
  EXPECT_EQ(SniffImageFormat(*jpg), ImageFormat::kJpeg);
  absl::StatusOr<Image> back = DecodeImage(*jpg, {});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->channels, 3);
  for (uint8_t v : back->u8) EXPECT_NEAR(v, 128, 2);
  absl::StatusOr<Image> gray = DecodeImage(*jpg, {.channels = 1});
  ASSERT_TRUE(gray.ok()) << gray.status();
  EXPECT_EQ(gray->channels, 1);
  EXPECT_EQ(gray->u8.size(), 256u);
}

TEST(ImageTest, CorruptAndTruncatedImagesAreDataLoss) {
  const std::string png = *EncodePng(Gradient(20, 20, 1));
  std::string flipped = png;
  flipped[png.size() / 2] ^= 0x55;  // inside IDAT: CRC or zlib fails
  for (const std::string& bad : {png.substr(0, png.size() / 2), flipped}) {
    absl::StatusOr<Image> d = DecodeImage(bad, {});
    EXPECT_TRUE(absl::IsDataLoss(d.status())) << d.status();
    EXPECT_THAT(d.status().message(), HasSubstr("corrupt PNG"));
  }
  const std::string jpg = *EncodeJpeg(Gradient(32, 32, 3), 90);
  absl::StatusOr<Image> d = DecodeImage(jpg.substr(0, jpg.size() / 2), {});
  EXPECT_TRUE(absl::IsDataLoss(d.status())) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("corrupt JPEG"));
  EXPECT_TRUE(absl::IsDataLoss(DecodeImage("GIF89a....", {}).status()));
}

TEST(ImageTest, DecompressionBombIsRefusedFromTheHeader) {
  // A 3000 x 3000 gray PNG of zeros compresses to a few KB.
  Image big;
  big.channels = 1;
  big.height = big.width = 3000;
  big.u8.assign(size_t{3000} * 3000, 0);
  const std::string png = *EncodePng(big);
  big.u8.clear();
  big.u8.shrink_to_fit();
  absl::StatusOr<Image> d = DecodeImage(png, {.max_pixels = 1 << 20});
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("decompression bomb"));
  EXPECT_THAT(d.status().message(), HasSubstr("3000 x 3000"));
  const std::string jpg = *EncodeJpeg(Gradient(64, 64, 1), 80);
  EXPECT_THAT(DecodeImage(jpg, {.max_pixels = 100}).status().message(),
              HasSubstr("decompression bomb"));
}

TEST(TarTest, WriterAndParserAgreeIncludingLongNames) {
  TarWriter w;
  const std::string long_name = std::string(120, 'a') + ".png";
  w.Add("000000.png", "png-bytes");
  w.Add("000000.cls", "7");
  w.Add(long_name, std::string(1000, 'x'));
  const std::string archive = w.Finish();
  absl::StatusOr<std::vector<TarMember>> m = ParseTar(archive);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0].name, "000000.png");
  EXPECT_EQ(archive.substr((*m)[0].offset, (*m)[0].size), "png-bytes");
  EXPECT_EQ(archive.substr((*m)[1].offset, (*m)[1].size), "7");
  EXPECT_EQ((*m)[2].name, long_name);
  EXPECT_EQ((*m)[2].size, 1000);
}

TEST(TarTest, DotDotAndAbsoluteNamesAreRefused) {
  for (const char* name : {"../etc/passwd", "a/../../b.png", "/abs/x.png"}) {
    TarWriter w;
    w.Add("ok.cls", "1");
    w.Add(name, "x");
    absl::StatusOr<std::vector<TarMember>> m = ParseTar(w.Finish());
    EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << name << ": " << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr("refused"));
    EXPECT_THAT(m.status().message(), HasSubstr("tar header 1"));
  }
}

TEST(TarTest, DamageIsReportedWithItsOffset) {
  TarWriter w;
  w.Add("a.png", std::string(600, 'p'));
  std::string archive = w.Finish();
  std::string bad_sum = archive;
  bad_sum[0] = 'b';
  EXPECT_THAT(ParseTar(bad_sum).status().message(), HasSubstr("checksum"));
  // Cut inside the member's contents.
  absl::StatusOr<std::vector<TarMember>> cut = ParseTar(archive.substr(0, 700));
  EXPECT_TRUE(absl::IsDataLoss(cut.status())) << cut.status();
  EXPECT_THAT(cut.status().message(), HasSubstr("runs past the end"));
  // A symlink member.
  std::string link = archive;
  link[156] = '2';
  unsigned sum = 0;
  std::memset(link.data() + 148, ' ', 8);
  for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(link[i]);
  std::snprintf(link.data() + 148, 8, "%06o", sum);
  EXPECT_THAT(ParseTar(link).status().message(), HasSubstr("only regular files"));
}

TEST(NpyTest, WrittenHeadersParseAndDataFollow) {
  const std::string data(2 * 3 * 4, '\x05');
  const std::string file = WriteNpy(NpyDtype::kU8, {2, 3, 4}, data);
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(file);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->dtype, NpyDtype::kU8);
  EXPECT_EQ(h->shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(h->data_offset % 64, 0);
  EXPECT_EQ(file.substr(h->data_offset), data);
  absl::StatusOr<NpyHeader> v = ParseNpyHeader(WriteNpy(NpyDtype::kI64, {7}, std::string(56, 0)));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->shape, std::vector<int64_t>{7});
  EXPECT_EQ(v->data_bytes, 56);
}

TEST(NpyTest, StrictAboutTheDict) {
  auto header = [](const std::string& dict) {
    std::string text = dict + "\n";
    std::string out("\x93NUMPY\x01\x00", 8);
    out.push_back(static_cast<char>(text.size()));
    out.push_back(0);
    return out + text;
  };
  EXPECT_TRUE(
      ParseNpyHeader(header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }")).ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", "dtype '>f4'"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", "fortran_order"},
      {"{'descr': '<f4', 'shape': (3,), }", "needs the keys"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}", "unexpected"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", "repeated"},
      {"{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", "not supported"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", "(n,)"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", "non-negative"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } x", "after the dict"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 999999), }",
       "too large"},
  };
  for (const auto& [dict, expected] : bad) {
    absl::StatusOr<NpyHeader> h = ParseNpyHeader(header(dict));
    EXPECT_FALSE(h.ok()) << dict;
    EXPECT_THAT(h.status().message(), HasSubstr(expected)) << dict;
  }
  EXPECT_THAT(ParseNpyHeader("PK\x03\x04 not npy").status().message(), HasSubstr("magic"));
  std::string truncated = header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
  EXPECT_THAT(ParseNpyHeader(truncated.substr(0, 30)).status().message(), HasSubstr("truncated"));
}

TEST(TransformsTest, NoTransformsGivePixelsOver255) {
  const Image im = Gradient(4, 5, 1);
  std::vector<float> out(20);
  ASSERT_TRUE(ApplyTransforms(im, {}, 0, 1, 4, 5, out.data()).ok());
  for (int p = 0; p < 20; ++p) EXPECT_EQ(out[p], static_cast<float>(im.u8[p]) / 255.0f);
  // RGB: interleaved in, planar out.
  const Image rgb = Gradient(2, 3, 3);
  std::vector<float> planar(18);
  ASSERT_TRUE(ApplyTransforms(rgb, {}, 0, 3, 2, 3, planar.data()).ok());
  EXPECT_EQ(planar[1 * 6 + 4], static_cast<float>(rgb.u8[4 * 3 + 1]) / 255.0f);
  // A size mismatch without transforms says what to do.
  EXPECT_THAT(ApplyTransforms(im, {}, 0, 1, 5, 5, out.data()).message(),
              HasSubstr("add resize and crop"));
}

TEST(TransformsTest, CropFlipNormalizeAreSeededAndCorrect) {
  const Image im = Gradient(8, 8, 1);
  Transforms t;
  t.crop_height = t.crop_width = 6;
  t.crop_padding = 2;
  t.random_crop = t.random_flip = true;
  t.mean = {0.5f};
  t.std = {0.25f};
  std::vector<float> a(36), b(36), other(36);
  ASSERT_TRUE(ApplyTransforms(im, t, SampleSeed(1, 2, 3), 1, 6, 6, a.data()).ok());
  ASSERT_TRUE(ApplyTransforms(im, t, SampleSeed(1, 2, 3), 1, 6, 6, b.data()).ok());
  EXPECT_EQ(a, b);
  // Over many samples every value is either padding or a pixel of the
  // image, and different seeds give different crops.
  int differing = 0;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(ApplyTransforms(im, t, SampleSeed(1, 2, i), 1, 6, 6, other.data()).ok());
    differing += other != a;
    for (float v : other) {
      const float pixel = v * 0.25f + 0.5f;
      bool found = std::abs(pixel) < 1e-6f;
      for (uint8_t p : im.u8) found |= std::abs(pixel - p / 255.0f) < 1e-5f;
      EXPECT_TRUE(found) << v;
    }
  }
  EXPECT_GT(differing, 40);
  // Center crop without padding: the middle 6 x 6, flipped when asked.
  Transforms center;
  center.crop_height = center.crop_width = 6;
  ASSERT_TRUE(ApplyTransforms(im, center, 0, 1, 6, 6, a.data()).ok());
  EXPECT_EQ(a[0], im.u8[1 * 8 + 1] / 255.0f);
  EXPECT_EQ(a[5], im.u8[1 * 8 + 6] / 255.0f);
}

// The 8-bit path (SIMD kernels where the CPU has them, tables elsewhere)
// against the definition, one output value at a time, bit for bit: rows
// from 1 to 70 pixels (the kernels' 4- and 8-pixel blocks and their
// tails), gray and RGB, flips, padding (also wider than the crop) and
// normalization.
TEST(TransformsTest, EightBitPathGivesTheDefinitionsValuesBitForBit) {
  uint64_t state = 99;
  int compared = 0;
  for (int i = 0; i < 400; ++i) {
    const int channels = i % 2 == 0 ? 3 : 1;
    const int h = 1 + static_cast<int>(SplitMix64Next(&state) % 20);
    const int w = 1 + static_cast<int>(SplitMix64Next(&state) % 70);
    Image im;
    im.channels = channels;
    im.height = h;
    im.width = w;
    // Exactly the pixels: a kernel reading past them would trip ASan.
    for (int k = 0; k < h * w * channels; ++k) {
      im.u8.push_back(static_cast<uint8_t>(SplitMix64Next(&state)));
    }
    Transforms t;
    t.crop_padding = static_cast<int>(SplitMix64Next(&state) % 6);
    t.crop_height = 1 + static_cast<int>(SplitMix64Next(&state) % (h + 2 * t.crop_padding));
    t.crop_width = 1 + static_cast<int>(SplitMix64Next(&state) % (w + 2 * t.crop_padding));
    t.random_crop = true;
    t.random_flip = true;
    if (i % 3 != 0) {
      for (int c = 0; c < channels; ++c) {
        t.mean.push_back(0.1f * (c + 1) + 0.013f * (i % 7));
        t.std.push_back(0.2f + 0.07f * c + 0.011f * (i % 5));
      }
    }
    const int oh = t.crop_height, ow = t.crop_width;
    std::vector<float> out(static_cast<size_t>(channels) * oh * ow);
    const uint64_t seed = SampleSeed(7, i, i * 31);
    ASSERT_TRUE(ApplyTransforms(im, t, seed, channels, oh, ow, out.data()).ok());
    // The definition (transforms.h): crop origin and flip from the seed.
    uint64_t s = seed;
    const int top = static_cast<int>(SplitMix64Next(&s) % (h + 2 * t.crop_padding - oh + 1));
    const int left = static_cast<int>(SplitMix64Next(&s) % (w + 2 * t.crop_padding - ow + 1));
    const bool flip = (SplitMix64Next(&s) >> 63) != 0;
    for (int c = 0; c < channels; ++c) {
      for (int y = 0; y < oh; ++y) {
        for (int x = 0; x < ow; ++x) {
          const int sy = top + y - t.crop_padding;
          const int sx = left + (flip ? ow - 1 - x : x) - t.crop_padding;
          float v = 0.0f;
          if (sy >= 0 && sy < h && sx >= 0 && sx < w) {
            v = static_cast<float>(im.u8[(static_cast<size_t>(sy) * w + sx) * channels + c]) /
                255.0f;
          }
          if (!t.mean.empty()) v = (v - t.mean[c]) * (1.0f / t.std[c]);
          const float got = out[(static_cast<size_t>(c) * oh + y) * ow + x];
          ASSERT_EQ(std::memcmp(&got, &v, 4), 0)
              << "case " << i << " channel " << c << " y " << y << " x " << x << ": " << got
              << " vs " << v << " (" << h << " x " << w << " crop " << oh << " x " << ow << " pad "
              << t.crop_padding << " flip " << flip << ")";
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 100000);
}

// Every byte value through the SIMD kernels (and the scalar tail): the
// divide's bits.
TEST(TransformsTest, EveryPixelValueIsItsQuotientBy255) {
  for (int channels : {1, 3}) {
    Image im;
    im.channels = channels;
    im.height = 2;
    im.width = 300;
    for (int k = 0; k < im.height * im.width * channels; ++k) {
      im.u8.push_back(static_cast<uint8_t>(k / channels));
    }
    std::vector<float> out(static_cast<size_t>(channels) * 2 * 300);
    ASSERT_TRUE(ApplyTransforms(im, Transforms{}, 1, channels, 2, 300, out.data()).ok());
    std::vector<bool> seen(256, false);
    for (int c = 0; c < channels; ++c) {
      for (int i = 0; i < 600; ++i) {
        const uint8_t p = im.u8[static_cast<size_t>(i) * channels + c];
        const float want = static_cast<float>(p) / 255.0f;
        const float got = out[static_cast<size_t>(c) * 600 + i];
        ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "p " << int{p} << ": " << got;
        seen[p] = true;
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 256);
  }
}

TEST(TransformsTest, CheckTransformsAgreesWithApplyTransforms) {
  const Image im = Gradient(10, 20, 3);
  Transforms t;
  t.resize = 8;  // 8 x 16
  t.crop_height = t.crop_width = 8;
  std::vector<float> out(3 * 16 * 16);
  EXPECT_TRUE(CheckTransforms(im, t, 3, 8, 8).ok());
  EXPECT_TRUE(ApplyTransforms(im, t, 0, 3, 8, 8, out.data()).ok());
  for (auto [channels, side] : {std::pair{1, 8}, std::pair{3, 9}}) {
    const absl::Status check = CheckTransforms(im, t, channels, side, side);
    EXPECT_FALSE(check.ok());
    EXPECT_EQ(check, ApplyTransforms(im, t, 0, channels, side, side, out.data()));
  }
  t.crop_height = t.crop_width = 16;  // wider than the padded 8 rows
  const absl::Status check = CheckTransforms(im, t, 3, 16, 16);
  EXPECT_THAT(check.message(), HasSubstr("larger than the (padded) image of 8 x 16"));
  EXPECT_EQ(check, ApplyTransforms(im, t, 0, 3, 16, 16, out.data()));
}

// A JPEG with TurboJPEG's own flags (progressive, 4:4:4, ...).
std::string Jpeg(const Image& im, int subsamp, int flags) {
  tjhandle tj = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int): the API's type
  const int rc =
      tjCompress2(tj, im.u8.data(), im.width, 0, im.height, im.channels == 1 ? TJPF_GRAY : TJPF_RGB,
                  &buffer, &size, subsamp, 85, flags);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(tj);
  std::string out(reinterpret_cast<const char*>(buffer), rc == 0 ? size : 0);
  tjFree(buffer);
  tjDestroy(tj);
  return out;
}

// Noise on a gradient: JPEG has detail to get wrong.
Image Textured(int h, int w, int c, uint32_t seed) {
  Image im = Gradient(h, w, c);
  std::mt19937 rng(seed);
  for (uint8_t& v : im.u8) v = static_cast<uint8_t>(v + rng() % 40);
  return im;
}

// What DecodeAndTransform must give: the two steps.
absl::Status TwoSteps(const std::string& bytes, const DecodeOptions& o, const Transforms& t,
                      uint64_t seed, int c, int h, int w, float* out) {
  Image im;
  if (absl::Status s = DecodeImageInto(bytes, o, &im); !s.ok()) return s;
  return ApplyTransforms(im, t, seed, c, h, w, out);
}

TEST(TransformsTest, DecodeAndTransformIsDecodeThenApplyBitForBit) {
  struct Input {
    std::string name, bytes;
    int channels;  // what the test asks for (the decoder converts)
    int h, w;
  };
  const Image rgb = Textured(45, 61, 3, 1), gray = Textured(40, 33, 1, 2);
  const std::vector<Input> inputs = {
      {"rgb 4:2:0", Jpeg(rgb, TJSAMP_420, 0), 3, 45, 61},
      {"rgb 4:4:4", Jpeg(rgb, TJSAMP_444, 0), 3, 45, 61},
      {"rgb 4:2:2 progressive", Jpeg(rgb, TJSAMP_422, TJFLAG_PROGRESSIVE), 3, 45, 61},
      {"rgb as gray", Jpeg(rgb, TJSAMP_420, 0), 1, 45, 61},
      {"gray", Jpeg(gray, TJSAMP_GRAY, 0), 1, 40, 33},
      {"gray as rgb", Jpeg(gray, TJSAMP_GRAY, TJFLAG_PROGRESSIVE), 3, 40, 33},
      {"png (two steps)", *EncodePng(rgb), 3, 45, 61},
  };
  for (const Input& in : inputs) {
    ASSERT_FALSE(in.bytes.empty()) << in.name;
    struct Case {
      const char* name;
      Transforms t;
      int out_h, out_w;
    };
    Transforms none, center, random, wide;
    center.crop_height = in.h - 6;
    center.crop_width = in.w - 10;
    random = center;
    random.crop_padding = 4;
    random.random_crop = random.random_flip = true;
    random.mean.assign(in.channels, 0.4f);
    random.std.assign(in.channels, 0.27f);
    wide = random;  // windows reaching far into the padding on every side
    wide.crop_padding = 12;
    wide.crop_height = in.h + 6;
    wide.crop_width = in.w + 2;
    for (const Case& c : {Case{"none", none, in.h, in.w},
                          Case{"center", center, center.crop_height, center.crop_width},
                          Case{"random", random, random.crop_height, random.crop_width},
                          Case{"wide", wide, wide.crop_height, wide.crop_width}}) {
      const size_t n = static_cast<size_t>(in.channels) * c.out_h * c.out_w;
      for (uint64_t seed = 0; seed < 24; ++seed) {
        std::vector<float> want(n, -7.0f), got(n, 7.0f);
        ASSERT_TRUE(TwoSteps(in.bytes, {.channels = in.channels}, c.t, seed, in.channels, c.out_h,
                             c.out_w, want.data())
                        .ok())
            << in.name << " " << c.name;
        Image scratch;
        const absl::Status s =
            DecodeAndTransform(in.bytes, {.channels = in.channels}, c.t, seed, in.channels, c.out_h,
                               c.out_w, &scratch, got.data());
        ASSERT_TRUE(s.ok()) << in.name << " " << c.name << ": " << s;
        ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
            << in.name << ", " << c.name << ", seed " << seed;
      }
    }
  }
}

TEST(TransformsTest, DecodeAndTransformFailsAsTheTwoSteps) {
  const std::string jpg = Jpeg(Textured(48, 48, 3, 3), TJSAMP_420, 0);
  const std::string progressive = Jpeg(Textured(48, 48, 3, 4), TJSAMP_420, TJFLAG_PROGRESSIVE);
  Transforms top;  // a window in the top rows: the rest is skipped, still read
  top.crop_height = 8;
  top.crop_width = 48;
  top.crop_padding = 0;
  std::vector<float> a(3 * 48 * 48), b(3 * 48 * 48);
  int failures = 0;
  for (const std::string* full : {&jpg, &progressive}) {
    std::vector<std::string> bad;
    for (size_t cut :
         {full->size() / 3, full->size() / 2, full->size() * 9 / 10, full->size() - 2}) {
      bad.push_back(full->substr(0, cut));
    }
    std::string flipped = *full;
    flipped[full->size() * 2 / 3] ^= 0x5a;
    bad.push_back(flipped);
    for (const std::string& bytes : bad) {
      for (const Transforms& t : {Transforms{}, top}) {
        const int h = t.crop_height > 0 ? t.crop_height : 48;
        const absl::Status want = TwoSteps(bytes, {.channels = 3}, t, 1, 3, h, 48, a.data());
        Image scratch;
        const absl::Status got =
            DecodeAndTransform(bytes, {.channels = 3}, t, 1, 3, h, 48, &scratch, b.data());
        EXPECT_EQ(got.code(), want.code()) << got << " vs " << want;
        EXPECT_EQ(got.message(), want.message());
        if (!want.ok()) {
          ++failures;
          EXPECT_THAT(got.message(), HasSubstr("corrupt JPEG"));
        }
      }
    }
  }
  EXPECT_GE(failures, 8);  // the truncations at least
  // The shape check and the pixel cap, before any pixel.
  Image scratch;
  absl::Status s =
      DecodeAndTransform(jpg, {.channels = 3}, Transforms{}, 1, 3, 40, 48, &scratch, b.data());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(),
            TwoSteps(jpg, {.channels = 3}, Transforms{}, 1, 3, 40, 48, a.data()).message());
  s = DecodeAndTransform(jpg, {.channels = 3, .max_pixels = 100}, Transforms{}, 1, 3, 48, 48,
                         &scratch, b.data());
  EXPECT_THAT(s.message(), HasSubstr("decompression bomb"));
}

TEST(TransformsTest, ResizeScalesTheShorterSide) {
  Image im = Gradient(10, 20, 3);
  for (uint8_t& v : im.u8) v = 200;
  Transforms t;
  t.resize = 5;
  std::vector<float> out(3 * 5 * 10);
  ASSERT_TRUE(ApplyTransforms(im, t, 0, 3, 5, 10, out.data()).ok());
  for (float v : out) EXPECT_NEAR(v, 200 / 255.0f, 1e-6);
  EXPECT_FALSE(ApplyTransforms(im, t, 0, 3, 5, 5, out.data()).ok());
}

}  // namespace
}  // namespace dtrain::data
