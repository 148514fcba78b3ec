#include "libs/base/signals.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

// Each case forks so that the process-wide handler state starts fresh.
int RunChild(void (*body)()) {
  pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(SignalsTest, SigtermWakesWaiterWithSignalNumber) {
  int status = RunChild([] {
    ShutdownSignal& s = ShutdownSignal::Install();
    if (s.requested()) _exit(10);
    kill(getpid(), SIGTERM);
    if (!s.WaitFor(absl::Seconds(10))) _exit(11);
    _exit(s.Wait() == SIGTERM ? 0 : 12);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SignalsTest, WaitForTimesOutWithoutSignal) {
  int status = RunChild([] {
    ShutdownSignal& s = ShutdownSignal::Install();
    _exit(s.WaitFor(absl::Milliseconds(50)) ? 1 : 0);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SignalsTest, TriggerReportsZero) {
  int status = RunChild([] {
    ShutdownSignal& s = ShutdownSignal::Install();
    s.Trigger();
    _exit(s.Wait() == 0 ? 0 : 1);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A real process that waits for SIGINT from its parent, then exits cleanly;
// a second signal during shutdown exits at once with 128+signal.
TEST(SignalsTest, ParentSignalsChildProcess) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t pid = fork();
  if (pid == 0) {
    ShutdownSignal& s = ShutdownSignal::Install();
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(20);
    int sig = s.Wait();
    if (sig != SIGINT) _exit(21);
    // Pretend to drain slowly; the parent's second signal ends us.
    if (write(ready[1], &c, 1) != 1) _exit(22);
    sleep(30);
    _exit(23);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(kill(pid, SIGINT), 0);
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
}

}  // namespace
}  // namespace dtrain
