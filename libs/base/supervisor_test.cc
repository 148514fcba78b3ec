#include "libs/base/supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"

namespace dtrain {
namespace {

using State = SupervisedProcess::State;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

SubprocessOptions ShellOptions(const std::string& script, const std::string& output = "") {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  options.output_file = output;
  return options;
}

std::unique_ptr<Subprocess> Start(const SubprocessOptions& options) {
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(options);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? *std::move(child) : nullptr;
}

// Polls at the fixed time `now` until something changes (a real exit),
// for up to 10 s of real time.
std::vector<std::string> PollUntilChange(Supervisor* s, absl::Time now) {
  for (absl::Time d = absl::Now() + absl::Seconds(10); absl::Now() < d;) {
    std::vector<std::string> events = s->Poll(now);
    if (!events.empty()) return events;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return {};
}

bool Runs(pid_t pid) {
  // Not a zombie of ours either: reap-free check through /proc.
  if (kill(pid, 0) != 0) return false;
  std::string stat = ReadFileForTest(absl::StrCat("/proc/", pid, "/stat"));
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

TEST(SupervisorTest, RestartsWithDoublingBackoffUpToTheMaximum) {
  const std::string log = TestTmpPath("doubling.log");
  std::remove(log.c_str());
  const SubprocessOptions options = ShellOptions("echo started; exit 3", log);
  SupervisorOptions so;  // 1 s doubling to 30 s
  Supervisor s(so);
  absl::Time now = absl::FromUnixSeconds(1000000);
  s.Adopt("crasher", Start(options), options, now);
  ASSERT_EQ(s.processes().size(), 1u);
  EXPECT_EQ(s.processes()[0].state, State::kRunning);
  EXPECT_EQ(s.processes()[0].last_exit, "");
  pid_t last_pid = s.processes()[0].pid;
  const std::vector<int> backoffs = {1, 2, 4, 8, 16, 30, 30};
  for (size_t i = 0; i < backoffs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("restart ", i + 1));
    now += absl::Milliseconds(10);  // each run "lasts" 10 ms
    std::vector<std::string> events = PollUntilChange(&s, now);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0],
              absl::StrCat("crasher (pid ", last_pid,
                           ") exited with status 3 after up 0s; restarting in ", backoffs[i], "s"));
    const SupervisedProcess& p = s.processes()[0];
    EXPECT_EQ(p.state, State::kRestarting);
    EXPECT_EQ(p.last_exit, "exited with status 3");
    EXPECT_EQ(p.last_exit_time, now);
    EXPECT_EQ(p.next_start, now + absl::Seconds(backoffs[i]));
    EXPECT_EQ(p.restarts, static_cast<int>(i));
    EXPECT_TRUE(s.AnyLeft());
    // Not a moment before the backoff ends.
    EXPECT_TRUE(s.Poll(now + absl::Seconds(backoffs[i]) - absl::Milliseconds(1)).empty());
    EXPECT_EQ(s.processes()[0].state, State::kRestarting);
    now += absl::Seconds(backoffs[i]);
    events = s.Poll(now);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().rfind("restarted crasher (pid ", 0), 0u) << events.back();
    EXPECT_EQ(s.processes()[0].state, State::kRunning);
    EXPECT_EQ(s.processes()[0].restarts, static_cast<int>(i + 1));
    EXPECT_NE(s.processes()[0].pid, last_pid);
    last_pid = s.processes()[0].pid;
  }
  // Every run, restarts included, appended to the same output file.
  PollUntilChange(&s, now + absl::Milliseconds(10));
  EXPECT_EQ(Count(ReadFileForTest(log), "started\n"), static_cast<int>(backoffs.size()) + 1)
      << ReadFileForTest(log);
}

TEST(SupervisorTest, BackoffStartsOverAfterALongRun) {
  SupervisorOptions so;
  so.initial_backoff = absl::Seconds(1);
  so.max_backoff = absl::Seconds(30);
  so.reset_backoff_after = absl::Minutes(1);
  Supervisor s(so);
  const SubprocessOptions options = ShellOptions("exec sleep 600");
  absl::Time now = absl::FromUnixSeconds(2000000);
  s.Adopt("server", Start(options), options, now);
  // Two quick deaths: backoff 1 s, then 2 s.
  for (int backoff : {1, 2}) {
    ASSERT_EQ(kill(s.processes()[0].pid, SIGKILL), 0);
    now += absl::Seconds(5);
    std::vector<std::string> events = PollUntilChange(&s, now);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(s.processes()[0].last_exit, "killed by SIGKILL");
    EXPECT_EQ(s.processes()[0].next_start, now + absl::Seconds(backoff));
    now += absl::Seconds(backoff);
    ASSERT_FALSE(s.Poll(now).empty());
    ASSERT_EQ(s.processes()[0].state, State::kRunning);
  }
  // A run of a minute: the next backoff is 1 s again, not 4 s.
  ASSERT_EQ(kill(s.processes()[0].pid, SIGTERM), 0);
  now += absl::Minutes(1);
  ASSERT_EQ(PollUntilChange(&s, now).size(), 1u);
  EXPECT_EQ(s.processes()[0].last_exit, "killed by SIGTERM");
  EXPECT_EQ(s.processes()[0].next_start, now + absl::Seconds(1));
  EXPECT_EQ(s.processes()[0].restarts, 2);
}

TEST(SupervisorTest, RestartNeverRecordsTheExitAndLeavesItDown) {
  SupervisorOptions so;
  so.restart = RestartPolicy::kNever;
  Supervisor s(so);
  const absl::Time now = absl::FromUnixSeconds(3000000);
  const SubprocessOptions quits = ShellOptions("exit 0");
  const SubprocessOptions stays = ShellOptions("exec sleep 600");
  s.Adopt("quits", Start(quits), quits, now);
  s.Adopt("stays", Start(stays), stays, now);
  const pid_t quits_pid = s.processes()[0].pid;
  std::vector<std::string> events = PollUntilChange(&s, now);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], absl::StrCat("quits (pid ", quits_pid,
                                    ") exited with status 0 after up 0s; not restarted "
                                    "(restart policy never)"));
  EXPECT_EQ(s.processes()[0].state, State::kExited);
  EXPECT_EQ(s.processes()[0].last_exit, "exited with status 0");
  EXPECT_TRUE(s.AnyLeft());  // "stays" runs
  // An hour later nothing was started again.
  EXPECT_TRUE(s.Poll(now + absl::Hours(1)).empty());
  EXPECT_EQ(s.processes()[0].restarts, 0);
  EXPECT_EQ(s.processes()[0].pid, quits_pid);
  EXPECT_EQ(s.processes()[1].state, State::kRunning);
  ASSERT_EQ(kill(s.processes()[1].pid, SIGKILL), 0);
  ASSERT_EQ(PollUntilChange(&s, now + absl::Hours(1)).size(), 1u);
  EXPECT_EQ(s.processes()[1].last_exit, "killed by SIGKILL");
  EXPECT_FALSE(s.AnyLeft());
}

TEST(SupervisorTest, AFailedRestartIsRetriedWithBackoff) {
  Supervisor s(SupervisorOptions{});
  SubprocessOptions missing;
  missing.argv = {"/nonexistent/server"};
  absl::Time now = absl::FromUnixSeconds(4000000);
  s.Adopt("server", Start(ShellOptions("exit 1")), missing, now);
  ASSERT_EQ(PollUntilChange(&s, now).size(), 1u);
  now += absl::Seconds(1);
  std::vector<std::string> events = s.Poll(now);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find("server: cannot start: "), std::string::npos) << events[0];
  EXPECT_NE(events[0].find("/nonexistent/server"), std::string::npos) << events[0];
  EXPECT_NE(events[0].find("trying again in 2s"), std::string::npos) << events[0];
  const SupervisedProcess& p = s.processes()[0];
  EXPECT_EQ(p.state, State::kRestarting);
  EXPECT_EQ(p.restarts, 1);
  EXPECT_EQ(p.last_exit.rfind("cannot start: ", 0), 0u) << p.last_exit;
  EXPECT_EQ(p.next_start, now + absl::Seconds(2));
  EXPECT_TRUE(s.AnyLeft());
}

TEST(SupervisorTest, ReleaseAllLeavesChildrenRunningAndDestructionKillsThem) {
  const SubprocessOptions options = ShellOptions("exec sleep 600");
  pid_t released, killed;
  {
    Supervisor s(SupervisorOptions{});
    s.Adopt("a", Start(options), options, absl::Now());
    released = s.processes()[0].pid;
    s.ReleaseAll();
  }
  EXPECT_TRUE(Runs(released));
  kill(released, SIGKILL);
  waitpid(released, nullptr, 0);
  {
    Supervisor s(SupervisorOptions{});
    s.Adopt("b", Start(options), options, absl::Now());
    killed = s.processes()[0].pid;
  }
  EXPECT_FALSE(Runs(killed));
}

TEST(SupervisorTest, DescribeExit) {
  EXPECT_EQ(DescribeExit(ExitStatus(3 << 8)), "exited with status 3");
  EXPECT_EQ(DescribeExit(ExitStatus(SIGKILL)), "killed by SIGKILL");
  EXPECT_EQ(DescribeExit(ExitStatus(SIGSEGV)), "killed by SIGSEGV");
  EXPECT_EQ(DescribeExit(ExitStatus(40)), "killed by signal 40");
}

}  // namespace
}  // namespace dtrain
