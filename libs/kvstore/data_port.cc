#include "libs/kvstore/data_port.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/base/files.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/net/tls.h"
#include "protos/kvstore.pb.h"

namespace dtrain {
namespace kvstore {
namespace {

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// `status` with "data port: " before its message.
absl::Status DataPortError(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("data port: ", status.message()));
}

// Splits "host:port" ("[v6]:port" too).
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), port) ||
      *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("data port address '", address, "' is not host:port"));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

// A plain socket: TCP or Unix (which can pass descriptors).
class FdConn : public DataConn {
 public:
  FdConn(int fd, Kind kind) : fd_(fd), kind_(kind) {}
  ~FdConn() override {
    if (received_fd_ >= 0) close(received_fd_);
    close(fd_);
  }
  Kind kind() const override { return kind_; }

  // Reads through a small buffer: a frame's fixed header and protobuf
  // header (and a small payload on the socket) arrive in one system call
  // instead of two or three (a system call costs about 1 us on the virtual
  // machines we run on). Reads of kReadAhead bytes or more go straight to
  // the caller's memory.
  absl::Status ReadFull(void* buf, size_t n) override {
    char* p = static_cast<char*>(buf);
    while (n > 0) {
      if (ahead_begin_ < ahead_end_) {
        const size_t take = std::min(n, ahead_end_ - ahead_begin_);
        std::memcpy(p, ahead_.get() + ahead_begin_, take);
        ahead_begin_ += take;
        p += take;
        n -= take;
        continue;
      }
      ssize_t got;
      if (n >= kReadAhead) {
        got = Receive(p, n);
        if (got > 0) {
          p += got;
          n -= static_cast<size_t>(got);
          continue;
        }
      } else {
        if (ahead_ == nullptr) ahead_.reset(new char[kReadAhead]);
        got = Receive(ahead_.get(), kReadAhead);
        if (got > 0) {
          ahead_begin_ = 0;
          ahead_end_ = static_cast<size_t>(got);
          continue;
        }
      }
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return absl::DeadlineExceededError("data port: no reply before the deadline");
      }
      return absl::UnavailableError(got == 0 ? "data port: connection closed by the peer"
                                             : Errno("data port: read"));
    }
    return absl::OkStatus();
  }

  absl::Status WriteAll(const std::vector<absl::string_view>& pieces, int pass_fd) override {
    if (pass_fd >= 0 && kind_ != Kind::kUnix) {
      return absl::FailedPreconditionError("data port: only a Unix socket passes descriptors");
    }
    std::vector<iovec> iov;
    for (absl::string_view p : pieces) {
      if (!p.empty()) iov.push_back({const_cast<char*>(p.data()), p.size()});
    }
    size_t first = 0;
    while (first < iov.size()) {
      msghdr msg{};
      msg.msg_iov = &iov[first];
      msg.msg_iovlen = std::min<size_t>(iov.size() - first, 1024);
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
      if (pass_fd >= 0) {
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
      }
      ssize_t sent = sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(Errno("data port: write"));
      }
      pass_fd = -1;
      size_t left = static_cast<size_t>(sent);
      while (left > 0 && first < iov.size()) {
        if (left >= iov[first].iov_len) {
          left -= iov[first].iov_len;
          ++first;
        } else {
          iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
          iov[first].iov_len -= left;
          left = 0;
        }
      }
    }
    return absl::OkStatus();
  }

  int TakeReceivedFd() override {
    int fd = received_fd_;
    received_fd_ = -1;
    return fd;
  }
  void Shutdown() override { shutdown(fd_, SHUT_RDWR); }
  bool PeerClosed() override {
    pollfd p{fd_, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }
  void SetReadTimeout(absl::Duration timeout) override {
    // Clients set the same timeout on every request: one system call less.
    if (read_timeout_.has_value() && *read_timeout_ == timeout) return;
    read_timeout_ = timeout;
    timeval tv{};
    if (timeout != absl::InfiniteDuration()) {
      timeout = std::max(timeout, absl::Milliseconds(1));
      tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
      tv.tv_usec = static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000);
    }
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  bool SpinUntilReadable(absl::Duration spin) override {
    if (ahead_begin_ < ahead_end_) return true;
    const absl::Time end = absl::Now() + spin;
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 0) != 0) return true;  // readable, closed, or an error to read
      if (absl::Now() >= end) return false;
      sched_yield();  // another thread on this CPU may be what we wait for
    }
  }
  bool HasBuffered() const override { return ahead_begin_ < ahead_end_; }
  int fd() const override { return fd_; }
  void SetIoTimeout(absl::Duration timeout) override;
  absl::StatusOr<security::Identity> AcceptHandshake() override { return security::Anonymous(); }

 protected:
  // Buffered reads take up to this many bytes from the socket at once.
  static constexpr size_t kReadAhead = 8192;

  // One recv (recvmsg on a Unix socket, keeping a descriptor that came with
  // the bytes: our peers send one frame at a time and wait for its answer,
  // so a descriptor read ahead still belongs to the next frame decoded).
  ssize_t Receive(char* p, size_t n) {
    if (kind_ != Kind::kUnix) return recv(fd_, p, n, 0);
    iovec iov{p, n};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t got = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (got > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c), sizeof(fd));
          if (received_fd_ >= 0) close(received_fd_);
          received_fd_ = fd;
        }
      }
    }
    return got;
  }

  const int fd_;
  const Kind kind_;
  int received_fd_ = -1;
  // Bytes read from the socket and not yet returned: [begin, end).
  std::unique_ptr<char[]> ahead_;
  size_t ahead_begin_ = 0, ahead_end_ = 0;
  // The last SetReadTimeout (unknown: the socket's timeout was set otherwise).
  absl::optional<absl::Duration> read_timeout_;
};

absl::StatusOr<security::Identity> PeerCertIdentity(SSL* ssl);

// TCP under TLS 1.3.
class TlsConn : public FdConn {
 public:
  TlsConn(int fd, SSL* ssl) : FdConn(fd, Kind::kTls), ssl_(ssl) {}
  ~TlsConn() override { SSL_free(ssl_); }

  // Server side: the handshake, then the client's verified identity.
  absl::StatusOr<security::Identity> AcceptHandshake() override {
    if (SSL_accept(ssl_) != 1) {
      return absl::UnauthenticatedError("data port: TLS handshake failed: " + net::OpenSslErrors());
    }
    return PeerCertIdentity(ssl_);
  }
  // Client side: the handshake (the server's certificate verified).
  absl::Status Connect() {
    if (SSL_connect(ssl_) != 1) {
      return absl::UnavailableError("data port: TLS handshake with the shard failed: " +
                                    net::OpenSslErrors());
    }
    return absl::OkStatus();
  }

  absl::Status ReadFull(void* buf, size_t n) override {
    char* p = static_cast<char*>(buf);
    while (n > 0) {
      size_t got = 0;
      int r = SSL_read_ex(ssl_, p, n, &got);
      if (r == 1) {
        p += got;
        n -= got;
        continue;
      }
      const int err = SSL_get_error(ssl_, r);
      if (err == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return absl::DeadlineExceededError("data port: no reply before the deadline");
      }
      ERR_clear_error();
      return absl::UnavailableError(err == SSL_ERROR_ZERO_RETURN
                                        ? "data port: connection closed by the peer"
                                        : "data port: TLS read failed (connection closed?)");
    }
    return absl::OkStatus();
  }

  bool SpinUntilReadable(absl::Duration spin) override {
    // SSL_has_pending: decrypted bytes, or raw ones read ahead.
    return SSL_has_pending(ssl_) == 1 || FdConn::SpinUntilReadable(spin);
  }
  bool HasBuffered() const override { return SSL_has_pending(ssl_) == 1; }

  absl::Status WriteAll(const std::vector<absl::string_view>& pieces, int pass_fd) override {
    if (pass_fd >= 0) {
      return absl::FailedPreconditionError("data port: only a Unix socket passes descriptors");
    }
    // Small pieces are gathered into one record (a frame's headers and a
    // small value: one write, one record).
    size_t total = 0;
    for (absl::string_view p : pieces) total += p.size();
    if (total <= 16384) {
      gather_.clear();
      for (absl::string_view p : pieces) gather_.append(p.data(), p.size());
      return Write(gather_);
    }
    for (absl::string_view p : pieces) DT_RETURN_IF_ERROR(Write(p));
    return absl::OkStatus();
  }

 private:
  absl::Status Write(absl::string_view data) {
    while (!data.empty()) {
      size_t wrote = 0;
      if (SSL_write_ex(ssl_, data.data(), data.size(), &wrote) != 1) {
        ERR_clear_error();
        return absl::UnavailableError("data port: TLS write failed (connection closed?)");
      }
      data.remove_prefix(wrote);
    }
    return absl::OkStatus();
  }

  SSL* const ssl_;
  std::string gather_;
};

// SSL_CTX for one side, from the certificate files.
absl::StatusOr<std::shared_ptr<SSL_CTX>> MakeTlsContext(const DataPortTls& tls, bool server) {
  net::TlsContextOptions options;
  options.side =
      server ? net::TlsContextOptions::Side::kServer : net::TlsContextOptions::Side::kClient;
  options.files = {tls.ca_file, tls.cert_file, tls.key_file};
  // Read whatever the socket holds, not a record's header and then its
  // body: one system call per small frame instead of two or more.
  options.read_ahead = true;
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx = net::NewTlsContext(options);
  if (!ctx.ok()) return DataPortError(ctx.status());
  return ctx;
}

// The client context, made once per set of files.
absl::StatusOr<std::shared_ptr<SSL_CTX>> ClientTlsContext(const DataPortTls& tls) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<std::string, std::shared_ptr<SSL_CTX>>();
  // Keyed by the files and their modification times: rewritten
  // certificates are read again.
  std::string key;
  for (const std::string& f : {tls.ca_file, tls.cert_file, tls.key_file}) {
    struct stat st {};
    stat(f.c_str(), &st);
    absl::StrAppend(&key, f, "@", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "/", st.st_size,
                    "\n");
  }
  absl::MutexLock lock(&mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  DT_ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> ctx, MakeTlsContext(tls, /*server=*/false));
  (*cache)[key] = ctx;
  return ctx;
}

// The identity in the verified peer certificate of `ssl`.
absl::StatusOr<security::Identity> PeerCertIdentity(SSL* ssl) {
  X509* cert = SSL_get_peer_certificate(ssl);
  if (cert == nullptr) return absl::UnauthenticatedError("the peer presented no certificate");
  std::unique_ptr<X509, void (*)(X509*)> owned(cert, X509_free);
  if (SSL_get_verify_result(ssl) != X509_V_OK) {
    return absl::UnauthenticatedError("the peer's certificate is not signed by the cluster CA");
  }
  std::unique_ptr<BIO, int (*)(BIO*)> bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_X509(bio.get(), cert);
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  absl::StatusOr<security::Identity> id =
      security::IdentityFromCertPem(absl::string_view(data, static_cast<size_t>(size)));
  if (!id.ok()) return absl::UnauthenticatedError(id.status().message());
  return id;
}

absl::Status CheckPeerUid(int fd, const char* who) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::UnavailableError(Errno("data port: SO_PEERCRED"));
  }
  if (cred.uid != getuid() && cred.uid != 0) {
    return absl::PermissionDeniedError(absl::StrCat("data port: the ", who, " runs as uid ",
                                                    cred.uid, ", not this process's uid ", getuid(),
                                                    " (or root)"));
  }
  return absl::OkStatus();
}

void SetTimeouts(int fd, absl::Duration timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
  tv.tv_usec = static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void ClearTimeouts(int fd) {
  timeval tv{};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void FdConn::SetIoTimeout(absl::Duration timeout) {
  read_timeout_.reset();  // set otherwise than by SetReadTimeout
  if (timeout == absl::InfiniteDuration()) {
    ClearTimeouts(fd_);
  } else {
    SetTimeouts(fd_, timeout);
  }
}

// Writes one frame: fixed header, protobuf header, payload pieces.
absl::Status WriteFrame(DataConn& conn, FrameHeader h, absl::string_view header,
                        const std::vector<absl::string_view>& payload, int pass_fd = -1) {
  char fixed[kFrameHeaderSize];
  h.header_bytes = static_cast<uint32_t>(header.size());
  EncodeFrameHeader(h, fixed);
  std::vector<absl::string_view> pieces = {absl::string_view(fixed, sizeof(fixed)), header};
  pieces.insert(pieces.end(), payload.begin(), payload.end());
  return conn.WriteAll(pieces, pass_fd);
}

absl::Status WriteError(DataConn& conn, uint16_t op, uint64_t id, const absl::Status& status) {
  FrameHeader h;
  h.op = static_cast<uint16_t>(op | kReplyBit);
  h.request_id = id;
  h.arg = static_cast<uint32_t>(status.code());
  return WriteFrame(conn, h, status.message(), {});
}

// A segment the client passed (sealed against shrinking, sized and mapped:
// net::SharedMemory::MapSealed).
struct Segment {
  net::SharedMemory memory;
  char* data = nullptr;
  uint64_t bytes = 0;
  absl::Status Map(int fd) {
    absl::StatusOr<net::SharedMemory> m = net::SharedMemory::MapSealed(fd, kMaxSegmentBytes);
    if (!m.ok()) return DataPortError(m.status());
    memory = std::move(*m);
    data = memory.data();
    bytes = memory.size();
    return absl::OkStatus();
  }
};

// Writes a request's reply (the error when `status` is not OK): its
// payload in the client's segment when it fits, on the socket otherwise.
absl::Status WriteReply(DataConn& conn, const Segment& segment, uint16_t op, uint64_t id,
                        const absl::Status& status, const DataReply& reply) {
  if (!status.ok()) return WriteError(conn, op, id, status);
  FrameHeader out;
  out.op = static_cast<uint16_t>(op | kReplyBit);
  out.request_id = id;
  uint64_t total = 0;
  for (absl::string_view v : reply.values) total += v.size();
  out.payload_bytes = total;
  if (conn.kind() == DataConn::Kind::kUnix && total > 0 && total <= segment.bytes) {
    char* p = segment.data;
    for (absl::string_view v : reply.values) {
      std::memcpy(p, v.data(), v.size());
      p += v.size();
    }
    out.flags = kPayloadInSegment;
    return WriteFrame(conn, out, reply.header, {});
  }
  return WriteFrame(conn, out, reply.header, reply.values);
}

absl::StatusOr<int> Listen(int family, const sockaddr* addr, socklen_t len, const char* what) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(Errno("data port: socket"));
  int one = 1;
  if (family != AF_UNIX) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, addr, len) != 0 || listen(fd, 128) != 0) {
    std::string error = Errno(absl::StrCat("data port: bind ", what).c_str());
    close(fd);
    return absl::UnavailableError(error);
  }
  return fd;
}

}  // namespace

const char* DataConn::KindName(Kind kind) {
  switch (kind) {
    case Kind::kTcp:
      return "tcp";
    case Kind::kTls:
      return "tls";
    case Kind::kUnix:
      return "unix";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------
// Server

namespace {

// `bytes` random bytes (OpenSSL's generator).
std::string RandomBytes(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  DT_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) == 1)
      << "RAND_bytes failed";
  return raw;
}

// `bytes` random bytes, hex.
std::string RandomHex(int bytes) { return absl::BytesToHexString(RandomBytes(bytes)); }

// A Unix HELLO without a job (a replica link) with TLS on: its ticket must
// be `ticket` (compared in constant time).
absl::Status CheckReplicaTicket(const std::string& sent, const std::string& ticket) {
  if (sent.empty()) {
    return absl::PermissionDeniedError(
        "data port: a Unix HELLO without a job opens a replica link and must carry the shard's "
        "replica ticket (KVStore.DataPort gives it only to kvstore shards and admins); this one "
        "carried none");
  }
  if (sent.size() != ticket.size() ||
      CRYPTO_memcmp(sent.data(), ticket.data(), ticket.size()) != 0) {
    return absl::PermissionDeniedError(
        "data port: the replica ticket of this Unix HELLO is not this shard's (a restarted shard "
        "has a new one: ask its KVStore.DataPort again)");
  }
  return absl::OkStatus();
}

}  // namespace

// An answers connection as Answer writes on it.
struct DataPortServer::AnswerSink {
  absl::Mutex mu;
  DataConn* conn ABSL_GUARDED_BY(mu) = nullptr;  // null once its thread left
  const Segment* segment ABSL_GUARDED_BY(mu) = nullptr;
  absl::optional<std::string> scope;  // its HELLO's job (nullopt: unconfined)
  uint64_t last_id ABSL_GUARDED_BY(mu) = 0;
};

absl::StatusOr<std::unique_ptr<DataPortServer>> DataPortServer::Start(
    const DataPortServerOptions& options, DataPortHandler* handler) {
  std::unique_ptr<DataPortServer> s(new DataPortServer());
  s->options_ = options;
  s->handler_ = handler;
  s->connections_per_job_ =
      std::make_unique<JobLimiter>(options.max_connections_per_job, "data port connections",
                                   "kvstore_server --data_max_connections_per_job");
  s->instance_ = RandomHex(8);
  s->replica_ticket_ = RandomBytes(kReplicaTicketBytes);
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("data port: max_connections must be >= 1");
  }
  if (options.tls.enabled && !options.tcp_listen.empty()) {
    DT_ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> ctx, MakeTlsContext(options.tls, true));
    s->tls_ctx_ = ctx;
  }
  if (!options.tcp_listen.empty()) {
    std::string host;
    int port = 0;
    DT_RETURN_IF_ERROR(SplitHostPort(options.tcp_listen, &host, &port));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    if (getaddrinfo(host.empty() || host == "0.0.0.0" || host == "::" ? nullptr : host.c_str(),
                    service.c_str(), &hints, &res) != 0 ||
        res == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("data port: cannot resolve '", options.tcp_listen, "'"));
    }
    absl::StatusOr<int> fd =
        Listen(res->ai_family, res->ai_addr, res->ai_addrlen, options.tcp_listen.c_str());
    freeaddrinfo(res);
    DT_RETURN_IF_ERROR(fd.status());
    s->tcp_fd_ = *fd;
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    getsockname(s->tcp_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    s->tcp_port_ =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  if (!options.unix_socket.empty()) {
    const std::string& path = options.unix_socket;
    sockaddr_un addr{};
    if (path.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data port: socket path '", path, "' is too long"));
    }
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    struct stat st {};
    if (stat(dir.c_str(), &st) != 0 || st.st_uid != getuid() || (st.st_mode & 022) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("data port: socket directory '", dir,
                       "' must exist, belong to this uid and be writable only by it (chmod 700)"));
    }
    unlink(path.c_str());  // a stale socket of an earlier run
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    DT_ASSIGN_OR_RETURN(s->unix_fd_, Listen(AF_UNIX, reinterpret_cast<sockaddr*>(&addr),
                                            sizeof(addr), path.c_str()));
    // Who may connect is the directory's mode and then SO_PEERCRED (same
    // uid or root), not the socket file's.
    chmod(path.c_str(), 0777);
  }
  DataPortServer* self = s.get();
  if (s->tcp_fd_ >= 0) {
    s->acceptors_.emplace_back([self] { self->AcceptLoop(self->tcp_fd_, false); });
  }
  if (s->unix_fd_ >= 0) {
    s->acceptors_.emplace_back([self] { self->AcceptLoop(self->unix_fd_, true); });
  }
  return s;
}

DataPortServer::~DataPortServer() { Shutdown(); }

void DataPortServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stopping_ = true;
  for (int fd : {tcp_fd_, unix_fd_}) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
  for (std::thread& t : acceptors_) t.join();
  for (int fd : {tcp_fd_, unix_fd_}) {
    if (fd >= 0) close(fd);
  }
  if (!options_.unix_socket.empty()) unlink(options_.unix_socket.c_str());
  std::map<int, Entry> conns;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, e] : conns_) {
      if (e.conn != nullptr) e.conn->Shutdown();
    }
    conns.swap(conns_);
  }
  for (auto& [id, e] : conns) e.thread.join();
}

std::map<std::string, int> DataPortServer::Connections() const {
  std::map<std::string, int> out = {{"tcp", 0}, {"tls", 0}, {"unix", 0}};
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : conns_) {
    if (e.conn != nullptr) ++out[DataConn::KindName(e.kind)];
  }
  return out;
}

void DataPortServer::AcceptLoop(int listen_fd, bool unix_socket) {
  while (!stopping_) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_) return;
      DT_LOG(WARNING) << Errno("data port: accept");
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    const DataConn::Kind kind = unix_socket           ? DataConn::Kind::kUnix
                                : tls_ctx_ != nullptr ? DataConn::Kind::kTls
                                                      : DataConn::Kind::kTcp;
    if (!unix_socket) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    std::vector<std::thread> ended;
    mu_.Lock();
    // Join the threads of connections that ended.
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second.done->load()) {
        ended.push_back(std::move(it->second.thread));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    int open = 0;
    for (const auto& [other, entry] : conns_) open += entry.conn != nullptr;
    const int id = next_id_++;
    Entry& e = conns_[id];
    e.kind = kind;
    std::shared_ptr<std::atomic<bool>> done = e.done;
    std::unique_ptr<DataConn> conn;
    if (kind == DataConn::Kind::kTls) {
      SSL* ssl = SSL_new(static_cast<SSL_CTX*>(tls_ctx_.get()));
      SSL_set_fd(ssl, fd);
      conn = std::make_unique<TlsConn>(fd, ssl);
    } else {
      conn = std::make_unique<FdConn>(fd, kind);
    }
    e.conn = conn.get();
    if (open >= options_.max_connections) {
      ++refused_;
      e.conn = nullptr;
      // Refused on its own thread (a TLS handshake first), not this one.
      e.thread =
          std::thread([conn = std::move(conn), max = options_.max_connections, done]() mutable {
            auto* c = conn.get();
            c->SetIoTimeout(absl::Seconds(5));
            struct Done {
              std::atomic<bool>* d;
              ~Done() { *d = true; }
            } mark{done.get()};
            if (!c->AcceptHandshake().ok()) return;
            // Read the HELLO first, so that closing does not reset the reply away.
            char fixed[kFrameHeaderSize];
            if (c->ReadFull(fixed, sizeof(fixed)).ok()) {
              absl::StatusOr<FrameHeader> h =
                  DecodeFrameHeader(absl::string_view(fixed, sizeof(fixed)), true);
              if (h.ok() && h->header_bytes <= 4096) {
                std::string header(h->header_bytes, '\0');
                (void)c->ReadFull(header.data(), header.size());
              }
            }
            (void)WriteError(*c, static_cast<uint16_t>(DataOp::kHello), 0,
                             absl::ResourceExhaustedError(absl::StrCat(
                                 "kvstore data port: at its limit of ", max,
                                 " connections (--data_max_connections); use gRPC or retry")));
          });
    } else {
      e.thread = std::thread([this, conn = std::move(conn), id, done]() mutable {
        Serve(std::move(conn), id);
        *done = true;
      });
    }
    mu_.Unlock();
    for (std::thread& t : ended) t.join();
  }
}

struct DataPortServer::Session {
  security::Identity who = security::Anonymous();
  absl::optional<std::string> scope;  // the job it is bound to; nullopt: unconfined
  JobLimiter::Hold job_hold;          // its place among its job's connections
  Segment segment;                    // a Unix peer's
  uint64_t answer_token = 0;          // an answers connection's (DataHello.answers)
};

void DataPortServer::Release(int id) {
  absl::MutexLock lock(&mu_);
  auto it = conns_.find(id);
  if (it != conns_.end()) it->second.conn = nullptr;
}

void DataPortServer::Serve(std::unique_ptr<DataConn> conn, int id) {
  absl::Cleanup release = [this, id] { Release(id); };
  Session session;
  // The handshake and HELLO within 10 s.
  conn->SetIoTimeout(absl::Seconds(10));
  if (!Admit(*conn, id, &session) || !Hello(*conn, id, &session)) return;
  conn->SetIoTimeout(absl::InfiniteDuration());
  if (session.answer_token != 0) {
    ServeAnswers(*conn, session.answer_token);
    Unregister(session.answer_token);
    return;
  }
  ServeRequests(*conn, session);
}

bool DataPortServer::Admit(DataConn& conn, int id, Session* session) {
  absl::StatusOr<security::Identity> who = conn.AcceptHandshake();
  if (!who.ok()) {
    DT_LOG(DEBUG) << "data port: TLS handshake refused: " << who.status();
    return false;
  }
  session->who = *who;
  if (conn.kind() != DataConn::Kind::kUnix) return true;
  absl::Status peer = CheckPeerUid(conn.fd(), "client");
  if (!peer.ok()) {
    Release(id);
    (void)WriteError(conn, static_cast<uint16_t>(DataOp::kHello), 0, peer);
    return false;
  }
  if (options_.tls.enabled) {
    // A local process of this uid could read the certificate files; it
    // counts as a trainer, so a cluster secret still requires its token.
    session->who.name = absl::StrCat("local-uid-", getuid());
    session->who.role = security::Role::kTrainer;
    session->who.authenticated = true;
  }
  return true;
}

bool DataPortServer::Hello(DataConn& conn, int id, Session* session) {
  char fixed[kFrameHeaderSize];
  if (!conn.ReadFull(fixed, sizeof(fixed)).ok()) return false;
  absl::StatusOr<FrameHeader> h =
      DecodeFrameHeader(absl::string_view(fixed, sizeof(fixed)), /*request=*/true);
  if (h.ok() && h->op != static_cast<uint16_t>(DataOp::kHello)) {
    h = absl::InvalidArgumentError(
        absl::StrCat("data port: the first frame must be HELLO, got ", DataOpName(h->op)));
  }
  if (h.ok() && h->payload_bytes != 0) {
    h = absl::InvalidArgumentError("data port: HELLO carries no payload");
  }
  if (!h.ok()) {
    Release(id);
    (void)WriteError(conn, static_cast<uint16_t>(DataOp::kHello), 0, h.status());
    return false;
  }
  std::string header(h->header_bytes, '\0');
  if (!conn.ReadFull(header.data(), header.size()).ok()) return false;
  v1::DataHello hello;
  absl::Status status;
  if (!hello.ParseFromString(header)) {
    status = absl::InvalidArgumentError("data port: unparsable DataHello");
  }
  if (status.ok() && conn.kind() == DataConn::Kind::kUnix) {
    const int seg_fd = conn.TakeReceivedFd();
    status = seg_fd < 0 ? absl::InvalidArgumentError(
                              "data port: a Unix HELLO must pass its shared-memory segment")
                        : session->segment.Map(seg_fd);
  }
  if (status.ok() && conn.kind() == DataConn::Kind::kUnix && options_.tls.enabled &&
      hello.job().empty()) {
    // A chain predecessor on this host: the ticket it got over mutual TLS
    // (KVStore.DataPort) makes it a kvstore peer.
    status = CheckReplicaTicket(hello.replica_ticket(), replica_ticket_);
    if (status.ok()) {
      session->who.name = absl::StrCat("local-replica-uid-", getuid());
      session->who.role = security::Role::kKvstore;
    }
  }
  int workers = 0;  // the job's trainers, as its token says
  if (status.ok()) {
    absl::StatusOr<absl::optional<security::JobGrant>> bound =
        handler_->Hello(session->who, hello, conn.kind());
    if (!bound.ok()) {
      status = bound.status();
    } else if (bound->has_value()) {
      session->scope = (*bound)->job;
      workers = (*bound)->workers;
    }
  }
  // A job's connections count against its cap (its client then uses
  // gRPC); a replica link names no job.
  const std::string& job = session->scope.has_value() ? *session->scope : hello.job();
  if (status.ok() && !job.empty()) {
    absl::StatusOr<JobLimiter::Hold> hold = connections_per_job_->Acquire(job, workers);
    if (hold.ok()) {
      session->job_hold = std::move(*hold);
    } else {
      status = hold.status();
    }
  }
  if (!status.ok()) {
    DT_LOG(DEBUG) << "data port: refused " << session->who.ToString() << ": " << status;
    Release(id);
    (void)WriteError(conn, static_cast<uint16_t>(DataOp::kHello), h->request_id, status);
    return false;
  }
  FrameHeader reply;
  reply.op = static_cast<uint16_t>(h->op | kReplyBit);
  reply.request_id = h->request_id;
  v1::DataHelloReply accepted;
  accepted.set_instance(instance_);
  std::shared_ptr<AnswerSink> sink;
  if (hello.answers()) {
    // Registered before the client learns the token.
    sink = std::make_shared<AnswerSink>();
    sink->conn = &conn;
    sink->segment = &session->segment;
    sink->scope = session->scope;
    absl::MutexLock lock(&sinks_mu_);
    uint64_t token = 0;
    do {
      const std::string r = RandomBytes(8);
      std::memcpy(&token, r.data(), sizeof(token));
    } while (token == 0 || sinks_.count(token) > 0);
    sinks_[token] = sink;
    session->answer_token = token;
    accepted.set_answer_token(token);
  }
  // Answers wait until this write returned: the client may have its
  // bytes (and the tail an answer for it) before (TLS: one state).
  if (sink != nullptr) sink->mu.Lock();
  const bool written = WriteFrame(conn, reply, accepted.SerializeAsString(), {}).ok();
  if (sink != nullptr) sink->mu.Unlock();
  if (!written && session->answer_token != 0) Unregister(session->answer_token);
  return written;
}

void DataPortServer::Unregister(uint64_t token) {
  std::shared_ptr<AnswerSink> sink;
  {
    absl::MutexLock lock(&sinks_mu_);
    auto it = sinks_.find(token);
    if (it == sinks_.end()) return;
    sink = std::move(it->second);
    sinks_.erase(it);
  }
  absl::MutexLock lock(&sink->mu);
  sink->conn = nullptr;  // nothing is written after this
}

void DataPortServer::ServeRequests(DataConn& conn, Session& session) {
  Segment& segment = session.segment;
  std::unique_ptr<char[]> buffer;
  uint64_t buffer_bytes = 0;
  std::string header;
  // An eventfd for DataResponder::Poke, made at the first PushPull.
  int wake_fd = -1;
  bool no_wake_fd = false;  // eventfd failed once
  absl::Cleanup close_wake = [&wake_fd] {
    if (wake_fd >= 0) close(wake_fd);
  };
  absl::Duration spin = absl::ZeroDuration();
  while (!stopping_) {
    char fixed[kFrameHeaderSize];
    if (spin > absl::ZeroDuration()) conn.SpinUntilReadable(spin);
    if (!conn.ReadFull(fixed, sizeof(fixed)).ok()) return;
    absl::StatusOr<FrameHeader> h =
        DecodeFrameHeader(absl::string_view(fixed, sizeof(fixed)), /*request=*/true);
    const int new_segment = conn.TakeReceivedFd();
    if (!h.ok()) {
      if (new_segment >= 0) close(new_segment);
      (void)WriteError(conn, 0, 0, h.status());
      return;
    }
    header.resize(h->header_bytes);
    if (!conn.ReadFull(header.data(), header.size()).ok()) {
      if (new_segment >= 0) close(new_segment);
      return;
    }
    absl::Status bad;
    if (new_segment >= 0) bad = segment.Map(new_segment);
    const bool in_segment = (h->flags & kPayloadInSegment) != 0;
    if (bad.ok() && in_segment && h->payload_bytes > segment.bytes) {
      bad = absl::InvalidArgumentError(absl::StrCat("data port: payload of ", h->payload_bytes,
                                                    " bytes does not fit the segment of ",
                                                    segment.bytes));
    }
    if (bad.ok() && h->op == static_cast<uint16_t>(DataOp::kHello)) {
      bad = absl::InvalidArgumentError("data port: HELLO twice");
    }
    if (!bad.ok()) {
      (void)WriteError(conn, h->op, h->request_id, bad);
      return;
    }
    bool payload_read = h->payload_bytes == 0;
    DataRequest request;
    request.op = static_cast<DataOp>(h->op);
    request.header = header;
    request.payload_bytes = h->payload_bytes;
    request.kind = conn.kind();
    request.scope = &session.scope;
    request.who = &session.who;
    request.deadline =
        h->arg == 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(h->arg);
    DataConn* c = &conn;
    request.cancelled = [this, c] { return stopping_.load() || c->PeerClosed(); };
    request.read_payload = [&]() -> absl::StatusOr<absl::string_view> {
      if (payload_read) {
        if (h->payload_bytes == 0) return absl::string_view();
        return absl::FailedPreconditionError("data port: payload read twice");
      }
      payload_read = true;
      if (in_segment) return absl::string_view(segment.data, h->payload_bytes);
      if (h->payload_bytes > buffer_bytes) {
        buffer.reset(new char[h->payload_bytes]);
        buffer_bytes = h->payload_bytes;
      }
      DT_RETURN_IF_ERROR(conn.ReadFull(buffer.get(), h->payload_bytes));
      return absl::string_view(buffer.get(), h->payload_bytes);
    };
    std::shared_ptr<DataResponder> deferred;
    if (wake_fd < 0 && !no_wake_fd && h->op == static_cast<uint16_t>(DataOp::kPushPull)) {
      // Made for the first PushPull (the only request the shard defers).
      // Without it (the process is out of descriptors) this connection's
      // requests get no `defer`: they wait on its thread.
      wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (wake_fd < 0) {
        no_wake_fd = true;
        DT_LOG(WARNING) << Errno("data port: eventfd")
                        << "; this connection's push-pulls wait on its thread";
      }
    }
    if (wake_fd >= 0) {
      request.defer = [&]() -> std::shared_ptr<DataResponder> {
        DT_CHECK(deferred == nullptr) << "data port: a request deferred twice";
        const Segment* seg = &segment;
        const uint16_t op = h->op;
        const uint64_t id = h->request_id;
        deferred.reset(new DataResponder(
            [c, seg, op, id](const absl::Status& status, const DataReply& reply) {
              return WriteReply(*c, *seg, op, id, status, reply);
            },
            wake_fd));
        return deferred;
      };
    }
    DataReply reply;
    absl::Status status = handler_->Handle(request, &reply);
    if (deferred != nullptr) {
      if (!payload_read && !in_segment) {
        status = absl::InternalError("data port: the handler deferred a request it did not read");
      }
      if (!status.ok()) deferred->Answer(status, DataReply());
      if (!AwaitAnswer(*deferred, conn, h->op, h->request_id)) return;
      spin = absl::ZeroDuration();
      continue;
    }
    if (!status.ok()) {
      if (!WriteError(conn, h->op, h->request_id, status).ok()) return;
      if (!payload_read && !in_segment) return;  // the stream is out of step
      continue;
    }
    if (!payload_read && !in_segment) {
      (void)WriteError(conn, h->op, h->request_id,
                       absl::InternalError("data port: the handler left the payload unread"));
      return;
    }
    if (reply.none) {  // answered elsewhere (v1::AnswerAt)
      spin = absl::ZeroDuration();
      continue;
    }
    if (!WriteReply(conn, segment, h->op, h->request_id, absl::OkStatus(), reply).ok()) return;
    spin = h->op == static_cast<uint16_t>(DataOp::kReplicate) ? options_.replicate_spin
                                                              : absl::ZeroDuration();
  }
}

bool DataPortServer::AwaitAnswer(DataResponder& r, DataConn& conn, uint16_t op,
                                 uint64_t request_id) {
  const int fd = conn.fd();
  for (;;) {
    absl::Time at;
    bool buffered;
    {
      absl::MutexLock lock(&r.mu_);
      if (r.answered_) return !r.failed_;
      if (stopping_) {
        r.EndLocked();
        return false;
      }
      at = r.at_;
      // Under the lock: an answer being written (TLS) shares the state.
      buffered = conn.HasBuffered();
    }
    pollfd fds[2] = {{fd, POLLIN | POLLRDHUP, 0}, {r.wake_fd_, POLLIN, 0}};
    if (!buffered) {
      // At most a second at a time: Shutdown also ends the wait by shutting
      // the socket down, this is a second line.
      absl::Duration wait = std::min(at - absl::Now(), absl::Seconds(1));
      if (wait < absl::ZeroDuration()) wait = absl::ZeroDuration();
      const timespec ts = absl::ToTimespec(wait);
      if (ppoll(fds, 2, &ts, nullptr) < 0 && errno != EINTR) {
        absl::MutexLock lock(&r.mu_);
        r.EndLocked();
        return false;
      }
    }
    bool run = false;
    if ((fds[1].revents & POLLIN) != 0) {
      uint64_t count;
      (void)read(r.wake_fd_, &count, sizeof(count));
      run = true;
    }
    std::function<void()> fn;
    {
      absl::MutexLock lock(&r.mu_);
      if (!r.answered_ && (run || absl::Now() >= r.at_)) {
        r.at_ = absl::InfiniteFuture();  // until fn sets it again
        fn = r.fn_;
      }
    }
    if (fn) fn();
    if (!buffered && fds[0].revents == 0) continue;
    // The peer sent a frame or closed its end: after the answer, the next
    // request; before it, the end of the connection (unless the request
    // gets no answer: EndOnFrame).
    {
      absl::MutexLock lock(&r.mu_);
      if (r.answered_) return !r.failed_;
      if (!r.end_on_frame_) {
        r.EndLocked();
        if (!conn.PeerClosed()) {
          (void)WriteError(conn, op, request_id,
                           absl::FailedPreconditionError(absl::StrCat(
                               "data port: a frame came before the reply to request ", request_id,
                               " (one request at a time on a connection)")));
        }
        return false;
      }
      fn = std::move(r.fn_);
      r.answered_ = true;
      r.write_ = nullptr;
      r.fn_ = nullptr;
    }
    if (fn) fn();
    return true;
  }
}

bool DataResponder::Answer(const absl::Status& status, const DataReply& reply) {
  absl::MutexLock lock(&mu_);
  if (answered_ || ended_) return false;
  answered_ = true;
  failed_ = !write_(status, reply).ok();
  write_ = nullptr;  // nothing of the connection's is touched after this
  fn_ = nullptr;     // (it may hold this responder)
  return true;
}

void DataResponder::EndLocked() {
  ended_ = true;
  write_ = nullptr;
  fn_ = nullptr;
}

void DataResponder::SetTimer(absl::Time at, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  at_ = at;
  fn_ = std::move(fn);
}

void DataResponder::Poke() {
  absl::MutexLock lock(&mu_);
  if (answered_ || ended_) return;
  const uint64_t one = 1;
  (void)write(wake_fd_, &one, sizeof(one));
}

bool DataResponder::answered() const {
  absl::MutexLock lock(&mu_);
  return answered_;
}

void DataResponder::EndOnFrame() {
  absl::MutexLock lock(&mu_);
  end_on_frame_ = true;
}

void DataResponder::Finish() {
  absl::MutexLock lock(&mu_);
  if (answered_ || ended_) return;
  answered_ = true;
  write_ = nullptr;
  fn_ = nullptr;
}

absl::Status DataPortServer::Answer(uint64_t token, uint64_t request_id, absl::string_view job,
                                    const absl::Status& status, const DataReply& reply) {
  std::shared_ptr<AnswerSink> sink;
  {
    absl::MutexLock lock(&sinks_mu_);
    auto it = sinks_.find(token);
    if (it != sinks_.end()) sink = it->second;
  }
  if (sink == nullptr) {
    return absl::NotFoundError("data port: no answers connection has this token here");
  }
  if (sink->scope.has_value() && *sink->scope != job) {
    return absl::PermissionDeniedError(absl::StrCat("data port: the answers connection is job '",
                                                    *sink->scope, "''s, not '", job, "''s"));
  }
  absl::MutexLock lock(&sink->mu);
  if (sink->conn == nullptr) return absl::NotFoundError("data port: the answers connection ended");
  if (request_id <= sink->last_id) {
    return absl::AlreadyExistsError(absl::StrCat("data port: request ", request_id,
                                                 " of the answers connection answered after ",
                                                 sink->last_id));
  }
  sink->last_id = request_id;
  absl::Status written =
      WriteReply(*sink->conn, *sink->segment, static_cast<uint16_t>(DataOp::kPushPull), request_id,
                 status, reply);
  if (!written.ok()) {
    sink->conn->Shutdown();  // its thread ends the connection
    return absl::UnavailableError(absl::StrCat("data port: answer: ", written.message()));
  }
  return absl::OkStatus();
}

bool DataPortServer::HasAnswers(uint64_t token) const {
  absl::MutexLock lock(&sinks_mu_);
  return sinks_.count(token) > 0;
}

void DataPortServer::ServeAnswers(DataConn& conn, uint64_t token) {
  // The client sends nothing more: readable means it closed its end (or
  // broke the protocol); either ends the connection. Not read here, so no
  // read runs alongside Answer's writes (TLS shares one state for both).
  const int fd = conn.fd();
  while (!stopping_) {
    pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    const int n = poll(&p, 1, 1000);
    if (n < 0 && errno != EINTR) break;
    if (n > 0) break;
  }
  DT_LOG(DEBUG) << "data port: answers connection " << token << " ended";
}

absl::StatusOr<std::string> DefaultDataSocketPath() {
  static std::atomic<int> counter{0};
  absl::StatusOr<std::string> dir = PrivateRuntimeDir("dtrain-kvstore");
  if (!dir.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("data port: ", dir.status().message(), " (remove it, or give --data_socket)"));
  }
  // Random too: processes of containers that share /tmp have the same pids.
  return absl::StrCat(*dir, "/kvstore-", getpid(), "-", counter++, "-", RandomHex(4), ".sock");
}

std::string HostId() {
  static const std::string* id = [] {
    const std::string boot = BootId();
    if (boot.empty()) return new std::string();
    // Another network namespace is another host to its peers (a container,
    // a pod, a netlab host): they talk over its network, not a socket file
    // they might happen to share.
    char net[128];
    const ssize_t n = readlink("/proc/self/ns/net", net, sizeof(net));
    return new std::string(n > 0 ? absl::StrCat(boot, " ", absl::string_view(net, n)) : boot);
  }();
  return *id;
}

// ---------------------------------------------------------------------------
// Client

absl::StatusOr<std::unique_ptr<DataConn>> DialDataConn(const DataPortAddress& address,
                                                       const DataPortTls& tls,
                                                       absl::Duration timeout) {
  if (!address.unix_socket.empty()) {
    sockaddr_un addr{};
    if (address.unix_socket.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError("data port: socket path too long");
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, address.unix_socket.c_str(), address.unix_socket.size() + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError(Errno("data port: socket"));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      std::string error = Errno(absl::StrCat("data port: connect ", address.unix_socket).c_str());
      close(fd);
      return absl::UnavailableError(error);
    }
    auto conn = std::make_unique<FdConn>(fd, DataConn::Kind::kUnix);
    DT_RETURN_IF_ERROR(CheckPeerUid(fd, "server"));
    return std::unique_ptr<DataConn>(std::move(conn));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(address.tcp_port);
  if (getaddrinfo(address.host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr) {
    return absl::UnavailableError(absl::StrCat("data port: cannot resolve '", address.host, "'"));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return absl::UnavailableError(Errno("data port: socket"));
  }
  SetTimeouts(fd, timeout);
  if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    std::string error =
        Errno(absl::StrCat("data port: connect ", address.host, ":", address.tcp_port).c_str());
    freeaddrinfo(res);
    close(fd);
    return absl::UnavailableError(error);
  }
  freeaddrinfo(res);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (!address.tls)
    return std::unique_ptr<DataConn>(std::make_unique<FdConn>(fd, DataConn::Kind::kTcp));
  if (!tls.enabled) {
    close(fd);
    return absl::FailedPreconditionError(
        "data port: the shard's data port is TLS but this process has no certificates");
  }
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx = ClientTlsContext(tls);
  if (!ctx.ok()) {
    close(fd);
    return ctx.status();
  }
  SSL* ssl = SSL_new(ctx->get());
  SSL_set_fd(ssl, fd);
  auto conn = std::make_unique<TlsConn>(fd, ssl);
  // The server's certificate must name the host dialed (as gRPC checks).
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  in6_addr ip6;
  in_addr ip4;
  if (inet_pton(AF_INET, address.host.c_str(), &ip4) == 1 ||
      inet_pton(AF_INET6, address.host.c_str(), &ip6) == 1) {
    X509_VERIFY_PARAM_set1_ip_asc(param, address.host.c_str());
  } else {
    X509_VERIFY_PARAM_set1_host(param, address.host.c_str(), 0);
    SSL_set_tlsext_host_name(ssl, address.host.c_str());
  }
  DT_RETURN_IF_ERROR(conn->Connect());
  conn->SetIoTimeout(absl::InfiniteDuration());
  return std::unique_ptr<DataConn>(std::move(conn));
}

absl::StatusOr<std::unique_ptr<DataPortConnection>> DataPortConnection::Dial(
    const DataPortAddress& address, const v1::DataHello& hello, const DataPortTls& tls,
    absl::Duration timeout) {
  std::unique_ptr<DataPortConnection> c(new DataPortConnection());
  DT_ASSIGN_OR_RETURN(c->conn_, DialDataConn(address, tls, timeout));
  int pass_fd = -1;
  if (c->conn_->kind() == DataConn::Kind::kUnix) {
    DT_RETURN_IF_ERROR(c->EnsureSegment(1 << 20, &pass_fd));
  }
  FrameHeader h;
  h.op = static_cast<uint16_t>(DataOp::kHello);
  h.request_id = c->next_id_++;
  c->conn_->SetReadTimeout(timeout);
  DT_RETURN_IF_ERROR(WriteFrame(*c->conn_, h, hello.SerializeAsString(), {}, pass_fd));
  DT_ASSIGN_OR_RETURN(std::string answer, c->ReceiveHeader());
  v1::DataHelloReply accepted;
  if (!accepted.ParseFromString(answer)) {
    return absl::DataLossError("data port: unparsable answer to HELLO");
  }
  if (hello.answers() && accepted.answer_token() == 0) {
    return absl::FailedPreconditionError(
        "data port: the server made no answers connection (a version from before AnswerAt)");
  }
  c->answer_token_ = accepted.answer_token();
  if (!address.instance.empty() && accepted.instance() != address.instance) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data port: ", address.unix_socket.empty() ? "the TCP port" : address.unix_socket,
        " is another server's (instance ", accepted.instance(), ", expected ", address.instance,
        ")"));
  }
  return c;
}

std::unique_ptr<DataPortConnection> IdleDataConns::Take(bool* peer_closed) {
  const absl::Time now = absl::Now();
  while (!idle_.empty()) {
    Idle last = std::move(idle_.back());
    idle_.pop_back();
    if (now - last.since >= kCheckAfter && last.conn->PeerClosed()) {
      *peer_closed = true;
      continue;
    }
    return std::move(last.conn);
  }
  return nullptr;
}

void IdleDataConns::Put(std::unique_ptr<DataPortConnection> conn) {
  if (idle_.size() < capacity_) idle_.push_back({std::move(conn), absl::Now()});
}

DataPortConnection::~DataPortConnection() = default;

absl::Status DataPortConnection::EnsureSegment(uint64_t bytes, int* pass_fd) {
  *pass_fd = -1;
  if (bytes <= segment_.size() || bytes > static_cast<uint64_t>(kMaxSegmentBytes)) {
    return absl::OkStatus();
  }
  uint64_t size = std::max<uint64_t>(segment_.size(), 1 << 20);
  while (size < bytes) size *= 2;
  size = std::min<uint64_t>(size, kMaxSegmentBytes);
  absl::StatusOr<net::SharedMemory> segment =
      net::SharedMemory::CreateSealed("dtrain-kvstore-segment", size);
  if (!segment.ok()) return DataPortError(segment.status());
  segment_ = std::move(*segment);
  *pass_fd = segment_.fd();
  return absl::OkStatus();
}

absl::Status DataPortConnection::Send(DataOp op, const std::string& header,
                                      const std::vector<absl::string_view>& payload,
                                      uint64_t reply_bytes, absl::Duration timeout) {
  FrameHeader h;
  h.op = static_cast<uint16_t>(op);
  h.request_id = next_id_++;
  const int64_t ms = absl::ToInt64Milliseconds(timeout);
  h.arg = timeout == absl::InfiniteDuration() || ms > 0x7fffffff
              ? 0
              : static_cast<uint32_t>(std::max<int64_t>(ms, 1));
  uint64_t total = 0;
  for (absl::string_view p : payload) total += p.size();
  h.payload_bytes = total;
  reply_ = FrameHeader();
  reply_read_ = 0;
  // A second of slack over the server's own deadline, so its answer (e.g.
  // DEADLINE_EXCEEDED naming the missing workers) arrives first.
  conn_->SetReadTimeout(timeout == absl::InfiniteDuration() ? timeout : timeout + absl::Seconds(1));
  int pass_fd = -1;
  if (conn_->kind() == DataConn::Kind::kUnix) {
    DT_RETURN_IF_ERROR(EnsureSegment(std::max(total, reply_bytes), &pass_fd));
    if (total > 0 && total <= segment_.size()) {
      char* p = segment_.data();
      for (absl::string_view piece : payload) {
        std::memcpy(p, piece.data(), piece.size());
        p += piece.size();
      }
      h.flags = kPayloadInSegment;
      return WriteFrame(*conn_, h, header, {}, pass_fd);
    }
  }
  return WriteFrame(*conn_, h, header, payload, pass_fd);
}

absl::StatusOr<std::string> DataPortConnection::ReceiveHeader() {
  if (spin_ > absl::ZeroDuration()) conn_->SpinUntilReadable(spin_);
  char fixed[kFrameHeaderSize];
  DT_RETURN_IF_ERROR(conn_->ReadFull(fixed, sizeof(fixed)));
  DT_ASSIGN_OR_RETURN(reply_, DecodeFrameHeader(absl::string_view(fixed, sizeof(fixed)),
                                                /*request=*/false));
  reply_read_ = 0;
  std::string header(reply_.header_bytes, '\0');
  DT_RETURN_IF_ERROR(conn_->ReadFull(header.data(), header.size()));
  if (reply_.arg != 0) {
    const auto code = static_cast<absl::StatusCode>(reply_.arg);
    return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code, header);
  }
  if ((reply_.flags & kPayloadInSegment) != 0 && reply_.payload_bytes > segment_.size()) {
    return absl::DataLossError("data port: reply payload larger than the segment");
  }
  return header;
}

absl::StatusOr<std::string> DataPortConnection::ReceiveAnswer(uint64_t request_id,
                                                              absl::Duration timeout) {
  conn_->SetReadTimeout(timeout);
  for (;;) {
    reply_ = FrameHeader();  // request id 0 unless a frame is read
    absl::StatusOr<std::string> header = ReceiveHeader();
    if (reply_.request_id == request_id || reply_.request_id == 0) return header;
    if (reply_.request_id > request_id) {
      return absl::DataLossError(absl::StrCat("data port: answer to request ", reply_.request_id,
                                              " while waiting for ", request_id));
    }
    // An answer to an attempt given up on: skip it.
    if ((reply_.flags & kPayloadInSegment) == 0) {
      char skip[4096];
      for (uint64_t left = reply_.payload_bytes; left > 0;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(left, sizeof(skip)));
        DT_RETURN_IF_ERROR(conn_->ReadFull(skip, n));
        left -= n;
      }
    }
  }
}

absl::StatusOr<int> DataPortConnection::WaitEither(DataPortConnection& a, DataPortConnection& b,
                                                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (a.conn_->HasBuffered()) return 0;
    if (b.conn_->HasBuffered()) return 1;
    pollfd fds[2] = {{a.conn_->fd(), POLLIN | POLLRDHUP, 0},
                     {b.conn_->fd(), POLLIN | POLLRDHUP, 0}};
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("data port: no answer in time");
    }
    const timespec ts = absl::ToTimespec(std::min(left, absl::Hours(1)));
    const int n = ppoll(fds, 2, &ts, nullptr);
    if (n < 0 && errno != EINTR) return absl::UnavailableError(Errno("data port: poll"));
    if (n > 0) return fds[0].revents != 0 ? 0 : 1;
  }
}

absl::Status DataPortConnection::ReadPayload(char* dst, size_t n) {
  if (reply_read_ + n > reply_.payload_bytes) {
    return absl::DataLossError("data port: reply payload shorter than its items");
  }
  if ((reply_.flags & kPayloadInSegment) != 0) {
    std::memcpy(dst, segment_.data() + reply_read_, n);
  } else {
    DT_RETURN_IF_ERROR(conn_->ReadFull(dst, n));
  }
  reply_read_ += n;
  return absl::OkStatus();
}

}  // namespace kvstore
}  // namespace dtrain
