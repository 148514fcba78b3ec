// main() of netlab tests: enters a private network namespace before
// GoogleTest (or anything else) starts a thread, then runs the tests. Tests
// skip with netlab::PrivateNetwork()'s reason where the kernel refuses.
#include "gtest/gtest.h"
#include "tests/netlab/netlab.h"

int main(int argc, char** argv) {
  (void)dtrain::netlab::EnterPrivateNetwork();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
