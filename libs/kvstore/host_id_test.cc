// HostId: the same for processes of one host and network namespace, and
// another in a new network namespace (a container, a pod, a netlab host).
#include <errno.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "libs/kvstore/data_port.h"

namespace dtrain {
namespace kvstore {
namespace {

// HostId() as a child process computes it (after unshare(CLONE_NEWNET) if
// `new_netns`); "error:..." when it could not.
std::string ChildHostId(bool new_netns) {
  int fds[2];
  if (pipe(fds) != 0) return "error: pipe";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string id;
    if (new_netns && unshare(CLONE_NEWNET) != 0) {
      id = std::string("error: unshare: ") + std::strerror(errno);
    } else {
      id = HostId();
    }
    (void)!write(fds[1], id.data(), id.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  return out;
}

TEST(HostIdTest, AnotherNetworkNamespaceIsAnotherHost) {
  // Children first: HostId() is computed once per process, and a child
  // forked after this process computed it would inherit the answer.
  const std::string same = ChildHostId(false);
  const std::string other = ChildHostId(true);
  const std::string mine = HostId();
  ASSERT_FALSE(mine.empty()) << "no boot id on this machine";
  EXPECT_EQ(same, mine);
  if (other.rfind("error: unshare", 0) == 0) {
    GTEST_SKIP() << "this kernel refuses a network namespace here (" << other << ")";
  }
  EXPECT_NE(other, mine) << "a process in its own network namespace looks like this host";
  EXPECT_EQ(other.substr(0, other.find(' ')), mine.substr(0, mine.find(' '))) << "same boot";
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
