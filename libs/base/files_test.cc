#include "libs/base/files.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"

namespace dtrain {
namespace {

TEST(ReadFileTest, ReadsWholeFilesAndNamesWhatIsMissing) {
  const std::string dir = FreshTestDir("read");
  const std::string big(200000, 'x');  // more than one read(2) buffer
  ASSERT_TRUE(WriteFileAtomically(dir + "/big", big + std::string("\0end", 4)).ok());
  absl::StatusOr<std::string> got = ReadFile(dir + "/big");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, big + std::string("\0end", 4));
  got = ReadFile(dir + "/missing");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find(dir + "/missing"), std::string::npos) << got.status();
  EXPECT_EQ(ReadFile(dir).status().code(), absl::StatusCode::kFailedPrecondition)
      << ReadFile(dir).status();
}

TEST(WriteFileAtomicallyTest, WritesAndReplacesContents) {
  const std::string dir = FreshTestDir("replace");
  const std::string path = dir + "/file";
  ASSERT_TRUE(WriteFileAtomically(path, "first\n").ok());
  EXPECT_EQ(ReadFileForTest(path), "first\n");
  ASSERT_TRUE(WriteFileAtomically(path, std::string("a\0b", 3)).ok());
  EXPECT_EQ(ReadFileForTest(path), std::string("a\0b", 3));
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_EQ(ReadFileForTest(path), "");
}

TEST(WriteFileAtomicallyTest, LeavesNoTemporaryFiles) {
  const std::string dir = FreshTestDir("notemp");
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "y").ok());
  // Only `file` is left: rmdir fails on anything else once it is removed.
  ASSERT_EQ(unlink((dir + "/file").c_str()), 0);
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "temporary files left in " << dir;
}

TEST(WriteFileAtomicallyTest, FilesAreReadableByOthers) {
  const std::string path = FreshTestDir("mode") + "/file";
  ASSERT_TRUE(WriteFileAtomically(path, "1234").ok());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(st.st_mode & S_IRGRP) << std::oct << st.st_mode;
  EXPECT_TRUE(st.st_mode & S_IROTH) << std::oct << st.st_mode;
}

TEST(WriteFileAtomicallyTest, MissingDirectoryIsNotFoundNamingThePath) {
  const std::string path = FreshTestDir("missing") + "/no/such/dir/file";
  absl::Status s = WriteFileAtomically(path, "x");
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("No such file or directory"), absl::string_view::npos) << s;
}

// WriteFileAtomically as an unprivileged user: root may write anywhere, so
// when the test runs as root a child process drops to `nobody` first.
absl::Status WriteAsUnprivileged(const std::string& path, const std::string& contents) {
  if (geteuid() != 0) return WriteFileAtomically(path, contents);
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string reply = "setuid failed";
    if (setgid(65534) == 0 && setuid(65534) == 0) {
      absl::Status s = WriteFileAtomically(path, contents);
      reply = absl::StrCat(static_cast<int>(s.code()), " ", s.message());
    }
    (void)!write(fds[1], reply.data(), reply.size());
    _exit(0);
  }
  close(fds[1]);
  std::string reply;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) reply.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const size_t space = reply.find(' ');
  int code = 0;
  if (space == std::string::npos || !absl::SimpleAtoi(reply.substr(0, space), &code)) {
    return absl::InternalError(absl::StrCat("child: ", reply));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), reply.substr(space + 1));
}

TEST(WriteFileAtomicallyTest, UnwritableDirectoryFailsAndKeepsTheOldFile) {
  const std::string dir = FreshTestDir("readonly");
  const std::string path = dir + "/file";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  ASSERT_EQ(chmod(dir.c_str(), 0555), 0);
  absl::Status s = WriteAsUnprivileged(path, "new");
  chmod(dir.c_str(), 0755);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("Permission denied"), absl::string_view::npos) << s;
  EXPECT_EQ(ReadFileForTest(path), "old");
}

TEST(WriteFileAtomicallyTest, ParentThatIsAFileFails) {
  const std::string dir = FreshTestDir("notdir");
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x").ok());
  const std::string path = dir + "/file/child";
  absl::Status s = WriteFileAtomically(path, "y");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("Not a directory"), absl::string_view::npos) << s;
  EXPECT_EQ(ReadFileForTest(dir + "/file"), "x");
}

TEST(WriteFileAtomicallyTest, PathThatIsADirectoryFails) {
  const std::string dir = FreshTestDir("isdir");
  const std::string path = dir + "/sub";
  mkdir(path.c_str(), 0755);
  absl::Status s = WriteFileAtomically(path, "x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST(WriteFileAtomicallyTest, EmptyPathIsInvalidArgument) {
  EXPECT_TRUE(absl::IsInvalidArgument(WriteFileAtomically("", "x")));
}

TEST(EnsurePrivateDirTest, CreatesItClosedAndRefusesOneOthersMayUse) {
  const std::string base = FreshTestDir("private");
  const std::string dir = base + "/mine";
  ASSERT_TRUE(EnsurePrivateDir(dir).ok());
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700);
  EXPECT_TRUE(EnsurePrivateDir(dir).ok()) << "an existing private directory is fine";
  const std::string open = base + "/open";
  ASSERT_EQ(mkdir(open.c_str(), 0700), 0);
  chmod(open.c_str(), 0777);
  absl::Status s = EnsurePrivateDir(open);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find(open), absl::string_view::npos) << s;
  const std::string link = base + "/link";
  ASSERT_EQ(symlink(dir.c_str(), link.c_str()), 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(EnsurePrivateDir(link))) << "a link is not followed";
}

TEST(BootIdTest, IsThisBootsAndStable) {
  const std::string id = BootId();
  EXPECT_EQ(id.size(), 36u) << id;  // a UUID
  EXPECT_EQ(BootId(), id);
}

}  // namespace
}  // namespace dtrain
