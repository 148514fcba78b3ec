#include "libs/agent/model_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/sha256.h"

namespace dtrain {
namespace agent {
namespace {

namespace v1 = scheduler::v1;

// The scheduler's side of GetModel: serves `bytes` in pieces, counts calls.
class ModelServer : public ClusterClient {
 public:
  absl::StatusOr<v1::RegisterTrainerReply> RegisterTrainer(
      const v1::RegisterTrainerRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::HeartbeatReply> Heartbeat(const v1::HeartbeatRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::ReportProgressReply> ReportProgress(const v1::ProgressReport&) override {
    return absl::UnimplementedError("");
  }
  std::unique_ptr<collective::Store> RendezvousStore(const std::string&, const std::string&,
                                                     int) override {
    return nullptr;
  }
  absl::Status GetModel(const v1::GetModelRequest& request,
                        const std::function<absl::Status(absl::string_view)>& sink) override {
    ++calls;
    last = request;
    for (size_t off = 0; off < bytes.size(); off += 777) {
      if (absl::Status s = sink(absl::string_view(bytes).substr(off, 777)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::string bytes;
  int calls = 0;
  v1::GetModelRequest last;
};

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

class ModelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.bytes = std::string(5000, 'x');
    for (size_t i = 0; i < server_.bytes.size(); ++i) server_.bytes[i] = static_cast<char>(i * 13);
    digest_ = "sha256:" + Sha256Hex(server_.bytes);
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "/models");
    path_ = dir_ + "/" + digest_.substr(7);
  }
  ModelServer server_;
  std::string digest_, dir_, path_;
};

TEST_F(ModelCacheTest, FetchesOnceThenReusesTheVerifiedFile) {
  ASSERT_TRUE(FetchModel(&server_, "trainer-1", "job-7", digest_, path_).ok());
  EXPECT_EQ(server_.calls, 1);
  EXPECT_EQ(server_.last.trainer_id(), "trainer-1");
  EXPECT_EQ(server_.last.job_id(), "job-7");
  EXPECT_EQ(server_.last.digest(), digest_);
  EXPECT_EQ(ReadAll(path_), server_.bytes);
  ASSERT_TRUE(FetchModel(&server_, "trainer-1", "job-8", digest_, path_).ok());
  EXPECT_EQ(server_.calls, 1) << "the cached file is used";
}

TEST_F(ModelCacheTest, BytesThatAreNotTheDigestAreDeletedWithDataLoss) {
  // Damaged on the way.
  std::string good = server_.bytes;
  server_.bytes[100] ^= 1;
  absl::Status s = FetchModel(&server_, "t", "j", digest_, path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(digest_), std::string::npos) << s;
  EXPECT_FALSE(Exists(path_));
  // Damaged in the cache: deleted, the attempt fails, the next one fetches.
  server_.bytes = good;
  ASSERT_TRUE(FetchModel(&server_, "t", "j", digest_, path_).ok());
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << "not the model";
  s = FetchModel(&server_, "t", "j", digest_, path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(Exists(path_));
  ASSERT_TRUE(FetchModel(&server_, "t", "j", digest_, path_).ok());
  EXPECT_EQ(ReadAll(path_), good);
  EXPECT_EQ(server_.calls, 3);
}

TEST_F(ModelCacheTest, AFailedFetchLeavesNothing) {
  class Failing : public ModelServer {
    absl::Status GetModel(const v1::GetModelRequest&,
                          const std::function<absl::Status(absl::string_view)>& sink) override {
      (void)sink("partial");
      return absl::UnavailableError("scheduler gone");
    }
  } failing;
  absl::Status s = FetchModel(&failing, "t", "j", digest_, path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_FALSE(Exists(path_));
  EXPECT_EQ(system(absl::StrCat("test -z \"$(ls -A ", dir_, ")\"").c_str()), 0)
      << "no partial file left";
}

}  // namespace
}  // namespace agent
}  // namespace dtrain
