#include "libs/collective/store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace collective {
namespace {

std::string TempDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base ? base : "/tmp", "/", name, "-", getpid(), "-", counter++);
}

enum class Kind { kMemory, kFile, kPrefix };

class StoreTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Kind::kMemory:
        store_ = std::make_unique<InMemoryStore>();
        break;
      case Kind::kFile:
        store_ = std::make_unique<FileStore>(TempDir("store") + "/nested/dir");
        break;
      case Kind::kPrefix:
        base_ = std::make_unique<InMemoryStore>();
        store_ = std::make_unique<PrefixStore>("job7/", base_.get());
        break;
    }
  }
  std::unique_ptr<Store> base_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, SetThenGet) {
  ASSERT_TRUE(store_->Set("a/b", "value one").ok());
  auto got = store_->Get("a/b", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "value one");
  ASSERT_TRUE(store_->Set("a/b", "two").ok());  // overwrite
  EXPECT_EQ(*store_->Get("a/b", absl::Seconds(1)), "two");
}

TEST_P(StoreTest, BinaryKeysAndValues) {
  std::string key("we\x01ird/.. key", 13);
  std::string value("\0\xff\n", 3);
  ASSERT_TRUE(store_->Set(key, value).ok());
  ASSERT_TRUE(store_->Set("", "empty key").ok());
  EXPECT_EQ(*store_->Get(key, absl::Seconds(1)), value);
  EXPECT_EQ(*store_->Get("", absl::Seconds(1)), "empty key");
}

TEST_P(StoreTest, GetTimesOutNamingTheKey) {
  absl::Time start = absl::Now();
  auto got = store_->Get("never", absl::Milliseconds(100));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("never"), std::string::npos) << got.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_P(StoreTest, GetWaitsForALaterSet) {
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(store_->Set("late", "here").ok());
  });
  auto got = store_->Get("late", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
}

TEST_P(StoreTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(store_->Add("counter", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  auto value = store_->Add("counter", 0);
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, kThreads * kAdds);
  EXPECT_EQ(*store_->Get("counter", absl::Seconds(1)), absl::StrCat(kThreads * kAdds));
  EXPECT_EQ(*store_->Add("counter", -kThreads * kAdds), 0);
}

TEST_P(StoreTest, AddOnANonNumberFails) {
  ASSERT_TRUE(store_->Set("text", "hello").ok());
  EXPECT_EQ(store_->Add("text", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(StoreTest, Barrier) {
  constexpr int kThreads = 3;
  std::vector<std::thread> threads;
  std::atomic<int> passed{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      EXPECT_TRUE(StoreBarrier(*store_, "b", kThreads, absl::Seconds(10)).ok());
      ++passed;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(passed, kThreads);
  // A barrier that not everyone reaches times out.
  EXPECT_EQ(StoreBarrier(*store_, "b2", 2, absl::Milliseconds(50)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

INSTANTIATE_TEST_SUITE_P(All, StoreTest,
                         ::testing::Values(Kind::kMemory, Kind::kFile, Kind::kPrefix),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           switch (info.param) {
                             case Kind::kMemory:
                               return "InMemory";
                             case Kind::kFile:
                               return "File";
                             case Kind::kPrefix:
                               return "Prefix";
                           }
                           return "?";
                         });

TEST(PrefixStoreTest, KeysLandUnderThePrefix) {
  InMemoryStore base;
  PrefixStore a("a/", &base), b("b/", &base);
  ASSERT_TRUE(a.Set("k", "1").ok());
  ASSERT_TRUE(b.Set("k", "2").ok());
  EXPECT_EQ(*base.Get("a/k", absl::Seconds(1)), "1");
  EXPECT_EQ(*base.Get("b/k", absl::Seconds(1)), "2");
}

TEST(FileStoreTest, AddIsAtomicAcrossProcesses) {
  const std::string dir = TempDir("filestore-procs");
  constexpr int kProcs = 4;
  constexpr int kAdds = 25;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      FileStore store(dir);
      for (int i = 0; i < kAdds; ++i) {
        if (!store.Add("n", 1).ok()) _exit(1);
      }
      if (!store.Set(absl::StrCat("done/", p), "1").ok()) _exit(1);
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  FileStore store(dir);
  EXPECT_EQ(*store.Add("n", 0), kProcs * kAdds);
  for (int p = 0; p < kProcs; ++p) {
    EXPECT_TRUE(store.Get(absl::StrCat("done/", p), absl::Seconds(1)).ok());
  }
}

}  // namespace
}  // namespace collective
}  // namespace dtrain
