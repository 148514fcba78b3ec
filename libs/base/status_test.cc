#include "libs/base/status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  DT_ASSIGN_OR_RETURN(int half, Half(x));
  DT_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckQuarter(int x, int* out) {
  DT_ASSIGN_OR_RETURN(*out, Quarter(x));
  DT_RETURN_IF_ERROR(*out > 100 ? absl::OutOfRangeError("too big") : absl::OkStatus());
  return absl::OkStatus();
}

TEST(StatusTest, AssignOrReturnPropagatesValueAndError) {
  EXPECT_EQ(*Quarter(12), 3);
  absl::StatusOr<int> bad = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "3 is odd");
}

TEST(StatusTest, ReturnIfErrorStopsAtFirstError) {
  int out = 0;
  EXPECT_TRUE(CheckQuarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(CheckQuarter(800, &out).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CheckQuarter(7, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusTest, AnnotateKeepsCodeAndPrefixesMessage) {
  absl::Status s = Annotate(absl::NotFoundError("no such key"), "pull w0");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "pull w0: no such key");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "anything").ok());
}

TEST(StatusTest, ErrnoMapsToCodes) {
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open /x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EACCES, "open /x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ECONNREFUSED, "connect").code(), absl::StatusCode::kUnavailable);
  absl::Status s = ErrnoToStatus(ENOENT, "open /data/x.gz");
  EXPECT_NE(s.message().find("open /data/x.gz"), absl::string_view::npos);
  EXPECT_NE(s.message().find("No such file"), absl::string_view::npos);
}

}  // namespace
}  // namespace dtrain
