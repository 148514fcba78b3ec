// Files for tests: paths in the test's private temporary directory and its
// runfiles, and whole-file reads whose failure shows up as a failed comparison.
//
//   const std::string dir = FreshTestDir("restart");   // $TEST_TMPDIR/restart, empty
//   EXPECT_EQ(ReadFileForTest(dir + "/port"), "7070");
//   const std::string model = ReadFileForTest(RunfilePath("libs/onnx/testdata/lenet.onnx"));
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

// A data dependency's path in the test's runfiles:
// $TEST_SRCDIR/$TEST_WORKSPACE/<workspace_relative> ("./dtrain/..." outside
// Bazel), e.g. RunfilePath("libs/onnx/testdata/lenet.onnx").
std::string RunfilePath(absl::string_view workspace_relative);

// The whole file at `path`; "" when it cannot be read.
std::string ReadFileForTest(const std::string& path);

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_TESTING_H_
