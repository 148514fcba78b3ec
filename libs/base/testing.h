// Files for tests: paths in the test's private temporary directory and
// whole-file reads whose failure shows up as a failed comparison.
//
//   const std::string dir = FreshTestDir("restart");   // $TEST_TMPDIR/restart, empty
//   EXPECT_EQ(ReadFileForTest(dir + "/port"), "7070");
#ifndef DTRAIN_LIBS_BASE_TESTING_H_
#define DTRAIN_LIBS_BASE_TESTING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace dtrain {

// $TEST_TMPDIR/<name> (/tmp/<name> outside Bazel); nothing is created.
std::string TestTmpPath(absl::string_view name);

// TestTmpPath(name) with no file there (one left by an earlier run is removed).
std::string FreshTestPath(absl::string_view name);

// TestTmpPath(name) as an empty directory (what was there is removed).
std::string FreshTestDir(absl::string_view name);

// The whole file at `path`; "" when it cannot be read.
std::string ReadFileForTest(const std::string& path);

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_TESTING_H_
