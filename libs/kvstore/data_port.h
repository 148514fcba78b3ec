// The kvstore's data port: Push, Pull and PushPull (and the chain's
// REPLICATE) outside gRPC, framed as in data_port_frame.h. gRPC stays the
// control path (jobs, Init, the shard map) and tells clients where the data
// port is (KVStore.DataPort).
//
// Transports, behind one interface (DataConn, like gloo's transport pairs):
//   - TCP: mutual TLS 1.3 through OpenSSL with the cluster's certificates
//     (the peer's chain is verified against the CA; the server takes the
//     client's identity from its certificate as rpc::PeerIdentity does).
//     Plain TCP only when the process runs --insecure. TCP_NODELAY.
//   - Unix socket + shared memory, for a client on the shard's host: both
//     sides check SO_PEERCRED (same uid, or root). With TLS on, a Unix peer
//     is a trainer ("local-uid-<uid>"), or a kvstore peer ("local-replica-
//     uid-<uid>") when its HELLO has no job and carries the server's
//     replica_ticket() (a chain predecessor on this host, which got it over
//     mutual TLS; a HELLO without a job and without the right ticket is
//     PERMISSION_DENIED). The client creates a
//     memfd sealed against shrinking (F_SEAL_SHRINK: a truncate cannot make
//     the server fault) and passes it with SCM_RIGHTS in its HELLO (and a
//     bigger one with a later request when a value outgrows it); pushed
//     values are written into the segment and the server reads them in
//     place; pull replies are written into it and the client copies them
//     out once. Values that do not fit go on the socket.
//
//   DataPortServer (thread per connection, blocking I/O: the connection's
//   thread reads a frame, runs it through the DataPortHandler, writes the
//   reply; a SYNC pull blocks that thread until its round completes, its
//   frame's timeout passes, the peer closes, or Shutdown; a handler may
//   defer a reply instead, and the thread that completes its wait writes
//   it: DataResponder).
//
//   Answers connections (DataHello.answers): a client keeps one at a
//   replicated shard's tail; the server gives it a random token, and a
//   push-pull at the chain's head that names the token (v1::AnswerAt) is
//   answered there by the tail (DataPortServer::Answer, from the thread
//   that applied the round) instead of by the head: chain replication's
//   reply from the tail, one hop less per round. The client sends nothing
//   on it and waits on both connections (WaitEither): the head writes only
//   a refusal.
//
//   auto conn = DataPortConnection::Dial(address, hello, tls, timeout);
//   DT_RETURN_IF_ERROR((*conn)->Send(DataOp::kPushPull, header, values, reply_bytes, timeout));
//   DT_ASSIGN_OR_RETURN(std::string reply, (*conn)->ReceiveHeader());
//   DT_RETURN_IF_ERROR((*conn)->ReadPayload(dst, n));
//
// Nothing here knows about gRPC.
#ifndef DTRAIN_LIBS_KVSTORE_DATA_PORT_H_
#define DTRAIN_LIBS_KVSTORE_DATA_PORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "libs/kvstore/data_port_frame.h"
#include "libs/kvstore/job_limiter.h"
#include "libs/net/shared_memory.h"
#include "libs/security/identity.h"
#include "libs/security/job_token.h"

namespace dtrain {
namespace kvstore {
namespace v1 {
class DataHello;
}  // namespace v1

// The cluster's certificate files (rpc::Credentials' TlsFiles); disabled:
// plain TCP (--insecure).
struct DataPortTls {
  bool enabled = false;
  std::string ca_file, cert_file, key_file;
};

// Size of DataPortServer::replica_ticket().
inline constexpr int kReplicaTicketBytes = 32;

// Largest shared-memory segment a client creates (and a server maps).
inline constexpr int64_t kMaxSegmentBytes = int64_t{1} << 30;

// Largest push payload of a push-pull the chain's tail answers
// (v1::AnswerAt): the client asks for it only up to this, the head refuses
// more (a bigger push's bytes would be copied to wait at the head).
inline constexpr uint64_t kMaxAnswerAtBytes = 64 << 10;

// One data port connection, either side: a byte stream that can pass a file
// descriptor (Unix sockets only).
class DataConn {
 public:
  enum class Kind { kTcp, kTls, kUnix };
  static const char* KindName(Kind kind);  // "tcp", "tls", "unix"

  virtual ~DataConn() = default;
  virtual Kind kind() const = 0;
  // Reads exactly `n` bytes: UNAVAILABLE when the peer closed or reset the
  // connection (or Shutdown was called), DEADLINE_EXCEEDED past the read
  // timeout.
  virtual absl::Status ReadFull(void* buf, size_t n) = 0;
  // Writes every piece, in order; `pass_fd` >= 0 travels with the first
  // byte (Unix sockets; FailedPrecondition elsewhere).
  virtual absl::Status WriteAll(const std::vector<absl::string_view>& pieces, int pass_fd = -1) = 0;
  // A descriptor that arrived with the bytes taken from the socket since the
  // last call, or -1; the caller owns it. Reads go through a small
  // read-ahead buffer, so a descriptor sent with a later frame can arrive
  // early when a peer sends frames without waiting for their answers (ours
  // never do; such a peer's segment is its own).
  //
  // Reads are buffered (up to 8 KiB at once: a small frame costs one
  // system call), so poll the connection through SpinUntilReadable, never
  // its descriptor.
  virtual int TakeReceivedFd() { return -1; }
  // Ends blocked reads and writes, from any thread.
  virtual void Shutdown() = 0;
  // Whether the peer closed its end (polls; does not read).
  virtual bool PeerClosed() = 0;
  // Blocking reads give up after `timeout` (InfiniteDuration: never).
  virtual void SetReadTimeout(absl::Duration timeout) = 0;
  // Polls (without sleeping) until bytes are ready to read or `spin`
  // passed; true when they are. A reply that comes within the spin is read
  // without the cost of waking a blocked thread (tens of microseconds on a
  // virtual machine whose idle CPUs halt).
  virtual bool SpinUntilReadable(absl::Duration spin) = 0;
  // Whether bytes were read from the socket and not yet returned (the
  // read-ahead buffer, or TLS's): polling the descriptor misses them.
  virtual bool HasBuffered() const = 0;
  // The socket, for waiting on it next to other descriptors (poll): check
  // HasBuffered first. Still owned by the connection.
  virtual int fd() const = 0;
  // Blocking reads and writes give up after `timeout` (InfiniteDuration:
  // never): for a handshake and the peer's first frame.
  virtual void SetIoTimeout(absl::Duration timeout) = 0;
  // Server side, once accepted: the transport's handshake and the identity
  // it proves. TLS: the client's certificate, verified against the CA
  // (UNAUTHENTICATED otherwise); TCP and Unix sockets: anonymous (the
  // server checks a Unix peer's uid itself).
  virtual absl::StatusOr<security::Identity> AcceptHandshake() = 0;
};

// ---------------------------------------------------------------------------
// Server

struct DataPortServerOptions {
  // "host:port" to listen on for TCP (port 0 picks one); "": no TCP.
  std::string tcp_listen;
  // Path of the Unix socket; "": none. Its directory must exist, belong to
  // this uid and be writable only by it (the default one is 0700); a stale
  // socket there is replaced. Peers of another uid (except root) are
  // refused (SO_PEERCRED).
  std::string unix_socket;
  DataPortTls tls;
  // Connections served at once (both kinds); one more is refused with
  // RESOURCE_EXHAUSTED (its client falls back to gRPC).
  int max_connections = 256;
  // Of those, connections bound to one job (its HELLO's token), or
  // JobLimiter::kPerWorker per trainer the token names if more: one more is
  // refused the same way, so one job cannot take them all. 0: no cap.
  int max_connections_per_job = 128;
  // After answering a REPLICATE frame, how long the connection's thread
  // polls for the next one before it sleeps (a chain under load sends
  // batches back to back; DataConn::SpinUntilReadable).
  absl::Duration replicate_spin = absl::Microseconds(50);
};

struct DataReply;
class DataResponder;

// One request as the connection's thread hands it to the handler.
struct DataRequest {
  DataOp op = DataOp::kPush;
  absl::string_view header;  // the protobuf header
  uint64_t payload_bytes = 0;
  // Reads the payload (exactly payload_bytes; a view into the connection's
  // buffer or shared-memory segment, valid until Handle returns). Call it at
  // most once, after checking payload_bytes: a payload not read makes the
  // server close the connection after the reply.
  std::function<absl::StatusOr<absl::string_view>()> read_payload;
  // From the frame's timeout (InfiniteFuture: none).
  absl::Time deadline = absl::InfiniteFuture();
  // True once the peer closed its end or the server is shutting down.
  std::function<bool()> cancelled;
  // The job the connection is bound to (its HELLO); nullopt: unconfined.
  const absl::optional<std::string>* scope = nullptr;
  // Who the connection is (its HELLO's identity).
  const security::Identity* who = nullptr;
  DataConn::Kind kind = DataConn::Kind::kTcp;
  // Defers the reply, for a request that waits for others (a pull whose
  // round is not complete): the handler reads the payload first, keeps the
  // responder and returns OK with `reply` left empty; the responder answers
  // later, from any thread (DataResponder). At most once per request.
  // Empty for a request that cannot defer (only PushPulls can, and only on
  // a connection that has its wake descriptor: none when the process was
  // out of descriptors); the handler then answers on this thread.
  std::function<std::shared_ptr<DataResponder>()> defer;
};

struct DataReply {
  std::string header;                               // serialized protobuf
  std::vector<absl::string_view> values;            // the payload, in order
  std::vector<std::shared_ptr<const void>> owners;  // keep `values` alive
  // OK, and no reply frame is written: a push-pull whose pull another
  // server answers (v1::AnswerAt). An error is written as usual.
  bool none = false;
};

// The answer to a deferred request (DataRequest::defer). Whichever thread
// makes the request's wait end answers it: the push that completes a round
// writes the replies of the pulls that waited for it, and no thread is
// woken to write them (a wakeup costs tens of microseconds on a virtual
// machine whose idle CPUs halt). Until then the connection's thread waits
// in poll, holding no lock, for the answer, the peer closing, Shutdown, or
// the responder's timer, whose function it runs (for deadlines, and for a
// wake that has no thread to answer from: Poke). A frame that comes before
// the answer ends the connection (one request at a time).
//
//   std::shared_ptr<DataResponder> r = request.defer();
//   r->SetTimer(deadline, [r] { r->Answer(absl::DeadlineExceededError("..."), DataReply()); });
//   ... later, on any thread:  r->Answer(absl::OkStatus(), reply);
class DataResponder {
 public:
  // Writes the reply (the error when `status` is not OK); false when the
  // request was answered already or its connection ended. Thread-safe.
  bool Answer(const absl::Status& status, const DataReply& reply);
  // `fn` runs on the connection's thread at `at` (InfiniteFuture: only
  // when poked) and when poked; it may answer, or set the timer again. Call
  // from the handler before it returns, or from `fn`.
  void SetTimer(absl::Time at, std::function<void()> fn);
  // From any thread: the connection's thread runs the timer's function
  // soon (a system call and a wakeup; Answer directly when you can).
  void Poke();
  bool answered() const;
  // For a deferred request that gets no answer (its pull is answered on
  // another server: v1::AnswerAt) and waits only for its timer: the
  // client's next frame ends the wait (the timer's function runs once
  // more first) and is served as the next request, instead of ending the
  // connection. Call from the handler before it returns.
  void EndOnFrame();
  // Ends the wait without writing anything (from the timer's function,
  // after EndOnFrame).
  void Finish();

 private:
  friend class DataPortServer;
  using Writer = std::function<absl::Status(const absl::Status&, const DataReply&)>;
  DataResponder(Writer write, int wake_fd) : write_(std::move(write)), wake_fd_(wake_fd) {}
  // The connection's thread leaves without an answer.
  void EndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Writer write_ ABSL_GUARDED_BY(mu_);
  const int wake_fd_;  // the connection's eventfd
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  bool end_on_frame_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;  // the answer could not be written
  bool ended_ ABSL_GUARDED_BY(mu_) = false;   // the connection's thread left
  absl::Time at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::function<void()> fn_ ABSL_GUARDED_BY(mu_);
};

// What the server runs: the kvstore shard behind both gRPC and the data
// port (services/kvstore/server.cc).
class DataPortHandler {
 public:
  virtual ~DataPortHandler() = default;
  // A connection's HELLO from `who` (its certificate's identity; for a Unix
  // peer of this uid a trainer named after it, or a kvstore peer when it
  // presented the replica ticket): what its token grants, the job the
  // connection is bound to (nullopt: unconfined), or why it is refused.
  virtual absl::StatusOr<absl::optional<security::JobGrant>> Hello(const security::Identity& who,
                                                                   const v1::DataHello& hello,
                                                                   DataConn::Kind kind) = 0;
  // Runs one request; fills `reply` when OK.
  virtual absl::Status Handle(const DataRequest& request, DataReply* reply) = 0;
};

class DataPortServer {
 public:
  // Binds and starts accepting. kUnavailable when an address cannot be bound,
  // kInvalidArgument for a bad address, kFailedPrecondition for a socket
  // directory that is not private, TLS files' errors.
  static absl::StatusOr<std::unique_ptr<DataPortServer>> Start(const DataPortServerOptions& options,
                                                               DataPortHandler* handler);
  ~DataPortServer();  // Shutdown
  DataPortServer(const DataPortServer&) = delete;
  DataPortServer& operator=(const DataPortServer&) = delete;

  // Stops accepting, ends every connection (blocked pulls end), joins their
  // threads, removes the socket file. Later calls do nothing.
  void Shutdown();

  int tcp_port() const { return tcp_port_; }
  const std::string& unix_socket() const { return options_.unix_socket; }
  // A random id made at Start, sent in every HELLO answer.
  const std::string& instance() const { return instance_; }
  // kReplicaTicketBytes random bytes made at Start: a Unix HELLO without a
  // job that carries them is a kvstore peer (with TLS; see above). Give
  // them only to peers authenticated as allowed to replicate.
  const std::string& replica_ticket() const { return replica_ticket_; }
  bool tls() const { return options_.tls.enabled; }
  // Connections open now, by kind ("tcp", "tls", "unix").
  std::map<std::string, int> Connections() const;
  // Connections refused at the max_connections limit since Start.
  int64_t refused() const { return refused_.load(); }

  // Writes the answer to a push-pull that named `token` (v1::AnswerAt) on
  // that answers connection, as the reply to its request `request_id`.
  // Refused, with nothing written: kNotFound (no such connection: closed,
  // or another server's token), kPermissionDenied (the connection is bound
  // to another job than `job`), kAlreadyExists (that connection was
  // answered a request id this large already: each request is answered
  // once, in order), kUnavailable (the write failed; the connection ends).
  // Thread-safe.
  absl::Status Answer(uint64_t token, uint64_t request_id, absl::string_view job,
                      const absl::Status& status, const DataReply& reply);
  // Whether an answers connection with `token` is open here.
  bool HasAnswers(uint64_t token) const;

  struct Impl;

 private:
  DataPortServer() = default;
  void AcceptLoop(int listen_fd, bool unix_socket) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // A connection's thread: the handshake (Admit), its HELLO (Hello), then
  // its requests (ServeRequests) or, for an answers connection, the wait
  // for its end (ServeAnswers).
  void Serve(std::unique_ptr<DataConn> conn, int id);
  // What a connection learned at its start: who the peer is, the job it
  // is bound to, its segment.
  struct Session;
  // Gives the connection's place back (it no longer counts against
  // max_connections): once it ends, or before a refusal is written.
  void Release(int id);
  // The transport's handshake and, for a Unix peer, its uid; the refusal
  // written when there is one to write. False: the connection ends.
  bool Admit(DataConn& conn, int id, Session* session);
  // Reads and answers the HELLO (binding the job, mapping the segment,
  // registering an answers connection). False: the connection ends.
  bool Hello(DataConn& conn, int id, Session* session);
  // Requests until the connection ends.
  void ServeRequests(DataConn& conn, Session& session);
  // Forgets an answers connection: nothing is written on it after this.
  void Unregister(uint64_t token);
  // Waits for a deferred request's answer (see DataResponder); false when
  // the connection ends instead.
  bool AwaitAnswer(DataResponder& responder, DataConn& conn, uint16_t op, uint64_t request_id);

  struct AnswerSink;
  // An answers connection's thread: waits for the peer to close (it sends
  // no requests) while Answer writes on it.
  void ServeAnswers(DataConn& conn, uint64_t token);

  DataPortServerOptions options_;
  std::string instance_;
  std::string replica_ticket_;
  DataPortHandler* handler_ = nullptr;
  std::shared_ptr<void> tls_ctx_;  // SSL_CTX
  int tcp_fd_ = -1, unix_fd_ = -1;
  int tcp_port_ = 0;
  std::vector<std::thread> acceptors_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> refused_{0};
  std::unique_ptr<JobLimiter> connections_per_job_;
  mutable absl::Mutex mu_;
  struct Entry {
    std::thread thread;
    DataConn* conn = nullptr;  // null once the thread ended
    DataConn::Kind kind = DataConn::Kind::kTcp;
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };
  std::map<int, Entry> conns_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex sinks_mu_;
  std::map<uint64_t, std::shared_ptr<AnswerSink>> sinks_ ABSL_GUARDED_BY(sinks_mu_);
  int next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ = false;
};

// The default Unix socket of a shard: <dir>/kvstore-<pid>-<n>.sock in
// $XDG_RUNTIME_DIR/dtrain-kvstore or /tmp/dtrain-kvstore-<uid>, created 0700
// (and checked to be this uid's and private).
absl::StatusOr<std::string> DefaultDataSocketPath();

// This host's boot id and this process's network namespace ("" when the
// boot id is unknown): where a client and a shard (or two replicas) compare
// hosts before one tries the other's Unix socket. Processes in different
// network namespaces (containers, pods, netlab's emulated hosts) are on
// different hosts to each other, even when a socket file would reach.
std::string HostId();

// ---------------------------------------------------------------------------
// Client

struct DataPortAddress {
  std::string host;  // for TCP (the host the client dialed for gRPC)
  int tcp_port = 0;
  bool tls = false;
  std::string unix_socket;  // "": TCP
  // The server's DataPortServer::instance() as discovery reported it; when
  // set, Dial refuses (FAILED_PRECONDITION) a server that answers with
  // another one.
  std::string instance;
};

// A client's connection: one request at a time.
class DataPortConnection {
 public:
  // Connects (TCP, with TLS when address.tls, verifying the server against
  // the CA and the host name; or the Unix socket, checking the server's
  // uid and creating the segment), sends the HELLO and reads its answer
  // (the server's refusal as its status). Transport failures are
  // UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<DataPortConnection>> Dial(const DataPortAddress& address,
                                                                  const v1::DataHello& hello,
                                                                  const DataPortTls& tls,
                                                                  absl::Duration timeout);
  ~DataPortConnection();

  DataConn::Kind kind() const { return conn_->kind(); }

  // Sends a request: `payload` goes into the segment (grown to hold it and
  // `reply_bytes`, the payload the reply will carry) on a Unix connection,
  // on the socket otherwise. The reply is awaited until `timeout` (which
  // the frame also carries to the server).
  absl::Status Send(DataOp op, const std::string& header,
                    const std::vector<absl::string_view>& payload, uint64_t reply_bytes,
                    absl::Duration timeout);
  // Reads the reply's headers: the protobuf header, or the server's error.
  absl::StatusOr<std::string> ReceiveHeader();
  uint64_t reply_payload_bytes() const { return reply_.payload_bytes; }
  // ReceiveHeader polls for the reply for up to `spin` before it blocks
  // (DataConn::SpinUntilReadable): for callers whose replies come within
  // tens of microseconds. Zero (the default): it blocks at once.
  void set_spin(absl::Duration spin) { spin_ = spin; }
  // The next `n` bytes of the reply's payload.
  absl::Status ReadPayload(char* dst, size_t n);

  // An answers connection (a HELLO with `answers`): its token, which a
  // push-pull at the chain's head names (v1::AnswerAt) so that the tail
  // answers it here; 0 for other connections.
  uint64_t answer_token() const { return answer_token_; }
  // The request id the next answer awaited here will carry (the server
  // answers ids in increasing order).
  uint64_t ReserveAnswerId() { return next_id_++; }
  // Reads the answer with `request_id` (skipping older ones: answers to
  // attempts given up on), as ReceiveHeader reads a reply; then
  // ReadPayload. DEADLINE_EXCEEDED after `timeout`.
  absl::StatusOr<std::string> ReceiveAnswer(uint64_t request_id, absl::Duration timeout);
  // Until `a` or `b` has bytes to read (or was closed): 0 or 1;
  // DEADLINE_EXCEEDED after `timeout`.
  static absl::StatusOr<int> WaitEither(DataPortConnection& a, DataPortConnection& b,
                                        absl::Duration timeout);
  // Ends a blocked call (from any thread); the connection is then unusable.
  void Shutdown() { conn_->Shutdown(); }
  // Whether the server closed its end (one poll; reads nothing).
  bool PeerClosed() { return conn_->PeerClosed(); }

 private:
  DataPortConnection() = default;
  absl::Status EnsureSegment(uint64_t bytes, int* pass_fd);

  std::unique_ptr<DataConn> conn_;
  uint64_t next_id_ = 1;
  absl::Duration spin_ = absl::ZeroDuration();
  FrameHeader reply_;
  uint64_t reply_read_ = 0;
  uint64_t answer_token_ = 0;
  // The shared-memory segment (Unix connections).
  net::SharedMemory segment_;
};

// The idle connections to one server that later requests reuse (the
// client's pool per shard address, a replica's link to its successor). A
// connection the server closed while it sat idle (the server restarted, or
// shut down) is dropped when taken instead of failing the request that
// would have used it, and the taker learns of it so that it asks the server
// for its data port again (a restarted one listens elsewhere).
//
//   IdleDataConns idle(/*capacity=*/4);
//   bool closed = false;
//   std::unique_ptr<DataPortConnection> conn = idle.Take(&closed);
//   if (closed) { /* rediscover the address */ }
//   if (conn == nullptr) { /* dial */ }
//   ...  // one request and its reply
//   idle.Put(std::move(conn));
//
// Thread-safety: none; its owner locks.
class IdleDataConns {
 public:
  // Connections reused within this of their last request are not checked:
  // they just worked, and a server gone since is a failure like any other
  // (its request fails and is retried).
  static constexpr absl::Duration kCheckAfter = absl::Milliseconds(1);

  explicit IdleDataConns(size_t capacity) : capacity_(capacity) {}

  // An idle connection whose server has not closed it, the most recently
  // used first, or null. `*peer_closed` becomes true when closed ones were
  // dropped.
  std::unique_ptr<DataPortConnection> Take(bool* peer_closed);
  // Keeps `conn` (after a complete request and reply) unless `capacity`
  // are idle already.
  void Put(std::unique_ptr<DataPortConnection> conn);
  void Clear() { idle_.clear(); }
  size_t size() const { return idle_.size(); }

 private:
  struct Idle {
    std::unique_ptr<DataPortConnection> conn;
    absl::Time since;
  };
  const size_t capacity_;
  std::vector<Idle> idle_;
};

// For tests of hostile peers: a raw connection to a data port (no HELLO).
absl::StatusOr<std::unique_ptr<DataConn>> DialDataConn(const DataPortAddress& address,
                                                       const DataPortTls& tls,
                                                       absl::Duration timeout);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_DATA_PORT_H_
