// Shared by the data-parallel kvstore tests: a kvstore of in-process shards
// (libs/kvstore/in_process.h). These tests are about data parallelism; the
// gRPC client is tested against real servers in services/kvstore.
#ifndef DTRAIN_LIBS_TRAIN_KVSTORE_TEST_UTIL_H_
#define DTRAIN_LIBS_TRAIN_KVSTORE_TEST_UTIL_H_

#include <memory>

#include "gtest/gtest.h"
#include "libs/kvstore/in_process.h"

namespace dtrain {
namespace train {
namespace testing {

// A kvstore of `num_shards` Stores, or null (with a test failure).
inline std::unique_ptr<kvstore::InProcessKVStore> InProcessShards(int num_shards) {
  kvstore::InProcessOptions options;
  options.num_shards = num_shards;
  auto kvstore = kvstore::InProcessKVStore::Create(options);
  EXPECT_TRUE(kvstore.ok()) << kvstore.status();
  return kvstore.ok() ? std::move(*kvstore) : nullptr;
}

}  // namespace testing
}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_KVSTORE_TEST_UTIL_H_
