#include "libs/base/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(PortsTest, PortsAreBelowTheEphemeralRangeFreeAndVaried) {
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    const int port = PickRestartablePort();
    ASSERT_GE(port, 20000);
    ASSERT_LT(port, 32000);
    // It can be bound right away.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << port;
    close(fd);
    seen.insert(port);
  }
  EXPECT_GT(seen.size(), 10u);  // random, not one fixed port
}

TEST(PortsTest, ABoundPortIsNotPicked) {
  // Hold many ports; none of them may be handed out.
  std::set<int> held;
  std::vector<int> fds;
  for (int port = 20000; port < 20200; ++port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      held.insert(port);
      fds.push_back(fd);
    } else {
      close(fd);
    }
  }
  for (int i = 0; i < 200; ++i) EXPECT_EQ(held.count(PickRestartablePort()), 0u);
  for (int fd : fds) close(fd);
}

}  // namespace
}  // namespace dtrain
