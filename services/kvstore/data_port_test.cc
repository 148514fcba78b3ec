// The kvstore data port (libs/kvstore/data_port.h) of a real shard, with
// security on (mutual TLS, a cluster secret): who is refused, what hostile
// frames get, and that the shard keeps serving the next good client; the
// shared accounting (metrics) of data port requests.
#include "libs/kvstore/data_port.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/kvstore/client.h"
#include "libs/kvstore/data_port_frame.h"
#include "libs/kvstore/job_limiter.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "libs/security/certs.h"
#include "libs/security/job_token.h"
#include "protos/kvstore.grpc.pb.h"
#include "protos/kvstore.pb.h"
#include "services/kvstore/server.h"

namespace dtrain {
namespace kvstore {
namespace {

std::shared_ptr<const rpc::Credentials> Creds(const std::string& dir, const std::string& name) {
  auto c = rpc::Credentials::Load(
      {dir + "/ca.pem", dir + "/" + name + ".pem", dir + "/" + name + ".key"});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : rpc::Credentials::Insecure();
}

DataPortTls TlsOf(const std::string& dir, const std::string& name) {
  return {true, dir + "/ca.pem", dir + "/" + name + ".pem", dir + "/" + name + ".key"};
}

std::string Frame(DataOp op, const std::string& header, uint64_t payload_bytes = 0,
                  uint64_t id = 1) {
  FrameHeader h;
  h.op = static_cast<uint16_t>(op);
  h.header_bytes = static_cast<uint32_t>(header.size());
  h.payload_bytes = payload_bytes;
  h.request_id = id;
  char fixed[kFrameHeaderSize];
  EncodeFrameHeader(h, fixed);
  return std::string(fixed, sizeof(fixed)) + header;
}

// A push of key "w" (4 floats) of `job` by `worker` for `round`.
v1::PushRequest PushOfW(const std::string& job, int worker, int64_t round) {
  v1::PushRequest push;
  push.set_job(job);
  push.set_worker(worker);
  v1::PushItem* item = push.add_items();
  item->set_key("w");
  item->set_round(round);
  item->add_shape(4);
  return push;
}

std::string HelloFrame(const std::string& job, const std::string& token) {
  v1::DataHello hello;
  hello.set_job(job);
  hello.set_token(token);
  return Frame(DataOp::kHello, hello.SerializeAsString());
}

// Reads one reply: its status code and header (the message of an error).
absl::Status ReadReply(DataConn& conn, std::string* header = nullptr) {
  char fixed[kFrameHeaderSize];
  if (absl::Status s = conn.ReadFull(fixed, sizeof(fixed)); !s.ok()) return s;
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader({fixed, sizeof(fixed)}, /*request=*/false);
  if (!h.ok()) return h.status();
  std::string body(h->header_bytes, '\0');
  if (absl::Status s = conn.ReadFull(body.data(), body.size()); !s.ok()) return s;
  if (header != nullptr) *header = body;
  if (h->arg != 0) return absl::Status(static_cast<absl::StatusCode>(h->arg), body);
  return absl::OkStatus();
}

class DataPortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("certs");
    ASSERT_TRUE(security::InitCertDir(dir_, {}).ok());
    ASSERT_TRUE(security::IssueCert(dir_, {"trainer-0", security::Role::kTrainer}).ok());
    absl::StatusOr<std::string> secret = security::ReadClusterSecret(dir_ + "/cluster.secret");
    ASSERT_TRUE(secret.ok()) << secret.status();
    secret_ = *secret;
    // Short (a socket path has 108 bytes at most), and reachable by others.
    char tmpl[] = "/tmp/kv_data_port_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    socket_dir_ = tmpl;
    chmod(socket_dir_.c_str(), 0711);  // others may reach the socket: SO_PEERCRED decides
    rpc::SetDefaultCredentials(Creds(dir_, "kvstore"));
    ServerOptions options;
    options.job_token_secret = secret_;
    options.metrics_listen = "127.0.0.1:0";
    options.data_socket = socket_dir_ + "/kv.sock";
    options.data_max_connections = 4;
    Configure(&options);
    auto server = KVStoreServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    rpc::SetDefaultCredentials(Creds(dir_, "trainer-0"));
    tcp_ = {"127.0.0.1", server_->data_port(), true, ""};
    unix_ = {"", 0, false, server_->data_socket()};
    // Job "a" with key "w" (4 floats), made by a trainer holding a's token.
    ClientOptions o;
    o.servers = {server_->local_address()};
    o.job = "a";
    o.token = Token("a");
    auto client = RemoteParameterServer::Connect(o);
    ASSERT_TRUE(client.ok());
    JobConfig config;
    config.job = "a";
    config.num_workers = 1;
    ASSERT_TRUE((*client)->CreateJob(config).ok());
    ASSERT_TRUE((*client)->Init({{"w", {4}}}).ok());
  }
  void TearDown() override {
    if (server_) ASSERT_TRUE(server_->Shutdown(absl::ZeroDuration()).ok());
    rpc::SetDefaultCredentials(rpc::Credentials::Insecure());
    std::filesystem::remove_all(socket_dir_);
  }

  // For fixtures that start the shard otherwise.
  virtual void Configure(ServerOptions* options) {}

  // A trainer's data port connection bound to `job` by its token.
  absl::StatusOr<std::unique_ptr<DataPortConnection>> DialAs(const DataPortAddress& where,
                                                             const std::string& job) {
    return DataPortConnection::Dial(where, Hello(job, Token(job)), TlsOf(dir_, "trainer-0"),
                                    absl::Seconds(5));
  }
  // `n` such connections of `job`, all accepted, kept in `held`.
  void HoldConnections(const std::string& job, int n,
                       std::vector<std::unique_ptr<DataPortConnection>>* held) {
    for (int i = 0; i < n; ++i) {
      auto c = DialAs(tcp_, job);
      ASSERT_TRUE(c.ok()) << c.status();
      held->push_back(std::move(*c));
    }
  }

  std::string Token(const std::string& job) {
    return security::MintJobToken(secret_, job, absl::Now() + absl::Hours(1));
  }

  v1::DataHello Hello(const std::string& job, const std::string& token) {
    v1::DataHello h;
    h.set_job(job);
    h.set_token(token);
    return h;
  }

  // A good client still gets a SYNC round through the data port (both
  // transports), so the shard is up and serving.
  void ExpectServes(DataPath path) {
    ClientOptions o;
    o.servers = {server_->local_address()};
    o.job = "a";
    o.token = Token("a");
    o.data_path = path;
    auto client = RemoteParameterServer::Connect(o);
    ASSERT_TRUE(client.ok());
    ASSERT_TRUE((*client)->Init({{"w", {4}}}).ok());
    ASSERT_TRUE((*client)->Resync().ok());
    std::vector<float> g(4, 1.0f), out(4, 0.0f);
    absl::Status s = (*client)->PushPull({{"w", g.data(), out.data()}});
    ASSERT_TRUE(s.ok()) << s;
  }

  // A trainer's client of `job` (its token) on `path`.
  std::unique_ptr<RemoteParameterServer> Client(const std::string& job, DataPath path,
                                                int worker = 0,
                                                absl::Duration pull_timeout = absl::Seconds(3)) {
    ClientOptions o;
    o.worker = worker;
    o.servers = {server_->local_address()};
    o.job = job;
    o.token = Token(job);
    o.data_path = path;
    o.pull_timeout = pull_timeout;
    auto client = RemoteParameterServer::Connect(o);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // The shard's count of OK PushPulls (both transports' method name).
  double OkPushPulls() {
    auto m = metrics::Scrape(server_->metrics_port());
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return -1;
    return metrics::SampleValue(*m,
                                "dtrain_kvstore_requests_total{code=\"OK\",method=\"PushPull\"}")
        .value_or(0);
  }

  std::string dir_, secret_, socket_dir_;
  std::unique_ptr<KVStoreServer> server_;
  DataPortAddress tcp_, unix_;
};

TEST_F(DataPortTest, TokensAreCheckedAndBindTheConnectionToTheirJob) {
  for (const DataPortAddress& where : {tcp_, unix_}) {
    SCOPED_TRACE(where.unix_socket.empty() ? "tcp" : "unix");
    const DataPortTls tls = TlsOf(dir_, "trainer-0");
    // No token, a forged one, another job's.
    auto none = DataPortConnection::Dial(where, Hello("a", ""), tls, absl::Seconds(5));
    EXPECT_EQ(none.status().code(), absl::StatusCode::kPermissionDenied) << none.status();
    EXPECT_NE(none.status().message().find("sent no kvstore token"), std::string::npos);
    auto forged =
        DataPortConnection::Dial(where, Hello("a", "v1.a.99999999999.00ff"), tls, absl::Seconds(5));
    EXPECT_FALSE(forged.ok());
    auto other = DataPortConnection::Dial(where, Hello("a", Token("b")), tls, absl::Seconds(5));
    EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied) << other.status();
    EXPECT_NE(other.status().message().find("grants job 'b', not 'a'"), std::string::npos)
        << other.status();
    // Bound to b: a pull naming a is refused, and the connection stays usable.
    auto bound = DataPortConnection::Dial(where, Hello("b", Token("b")), tls, absl::Seconds(5));
    ASSERT_TRUE(bound.ok()) << bound.status();
    v1::PullRequest pull;
    pull.set_job("a");
    v1::PullItem* item = pull.add_items();
    item->set_key("w");
    ASSERT_TRUE(
        (*bound)->Send(DataOp::kPull, pull.SerializeAsString(), {}, 16, absl::Seconds(5)).ok());
    absl::StatusOr<std::string> reply = (*bound)->ReceiveHeader();
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kPermissionDenied) << reply.status();
    // A push naming a, with its payload: refused before any lookup of a.
    const v1::PushRequest push = PushOfW("a", 0, 1);
    const std::string values(16, '\0');
    ASSERT_TRUE((*bound)
                    ->Send(DataOp::kPush, push.SerializeAsString(), {values}, 0, absl::Seconds(5))
                    .ok());
    reply = (*bound)->ReceiveHeader();
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kPermissionDenied) << reply.status();
  }
  ExpectServes(DataPath::kAuto);
  ExpectServes(DataPath::kTcp);
}

// A client reaches the socket of the server it discovered, or none: a
// socket at the advertised path that answers with another instance (a
// server of another container sharing /tmp) is refused, and a client whose
// discovery named another instance uses TCP.
// An idle connection is handed out again while its server keeps it; once
// the server closed it (a restart, a shutdown) it is dropped when taken and
// the taker is told (to ask for the data port again), on both transports.
// An answers connection (DataHello.answers) gets a token from the server.
// DataPortServer::Answer writes on it only its own job's answers, each
// request id once and in increasing order; the client skips answers to
// attempts it gave up on. A frame the client sends on it ends it.
TEST_F(DataPortTest, AnswersConnectionsTakeOnlyTheirJobsAnswersOnceAndInOrder) {
  DataPortServer* port = server_->data_port_server();
  ASSERT_NE(port, nullptr);
  for (const DataPortAddress& where : {tcp_, unix_}) {
    SCOPED_TRACE(where.unix_socket.empty() ? "tcp" : "unix");
    auto plain = DialAs(where, "b");
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ((*plain)->answer_token(), 0u);
    plain->reset();
    v1::DataHello hello = Hello("b", Token("b"));
    hello.set_answers(true);
    auto answers =
        DataPortConnection::Dial(where, hello, TlsOf(dir_, "trainer-0"), absl::Seconds(5));
    ASSERT_TRUE(answers.ok()) << answers.status();
    const uint64_t token = (*answers)->answer_token();
    ASSERT_NE(token, 0u);
    EXPECT_TRUE(port->HasAnswers(token));
    const uint64_t first = (*answers)->ReserveAnswerId();
    const uint64_t second = (*answers)->ReserveAnswerId();
    v1::PullResponse header;
    header.add_items()->set_bytes(8);
    const std::string old_value = "oldvalue", new_value = "newvalue";
    DataReply old_reply{header.SerializeAsString(), {old_value}, {}};
    DataReply new_reply{header.SerializeAsString(), {new_value}, {}};
    EXPECT_EQ(port->Answer(token, first, "a", absl::OkStatus(), old_reply).code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(port->Answer(token ^ 1, first, "b", absl::OkStatus(), old_reply).code(),
              absl::StatusCode::kNotFound);
    absl::Status answered = port->Answer(token, first, "b", absl::OkStatus(), old_reply);
    ASSERT_TRUE(answered.ok()) << answered;
    answered = port->Answer(token, second, "b", absl::OkStatus(), new_reply);
    ASSERT_TRUE(answered.ok()) << answered;
    EXPECT_EQ(port->Answer(token, second, "b", absl::OkStatus(), old_reply).code(),
              absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(port->Answer(token, first, "b", absl::OkStatus(), old_reply).code(),
              absl::StatusCode::kAlreadyExists);
    absl::StatusOr<std::string> got = (*answers)->ReceiveAnswer(second, absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, header.SerializeAsString());
    std::string value(8, '\0');
    ASSERT_TRUE((*answers)->ReadPayload(value.data(), value.size()).ok());
    EXPECT_EQ(value, new_value);
    // An error answer arrives as the status.
    const uint64_t third = (*answers)->ReserveAnswerId();
    ASSERT_TRUE(
        port->Answer(token, third, "b", absl::DeadlineExceededError("round 3 waits"), {}).ok());
    got = (*answers)->ReceiveAnswer(third, absl::Seconds(5));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
    EXPECT_EQ(got.status().message(), "round 3 waits");
    // No request may come on it: one ends the connection.
    ASSERT_TRUE((*answers)->Send(DataOp::kPull, "", {}, 0, absl::Seconds(5)).ok());
    for (int i = 0; i < 500 && port->HasAnswers(token); ++i) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_FALSE(port->HasAnswers(token));
    EXPECT_EQ(port->Answer(token, third + 1, "b", absl::OkStatus(), new_reply).code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ((*answers)->ReceiveHeader().status().code(), absl::StatusCode::kUnavailable);
  }
  ExpectServes(DataPath::kAuto);
}

// answer_at (the tail answers) is for push-pulls at a replicated shard's
// head: an unreplicated shard refuses one (UNAVAILABLE: the client
// refreshes its map and asks the head), a plain push naming it is
// INVALID_ARGUMENT; nothing is applied and the connection stays usable.
TEST_F(DataPortTest, AnswerAtIsRefusedWhereNoTailCanAnswer) {
  for (const DataPortAddress& where : {tcp_, unix_}) {
    SCOPED_TRACE(where.unix_socket.empty() ? "tcp" : "unix");
    auto conn = DialAs(where, "a");
    ASSERT_TRUE(conn.ok()) << conn.status();
    v1::PushRequest push = PushOfW("a", 0, 1);
    push.mutable_answer_at()->set_token(42);
    push.mutable_answer_at()->set_request_id(7);
    const std::string values(16, '\0');
    ASSERT_TRUE(
        (*conn)
            ->Send(DataOp::kPushPull, push.SerializeAsString(), {values}, 16, absl::Seconds(5))
            .ok());
    absl::StatusOr<std::string> reply = (*conn)->ReceiveHeader();
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
    EXPECT_NE(reply.status().message().find("no replica after this one"), std::string::npos)
        << reply.status();
    ASSERT_TRUE(
        (*conn)->Send(DataOp::kPush, push.SerializeAsString(), {values}, 0, absl::Seconds(5)).ok());
    reply = (*conn)->ReceiveHeader();
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << reply.status();
    EXPECT_NE(reply.status().message().find("push-pulls only"), std::string::npos)
        << reply.status();
  }
  // Round 1 is still to push: a client's first PushPull succeeds.
  ExpectServes(DataPath::kAuto);
}

TEST_F(DataPortTest, IdleConnectionsTheServerClosedAreDroppedWhenTaken) {
  IdleDataConns idle(2);
  for (const DataPortAddress& where : {tcp_, unix_}) {
    auto c = DialAs(where, "a");
    ASSERT_TRUE(c.ok()) << c.status();
    const DataPortConnection* dialed = c->get();
    idle.Put(*std::move(c));
    absl::SleepFor(2 * IdleDataConns::kCheckAfter);  // old enough to be checked
    bool closed = false;
    std::unique_ptr<DataPortConnection> taken = idle.Take(&closed);
    EXPECT_EQ(taken.get(), dialed);
    EXPECT_FALSE(closed);
    idle.Put(std::move(taken));
  }
  auto extra = DialAs(tcp_, "a");
  ASSERT_TRUE(extra.ok()) << extra.status();
  idle.Put(*std::move(extra));  // over capacity: not kept
  EXPECT_EQ(idle.size(), 2u);
  ASSERT_TRUE(server_->Shutdown(absl::ZeroDuration()).ok());
  server_.reset();
  absl::SleepFor(2 * IdleDataConns::kCheckAfter);
  bool closed = false;
  EXPECT_EQ(idle.Take(&closed), nullptr);
  EXPECT_TRUE(closed);
  EXPECT_EQ(idle.size(), 0u);
}

TEST_F(DataPortTest, ASocketOfAnotherServerIsRefused) {
  const DataPortTls tls = TlsOf(dir_, "trainer-0");
  const std::string instance = server_->data_port_instance();
  ASSERT_EQ(instance.size(), 16u);
  DataPortAddress right = unix_;
  right.instance = instance;
  auto reached = DataPortConnection::Dial(right, Hello("a", Token("a")), tls, absl::Seconds(5));
  ASSERT_TRUE(reached.ok()) << reached.status();
  DataPortAddress wrong = unix_;
  wrong.instance = "0123456789abcdef";
  auto refused = DataPortConnection::Dial(wrong, Hello("a", Token("a")), tls, absl::Seconds(5));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("is another server's (instance " + instance +
                                            ", expected 0123456789abcdef)"),
            std::string::npos)
      << refused.status();
  // Default socket paths differ even within one process (and carry random
  // bytes: processes of containers sharing /tmp have the same pids).
  absl::StatusOr<std::string> a = DefaultDataSocketPath(), b = DefaultDataSocketPath();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  ExpectServes(DataPath::kAuto);
}

// KVStore.DataPort as `name` (its certificate; a trainer sends a's token).
v1::DataPortResponse DataPortAs(const std::string& dir, const std::string& name,
                                const std::string& address, const std::string& token) {
  std::shared_ptr<const rpc::Credentials> creds = Creds(dir, name);
  auto stub = v1::KVStore::NewStub(rpc::NewChannel(address, creds.get()));
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata(security::kJobTokenMetadata, token);
  v1::DataPortResponse response;
  grpc::Status s = stub->DataPort(&ctx, v1::DataPortRequest(), &response);
  EXPECT_TRUE(s.ok()) << name << ": " << s.error_message();
  return response;
}

// The replica ticket (a same-host chain link over the Unix socket) goes to
// identities that may replicate and is what makes a Unix peer a kvstore.
TEST_F(DataPortTest, TheReplicaTicketGoesToKvstoreShardsOnlyAndLetsTheirUnixLinkIn) {
  const DataPortTls tls = TlsOf(dir_, "trainer-0");
  const v1::DataPortResponse trainer =
      DataPortAs(dir_, "trainer-0", server_->local_address(), Token("a"));
  EXPECT_EQ(trainer.unix_socket(), server_->data_socket());  // an answer, without the ticket
  EXPECT_TRUE(trainer.replica_ticket().empty());
  const v1::DataPortResponse shard = DataPortAs(dir_, "kvstore", server_->local_address(), "");
  ASSERT_EQ(shard.replica_ticket().size(), static_cast<size_t>(kReplicaTicketBytes));
  EXPECT_EQ(DataPortAs(dir_, "kvstore", server_->local_address(), "").replica_ticket(),
            shard.replica_ticket());  // one per start

  // With the ticket a Unix link is a kvstore peer: REPLICATE passes
  // authorization (this shard is not replicated, which it says next).
  v1::DataHello link = Hello("", "");
  link.set_replica_ticket(shard.replica_ticket());
  auto replica = DataPortConnection::Dial(unix_, link, tls, absl::Seconds(5));
  ASSERT_TRUE(replica.ok()) << replica.status();
  ASSERT_TRUE((*replica)->Send(DataOp::kReplicate, "", {"x"}, 0, absl::Seconds(5)).ok());
  absl::StatusOr<std::string> reply = (*replica)->ReceiveHeader();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_NE(reply.status().message().find("not replicated"), std::string::npos) << reply.status();
  // The ticket on a trainer's HELLO (with a job) makes it no kvstore.
  v1::DataHello job = Hello("a", Token("a"));
  job.set_replica_ticket(shard.replica_ticket());
  auto trainer_conn = DataPortConnection::Dial(unix_, job, tls, absl::Seconds(5));
  ASSERT_TRUE(trainer_conn.ok()) << trainer_conn.status();
  ASSERT_TRUE((*trainer_conn)->Send(DataOp::kReplicate, "", {"x"}, 0, absl::Seconds(5)).ok());
  reply = (*trainer_conn)->ReceiveHeader();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kPermissionDenied) << reply.status();
  ExpectServes(DataPath::kAuto);
}

// A Unix HELLO without a job (a replica link) and without the right ticket
// is refused, and the shard keeps serving.
TEST_F(DataPortTest, AUnixReplicaLinkWithoutTheRightTicketIsRefused) {
  const DataPortTls tls = TlsOf(dir_, "trainer-0");
  auto none = DataPortConnection::Dial(unix_, Hello("", ""), tls, absl::Seconds(5));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kPermissionDenied) << none.status();
  EXPECT_NE(none.status().message().find("must carry the shard's replica ticket"),
            std::string::npos)
      << none.status();
  for (const std::string& wrong : {std::string(kReplicaTicketBytes, 'x'), std::string("short")}) {
    v1::DataHello hello = Hello("", "");
    hello.set_replica_ticket(wrong);
    auto refused = DataPortConnection::Dial(unix_, hello, tls, absl::Seconds(5));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
    EXPECT_NE(refused.status().message().find("is not this shard's"), std::string::npos)
        << refused.status();
  }
  ExpectServes(DataPath::kAuto);
}

// Only kvstore shards may open a replica link or send REPLICATE frames.
TEST_F(DataPortTest, ReplicationIsForKvstoreIdentitiesOnly) {
  const DataPortTls tls = TlsOf(dir_, "trainer-0");
  auto link = DataPortConnection::Dial(tcp_, Hello("", ""), tls, absl::Seconds(5));
  EXPECT_EQ(link.status().code(), absl::StatusCode::kPermissionDenied) << link.status();
  auto conn = DataPortConnection::Dial(tcp_, Hello("a", Token("a")), tls, absl::Seconds(5));
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE((*conn)->Send(DataOp::kReplicate, "", {"x"}, 0, absl::Seconds(5)).ok());
  absl::StatusOr<std::string> reply = (*conn)->ReceiveHeader();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kPermissionDenied) << reply.status();
  ExpectServes(DataPath::kTcp);
}

TEST_F(DataPortTest, ClientWithoutACertificateOfTheClusterIsRefused) {
  const std::string rogue = FreshTestDir("rogue");
  ASSERT_TRUE(security::InitCertDir(rogue, {}).ok());
  ASSERT_TRUE(security::IssueCert(rogue, {"trainer-0", security::Role::kTrainer}).ok());
  // Its own CA: it does not trust the shard, and the shard does not trust it.
  auto conn = DataPortConnection::Dial(tcp_, Hello("a", Token("a")), TlsOf(rogue, "trainer-0"),
                                       absl::Seconds(5));
  EXPECT_FALSE(conn.ok());
  // Trusting the cluster CA but presenting a certificate of another CA.
  DataPortTls mixed = TlsOf(rogue, "trainer-0");
  mixed.ca_file = dir_ + "/ca.pem";
  conn = DataPortConnection::Dial(tcp_, Hello("a", Token("a")), mixed, absl::Seconds(5));
  EXPECT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().code(), absl::StatusCode::kUnavailable) << conn.status();
  // Plain TCP to the TLS port.
  DataPortAddress plain = tcp_;
  plain.tls = false;
  auto raw = DialDataConn(plain, {}, absl::Seconds(5));
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE((*raw)->WriteAll({HelloFrame("a", Token("a"))}).ok());
  (*raw)->SetReadTimeout(absl::Seconds(5));
  EXPECT_FALSE(ReadReply(**raw).ok());
  ExpectServes(DataPath::kTcp);
}

TEST_F(DataPortTest, UnixPeerOfAnotherUidIsRefused) {
  ASSERT_EQ(getuid(), 0u) << "the test setuid()s a child";
  const std::string hello = HelloFrame("a", Token("a"));
  const std::string path = server_->data_socket();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only raw system calls from here (the parent has threads).
    if (setuid(65534) != 0) _exit(10);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) _exit(11);
    (void)write(fd, hello.data(), hello.size());
    char fixed[kFrameHeaderSize];
    size_t got = 0;
    while (got < sizeof(fixed)) {
      ssize_t n = read(fd, fixed + got, sizeof(fixed) - got);
      if (n <= 0) _exit(12);
      got += static_cast<size_t>(n);
    }
    uint32_t code;
    std::memcpy(&code, fixed + 8, 4);
    _exit(code == static_cast<uint32_t>(absl::StatusCode::kPermissionDenied) ? 0 : 13);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setuid, 11: connect, 12: no reply, 13: not refused";
  ExpectServes(DataPath::kAuto);
}

TEST_F(DataPortTest, UnsealedSegmentIsRefused) {
  auto raw = DialDataConn(unix_, {}, absl::Seconds(5));
  ASSERT_TRUE(raw.ok()) << raw.status();
  int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
  ASSERT_TRUE((*raw)->WriteAll({HelloFrame("a", Token("a"))}, fd).ok());
  close(fd);
  (*raw)->SetReadTimeout(absl::Seconds(5));
  absl::Status s = ReadReply(**raw);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("F_SEAL_SHRINK"), std::string::npos) << s;
  // And a Unix HELLO without any segment.
  raw = DialDataConn(unix_, {}, absl::Seconds(5));
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE((*raw)->WriteAll({HelloFrame("a", Token("a"))}).ok());
  (*raw)->SetReadTimeout(absl::Seconds(5));
  s = ReadReply(**raw);
  EXPECT_NE(s.message().find("must pass its shared-memory segment"), std::string::npos) << s;
  ExpectServes(DataPath::kAuto);
}

TEST_F(DataPortTest, HostileFramesGetAnErrorAndTheConnectionCloses) {
  const DataPortTls tls = TlsOf(dir_, "trainer-0");
  auto open = [&]() {
    auto raw = DialDataConn(tcp_, tls, absl::Seconds(5));
    EXPECT_TRUE(raw.ok()) << raw.status();
    (*raw)->SetReadTimeout(absl::Seconds(5));
    EXPECT_TRUE((*raw)->WriteAll({HelloFrame("a", Token("a"))}).ok());
    EXPECT_TRUE(ReadReply(**raw).ok());
    return std::move(*raw);
  };
  struct Case {
    const char* name;
    std::string bytes;
    const char* message;
  };
  std::string bad_magic = Frame(DataOp::kPull, "");
  bad_magic[0] = 'X';
  std::string big_header = Frame(DataOp::kPull, "");
  big_header[14] = '\x7f';  // header_bytes ~ 8 MiB
  std::string unknown_op = Frame(DataOp::kPull, "");
  unknown_op[6] = 42;
  v1::PushRequest push;
  push.set_job("a");
  v1::PushItem* item = push.add_items();
  item->set_key("w");
  item->set_round(1);
  item->add_shape(4);
  // 16 bytes expected; the frame says 1 TiB (and sends none of it).
  const std::string mismatch = Frame(DataOp::kPush, push.SerializeAsString(), uint64_t{1} << 40);
  for (const Case& c : {Case{"bad magic", bad_magic, "bad magic"},
                        Case{"oversized header", big_header, "at most 1048576"},
                        Case{"unknown op", unknown_op, "unknown request op 42"},
                        Case{"payload mismatch", mismatch, "its 1 items need 16"}}) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<DataConn> conn = open();
    ASSERT_TRUE(conn->WriteAll({c.bytes}).ok());
    absl::Status s = ReadReply(*conn);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s;
    char byte;
    EXPECT_EQ(conn->ReadFull(&byte, 1).code(), absl::StatusCode::kUnavailable);  // closed
  }
  // Truncated: half a header, then the client goes away.
  {
    std::unique_ptr<DataConn> conn = open();
    ASSERT_TRUE(conn->WriteAll({Frame(DataOp::kPull, "").substr(0, 13)}).ok());
  }
  // A frame before HELLO.
  auto raw = DialDataConn(tcp_, tls, absl::Seconds(5));
  ASSERT_TRUE(raw.ok());
  (*raw)->SetReadTimeout(absl::Seconds(5));
  ASSERT_TRUE((*raw)->WriteAll({Frame(DataOp::kPull, "")}).ok());
  EXPECT_NE(ReadReply(**raw).message().find("the first frame must be HELLO"), std::string::npos);
  ExpectServes(DataPath::kTcp);
  ExpectServes(DataPath::kAuto);
}

TEST_F(DataPortTest, ConnectionsOverTheLimitAreRefusedAndClientsUseGrpc) {
  std::vector<std::unique_ptr<DataPortConnection>> held;
  ASSERT_NO_FATAL_FAILURE(HoldConnections("a", 4, &held));  // data_max_connections
  auto refused = DialAs(tcp_, "a");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("at its limit of 4 connections"), std::string::npos);
  // A client still gets its rounds (over gRPC).
  ExpectServes(DataPath::kTcp);
  auto text = metrics::Scrape(server_->metrics_port());
  ASSERT_TRUE(text.ok());
  absl::StatusOr<double> open =
      metrics::SampleValue(*text, "dtrain_kvstore_data_port_connections{kind=\"tls\"}");
  ASSERT_TRUE(open.ok()) << *text;
  EXPECT_EQ(*open, 4);
  held.clear();
}

TEST_F(DataPortTest, DataPortRequestsCountInTheKvstoresMetrics) {
  auto before = metrics::Scrape(server_->metrics_port());
  ASSERT_TRUE(before.ok());
  const double pushpulls =
      metrics::SampleValue(*before,
                           "dtrain_kvstore_requests_total{code=\"OK\",method=\"PushPull\"}")
          .value_or(0);
  ExpectServes(DataPath::kAuto);  // one PushPull over the Unix socket
  ExpectServes(DataPath::kTcp);   // one over TLS
  auto after = metrics::Scrape(server_->metrics_port());
  ASSERT_TRUE(after.ok());
  absl::StatusOr<double> v = metrics::SampleValue(
      *after, "dtrain_kvstore_requests_total{code=\"OK\",method=\"PushPull\"}");
  ASSERT_TRUE(v.ok()) << *after;
  EXPECT_EQ(*v, pushpulls + 2);
  // Neither went over gRPC.
  EXPECT_EQ(metrics::SampleValue(
                *after, "dtrain_kvstore_requests_total{code=\"OK\",method=\"PushPullUnary\"}")
                .value_or(-1),
            0);
}

// A PushPull whose push leaves its round waiting for other workers holds no
// thread on the data port: the round's last push answers it (DataResponder).
// These end that wait every way it can end, on both transports.
class ParkedPullTest : public DataPortTest {
 protected:
  // A PushRequest header: `worker` pushes key "w" (4 floats) of `job` for `round`.
  static std::string PushHeader(const std::string& job, int worker, int64_t round) {
    return PushOfW(job, worker, round).SerializeAsString();
  }

  // One round of key "w": worker 0 push-pulls g0 into out0 on a thread of
  // its own, worker 1 g1 into out1 100 ms later. Both must succeed; returns
  // how long worker 0's answer came after worker 1 pushed.
  static absl::Duration LastPushLate(std::vector<std::unique_ptr<RemoteParameterServer>>& w,
                                     std::vector<float>& g0, std::vector<float>& g1,
                                     std::vector<float>* out0, std::vector<float>* out1) {
    absl::Status s0;
    absl::Time answered;
    std::thread t0([&] {
      s0 = w[0]->PushPull({{"w", g0.data(), out0->data()}});
      answered = absl::Now();
    });
    absl::SleepFor(absl::Milliseconds(100));
    const absl::Time pushed = absl::Now();
    absl::Status s1 = w[1]->PushPull({{"w", g1.data(), out1->data()}});
    t0.join();
    EXPECT_TRUE(s0.ok()) << s0;
    EXPECT_TRUE(s1.ok()) << s1;
    return answered - pushed;
  }

  // Job `job` of `workers` workers with key "w" (4 floats), and its
  // clients on `path` (pulls waiting up to `pull_timeout`).
  std::vector<std::unique_ptr<RemoteParameterServer>> Job(
      const std::string& job, int workers, DataPath path,
      absl::Duration pull_timeout = absl::Seconds(10)) {
    return Job(job, std::vector<DataPath>(workers, path), pull_timeout);
  }
  // The same, worker w's client on paths[w].
  std::vector<std::unique_ptr<RemoteParameterServer>> Job(
      const std::string& job, const std::vector<DataPath>& paths,
      absl::Duration pull_timeout = absl::Seconds(10)) {
    std::vector<std::unique_ptr<RemoteParameterServer>> clients;
    for (size_t w = 0; w < paths.size(); ++w) {
      clients.push_back(Client(job, paths[w], static_cast<int>(w), pull_timeout));
      if (clients.back() == nullptr) return {};
    }
    JobConfig config;
    config.job = job;
    config.num_workers = static_cast<int>(paths.size());
    EXPECT_TRUE(clients[0]->CreateJob(config).ok());
    for (auto& c : clients) EXPECT_TRUE(c->Init({{"w", {4}}}).ok());
    return clients;
  }
};

// Worker 0's pull waits (parked) until worker 1 pushes; then both get the
// round's values, and both calls count as OK PushPulls.
TEST_F(ParkedPullTest, TheRoundsLastPushAnswersThePullsThatWaitForIt) {
  int n = 0;
  for (DataPath path : {DataPath::kAuto, DataPath::kTcp}) {
    SCOPED_TRACE(path == DataPath::kAuto ? "unix" : "tls");
    std::vector<std::unique_ptr<RemoteParameterServer>> w = Job(absl::StrCat("p", n++), 2, path);
    ASSERT_EQ(w.size(), 2u);
    const double before = OkPushPulls();
    std::vector<float> g0 = {1, 2, 3, 4}, g1 = {10, 20, 30, 40}, out0(4, -1), out1(4, -1);
    absl::Notification answered;
    absl::Status s0;
    std::thread t0([&] {
      s0 = w[0]->PushPull({{"w", g0.data(), out0.data()}});
      answered.Notify();
    });
    // Worker 0's push is in (the round counts it) and its pull waits.
    bool pushed = false;
    for (absl::Time end = absl::Now() + absl::Seconds(5); !pushed && absl::Now() < end;) {
      auto job = server_->store().GetJob(absl::StrCat("p", n - 1), 0, true);
      ASSERT_TRUE(job.ok()) << job.status();
      pushed = job->slices.size() == 1 && job->slices[0].pushed_round == 1;
      if (!pushed) absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_TRUE(pushed);
    EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
    absl::Status s1 = w[1]->PushPull({{"w", g1.data(), out1.data()}});
    t0.join();
    ASSERT_TRUE(s0.ok()) << s0;
    ASSERT_TRUE(s1.ok()) << s1;
    EXPECT_EQ(out0, out1);
    std::vector<float> pulled(4, -2);
    ASSERT_TRUE(w[0]->Pull({{"w", pulled.data()}}).ok());
    EXPECT_EQ(out0, pulled);
    EXPECT_NE(out0, std::vector<float>(4, 0.0f));  // the round changed the value
    EXPECT_EQ(OkPushPulls(), before + 2);
  }
}

// A round no one completes: the parked pull is answered at its deadline,
// by the shard (naming the worker it waits for), not by the client giving
// up; the shard then serves the next round.
TEST_F(ParkedPullTest, APullWhoseRoundNeverCompletesIsAnsweredAtItsDeadline) {
  std::vector<std::unique_ptr<RemoteParameterServer>> w = Job("p", 2, DataPath::kAuto);
  ASSERT_EQ(w.size(), 2u);
  for (const DataPortAddress& where : {unix_, tcp_}) {
    SCOPED_TRACE(where.unix_socket.empty() ? "tls" : "unix");
    auto conn = DialAs(where, "p");
    ASSERT_TRUE(conn.ok()) << conn.status();
    const absl::Time start = absl::Now();
    ASSERT_TRUE((*conn)
                    ->Send(DataOp::kPushPull, PushHeader("p", 0, 1), {std::string(16, '\0')}, 16,
                           absl::Milliseconds(300))
                    .ok());
    absl::StatusOr<std::string> reply = (*conn)->ReceiveHeader();
    const absl::Duration took = absl::Now() - start;
    EXPECT_TRUE(absl::IsDeadlineExceeded(reply.status())) << reply.status();
    EXPECT_NE(reply.status().message().find("waiting for workers [1]"), std::string::npos)
        << reply.status();
    EXPECT_GE(took, absl::Milliseconds(250));
    EXPECT_LT(took, absl::Seconds(1));  // the connection's own timeout is 1 s later
  }
  ExpectServes(DataPath::kAuto);
}

// The round is completed by a push over gRPC (a client refused a data port
// connection uses it), which answers no parked pulls itself: it wakes the
// parked request's thread, which answers at once, not at the deadline.
TEST_F(ParkedPullTest, ARoundCompletedOverGrpcAnswersAPullParkedOnTheDataPort) {
  std::vector<std::unique_ptr<RemoteParameterServer>> w =
      Job("p", {DataPath::kAuto, DataPath::kGrpc});
  ASSERT_EQ(w.size(), 2u);
  std::vector<float> g(4, 1.0f), out0(4), out1(4);
  absl::Duration wait = LastPushLate(w, g, g, &out0, &out1);  // worker 0's pull parks
  EXPECT_EQ(out0, std::vector<float>(4, 2.0f));
  EXPECT_EQ(out1, out0);
  EXPECT_LT(wait, absl::Seconds(3));  // not at the 10 s deadline
}

// A connection that cannot make the descriptor a parked pull is woken
// through (the process is out of file descriptors) does not park: the pull
// waits on its thread as before, and a round completed over gRPC (which
// can only wake a parked pull through that descriptor) still answers it at
// once, not at its deadline.
TEST_F(ParkedPullTest, WithoutADescriptorToWakeItAPullWaitsOnItsThread) {
  std::vector<std::unique_ptr<RemoteParameterServer>> w =
      Job("nofd", {DataPath::kAuto, DataPath::kGrpc});
  ASSERT_EQ(w.size(), 2u);
  std::vector<float> g(4, 1.0f), out0(4), out1(4);
  // Round 1 opens every connection; worker 0 pushes last, so nothing parks.
  Work first = w[1]->PushPullAsync({{"w", g.data(), out1.data()}});
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(w[0]->PushPull({{"w", g.data(), out0.data()}}).ok());
  ASSERT_TRUE(first.Wait().ok());
  ASSERT_EQ(out0, std::vector<float>(4, 2.0f));

  // No new descriptor from here on: the limit is the lowest free number.
  const int lowest_free = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(lowest_free, 0);
  close(lowest_free);
  rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  rlimit none = before;
  none.rlim_cur = static_cast<rlim_t>(lowest_free);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &none), 0);
  absl::Cleanup restore = [&] { setrlimit(RLIMIT_NOFILE, &before); };
  ASSERT_LT(open("/dev/null", O_RDONLY | O_CLOEXEC), 0);
  ASSERT_EQ(errno, EMFILE);

  // Round 2: the sum of 1 and 3.
  std::vector<float> g1(4, 3.0f);
  absl::Duration wait = LastPushLate(w, g, g1, &out0, &out1);  // worker 0's pull waits
  std::move(restore).Invoke();
  EXPECT_EQ(out0, std::vector<float>(4, 4.0f));
  EXPECT_EQ(out1, out0);
  EXPECT_LT(wait, absl::Seconds(3));  // not at the 10 s deadline
}

// Hostile or gone peers of a parked request: a frame sent before the reply
// gets an error and the connection ends; a peer that closes frees its
// connection; either way the shard goes on serving.
TEST_F(ParkedPullTest, AFrameBeforeTheReplyOrAPeerThatLeavesEndsOnlyItsConnection) {
  // Workers 0 to 3 each push once (a round of 5 never completes).
  std::vector<std::unique_ptr<RemoteParameterServer>> w = Job("p", 5, DataPath::kAuto);
  ASSERT_EQ(w.size(), 5u);
  int worker = 0;
  for (bool leave : {false, true}) {
    SCOPED_TRACE(leave ? "the peer leaves" : "a frame before the reply");
    for (const DataPortAddress& where : {unix_, tcp_}) {
      const std::string kind = where.unix_socket.empty() ? "tls" : "unix";
      SCOPED_TRACE(kind);
      auto open = [&] {
        auto m = metrics::Scrape(server_->metrics_port());
        EXPECT_TRUE(m.ok());
        return m.ok() ? metrics::SampleValue(
                            *m, "dtrain_kvstore_data_port_connections{kind=\"" + kind + "\"}")
                            .value_or(-1)
                      : -1;
      };
      // The shard counts a connection when its handshake ends and uncounts
      // it when its thread sees it close, both a little after the client
      // side: wait until the count of the earlier iterations' closed
      // connections (ExpectServes below) has settled, then dial and wait
      // until the new one is counted.
      double idle = open();
      for (absl::Time end = absl::Now() + absl::Seconds(5), still = absl::Now();
           absl::Now() < end && absl::Now() - still < absl::Milliseconds(200);) {
        absl::SleepFor(absl::Milliseconds(10));
        const double v = open();
        if (v != idle) {
          idle = v;
          still = absl::Now();
        }
      }
      auto conn = DialAs(where, "p");
      ASSERT_TRUE(conn.ok()) << conn.status();
      double before = -1;
      for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;) {
        before = open();
        if (before >= idle + 1) break;
        absl::SleepFor(absl::Milliseconds(10));
      }
      ASSERT_GE(before, idle + 1);
      const std::string push = PushHeader("p", worker++, 1);
      ASSERT_TRUE(
          (*conn)
              ->Send(DataOp::kPushPull, push, {std::string(16, '\0')}, 16, absl::Seconds(10))
              .ok());
      absl::SleepFor(absl::Milliseconds(50));  // parked
      if (leave) {
        conn->reset();
      } else {
        ASSERT_TRUE(
            (*conn)
                ->Send(DataOp::kPushPull, push, {std::string(16, '\0')}, 16, absl::Seconds(10))
                .ok());
        absl::StatusOr<std::string> reply = (*conn)->ReceiveHeader();
        EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
        EXPECT_NE(reply.status().message().find("a frame came before the reply to request 2"),
                  std::string::npos)
            << reply.status();
        for (absl::Time end = absl::Now() + absl::Seconds(5);
             absl::Now() < end && !(*conn)->PeerClosed();) {
          absl::SleepFor(absl::Milliseconds(5));
        }
        EXPECT_TRUE((*conn)->PeerClosed());
      }
      double now = -1;
      for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;) {
        now = open();
        if (now == before - 1) break;
        absl::SleepFor(absl::Milliseconds(10));
      }
      EXPECT_EQ(now, before - 1);
      conn->reset();
      ExpectServes(DataPath::kAuto);
    }
  }
}

// Shutdown ends a parked request's wait (the client sees the shard go) and
// does not wait for its deadline.
TEST_F(ParkedPullTest, ShutdownEndsAParkedPull) {
  std::vector<std::unique_ptr<RemoteParameterServer>> w = Job("p", 2, DataPath::kAuto);
  ASSERT_EQ(w.size(), 2u);
  std::vector<float> g(4, 1.0f), out(4);
  absl::Status s0;
  absl::Notification answered;
  std::thread t0([&] {
    s0 = w[0]->PushPull({{"w", g.data(), out.data()}});
    answered.Notify();
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  ASSERT_TRUE(server_->Shutdown(absl::ZeroDuration()).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  server_.reset();
  // The client retries an unreachable shard for a while (unavailable_timeout); its
  // call ends unanswered, not with the round's values.
  t0.join();
  EXPECT_FALSE(s0.ok());
}

// A shard whose per-job caps are small: one job at its cap, another still served.
class JobCapTest : public DataPortTest {
 protected:
  void Configure(ServerOptions* options) override {
    options->data_max_connections = 8;
    options->data_max_connections_per_job = 2;
    options->max_calls_per_job = 2;
  }
  // Two of job c's three workers push over gRPC and each holds a pull of
  // the round the third never pushes: two calls in flight, its cap. A third
  // call of c is refused, job a is served, and c's calls are served again
  // once the pulls ended.
  void ExpectAJobAtItsCallCapIsRefusedAndOtherJobsAreServed() {
    std::unique_ptr<RemoteParameterServer> w0 = Client("c", DataPath::kGrpc, 0);
    std::unique_ptr<RemoteParameterServer> w1 = Client("c", DataPath::kGrpc, 1);
    ASSERT_TRUE(w0 && w1);
    JobConfig config;
    config.job = "c";
    config.num_workers = 3;
    ASSERT_TRUE(w0->CreateJob(config).ok());
    ASSERT_TRUE(w0->Init({{"w", {4}}}).ok());
    ASSERT_TRUE(w1->Init({{"w", {4}}}).ok());
    std::vector<float> g(4, 1.0f), out0(4), out1(4);
    std::vector<absl::Status> held(2);
    std::thread t0([&] { held[0] = w0->PushPull({{"w", g.data(), out0.data()}}); });
    std::thread t1([&] { held[1] = w1->PushPull({{"w", g.data(), out1.data()}}); });
    // A third call of c is refused once both pulls are in.
    std::unique_ptr<RemoteParameterServer> third = Client("c", DataPath::kGrpc);
    ASSERT_TRUE(third);
    absl::Status refused;
    for (absl::Time end = absl::Now() + absl::Seconds(2); absl::Now() < end;
         absl::SleepFor(absl::Milliseconds(10))) {
      refused = third->GetJob(0, false).status();
      if (absl::IsResourceExhausted(refused)) break;
    }
    EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
    EXPECT_NE(refused.message().find("job 'c' has 2 calls in flight"), std::string::npos)
        << refused;
    EXPECT_NE(refused.message().find("--max_calls_per_job"), std::string::npos);
    // Job a's rounds go on meanwhile (its calls have their own cap).
    ExpectServes(DataPath::kGrpc);
    t0.join();
    t1.join();
    EXPECT_TRUE(absl::IsDeadlineExceeded(held[0])) << held[0];
    // The pulls ended: c's calls are served again (once the shard's handlers
    // of the held pulls returned, which may be a moment after the clients
    // gave up).
    absl::Status again;
    for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;
         absl::SleepFor(absl::Milliseconds(20))) {
      again = third->GetJob(0, false).status();
      if (again.ok()) break;
    }
    EXPECT_TRUE(again.ok()) << again;
  }
};

TEST_F(JobCapTest, AJobAtItsConnectionCapIsRefusedAndOtherJobsStillConnect) {
  std::vector<std::unique_ptr<DataPortConnection>> held;
  ASSERT_NO_FATAL_FAILURE(HoldConnections("a", 2, &held));  // data_max_connections_per_job
  auto refused = DialAs(unix_, "a");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("job 'a' has 2 data port connections"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("--data_max_connections_per_job"), std::string::npos);
  // Another job still connects; a's place comes back when one of its connections closes.
  EXPECT_TRUE(DialAs(tcp_, "b").ok());
  held.pop_back();
  absl::StatusOr<std::unique_ptr<DataPortConnection>> again;
  for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(20))) {  // the server sees the close
    again = DialAs(tcp_, "a");
    if (again.ok()) break;
  }
  EXPECT_TRUE(again.ok()) << again.status();
}

// A token that names its attempt's trainers (the scheduler's) lifts the
// job's cap to JobLimiter::kPerWorker connections per trainer: a job of
// many trainers is not refused by its own size; past that it is.
TEST_F(JobCapTest, ATokenNamingItsTrainersScalesTheJobsConnectionCap) {
  const int workers = 1;
  v1::DataHello hello =
      Hello("d", security::MintJobToken(secret_, "d", absl::Now() + absl::Hours(1), workers));
  std::vector<std::unique_ptr<DataPortConnection>> held;
  for (int i = 0; i < JobLimiter::kPerWorker * workers; ++i) {  // more than the cap of 2
    auto c = DataPortConnection::Dial(tcp_, hello, TlsOf(dir_, "trainer-0"), absl::Seconds(5));
    ASSERT_TRUE(c.ok()) << i << ": " << c.status();
    held.push_back(*std::move(c));
  }
  auto refused = DataPortConnection::Dial(unix_, hello, TlsOf(dir_, "trainer-0"), absl::Seconds(5));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("job 'd' has 4 data port connections"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("4 per trainer of its 1"), std::string::npos)
      << refused.status();
}

TEST_F(JobCapTest, AJobAtItsCallCapIsRefusedAndOtherJobsAreServed) {
  ExpectAJobAtItsCallCapIsRefusedAndOtherJobsAreServed();
}

// The same on the callback data path, where a waiting pull holds no thread
// but still holds its place among its job's calls.
class CallbackJobCapTest : public JobCapTest {
 protected:
  void Configure(ServerOptions* options) override {
    JobCapTest::Configure(options);
    options->callback_data = true;
  }
};

TEST_F(CallbackJobCapTest, AJobAtItsCallCapIsRefusedAndOtherJobsAreServed) {
  ExpectAJobAtItsCallCapIsRefusedAndOtherJobsAreServed();
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
