#include "libs/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

Bytes MakeIdx(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes out;
  auto put32 = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back((v >> shift) & 0xFF);
  };
  put32(magic);
  for (uint32_t d : dims) put32(d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Bytes Pattern(size_t n) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 37 + 11);
  return b;
}

void WriteRaw(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  ASSERT_TRUE(out.good()) << path;
}

void WriteGz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

Bytes ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A small valid image file: 2 x 3 x 4 pixels.
const std::vector<uint32_t> kImageDims = {2, 3, 4};
Bytes SmallImages() { return MakeIdx(kIdxMagicU8Images, kImageDims, Pattern(24)); }

TEST(IdxTest, RoundTripsGzipImages) {
  const std::string path = TempPath("images.gz");
  WriteGz(path, SmallImages());
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a->data, Pattern(24));
}

TEST(IdxTest, RoundTripsGzipLabels) {
  const std::string path = TempPath("labels.gz");
  WriteGz(path, MakeIdx(kIdxMagicU8Vector, {7}, Bytes{9, 0, 0, 3, 0, 2, 7}));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<int64_t>{7}));
  EXPECT_EQ(a->data, (Bytes{9, 0, 0, 3, 0, 2, 7}));
}

TEST(IdxTest, RoundTripsUncompressedFile) {
  const std::string path = TempPath("images.raw");
  WriteRaw(path, SmallImages());
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a->data, Pattern(24));
}

TEST(IdxTest, RoundTripsLargerThanOneBufferAndEmptyArrays) {
  // 300000 bytes: several zlib buffers; dimension values above 255 check the
  // big-endian decoding.
  const std::string path = TempPath("big.gz");
  WriteGz(path, MakeIdx(kIdxMagicU8Images, {300, 1000, 1}, Pattern(300000)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<int64_t>{300, 1000, 1}));
  EXPECT_EQ(a->data, Pattern(300000));

  const std::string empty = TempPath("empty_array.gz");
  WriteGz(empty, MakeIdx(kIdxMagicU8Images, {0, 28, 28}, {}));
  a = ReadIdxFile(empty);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<int64_t>{0, 28, 28}));
  EXPECT_TRUE(a->data.empty());
}

TEST(IdxTest, MaxItemsReadsOnlyTheFirstItemsOfTheFirstDimension) {
  // 300 images of 1000 bytes, gzip and plain: the first 7 and their bytes.
  const Bytes file = MakeIdx(kIdxMagicU8Images, {300, 1000, 1}, Pattern(300000));
  const std::string gz = TempPath("limit.gz"), raw = TempPath("limit.raw");
  WriteGz(gz, file);
  WriteRaw(raw, file);
  const Bytes all = Pattern(300000);
  const Bytes first7(all.begin(), all.begin() + 7000);
  for (const std::string& path : {gz, raw}) {
    absl::StatusOr<IdxArray> a = ReadIdxFile(path, 7);
    ASSERT_TRUE(a.ok()) << path << ": " << a.status();
    EXPECT_EQ(a->dims, (std::vector<int64_t>{7, 1000, 1})) << path;
    EXPECT_EQ(a->data, first7) << path;
    // At or above the count: everything, as without a limit.
    for (int64_t limit : {300, 301}) {
      a = ReadIdxFile(path, limit);
      ASSERT_TRUE(a.ok()) << path << ": " << a.status();
      EXPECT_EQ(a->dims, (std::vector<int64_t>{300, 1000, 1})) << path;
      EXPECT_EQ(a->data, Pattern(300000)) << path;
    }
  }
  // Labels too.
  WriteGz(gz, MakeIdx(kIdxMagicU8Vector, {7}, Bytes{9, 0, 0, 3, 0, 2, 7}));
  absl::StatusOr<IdxArray> labels = ReadIdxFile(gz, 3);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(labels->dims, (std::vector<int64_t>{3}));
  EXPECT_EQ(labels->data, (Bytes{9, 0, 0}));
}

TEST(IdxTest, MaxItemsStillChecksWhatItReads) {
  // Truncated inside the first items: still an error naming the shortfall;
  // truncated after them: the limit never reads that far (idx.h), while a
  // full read fails.
  Bytes file = MakeIdx(kIdxMagicU8Images, {10, 2, 2}, Pattern(40));
  file.resize(file.size() - 8);  // the last two images are missing
  const std::string path = TempPath("limit_truncated.raw");
  WriteRaw(path, file);
  absl::StatusOr<IdxArray> a = ReadIdxFile(path, 9);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("expected 36 bytes"));
  a = ReadIdxFile(path, 8);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<int64_t>{8, 2, 2}));
  EXPECT_FALSE(ReadIdxFile(path).ok());
}

TEST(IdxTest, MissingFileIsNotFound) {
  const std::string path = TempPath("no-such-file.gz");
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
}

TEST(IdxTest, DirectoryIsAnError) {
  const std::string path = TempPath("a_directory");
  mkdir(path.c_str(), 0755);
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("directory"));
}

TEST(IdxTest, EveryTruncationOfAGzipFileIsAnErrorNamingTheFile) {
  const std::string whole = TempPath("whole.gz");
  WriteGz(whole, SmallImages());
  const Bytes gz = ReadRaw(whole);
  ASSERT_GT(gz.size(), 20u);
  const std::string path = TempPath("truncated.gz");
  for (size_t len = 0; len < gz.size(); ++len) {
    WriteRaw(path, Bytes(gz.begin(), gz.begin() + len));
    absl::StatusOr<IdxArray> a = ReadIdxFile(path);
    ASSERT_FALSE(a.ok()) << "truncated to " << len << " of " << gz.size() << " bytes";
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(path)) << len;
    EXPECT_THAT(std::string(a.status().message()), HasSubstr("truncated"))
        << len << ": " << a.status();
  }
}

TEST(IdxTest, EveryTruncationOfAnUncompressedFileIsAnError) {
  const Bytes raw = SmallImages();
  const std::string path = TempPath("truncated.raw");
  for (size_t len = 0; len < raw.size(); ++len) {
    WriteRaw(path, Bytes(raw.begin(), raw.begin() + len));
    absl::StatusOr<IdxArray> a = ReadIdxFile(path);
    ASSERT_FALSE(a.ok()) << "truncated to " << len << " bytes";
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(path)) << len;
  }
}

TEST(IdxTest, TruncatedPayloadSaysExpectedAndGotBytes) {
  const std::string path = TempPath("short.gz");
  WriteGz(path, MakeIdx(kIdxMagicU8Images, kImageDims, Pattern(23)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  const std::string message(a.status().message());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("expected 24 bytes"));
  EXPECT_THAT(message, HasSubstr("got 23"));
  EXPECT_THAT(message, HasSubstr("2 x 3 x 4"));
}

TEST(IdxTest, HugeDimensionsOnATinyFileFailWithoutAllocatingThem) {
  // Claims 10^11 bytes; the reader must report the truncation, not try to
  // allocate 100 GB.
  const std::string path = TempPath("liar.gz");
  WriteGz(path, MakeIdx(kIdxMagicU8Images, {100000, 1000, 1000}, Pattern(10)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("expected 100000000000 bytes"));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("got 10"));

  // 2^96 bytes: beyond any size the reader accepts.
  WriteGz(path, MakeIdx(kIdxMagicU8Images, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, Pattern(10)));
  a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
}

TEST(IdxTest, TrailingBytesAreAnError) {
  const std::string path = TempPath("long.gz");
  WriteGz(path, MakeIdx(kIdxMagicU8Images, kImageDims, Pattern(27)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("3 unexpected bytes"));

  WriteRaw(path, MakeIdx(kIdxMagicU8Vector, {3}, Bytes{1, 2, 3, 4}));
  a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("1 unexpected bytes"));
}

TEST(IdxTest, BadMagicIsAnError) {
  const std::string path = TempPath("bad_magic.gz");
  WriteGz(path, MakeIdx(0x12340803, kImageDims, Pattern(24)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("bad magic number 0x12340803"));

  // A text file, e.g. an HTML error page saved instead of the data.
  WriteRaw(path, Bytes{'<', 'h', 't', 'm', 'l', '>'});
  a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("not an IDX file"));
}

TEST(IdxTest, UnsupportedElementTypeIsAnError) {
  const std::string path = TempPath("floats.gz");
  WriteGz(path, MakeIdx(0x00000D03, kImageDims, Pattern(96)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("float32"));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("only unsigned bytes"));

  WriteGz(path, MakeIdx(0x00000703, kImageDims, Pattern(24)));
  a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("invalid element type 0x07"));
}

TEST(IdxTest, WrongDimensionCountIsAnError) {
  const std::string path = TempPath("dims.gz");
  for (uint32_t magic : {0x00000800u, 0x00000802u, 0x00000804u, 0x000008FFu}) {
    WriteGz(path, MakeIdx(magic, {2, 3, 4, 5}, Pattern(120)));
    absl::StatusOr<IdxArray> a = ReadIdxFile(path);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << std::hex << magic;
    EXPECT_THAT(std::string(a.status().message()), HasSubstr("number of IDX dimensions"));
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
  }
}

TEST(IdxTest, CorruptGzipIsAnError) {
  const std::string whole = TempPath("good.gz");
  WriteGz(whole, MakeIdx(kIdxMagicU8Images, {10, 10, 10}, Pattern(1000)));
  const Bytes gz = ReadRaw(whole);
  ASSERT_GT(gz.size(), 30u);
  const std::string path = TempPath("corrupt.gz");
  struct Case {
    size_t offset;
    const char* what;
  };
  // The compressed block header, the CRC-32 and the length in the trailer.
  for (const Case& c : {Case{10, "invalid"}, Case{gz.size() - 8, "incorrect data check"},
                        Case{gz.size() - 2, "incorrect length check"}}) {
    Bytes bad = gz;
    bad[c.offset] ^= 0xFF;
    WriteRaw(path, bad);
    absl::StatusOr<IdxArray> a = ReadIdxFile(path);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << c.offset;
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(c.what)) << a.status();
  }
}

TEST(IdxTest, AnySingleByteCorruptionNeverCrashes) {
  const std::string whole = TempPath("good2.gz");
  WriteGz(whole, SmallImages());
  const Bytes gz = ReadRaw(whole);
  const std::string path = TempPath("flipped.gz");
  int errors = 0;
  for (size_t i = 0; i < gz.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xFF}) {
      Bytes bad = gz;
      bad[i] ^= mask;
      WriteRaw(path, bad);
      absl::StatusOr<IdxArray> a = ReadIdxFile(path);
      if (a.ok()) {
        // Only header fields zlib does not check (time stamp, OS, ...) may
        // change without an error, and then the contents are intact.
        EXPECT_EQ(a->data, Pattern(24)) << "byte " << i;
      } else {
        ++errors;
        EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
      }
    }
  }
  EXPECT_GT(errors, static_cast<int>(gz.size()));
}

}  // namespace
}  // namespace dtrain::data
