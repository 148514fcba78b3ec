// ParameterServerContractTest: what every ParameterServer (parameter_server.h)
// must do, as one parameterized GoogleTest suite run against each
// implementation, so that they are shown to behave the same: SYNC rounds and
// their mean, rounds in order, server-side SGD under ASYNC, BOUNDED_DELAY
// holding a worker back, idempotent and conflicting CreateJob/Init, errors,
// and the order of operations on one key.
//
// A test binary depends on //libs/kvstore:parameter_server_contract (the
// tests) and instantiates the suite with a way to make a kvstore:
//
//   class InProcessFixture : public ContractKVStore {
//     absl::StatusOr<std::unique_ptr<ParameterServer>> Connect(const std::string& job,
//                                                              int worker) override;
//   };
//   INSTANTIATE_TEST_SUITE_P(
//       InProcess, ParameterServerContractTest,
//       ::testing::Values(ContractParam{"in_process",
//                                       [] { return std::make_unique<InProcessFixture>(); }}),
//       ContractParamName);
//
// Every test makes a fresh kvstore, which must have at least two shards (a
// large key is then sliced over several of them) and keep the default
// placement (keys from 256 KiB up are sliced).
#ifndef DTRAIN_LIBS_KVSTORE_PARAMETER_SERVER_CONTRACT_H_
#define DTRAIN_LIBS_KVSTORE_PARAMETER_SERVER_CONTRACT_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "libs/kvstore/parameter_server.h"

namespace dtrain {
namespace kvstore {

// One kvstore for one test, whatever carries it.
class ContractKVStore {
 public:
  virtual ~ContractKVStore() = default;
  // A ParameterServer for `worker` of `job` on this kvstore.
  virtual absl::StatusOr<std::unique_ptr<ParameterServer>> Connect(const std::string& job,
                                                                   int worker) = 0;
};

struct ContractParam {
  std::string name;  // the instantiation's test-name suffix
  std::function<std::unique_ptr<ContractKVStore>()> make;
};

inline std::string ContractParamName(const ::testing::TestParamInfo<ContractParam>& info) {
  return info.param.name;
}

inline void PrintTo(const ContractParam& param, std::ostream* os) { *os << param.name; }

class ParameterServerContractTest : public ::testing::TestWithParam<ContractParam> {
 protected:
  void SetUp() override;
  // A worker of `job`, or null (with a test failure).
  std::unique_ptr<ParameterServer> Connect(const std::string& job, int worker);

 private:
  std::unique_ptr<ContractKVStore> kvstore_;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_PARAMETER_SERVER_CONTRACT_H_
