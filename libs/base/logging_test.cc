#include "libs/base/logging.h"

#include <regex>
#include <string>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(LoggingTest, LineHasLevelTimeThreadAndLocation) {
  SetMinLogLevel(LogLevel::kInfo);
  testing::internal::CaptureStderr();
  DT_LOG(INFO) << "hello " << 42;
  std::string out = testing::internal::GetCapturedStderr();
  std::regex line(R"(I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ logging_test\.cc:\d+\] hello 42\n)");
  EXPECT_TRUE(std::regex_match(out, line)) << out;
}

TEST(LoggingTest, MinLevelFiltersAndSkipsEvaluation) {
  SetMinLogLevel(LogLevel::kWarning);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  testing::internal::CaptureStderr();
  DT_LOG(INFO) << "hidden " << count();
  DT_LOG(WARNING) << "shown " << count();
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(out.find("hidden"), std::string::npos);
  EXPECT_NE(out.find("shown 1"), std::string::npos);
  EXPECT_EQ(out[0], 'W');
  SetMinLogLevel(LogLevel::kInfo);
}

TEST(LoggingTest, ParseLogLevel) {
  LogLevel level;
  ASSERT_TRUE(ParseLogLevel("debug", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
  ASSERT_TRUE(ParseLogLevel("Warning", &level));
  EXPECT_EQ(level, LogLevel::kWarning);
  EXPECT_FALSE(ParseLogLevel("loud", &level));
}

TEST(LoggingDeathTest, CheckFailureAbortsWithMessage) {
  int x = 3;
  EXPECT_DEATH(DT_CHECK(x == 4) << "x was " << x, "Check failed: x == 4 x was 3");
}

}  // namespace
}  // namespace dtrain
