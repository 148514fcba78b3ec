// Shared by the data-parallel kvstore tests: real kvstore shards on loopback
// ports, each with a fresh data directory under $TEST_TMPDIR.
#ifndef DTRAIN_LIBS_TRAIN_KVSTORE_TEST_UTIL_H_
#define DTRAIN_LIBS_TRAIN_KVSTORE_TEST_UTIL_H_

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "services/kvstore/server.h"

namespace dtrain {
namespace train {
namespace testing {

// $TEST_TMPDIR/<name>, emptied.
inline std::string TmpDir(const std::string& name) {
  const char* d = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(d ? d : "/tmp") + "/" + name;
  std::string cmd = "rm -rf " + dir + " && mkdir -p " + dir;
  EXPECT_EQ(system(cmd.c_str()), 0);
  return dir;
}

// Starts `n` shards (appended to *shards); returns their addresses in shard
// order, or fewer (with a test failure) when one cannot start.
inline std::vector<std::string> StartShards(
    const std::string& name, int n, std::vector<std::unique_ptr<kvstore::KVStoreServer>>* shards,
    absl::Duration snapshot_interval = kvstore::ServerOptions().snapshot_interval) {
  std::vector<std::string> addresses;
  for (int s = 0; s < n; ++s) {
    kvstore::ServerOptions so;
    so.data_dir = TmpDir(name + "_shard" + std::to_string(s));
    so.shard_index = s;
    so.snapshot_interval = snapshot_interval;
    auto server = kvstore::KVStoreServer::Start(so);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return addresses;
    addresses.push_back("127.0.0.1:" + std::to_string((*server)->port()));
    shards->push_back(std::move(*server));
  }
  return addresses;
}

}  // namespace testing
}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_KVSTORE_TEST_UTIL_H_
