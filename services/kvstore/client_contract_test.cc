// The kvstore client (libs/kvstore/client.h) against the ParameterServer
// contract (libs/kvstore/parameter_server_contract.h): every test gets two
// real kvstore shards on loopback ports, and the suite runs once per data
// path: gRPC (sync and callback servers), the data port over TCP with mutual
// TLS, and the data port over the Unix socket and shared memory (auto, with
// TLS certificates present, as a user runs it).
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/kvstore/client.h"
#include "libs/kvstore/parameter_server_contract.h"
#include "libs/rpc/credentials.h"
#include "libs/security/certs.h"
#include "services/kvstore/server.h"

namespace dtrain {
namespace kvstore {
namespace {

// Credentials of the process's cluster (made once): the shards' and the
// clients' (admin).
std::shared_ptr<const rpc::Credentials> TestCredentials(const std::string& name) {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto* d = new std::string(std::string(tmp != nullptr ? tmp : "/tmp") + "/contract_certs");
    std::filesystem::remove_all(*d);
    absl::Status s = security::InitCertDir(*d, {});
    EXPECT_TRUE(s.ok()) << s;
    return d;
  }();
  auto c = rpc::Credentials::Load(
      {*dir + "/ca.pem", *dir + "/" + name + ".pem", *dir + "/" + name + ".key"});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : rpc::Credentials::Insecure();
}

class GrpcContractKVStore : public ContractKVStore {
 public:
  GrpcContractKVStore(bool callback_data, DataPath path, bool tls = false) : path_(path) {
    if (tls) rpc::SetDefaultCredentials(TestCredentials("kvstore"));
    for (int i = 0; i < 2; ++i) {
      ServerOptions options;
      options.listen = "127.0.0.1:0";
      options.shard_index = i;
      options.callback_data = callback_data;
      auto server = KVStoreServer::Start(options);
      EXPECT_TRUE(server.ok()) << server.status();
      if (!server.ok()) return;
      if (path != DataPath::kGrpc) {
        EXPECT_GT((*server)->data_port(), 0);
        EXPECT_FALSE((*server)->data_socket().empty());
      }
      addresses_.push_back((*server)->local_address());
      servers_.push_back(std::move(*server));
    }
    if (tls) rpc::SetDefaultCredentials(TestCredentials("admin"));
  }
  ~GrpcContractKVStore() override {
    servers_.clear();
    rpc::SetDefaultCredentials(rpc::Credentials::Insecure());
  }

  absl::StatusOr<std::unique_ptr<ParameterServer>> Connect(const std::string& job,
                                                           int worker) override {
    ClientOptions options;
    options.servers = addresses_;
    options.job = job;
    options.worker = worker;
    options.data_path = path_;
    DT_ASSIGN_OR_RETURN(std::unique_ptr<RemoteParameterServer> client,
                        RemoteParameterServer::Connect(options));
    return std::unique_ptr<ParameterServer>(std::move(client));
  }

 private:
  const DataPath path_;
  std::vector<std::unique_ptr<KVStoreServer>> servers_;
  std::vector<std::string> addresses_;
};

INSTANTIATE_TEST_SUITE_P(
    Grpc, ParameterServerContractTest,
    ::testing::Values(
        ContractParam{"two_shards_grpc",
                      [] { return std::make_unique<GrpcContractKVStore>(false, DataPath::kGrpc); }},
        // The unary data calls on the callback API.
        ContractParam{"two_shards_callback",
                      [] { return std::make_unique<GrpcContractKVStore>(true, DataPath::kGrpc); }},
        // The data port over TCP, mutual TLS.
        ContractParam{"two_shards_data_port_tls",
                      [] {
                        return std::make_unique<GrpcContractKVStore>(false, DataPath::kTcp,
                                                                     /*tls=*/true);
                      }},
        // The data port over plain TCP (--insecure): values on the socket,
        // read through the connection's read-ahead buffer.
        ContractParam{"two_shards_data_port_plain_tcp",
                      [] { return std::make_unique<GrpcContractKVStore>(false, DataPath::kTcp); }},
        // The default: the data port over the Unix socket and shared memory.
        ContractParam{"two_shards_data_port_shm",
                      [] {
                        return std::make_unique<GrpcContractKVStore>(false, DataPath::kAuto,
                                                                     /*tls=*/true);
                      }}),
    ContractParamName);

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
