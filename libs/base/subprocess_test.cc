#include "libs/base/subprocess.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"

namespace dtrain {
namespace {

bool ProcessExists(pid_t pid) { return kill(pid, 0) == 0; }

std::unique_ptr<Subprocess> StartOrDie(SubprocessOptions options) {
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(options);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? *std::move(child) : nullptr;
}

std::unique_ptr<Subprocess> Shell(const std::string& script, const std::string& output = "") {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  options.output_file = output;
  return StartOrDie(options);
}

TEST(SubprocessTest, ExitCodeOfAShell) {
  auto child = Shell("exit 3");
  ASSERT_NE(child, nullptr);
  absl::StatusOr<ExitStatus> status = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->exited());
  EXPECT_EQ(status->exit_code(), 3);
  EXPECT_FALSE(status->success());
  EXPECT_FALSE(status->signaled());
  EXPECT_EQ(status->ToString(), "exited with status 3");
  // Waiting again returns the same status; the child is gone.
  absl::StatusOr<ExitStatus> again = child->Wait(absl::ZeroDuration());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->exit_code(), 3);
  EXPECT_FALSE(child->Running());
  EXPECT_TRUE(absl::IsFailedPrecondition(child->Signal(SIGTERM)));
}

TEST(SubprocessTest, ArgumentsEnvironmentAndOutputFile) {
  const std::string out = TestTmpPath("args.log");
  std::remove(out.c_str());
  setenv("DTRAIN_SUBPROCESS_TEST_INHERITED", "from-parent", 1);
  setenv("DTRAIN_SUBPROCESS_TEST_REPLACED", "old", 1);
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c",
                  "echo \"$0|$1|$DTRAIN_SUBPROCESS_TEST_INHERITED|"
                  "$DTRAIN_SUBPROCESS_TEST_REPLACED|$DTRAIN_SUBPROCESS_TEST_NEW\"; echo err >&2",
                  "zero", "one two"};
  options.env = {{"DTRAIN_SUBPROCESS_TEST_REPLACED", "new"}, {"DTRAIN_SUBPROCESS_TEST_NEW", "a=b"}};
  options.output_file = out;
  auto child = StartOrDie(options);
  ASSERT_NE(child, nullptr);
  absl::StatusOr<ExitStatus> status = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->success()) << status->ToString();
  EXPECT_EQ(ReadFileForTest(out), "zero|one two|from-parent|new|a=b\nerr\n");
  // The file is appended to, not truncated.
  auto second = Shell("echo more", out);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(ReadFileForTest(out), "zero|one two|from-parent|new|a=b\nerr\nmore\n");
}

TEST(SubprocessTest, StdinIsDevNull) {
  const std::string out = TestTmpPath("stdin.log");
  std::remove(out.c_str());
  auto child = Shell("cat; echo \"eof\"", out);
  ASSERT_NE(child, nullptr);
  absl::StatusOr<ExitStatus> status = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(ReadFileForTest(out), "eof\n");
}

TEST(SubprocessTest, WaitTimesOutWhileRunningThenSignalEndsIt) {
  SubprocessOptions options;
  options.argv = {"/bin/sleep", "60"};
  auto child = StartOrDie(options);
  ASSERT_NE(child, nullptr);
  EXPECT_TRUE(child->Running());
  const absl::Time start = absl::Now();
  absl::StatusOr<ExitStatus> early = child->Wait(absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(early.status())) << early.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  ASSERT_TRUE(child->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> status = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->signaled());
  EXPECT_EQ(status->signal(), SIGTERM);
  EXPECT_EQ(status->exit_code(), -1);
  EXPECT_NE(status->ToString().find("killed by signal 15"), std::string::npos)
      << status->ToString();
}

TEST(SubprocessTest, SignalReachesTheWholeProcessGroup) {
  // The shell starts a grandchild and waits; SIGKILL to the group ends both.
  const std::string pid_file = TestTmpPath("grandchild.pid");
  std::remove(pid_file.c_str());
  auto child = Shell(absl::StrCat("/bin/sleep 60 & echo $! > ", pid_file, "; wait"));
  ASSERT_NE(child, nullptr);
  int grandchild = 0;
  for (int i = 0; i < 1000 && grandchild == 0; ++i) {
    std::string text(absl::StripAsciiWhitespace(ReadFileForTest(pid_file)));
    if (!absl::SimpleAtoi(text, &grandchild)) grandchild = 0;
    if (grandchild == 0) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(grandchild, 0);
  EXPECT_EQ(getpgid(child->pid()), child->pid());
  EXPECT_EQ(getpgid(grandchild), child->pid());
  ASSERT_TRUE(child->Signal(SIGKILL).ok());
  absl::StatusOr<ExitStatus> status = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->signal(), SIGKILL);
  // The grandchild is not ours to reap (it is init's); it must be gone or a
  // zombie soon after SIGKILL.
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    const std::string stat = ReadFileForTest(absl::StrCat("/proc/", grandchild, "/stat"));
    const size_t paren = stat.rfind(')');
    gone = stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() &&
                            (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X'));
    if (!gone) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone) << "grandchild " << grandchild << " survived SIGKILL of its group";
}

TEST(SubprocessTest, StopEscalatesToSigkillAfterTheGrace) {
  // Ignores SIGTERM: Stop must SIGKILL it after the grace period.
  const std::string ready = TestTmpPath("trap.ready");
  std::remove(ready.c_str());
  auto child =
      Shell(absl::StrCat("trap '' TERM; touch ", ready, "; while :; do /bin/sleep 0.05; done"));
  ASSERT_NE(child, nullptr);
  for (int i = 0; i < 1000 && access(ready.c_str(), F_OK) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<ExitStatus> status = child->Stop(absl::Milliseconds(300));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->signal(), SIGKILL) << status->ToString();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
}

TEST(SubprocessTest, StopOfAPoliteChildIsSigterm) {
  SubprocessOptions options;
  options.argv = {"/bin/sleep", "60"};
  auto child = StartOrDie(options);
  ASSERT_NE(child, nullptr);
  absl::StatusOr<ExitStatus> status = child->Stop(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->signal(), SIGTERM);
}

TEST(SubprocessTest, DestructorKillsARunningChild) {
  pid_t pid;
  {
    SubprocessOptions options;
    options.argv = {"/bin/sleep", "60"};
    auto child = StartOrDie(options);
    ASSERT_NE(child, nullptr);
    pid = child->pid();
    EXPECT_TRUE(ProcessExists(pid));
  }
  // Killed and reaped: the pid no longer exists (not even as a zombie).
  EXPECT_FALSE(ProcessExists(pid));
}

TEST(SubprocessTest, ReleasedChildOutlivesItsSubprocess) {
  pid_t pid;
  {
    SubprocessOptions options;
    options.argv = {"/bin/sleep", "60"};
    options.new_session = true;
    auto child = StartOrDie(options);
    ASSERT_NE(child, nullptr);
    pid = child->pid();
    child->Release();
  }
  EXPECT_TRUE(ProcessExists(pid));
  EXPECT_EQ(getsid(pid), pid);  // a session of its own
  kill(pid, SIGKILL);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
}

TEST(SubprocessTest, MissingProgramFailsStartNamingIt) {
  SubprocessOptions options;
  options.argv = {"/no/such/program", "--flag"};
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(options);
  EXPECT_TRUE(absl::IsNotFound(child.status())) << child.status();
  EXPECT_NE(child.status().message().find("/no/such/program"), absl::string_view::npos);
}

TEST(SubprocessTest, NonExecutableProgramFailsStart) {
  const std::string path = TestTmpPath("not_executable");
  { std::ofstream(path) << "#!/bin/sh\nexit 0\n"; }
  chmod(path.c_str(), 0644);
  SubprocessOptions options;
  options.argv = {path};
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(options);
  EXPECT_TRUE(absl::IsPermissionDenied(child.status())) << child.status();
  EXPECT_NE(child.status().message().find(path), absl::string_view::npos);
}

TEST(SubprocessTest, BadOptionsAreInvalidArgument) {
  SubprocessOptions empty;
  EXPECT_TRUE(absl::IsInvalidArgument(Subprocess::Start(empty).status()));
  SubprocessOptions bad_env;
  bad_env.argv = {"/bin/true"};
  bad_env.env = {{"A=B", "c"}};
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(bad_env);
  EXPECT_TRUE(absl::IsInvalidArgument(child.status()));
  EXPECT_NE(child.status().message().find("A=B"), absl::string_view::npos);
}

TEST(SubprocessTest, UnopenableOutputFileFailsStart) {
  SubprocessOptions options;
  options.argv = {"/bin/true"};
  options.output_file = TestTmpPath("no/such/dir/out.log");
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(options);
  EXPECT_TRUE(absl::IsNotFound(child.status())) << child.status();
  EXPECT_NE(child.status().message().find("out.log"), absl::string_view::npos);
}

}  // namespace
}  // namespace dtrain
