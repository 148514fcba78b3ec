// The gRPC client (libs/kvstore/client.h) against the ParameterServer
// contract (libs/kvstore/parameter_server_contract.h): every test gets two
// real kvstore shards on loopback ports.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/kvstore/client.h"
#include "libs/kvstore/parameter_server_contract.h"
#include "services/kvstore/server.h"

namespace dtrain {
namespace kvstore {
namespace {

class GrpcContractKVStore : public ContractKVStore {
 public:
  explicit GrpcContractKVStore(bool callback_data) {
    for (int i = 0; i < 2; ++i) {
      ServerOptions options;
      options.listen = "127.0.0.1:0";
      options.shard_index = i;
      options.callback_data = callback_data;
      auto server = KVStoreServer::Start(options);
      EXPECT_TRUE(server.ok()) << server.status();
      if (!server.ok()) return;
      addresses_.push_back((*server)->local_address());
      servers_.push_back(std::move(*server));
    }
  }

  absl::StatusOr<std::unique_ptr<ParameterServer>> Connect(const std::string& job,
                                                           int worker) override {
    ClientOptions options;
    options.servers = addresses_;
    options.job = job;
    options.worker = worker;
    DT_ASSIGN_OR_RETURN(std::unique_ptr<KVClient> client, KVClient::Connect(options));
    return std::unique_ptr<ParameterServer>(std::move(client));
  }

 private:
  std::vector<std::unique_ptr<KVStoreServer>> servers_;
  std::vector<std::string> addresses_;
};

INSTANTIATE_TEST_SUITE_P(
    Grpc, ParameterServerContractTest,
    ::testing::Values(ContractParam{"two_shards",
                                    [] { return std::make_unique<GrpcContractKVStore>(false); }},
                      // The unary data calls on the callback API.
                      ContractParam{"two_shards_callback",
                                    [] { return std::make_unique<GrpcContractKVStore>(true); }}),
    ContractParamName);

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
