#include "libs/checkpoint/checkpoint.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "libs/checkpoint/crc32c.h"

// ---------------------------------------------------------------------------
// Allocation tracking: replaces the global operator new for this test binary
// so tests can assert that reading a corrupt file never asks for a huge
// block. (operator new[] and the nothrow forms forward to this one.)
namespace {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

void* operator new(size_t size) {
  if (g_track_allocations.load(std::memory_order_relaxed)) {
    size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
    while (size > seen && !g_largest_allocation.compare_exchange_weak(seen, size)) {
    }
  }
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace dtrain {
namespace checkpoint {
namespace {

// Records the largest single allocation made while it is alive.
class AllocationTracker {
 public:
  AllocationTracker() {
    g_largest_allocation = 0;
    g_track_allocations = true;
  }
  ~AllocationTracker() { g_track_allocations = false; }
  size_t largest() const { return g_largest_allocation.load(); }
};

// ---------------------------------------------------------------------------
// Files.

// A fresh, empty directory for the current test under $TEST_TMPDIR.
std::string TestDir() {
  const char* root = std::getenv("TEST_TMPDIR");
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", info->test_suite_name(), ".",
                                 info->name());
  std::string rm = absl::StrCat("rm -rf '", dir, "'");
  EXPECT_EQ(std::system(rm.c_str()), 0);
  EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
  return dir;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// ---------------------------------------------------------------------------
// A reference encoder written from the layout table in checkpoint.h. It
// records where each field and each CRC is, so tests can patch fields and
// re-seal the CRCs to reach the reader's checks behind them.

struct Field {
  size_t offset;
  int width;
};

struct CrcSpan {
  size_t begin, end, at;  // CRC of bytes [begin, end), stored at `at`
};

struct Layout {
  std::string bytes;
  std::map<std::string, Field> fields;
  std::vector<CrcSpan> crcs;  // in the order they must be recomputed

  void Put(const std::string& name, uint64_t v, int width) {
    if (!name.empty()) fields[name] = {bytes.size(), width};
    for (int i = 0; i < width; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  void PutCrc(size_t begin) {
    crcs.push_back({begin, bytes.size(), bytes.size()});
    Put("", 0, 4);
  }
  // Overwrites a field (little-endian) without touching the CRCs.
  void Patch(const std::string& name, uint64_t v) {
    ASSERT_TRUE(fields.count(name)) << name;
    Field f = fields[name];
    for (int i = 0; i < f.width; ++i)
      bytes[f.offset + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  }
  uint64_t Get(const std::string& name) const {
    Field f = fields.at(name);
    uint64_t v = 0;
    for (int i = 0; i < f.width; ++i) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[f.offset + i])) << (8 * i);
    }
    return v;
  }
  // Recomputes every CRC over the (possibly patched) bytes.
  void Reseal() {
    for (const CrcSpan& c : crcs) {
      uint32_t crc = crc32c::Value(bytes.data() + c.begin, c.end - c.begin);
      for (int i = 0; i < 4; ++i) bytes[c.at + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
    }
  }
};

const char kMagicBytes[] =
    "\x89"
    "DTRAIN-CKPT\r\n\x1a\n";

Layout Encode(const std::vector<std::pair<std::string, std::string>>& metadata,
              const std::vector<TensorRecord>& tensors, uint32_t major = 1, uint32_t minor = 0,
              const std::string& extra_header = "") {
  Layout l;
  l.bytes.assign(kMagicBytes, 16);
  l.Put("header.major", major, 4);
  l.Put("header.minor", minor, 4);
  l.Put("header.header_size", 48 + extra_header.size(), 4);
  l.Put("header.metadata_count", metadata.size(), 4);
  l.Put("header.tensor_count", tensors.size(), 4);
  l.Put("header.file_size", 0, 8);  // patched below
  l.bytes += extra_header;
  l.PutCrc(0);
  for (size_t i = 0; i < metadata.size(); ++i) {
    std::string p = absl::StrCat("meta", i, ".");
    size_t begin = l.bytes.size();
    l.Put(p + "key_length", metadata[i].first.size(), 4);
    l.bytes += metadata[i].first;
    l.Put(p + "value_length", metadata[i].second.size(), 4);
    l.bytes += metadata[i].second;
    l.PutCrc(begin);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRecord& t = tensors[i];
    std::string p = absl::StrCat("tensor", i, ".");
    size_t begin = l.bytes.size();
    l.Put(p + "name_length", t.name.size(), 4);
    l.bytes += t.name;
    l.Put(p + "dtype", static_cast<uint32_t>(t.dtype), 4);
    l.Put(p + "rank", t.shape.size(), 4);
    for (size_t d = 0; d < t.shape.size(); ++d) {
      l.Put(absl::StrCat(p, "dim", d), static_cast<uint64_t>(t.shape[d]), 8);
    }
    l.Put(p + "data_length", t.data.size(), 8);
    l.PutCrc(begin);
    size_t data_begin = l.bytes.size();
    l.bytes += t.data;
    l.PutCrc(data_begin);
  }
  l.Put("footer.file_size", 0, 8);
  l.crcs.push_back({0, l.bytes.size(), l.bytes.size()});
  l.Put("", 0, 4);
  l.Patch("header.file_size", l.bytes.size());
  l.Patch("footer.file_size", l.bytes.size());
  l.Reseal();
  return l;
}

Layout Encode(const Checkpoint& ckpt) {
  return Encode({ckpt.metadata.begin(), ckpt.metadata.end()}, ckpt.tensors);
}

// ---------------------------------------------------------------------------
// Sample data.

std::string Floats(std::vector<float> values) {
  std::string s(values.size() * 4, '\0');
  std::memcpy(&s[0], values.data(), s.size());  // x86: already little-endian
  return s;
}

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s[i] = static_cast<char>(x >> 56);
  }
  return s;
}

// A small checkpoint touching every kind of field.
Checkpoint SmallCheckpoint() {
  Checkpoint c;
  c.metadata = {{"model", "lenet"}, {"step", "1200"}};
  c.tensors = {
      {"w", 0, {2, 3}, Floats({1, 2, 3, 4, 5, 6})},
      {"b", 0, {}, Floats({0.5f})},
      {"empty", 4, {0, 4}, ""},
  };
  return c;
}

void ExpectSame(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    SCOPED_TRACE(a.tensors[i].name);
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_TRUE(a.tensors[i].data == b.tensors[i].data);
  }
}

// ---------------------------------------------------------------------------
// Round trips and format.

TEST(CheckpointTest, RoundTripsDtypesShapesAndMetadata) {
  std::string dir = TestDir();
  std::string path = dir + "/model.dtckpt";
  Checkpoint c;
  c.metadata = {{"model", "lenet"},
                {"step", "1200"},
                {"optimizer", "sgd"},
                {"", "empty key"},
                {"binary", std::string("\0\xff\n", 3)}};
  std::vector<int64_t> rank8 = {1, 2, 1, 2, 1, 2, 1, 2};
  c.tensors = {
      {"conv1.weight", 0, {6, 1, 5, 5}, Bytes(6 * 25 * 4, 1)},
      {"conv1.bias", 0, {6}, Bytes(24, 2)},
      {"half", 1, {3}, Bytes(6, 3)},
      {"bf16", 2, {2, 2}, Bytes(8, 4)},
      {"int64", 4, {2, 2}, Bytes(32, 5)},
      {"bytes", 5, {7}, Bytes(7, 6)},
      {"scalar", 0, {}, Floats({3.25f})},
      {"zero_elements", 3, {0}, ""},
      {"zero_middle", 0, {2, 0, 3}, ""},
      {"rank8", 0, rank8, Bytes(16 * 4, 7)},
      {"odd dtype code", -7, {1}, "x"},
      {"big dtype code", 1 << 30, {2}, "yz"},
      {std::string("bin\0name", 8), 0, {1}, Floats({1})},
  };
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(c, *read);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"model.dtckpt"});
}

TEST(CheckpointTest, RoundTripsEmptyCheckpointAndEmptyMetadata) {
  std::string dir = TestDir();
  Checkpoint empty;
  ASSERT_TRUE(WriteCheckpoint(dir + "/empty", empty).ok());
  EXPECT_EQ(ReadBytes(dir + "/empty").size(), 60u);  // header + footer
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(dir + "/empty");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->metadata.empty());
  EXPECT_TRUE(read->tensors.empty());

  Checkpoint no_metadata;
  no_metadata.tensors = {{"t", 0, {2}, Floats({1, 2})}};
  ASSERT_TRUE(WriteCheckpoint(dir + "/no_metadata", no_metadata).ok());
  read = ReadCheckpoint(dir + "/no_metadata");
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(no_metadata, *read);

  Checkpoint only_metadata;
  only_metadata.metadata["step"] = "7";
  ASSERT_TRUE(WriteCheckpoint(dir + "/only_metadata", only_metadata).ok());
  read = ReadCheckpoint(dir + "/only_metadata");
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(only_metadata, *read);
}

TEST(CheckpointTest, BytesMatchTheDocumentedLayout) {
  std::string dir = TestDir();
  Checkpoint c = SmallCheckpoint();
  ASSERT_TRUE(WriteCheckpoint(dir + "/c", c).ok());
  std::string bytes = ReadBytes(dir + "/c");
  EXPECT_TRUE(bytes == Encode(c).bytes) << "the file format changed; bump the version";

  // Spot checks against the table itself, independent of the encoder above.
  ASSERT_TRUE(WriteCheckpoint(dir + "/e", Checkpoint()).ok());
  std::string e = ReadBytes(dir + "/e");
  ASSERT_EQ(e.size(), 60u);
  EXPECT_EQ(e.substr(0, 16), std::string(kMagicBytes, 16));
  EXPECT_EQ(e.substr(16, 28), std::string("\x01\0\0\0"           // major 1
                                          "\0\0\0\0"             // minor 0
                                          "\x30\0\0\0"           // header size 48
                                          "\0\0\0\0"             // metadata count
                                          "\0\0\0\0"             // tensor count
                                          "\x3c\0\0\0\0\0\0\0",  // file size 60
                                          28));
  EXPECT_EQ(e.substr(48, 8), std::string("\x3c\0\0\0\0\0\0\0", 8));
  uint32_t header_crc = crc32c::Value(e.data(), 44);
  EXPECT_EQ(std::memcmp(e.data() + 44, &header_crc, 4), 0);
  uint32_t file_crc = crc32c::Value(e.data(), 56);
  EXPECT_EQ(std::memcmp(e.data() + 56, &file_crc, 4), 0);
}

TEST(CheckpointTest, FindReturnsTheNamedTensor) {
  Checkpoint c = SmallCheckpoint();
  ASSERT_NE(c.Find("b"), nullptr);
  EXPECT_EQ(c.Find("b")->shape, std::vector<int64_t>{});
  EXPECT_EQ(c.Find("w"), &c.tensors[0]);
  EXPECT_EQ(c.Find("missing"), nullptr);
  EXPECT_EQ(c.Find(""), nullptr);
}

TEST(CheckpointTest, OverwritesAnExistingCheckpoint) {
  std::string dir = TestDir();
  std::string path = dir + "/ckpt";
  Checkpoint first = SmallCheckpoint();
  ASSERT_TRUE(WriteCheckpoint(path, first).ok());
  Checkpoint second;
  second.metadata["step"] = "2400";
  second.tensors = {{"w", 0, {1}, Floats({42})}};
  ASSERT_TRUE(WriteCheckpoint(path, second).ok());
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(second, *read);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointTest, ConcurrentWritersOfOnePathLeaveOneCompleteFile) {
  std::string dir = TestDir();
  std::string path = dir + "/ckpt";
  std::vector<Checkpoint> versions(4);
  for (int i = 0; i < 4; ++i) {
    versions[i].metadata["writer"] = std::to_string(i);
    versions[i].tensors = {{"t", 5, {40000}, Bytes(40000, i)}};
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 5; ++round) {
        if (!WriteCheckpoint(path, versions[i]).ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(versions[std::stoi(read->metadata.at("writer"))], *read);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointTest, LargeCheckpointRoundTripsQuickly) {
  std::string path = TestDir() + "/large";
  Checkpoint c;
  c.metadata["model"] = "big";
  for (int i = 0; i < 5; ++i) {
    c.tensors.push_back({absl::StrCat("layer", i, ".weight"), 0, {2500, 1000}, Bytes(10000000, i)});
  }
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  auto t1 = std::chrono::steady_clock::now();
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(path);
  auto t2 = std::chrono::steady_clock::now();
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(c, *read);
  double write_s = std::chrono::duration<double>(t1 - t0).count();
  double read_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("50 MB checkpoint: write %.3f s (with fsync), read %.3f s (%.0f MB/s)\n", write_s,
              read_s, 50 / read_s);
  // Generous for a shared 2-core machine; byte-at-a-time I/O or quadratic
  // copying takes far longer.
  EXPECT_LT(read_s, 3.0);
}

// ---------------------------------------------------------------------------
// Reading damaged files.

class DamagedFileTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir();
    ASSERT_TRUE(WriteCheckpoint(dir_ + "/good", SmallCheckpoint()).ok());
    good_ = ReadBytes(dir_ + "/good");
    ASSERT_GT(good_.size(), 200u);
    path_ = dir_ + "/damaged.dtckpt";
  }

  absl::Status ReadDamaged(const std::string& bytes) {
    WriteBytes(path_, bytes);
    return ReadCheckpoint(path_).status();
  }

  std::string dir_, good_, path_;
};

TEST_F(DamagedFileTest, TruncationAtEveryOffsetIsReported) {
  for (size_t size = 0; size < good_.size(); ++size) {
    absl::Status s = ReadDamaged(good_.substr(0, size));
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << size << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "truncated")) << size << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), path_)) << s;
  }
  absl::Status s = ReadDamaged(good_.substr(0, good_.size() - 1));
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(good_.size(), " bytes"))) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(good_.size() - 1))) << s;
}

TEST_F(DamagedFileTest, AppendedBytesAreReported) {
  absl::Status s = ReadDamaged(good_ + "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  s = ReadDamaged(good_ + good_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(DamagedFileTest, EveryFlippedBitIsDetected) {
  for (size_t offset = 0; offset < good_.size(); ++offset) {
    for (int mask : {0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xFF}) {
      std::string bytes = good_;
      bytes[offset] = static_cast<char>(bytes[offset] ^ mask);
      absl::Status s = ReadDamaged(bytes);
      // Inside the magic the file is no checkpoint at all; anywhere else
      // it is a damaged one.
      absl::StatusCode expected =
          offset < 16 ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kDataLoss;
      ASSERT_EQ(s.code(), expected) << "offset " << offset << " mask " << mask << ": " << s;
    }
  }
}

TEST_F(DamagedFileTest, ChecksumErrorsNameTheRecord) {
  Layout l = Encode(SmallCheckpoint());
  ASSERT_TRUE(l.bytes == good_);
  // Last byte of tensor 0's data ("w").
  std::string bytes = good_;
  size_t data_end = l.fields["tensor1.name_length"].offset - 5;
  bytes[data_end] ^= 0x10;
  absl::Status s = ReadDamaged(bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "checksum mismatch in the data of tensor 'w'")) << s;
  // Tensor 2's dtype.
  bytes = good_;
  bytes[l.fields["tensor2.dtype"].offset] ^= 0x01;
  s = ReadDamaged(bytes);
  EXPECT_TRUE(absl::StrContains(s.message(), "header of tensor record 2")) << s;
  // Metadata entry 1's value.
  bytes = good_;
  bytes[l.fields["tensor0.name_length"].offset - 5] ^= 0x01;
  s = ReadDamaged(bytes);
  EXPECT_TRUE(absl::StrContains(s.message(), "metadata entry 1")) << s;
  // The header.
  bytes = good_;
  bytes[l.fields["header.tensor_count"].offset] ^= 0x01;
  s = ReadDamaged(bytes);
  EXPECT_TRUE(absl::StrContains(s.message(), "header checksum")) << s;
  // The footer's copy of the size.
  bytes = good_;
  bytes[l.fields["footer.file_size"].offset] ^= 0x01;
  s = ReadDamaged(bytes);
  EXPECT_TRUE(absl::StrContains(s.message(), "footer")) << s;
  // The whole-file CRC itself.
  bytes = good_;
  bytes[bytes.size() - 1] ^= 0x01;
  s = ReadDamaged(bytes);
  EXPECT_TRUE(absl::StrContains(s.message(), "whole-file checksum")) << s;
}

TEST_F(DamagedFileTest, MissingFileIsNotFound) {
  absl::Status s = ReadCheckpoint(dir_ + "/no_such_file").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), dir_ + "/no_such_file")) << s;
}

TEST_F(DamagedFileTest, DirectoryIsNotACheckpoint) {
  absl::Status s = ReadCheckpoint(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), dir_)) << s;
}

TEST_F(DamagedFileTest, BadMagicIsNotACheckpoint) {
  for (std::string bytes : {std::string("{\"model\": \"lenet\", \"step\": 1200}\n"),
                            std::string("PK\x03\x04"), std::string(100, '\0')}) {
    absl::Status s = ReadDamaged(bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "not a dtrain checkpoint")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), path_)) << s;
  }
  // Text-mode copies in either direction.
  for (std::string bytes : {absl::StrReplaceAll(good_, {{"\n", "\r\n"}}),
                            absl::StrReplaceAll(good_, {{"\r\n", "\n"}})}) {
    absl::Status s = ReadDamaged(bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "line endings")) << s;
  }
}

TEST_F(DamagedFileTest, NewerMajorVersionIsRejectedNamingBothVersions) {
  Layout l = Encode(SmallCheckpoint());
  l.Patch("header.major", 2);
  l.Patch("header.minor", 3);
  l.Reseal();  // a genuine file from a newer writer
  absl::Status s = ReadDamaged(l.bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "format version 2.3")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "reads format version 1.x")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path_)) << s;

  // A future version may lay out everything after its header differently.
  std::string future = l.bytes.substr(0, 48) + "entirely different body";
  EXPECT_EQ(ReadDamaged(future).code(), absl::StatusCode::kFailedPrecondition);

  // The same field damaged in a version-1 file is corruption.
  l = Encode(SmallCheckpoint());
  l.Patch("header.major", 2);
  s = ReadDamaged(l.bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "claims format version 2.0")) << s;

  l = Encode(SmallCheckpoint());
  l.Patch("header.major", 0);
  l.Reseal();
  EXPECT_EQ(ReadDamaged(l.bytes).code(), absl::StatusCode::kDataLoss);
}

TEST_F(DamagedFileTest, NewerMinorVersionWithLongerHeaderIsRead) {
  Checkpoint c = SmallCheckpoint();
  Layout l =
      Encode({c.metadata.begin(), c.metadata.end()}, c.tensors, 1, 1, std::string("new field", 9));
  WriteBytes(path_, l.bytes);
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(c, *read);
  // In 1.0 the header is exactly 48 bytes.
  l.Patch("header.minor", 0);
  l.Reseal();
  EXPECT_EQ(ReadDamaged(l.bytes).code(), absl::StatusCode::kDataLoss);
}

TEST_F(DamagedFileTest, DuplicatesInTheFileAreReported) {
  std::vector<TensorRecord> twice = {{"w", 0, {1}, Floats({1})}, {"w", 0, {1}, Floats({2})}};
  absl::Status s = ReadDamaged(Encode({}, twice).bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "duplicate tensor name 'w'")) << s;
  s = ReadDamaged(Encode({{"step", "1"}, {"step", "2"}}, {}).bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "duplicate metadata key 'step'")) << s;
}

// Each case patches one field to a hostile value and re-seals every CRC, so
// the reader's range checks are all that stands between it and the value.
TEST_F(DamagedFileTest, HostileLengthsAndCountsFailWithoutLargeAllocations) {
  struct Case {
    std::string field;
    uint64_t value;
    std::string message;
  };
  const uint64_t k2to60 = uint64_t{1} << 60;
  std::vector<Case> cases = {
      {"tensor0.data_length", k2to60, "data length 1152921504606846976"},
      {"tensor0.data_length", 1 << 20, "bytes left before the footer"},
      {"tensor2.data_length", 1, "bytes left before the footer"},
      {"tensor0.name_length", 0xFFFFFFFF, "name length 4294967295"},
      {"tensor0.name_length", 4096, "remain before the footer"},
      {"tensor0.name_length", 0, "name length 0"},
      {"tensor0.rank", 0xFFFFFFFF, "rank 4294967295"},
      {"tensor0.rank", 9, "rank 9 exceeds"},
      {"tensor0.rank", 8, "checksum mismatch in the header of tensor record 0"},
      {"tensor0.dim0", uint64_t{1} << 62, "overflows int64"},
      {"tensor0.dim1", ~uint64_t{0}, "negative dimension"},
      {"meta0.key_length", 0xFFFFFFFF, "key length 4294967295"},
      {"meta0.key_length", 4000, "remain before the footer"},
      {"meta1.value_length", 0xFFFFFFFF, "value length 4294967295"},
      {"meta1.value_length", 1 << 24, "remain before the footer"},
      {"header.tensor_count", 0xFFFFFFFF, "cannot fit"},
      {"header.metadata_count", 0xFFFFFFFF, "cannot fit"},
      {"header.tensor_count", 4, "remain before the footer"},
      {"header.tensor_count", 2, "unexpected bytes"},
      {"header.metadata_count", 3, "checksum mismatch"},  // parses a record as an entry
      {"header.file_size", k2to60, "truncated: header says the file has 1152921504606846976"},
      {"header.header_size", 0xFFFFFFFF, "invalid header size"},
      {"header.header_size", 47, "invalid header size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field + " = " + std::to_string(c.value));
    Layout l = Encode(SmallCheckpoint());
    l.Patch(c.field, c.value);
    l.Reseal();
    WriteBytes(path_, l.bytes);
    absl::Status s;
    size_t largest;
    {
      AllocationTracker tracker;
      s = ReadCheckpoint(path_).status();
      largest = tracker.largest();
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), c.message)) << s;
    EXPECT_LT(largest, 1u << 20);
  }
}

// Every integer field set to every troublesome value, CRCs re-sealed: the
// reader may accept the file (a dtype code is anything the caller likes) but
// must never crash or allocate much.
TEST_F(DamagedFileTest, ResealedFieldSweepNeverCrashes) {
  const Layout original = Encode(SmallCheckpoint());
  int accepted = 0, rejected = 0;
  for (const auto& [name, field] : original.fields) {
    uint64_t old = original.Get(name);
    for (uint64_t value :
         {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{8}, uint64_t{9}, old - 1, old + 1,
          uint64_t{0x7FFFFFFF}, uint64_t{0x80000000}, uint64_t{0xFFFFFFFF}, uint64_t{1} << 32,
          uint64_t{1} << 60, uint64_t{1} << 63, ~uint64_t{0}}) {
      Layout l = original;
      l.Patch(name, value);
      l.Reseal();
      WriteBytes(path_, l.bytes);
      AllocationTracker tracker;
      absl::StatusOr<Checkpoint> read = ReadCheckpoint(path_);
      EXPECT_LT(tracker.largest(), 1u << 20) << name << " = " << value;
      (read.ok() ? accepted : rejected)++;
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("re-sealed sweep: %d accepted, %d rejected\n", accepted, rejected);
}

// ---------------------------------------------------------------------------
// Failed writes.

TEST(CheckpointWriteTest, MissingDirectoryFailsAndCreatesNothing) {
  std::string dir = TestDir();
  std::string path = dir + "/no_such_dir/ckpt";
  absl::Status s = WriteCheckpoint(path, SmallCheckpoint());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  EXPECT_FALSE(Exists(dir + "/no_such_dir"));
  EXPECT_TRUE(ListDir(dir).empty());
}

TEST(CheckpointWriteTest, PathThatIsADirectoryFailsAndLeavesItAlone) {
  std::string dir = TestDir();
  std::string path = dir + "/ckpt";
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  WriteBytes(path + "/inside", "keep me");
  absl::Status s = WriteCheckpoint(path, SmallCheckpoint());
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rename")) << s;
  EXPECT_EQ(ReadBytes(path + "/inside"), "keep me");
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointWriteTest, FailureMidWriteKeepsThePreviousCheckpoint) {
  std::string dir = TestDir();
  std::string path = dir + "/ckpt";
  ASSERT_TRUE(WriteCheckpoint(path, SmallCheckpoint()).ok());
  std::string before = ReadBytes(path);

  Checkpoint big;
  big.tensors = {{"big", 5, {4 << 20}, Bytes(4 << 20, 9)}};
  // Files may not grow past 1 MiB while the limit is set, so write(2) fails
  // with EFBIG part-way through the temporary file.
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit limited = saved;
  limited.rlim_cur = 1 << 20;
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  absl::Status s = WriteCheckpoint(path, big);
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "write checkpoint " + path)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "File too large")) << s;
  EXPECT_TRUE(ReadBytes(path) == before);
  EXPECT_TRUE(ReadCheckpoint(path).ok());
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointWriteTest, InvalidCheckpointsAreRejectedBeforeTouchingTheFile) {
  std::string dir = TestDir();
  std::string path = dir + "/ckpt";
  ASSERT_TRUE(WriteCheckpoint(path, SmallCheckpoint()).ok());
  std::string before = ReadBytes(path);

  auto with_tensor = [](TensorRecord t) {
    Checkpoint c = SmallCheckpoint();
    c.tensors.push_back(std::move(t));
    return c;
  };
  struct Case {
    Checkpoint ckpt;
    std::string message;
  };
  std::vector<Case> cases = {
      {with_tensor({"", 0, {}, "abcd"}), "empty name"},
      {with_tensor({"w", 0, {1}, "abcd"}), "duplicate tensor name 'w'"},
      {with_tensor({std::string(4097, 'n'), 0, {}, ""}), "exceeds the limit of 4096"},
      {with_tensor({"r", 0, std::vector<int64_t>(9, 1), "abcd"}), "rank 9"},
      {with_tensor({"neg", 0, {2, -1}, ""}), "negative dimension"},
      {with_tensor({"huge", 0, {int64_t{1} << 40, int64_t{1} << 40}, ""}), "overflows int64"},
  };
  Checkpoint long_key = SmallCheckpoint();
  long_key.metadata[std::string(5000, 'k')] = "v";
  cases.push_back({long_key, "metadata key of 5000 bytes"});
  for (const Case& c : cases) {
    absl::Status s = WriteCheckpoint(path, c.ckpt);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), c.message)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  }
  EXPECT_TRUE(ReadBytes(path) == before);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"ckpt"});
  EXPECT_EQ(WriteCheckpoint("", SmallCheckpoint()).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// ValidateRecord.

TEST(ValidateRecordTest, AcceptsDenseTensors) {
  EXPECT_TRUE(ValidateRecord({"w", 0, {2, 3}, std::string(24, 'x')}, 4).ok());
  EXPECT_TRUE(ValidateRecord({"scalar", 0, {}, std::string(4, 'x')}, 4).ok());
  EXPECT_TRUE(ValidateRecord({"none", 0, {0}, ""}, 4).ok());
  EXPECT_TRUE(ValidateRecord({"none", 0, {5, 0, 7}, ""}, 8).ok());
  EXPECT_TRUE(ValidateRecord({"u8", 5, {3}, "abc"}, 1).ok());
}

TEST(ValidateRecordTest, RejectsInconsistentTensors) {
  absl::Status s = ValidateRecord({"w", 0, {2, 3}, std::string(20, 'x')}, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "'w'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "data has 20 bytes, expected 24")) << s;
  EXPECT_FALSE(ValidateRecord({"scalar", 0, {}, ""}, 4).ok());
  EXPECT_FALSE(ValidateRecord({"none", 0, {0}, "x"}, 4).ok());
  EXPECT_FALSE(ValidateRecord({"neg", 0, {-2, -3}, std::string(24, 'x')}, 4).ok());
  EXPECT_FALSE(ValidateRecord({"w", 0, {2, 3}, std::string(24, 'x')}, 0).ok());
  EXPECT_FALSE(ValidateRecord({"w", 0, {2, 3}, std::string(24, 'x')}, -4).ok());
  EXPECT_FALSE(ValidateRecord({"big", 0, {int64_t{1} << 62}, ""}, 4).ok());
  EXPECT_FALSE(ValidateRecord({"r9", 0, std::vector<int64_t>(9, 1), "x"}, 1).ok());
}

}  // namespace
}  // namespace checkpoint
}  // namespace dtrain
