#include "libs/base/testing.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "libs/base/files.h"

namespace dtrain {

std::string TestTmpPath(absl::string_view name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

std::string FreshTestPath(absl::string_view name) {
  const std::string path = TestTmpPath(name);
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
  return path;
}

std::string FreshTestDir(absl::string_view name) {
  const std::string dir = TestTmpPath(name);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  std::filesystem::create_directories(dir, ignored);
  return dir;
}

std::string RunfilePath(absl::string_view workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "dtrain", "/", workspace_relative);
}

std::string ReadFileForTest(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  return bytes.ok() ? *std::move(bytes) : std::string();
}

}  // namespace dtrain
