// Issue 16, end to end on a mutual-TLS cluster (`trainctl cluster up`, two
// trainers): a process without the attempt's collective secret cannot join a
// job's allreduce.
//
// The higher-placed trainer is stopped (SIGSTOP) before a 2-trainer
// ALLREDUCE job is placed, so rank 0 (the rank that accepts in the TCP
// transport's rendezvous; rank 1 connects) sits in its accept loop with its
// listening socket open. The test finds that socket the way an attacker on
// the host would (/proc/<pid>/net/tcp LISTEN entries whose inode is one of
// the trainer's socket fds, new since before the job) and connects to it:
//   - knowing the job id (trainctl get) but not the communicator's id:
//     refused (the connection is closed, nothing is answered);
//   - knowing everything but the secret: the communicator id and rank 0's
//     address, read from the attempt's rendezvous store with the stopped
//     trainer's own certificate (standing in for a leaked store), and
//     claiming rank 1 with the NEXT attempt's secret, or with none: refused
//     with PERMISSION_DENIED; and one speaking the handshake by hand that
//     sends rank 0's own proof back: rank 0's verdict byte is 0 and it
//     closes the connection. Rank 0 logs each refusal.
// Then the stopped trainer continues (SIGCONT), joins with the real secret,
// and the job SUCCEEDS in its first attempt.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/collective/store.h"
#include "libs/collective/tcp_transport.h"
#include "libs/rpc/credentials.h"
#include "libs/security/job_token.h"
#include "protos/scheduler.grpc.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

// The TCP ports `pid` listens on (IPv4): LISTEN rows of its network
// namespace's /proc/<pid>/net/tcp whose socket inode is one of its fds.
std::set<int> ListeningPorts(int pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  for (int fd = 0; fd < 4096; ++fd) {
    char target[256];
    const std::string link = absl::StrCat(fd_dir, "/", fd);
    ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    std::string t(target, static_cast<size_t>(n));
    if (absl::StartsWith(t, "socket:[")) inodes.insert(t.substr(8, t.size() - 9));
  }
  std::set<int> ports;
  std::istringstream table(ReadFile(absl::StrCat("/proc/", pid, "/net/tcp")));
  std::string line;
  std::getline(table, line);  // header
  while (std::getline(table, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    if (f.size() < 10 || f[3] != "0A" || inodes.count(f[9]) == 0) continue;
    const std::string local = f[1];
    int port = 0;
    if (absl::SimpleHexAtoi(local.substr(local.find(':') + 1), &port)) ports.insert(port);
  }
  return ports;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Claims rank 1 of a 2-rank communicator `comm_id` whose rank 0 listens at
// 127.0.0.1 `port`, holding `secret`, through the TCP transport itself (which
// gives up as soon as rank 0's proof does not match its secret); the
// transport's status.
absl::Status Intrude(const std::string& store_dir, const std::string& comm_id, int port,
                     const std::string& secret) {
  collective::FileStore store(store_dir);
  absl::Status s = store.Set(absl::StrCat("tcp/", comm_id, "/0"), absl::StrCat("127.0.0.1 ", port));
  if (!s.ok()) return s;
  collective::TransportOptions o;
  o.rank = 1;
  o.size = 2;
  o.store = &store;
  o.job_id = comm_id;
  o.peers = {0};
  o.channels = 2;
  o.deadline = absl::Now() + absl::Seconds(20);
  collective::TcpOptions tcp;
  tcp.host = "127.0.0.1";
  tcp.secret = secret;
  return collective::CreateTcpTransport(o, tcp).status();
}

// What rank 0 answered an intruder that speaks the handshake by hand and
// does not give up: it sends the header and a nonce, reads rank 0's nonce and
// proof, and sends rank 0's own proof back as its "connect" proof (a
// reflection; it has no secret to make one of its own).
struct RawAnswer {
  size_t proof_bytes = 0;  // of rank 0's nonce and proof (64)
  int verdict = -1;        // the verdict byte; -1: none
  bool closed_after = false;
};

RawAnswer RawIntrude(const std::string& comm_id, int port) {
  RawAnswer answer;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return answer;
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto read_full = [fd](char* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd, p + got, n - got, 0);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  };
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    // magic "DTC2", rank 1, channel 0, job id length; then the id and nonce_c.
    const uint32_t header[4] = {0x44544332u, 1, 0, static_cast<uint32_t>(comm_id.size())};
    std::string hello(reinterpret_cast<const char*>(header), sizeof(header));
    hello += comm_id;
    hello += std::string(32, '\x5a');
    if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(hello.size())) {
      char reply[64];
      answer.proof_bytes = read_full(reply, sizeof(reply));
      if (answer.proof_bytes == sizeof(reply) && ::send(fd, reply + 32, 32, MSG_NOSIGNAL) == 32) {
        char verdict;
        if (read_full(&verdict, 1) == 1) answer.verdict = verdict;
        char more;
        answer.closed_after = ::recv(fd, &more, 1, 0) == 0;
      }
    }
  }
  ::close(fd);
  return answer;
}

class CollectiveAuthE2eTest : public ClusterTest {
 protected:
  void SetUp() override {
    // A stopped trainer must not be declared lost while the test works.
    ASSERT_NO_FATAL_FAILURE(Up({.name = "collective-auth-cluster",
                                .trainers = 2,
                                .heartbeat_timeout_s = 300,
                                .down_grace_s = 10}));
    trainers_ = cluster_->Processes("trainer");
    ASSERT_EQ(trainers_.size(), 2u);
    certs_ = dir() + "/certs";
  }

  void TearDown() override {
    for (const ClusterProcess& p : trainers_) ::kill(p.pid, SIGCONT);
    ClusterTest::TearDown();
  }

  std::shared_ptr<const rpc::Credentials> As(const std::string& name) {
    return cluster_->Credentials(name);
  }

  std::string certs_;
  std::vector<ClusterProcess> trainers_;
};

TEST_F(CollectiveAuthE2eTest, AProcessWithoutTheAttemptSecretCannotJoinTheAllreduce) {
  auto admin = As("admin");
  auto jobs = v1::JobService::NewStub(rpc::NewChannel(scheduler(), admin.get()));

  // Both trainers registered: the lower order becomes rank 0 of the job.
  v1::ListTrainersReply listed;
  for (absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(100))) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    listed.Clear();
    ASSERT_TRUE(jobs->ListTrainers(&ctx, v1::ListTrainersRequest(), &listed).ok());
    if (listed.trainers_size() == 2) break;
  }
  ASSERT_EQ(listed.trainers_size(), 2) << listed.DebugString();
  auto order = [](const std::string& id) {
    int64_t n = -1;
    EXPECT_TRUE(absl::SimpleAtoi(id.substr(id.rfind('-') + 1), &n)) << id;
    return n;
  };
  const v1::TrainerStatus& first = order(listed.trainers(0).id()) < order(listed.trainers(1).id())
                                       ? listed.trainers(0)
                                       : listed.trainers(1);
  const v1::TrainerStatus& second =
      &first == &listed.trainers(0) ? listed.trainers(1) : listed.trainers(0);
  ClusterProcess rank0, rank1;
  for (const ClusterProcess& p : trainers_) {
    if (p.name == first.name()) rank0 = p;
    if (p.name == second.name()) rank1 = p;
  }
  ASSERT_GT(rank0.pid, 0) << first.DebugString();
  ASSERT_GT(rank1.pid, 0) << second.DebugString();
  const std::set<int> before = ListeningPorts(rank0.pid);
  ASSERT_FALSE(before.empty()) << "no listening socket of " << rank0.name << " found in /proc";

  // The future rank 1 stops (a real signal): placed, it cannot rendezvous.
  ASSERT_EQ(::kill(rank1.pid, SIGSTOP), 0);
  v1::SubmitRequest submit;
  v1::JobSpec* s = submit.mutable_spec();
  s->set_name("allreduce-auth");
  s->set_model("mlp");
  s->set_epochs(1);
  s->set_global_batch_size(256);
  s->set_lr(0.1);
  s->set_num_trainers(2);
  s->set_devices_per_trainer(1);
  s->set_device_kind("cpu");
  s->mutable_sync()->set_mode(v1::ALLREDUCE);
  s->set_train_limit(4096);
  s->set_test_limit(1000);
  s->set_threads(1);
  s->set_seed(1);
  v1::JobStatus job;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    grpc::Status st = jobs->Submit(&ctx, submit, &job);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  const std::string job_id = job.id();

  // Placed as expected: rank 0 runs, rank 1 is the stopped trainer.
  for (absl::Time end = absl::Now() + absl::Seconds(30);
       job.state() != v1::RUNNING && absl::Now() < end; absl::SleepFor(absl::Milliseconds(100))) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    v1::GetRequest get;
    get.set_id(job_id);
    ASSERT_TRUE(jobs->Get(&ctx, get, &job).ok());
  }
  ASSERT_EQ(job.state(), v1::RUNNING) << job.DebugString();
  ASSERT_EQ(job.trainers_size(), 2);
  ASSERT_EQ(job.trainers(0), first.id()) << job.DebugString();
  ASSERT_EQ(job.trainers(1), second.id()) << job.DebugString();
  ASSERT_EQ(job.attempts(), 1);

  // Rank 0's collective listener, found from outside: a port it did not
  // listen on before the job.
  int port = 0;
  for (absl::Time end = absl::Now() + absl::Seconds(30); port == 0 && absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(50))) {
    for (int p : ListeningPorts(rank0.pid)) {
      if (before.count(p) == 0) port = p;
    }
  }
  ASSERT_GT(port, 0) << rank0.name << " opened no new listening socket for the job";

  const std::string log_path = absl::StrCat(dir(), "/", rank0.name, ".log");
  const std::string refusal = "refused a connection claiming rank 1";
  const int refusals_before = Count(ReadFile(log_path), refusal);

  // An intruder that knows only the job id (trainctl get): not even an answer.
  absl::Status guess = Intrude(TmpDir("intruder-guess"), job_id, port, "");
  EXPECT_FALSE(guess.ok());
  EXPECT_TRUE(absl::StrContains(guess.message(), "did not answer")) << guess;

  // An intruder that knows everything but the secret: the communicator id
  // and rank 0's address from the attempt's rendezvous store, read with the
  // stopped trainer's own certificate.
  auto leaked = As(rank1.name);
  auto cluster = v1::ClusterService::NewStub(rpc::NewChannel(scheduler(), leaked.get()));
  auto store_get = [&](const std::string& key) -> std::string {
    v1::StoreGetRequest r;
    r.set_trainer_id(second.id());
    r.set_job_id(job_id);
    r.set_attempt(job.attempts());
    r.set_key(key);
    r.set_wait_ms(2000);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    v1::StoreGetReply reply;
    grpc::Status st = cluster->StoreGet(&ctx, r, &reply);
    EXPECT_TRUE(st.ok()) << key << ": " << st.error_message();
    EXPECT_TRUE(reply.found()) << key;
    return reply.value();
  };
  const std::string comm_id = store_get("allreduce/job_id");
  ASSERT_EQ(comm_id.size(), 32u) << comm_id;
  // The port found in /proc is the one rank 0 published ("host port").
  EXPECT_EQ(store_get(absl::StrCat("allreduce/tcp/", comm_id, "/0")),
            absl::StrCat("127.0.0.1 ", port));

  absl::StatusOr<std::string> cluster_secret =
      security::ReadClusterSecret(certs_ + "/cluster.secret");
  ASSERT_TRUE(cluster_secret.ok()) << cluster_secret.status();
  const std::string next_attempts =
      security::CollectiveSecret(*cluster_secret, job_id, job.attempts() + 1);
  for (const std::string& secret : {next_attempts, std::string()}) {
    absl::Status st =
        Intrude(TmpDir(absl::StrCat("intruder-", secret.size())), comm_id, port, secret);
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "collective secret")) << st;
  }
  // One that does not give up: refused by rank 0's verdict, then closed.
  const RawAnswer raw = RawIntrude(comm_id, port);
  EXPECT_EQ(raw.proof_bytes, 64u);
  EXPECT_EQ(raw.verdict, 0);
  EXPECT_TRUE(raw.closed_after);
  // Rank 0 logged the three refusals, the last for its wrong proof (allow
  // the log a moment).
  int refusals = 0;
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(100))) {
    refusals = Count(ReadFile(log_path), refusal) - refusals_before;
    if (refusals >= 3) break;
  }
  EXPECT_EQ(refusals, 3) << ReadFile(log_path);
  EXPECT_EQ(Count(ReadFile(log_path), "(wrong MAC)"), 1) << ReadFile(log_path);

  // The real rank 1 continues, joins with the attempt's secret: the job
  // succeeds in its first attempt.
  ASSERT_EQ(::kill(rank1.pid, SIGCONT), 0);
  absl::StatusOr<v1::JobStatus> last = e2e::WatchToEnd(jobs.get(), job_id, absl::Seconds(120));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->state(), v1::SUCCEEDED) << last->DebugString();
  EXPECT_EQ(last->attempts(), 1) << last->DebugString();
  EXPECT_EQ(Count(ReadFile(log_path), refusal) - refusals_before, 3) << ReadFile(log_path);
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
