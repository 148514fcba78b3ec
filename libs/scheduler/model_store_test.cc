#include "libs/scheduler/model_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

std::string TestDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + seed);
  return s;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int FilesIn(const std::string& dir) {
  int n = 0;
  for (const std::string& sub : {"/sha256", "/tmp"}) {
    std::string cmd = absl::StrCat("ls -A ", dir, sub, " | wc -l");
    FILE* p = popen(cmd.c_str(), "r");
    int k = 0;
    if (fscanf(p, "%d", &k) != 1) k = -1;
    pclose(p);
    n += k;
  }
  return n;
}

absl::StatusOr<ModelStore::Stored> Put(ModelStore* store, const std::string& bytes,
                                       size_t chunk = 1000) {
  auto up = store->BeginUpload(ModelDigestOf(bytes), static_cast<int64_t>(bytes.size()));
  if (!up.ok()) return up.status();
  for (size_t off = 0; off < bytes.size(); off += chunk) {
    if (absl::Status s = (*up)->Append(absl::string_view(bytes).substr(off, chunk)); !s.ok()) {
      return s;
    }
  }
  return (*up)->Commit();
}

TEST(ModelStore, StoresByDigestAndSurvivesReopening) {
  const std::string dir = TestDir("store");
  const std::string bytes = Bytes(10000, 1);
  {
    auto store = ModelStore::Open({.dir = dir});
    ASSERT_TRUE(store.ok()) << store.status();
    auto stored = Put(store->get(), bytes);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->digest, ModelDigestOf(bytes));
    EXPECT_EQ(stored->bytes, 10000);
    EXPECT_FALSE(stored->existed);
    // Again: nothing written.
    auto again = Put(store->get(), bytes);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->existed);
  }
  auto reopened = ModelStore::Open({.dir = dir});
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto path = (*reopened)->Find(ModelDigestOf(bytes));
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(ReadAll(*path), bytes);
  EXPECT_EQ(*path, absl::StrCat(dir, "/sha256/", ModelDigestOf(bytes).substr(7)));
  EXPECT_EQ(FilesIn(dir), 1) << "no temporary file left";
  EXPECT_EQ((*reopened)->Find(ModelDigestOf("other")).status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelStore, RefusesOverTheCapAsSoonAsExceeded) {
  const std::string dir = TestDir("cap");
  auto store = ModelStore::Open({.dir = dir, .max_model_bytes = 4096});
  ASSERT_TRUE(store.ok());
  const std::string big = Bytes(5000, 2);
  // The header says too much.
  auto up = (*store)->BeginUpload(ModelDigestOf(big), 5000);
  ASSERT_EQ(up.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(up.status().message().find("cap of 4096 bytes"), std::string::npos) << up.status();
  EXPECT_NE(up.status().message().find("--max_model_bytes"), std::string::npos);
  // The header lies (says 4000): the data over the cap is refused at the
  // chunk that crosses it, before the rest arrives.
  auto liar = (*store)->BeginUpload(ModelDigestOf(big), 4000);
  ASSERT_TRUE(liar.ok()) << liar.status();
  ASSERT_TRUE((*liar)->Append(absl::string_view(big).substr(0, 4000)).ok());
  absl::Status over = (*liar)->Append(absl::string_view(big).substr(4000, 1000));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_EQ((*liar)->received(), 4000);
  liar->reset();
  EXPECT_EQ(FilesIn(dir), 0) << "the refused upload's temporary file is gone";
}

TEST(ModelStore, RefusesTruncatedOversizedAndDamagedUploads) {
  auto store = ModelStore::Open({.dir = TestDir("bad")});
  ASSERT_TRUE(store.ok());
  const std::string bytes = Bytes(3000, 3);
  const std::string digest = ModelDigestOf(bytes);
  {
    auto up = (*store)->BeginUpload(digest, 3000);
    ASSERT_TRUE(up.ok());
    ASSERT_TRUE((*up)->Append(absl::string_view(bytes).substr(0, 2000)).ok());
    auto c = (*up)->Commit();
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("after 2000 of the header's 3000 bytes"), std::string::npos)
        << c.status();
  }
  {
    auto up = (*store)->BeginUpload(digest, 2000);
    ASSERT_TRUE(up.ok());
    EXPECT_EQ((*up)->Append(bytes).code(), absl::StatusCode::kInvalidArgument);
  }
  {
    std::string damaged = bytes;
    damaged[1234] ^= 0x40;
    auto up = (*store)->BeginUpload(digest, 3000);
    ASSERT_TRUE(up.ok());
    ASSERT_TRUE((*up)->Append(damaged).ok());
    auto c = (*up)->Commit();
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("not the header's"), std::string::npos) << c.status();
  }
  EXPECT_EQ((*store)->Find(digest).status().code(), absl::StatusCode::kNotFound);
  for (const char* bad : {"", "sha256:", "md5:abc", "sha256:ABCDEF", "sha256:../../etc/passwd"}) {
    EXPECT_EQ((*store)->BeginUpload(bad, 10).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_EQ((*store)->Find(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ((*store)->BeginUpload(digest, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelStore, CollectsUnreferencedFilesAfterTheGraceAndStaleTemporaryFiles) {
  const std::string dir = TestDir("gc");
  absl::Time now = absl::Now();
  auto store = ModelStore::Open({.dir = dir, .now = [&] { return now; }});
  ASSERT_TRUE(store.ok());
  const std::string kept = Bytes(100, 4), dropped = Bytes(100, 5);
  ASSERT_TRUE(Put(store->get(), kept).ok());
  ASSERT_TRUE(Put(store->get(), dropped).ok());
  // A temporary file of an upload that never ended.
  auto pending = (*store)->BeginUpload(ModelDigestOf(Bytes(50, 6)), 50);
  ASSERT_TRUE(pending.ok());
  ASSERT_TRUE((*pending)->Append(Bytes(10, 6)).ok());
  // Within the grace nothing goes, referenced or not.
  EXPECT_EQ((*store)->CollectGarbage({ModelDigestOf(kept)}), 0);
  now += absl::Hours(2);
  EXPECT_EQ((*store)->CollectGarbage({ModelDigestOf(kept)}), 2);  // dropped + the temp file
  EXPECT_TRUE((*store)->Find(ModelDigestOf(kept)).ok());
  EXPECT_EQ((*store)->Find(ModelDigestOf(dropped)).status().code(), absl::StatusCode::kNotFound);
  // Find refreshed `kept`: unreferenced now, it stays for another grace.
  EXPECT_EQ((*store)->CollectGarbage({}), 0);
  now += absl::Hours(2);
  EXPECT_EQ((*store)->CollectGarbage({}), 1);
  EXPECT_EQ(FilesIn(dir), 0);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
