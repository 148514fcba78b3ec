#include "libs/collective/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/collective/engine.h"
#include "libs/collective/socket_util.h"
#include "libs/net/tls.h"

namespace dtrain {
namespace collective {
namespace {

using internal::EnginePair;
using internal::EngineTransport;
using internal::PairGridTransport;

// The handshake of a new connection (the connecting, higher rank C; the
// accepting, lower rank A):
//   C -> A  Handshake{magic, rank C, channel, job id length}, job id, nonce_c
//   A -> C  nonce_a, HMAC(secret, "accept" | job | A | C | channel | nonce_c | nonce_a)
//   C -> A  HMAC(secret, "connect" | job | A | C | channel | nonce_c | nonce_a)
//   A -> C  one byte: 1 accepted, 0 refused (then A closes)
// Each side checks the other's MAC (CRYPTO_memcmp) before it sends or
// accepts a byte of tensor data; fresh nonces on both sides make a recorded
// handshake useless, and the two labels keep one side's MAC from serving
// as the other's.
constexpr uint32_t kHandshakeMagic = 0x44544332;  // "DTC2"
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
// How long the accepting rank waits for one connection's handshake bytes,
// so that a connection that sends nothing holds up the real peers briefly.
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(5);

// Sent by the connecting side right after connect.
struct Handshake {
  uint32_t magic;
  uint32_t rank;
  uint32_t channel;
  uint32_t job_id_length;  // followed by the job id bytes, then nonce_c
};

std::string Nonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&nonce[0]), kNonceBytes) != 1) {
    // The kernel's generator as a fallback (RAND_bytes does not fail on Linux
    // in practice).
    size_t got = 0;
    while (got < kNonceBytes) {
      ssize_t n = ::getrandom(&nonce[got], kNonceBytes - got, 0);
      if (n > 0) got += static_cast<size_t>(n);
    }
  }
  return nonce;
}

// `label`: "accept", "connect" or "tls" (the TLS pre-shared key). The MAC
// covers whether the connection is to use TLS, so two ranks that disagree
// refuse each other instead of reading TLS records as tensor bytes.
std::string HandshakeMac(const std::string& secret, bool tls, absl::string_view label,
                         const std::string& job_id, int acceptor, int connector, int channel,
                         const std::string& nonce_c, const std::string& nonce_a) {
  const std::string payload =
      absl::StrCat("dtrain-collective-v2|", tls ? "tls" : "plain", "|", label, "|", job_id, "|",
                   acceptor, "|", connector, "|", channel, "|");
  const std::string message = absl::StrCat(payload, nonce_c, nonce_a);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

bool SameMac(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// --- TLS (TcpOptions::tls): TLS 1.3, TLS_AES_128_GCM_SHA256, no
// certificates: both sides hold a pre-shared key, the connection's key from
// the handshake above (HMAC under the attempt secret over both nonces), and
// the key exchange is (EC)DHE on top of it (psk_dhe_ke), so recorded traffic
// stays secret even if the attempt secret leaks later.

// The context (libs/net/tls.h): TLS 1.3 with TLS_AES_128_GCM_SHA256 only,
// pre-shared keys, on non-blocking sockets.
absl::StatusOr<std::shared_ptr<SSL_CTX>> NewTlsContext() {
  net::TlsContextOptions options;
  options.psk = true;
  options.ciphersuites = "TLS_AES_128_GCM_SHA256";
  options.partial_writes = true;
  return net::NewTlsContext(options);
}

struct SslDeleter {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
using SslPtr = std::unique_ptr<SSL, SslDeleter>;

// Runs the TLS handshake on the non-blocking socket `fd` (as the server when
// `server`) with pre-shared key `*key` (must outlive the handshake).
absl::StatusOr<SslPtr> StartTls(SSL_CTX* ctx, int fd, bool server, const std::string* key,
                                absl::Time deadline) {
  SslPtr ssl(SSL_new(ctx));
  if (!ssl || SSL_set_fd(ssl.get(), fd) != 1) {
    return absl::InternalError(absl::StrCat("SSL_new: ", net::OpenSslErrors()));
  }
  net::SetTlsPsk(ssl.get(), key);
  if (server) {
    SSL_set_accept_state(ssl.get());
  } else {
    SSL_set_connect_state(ssl.get());
  }
  while (true) {
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl.get());
    if (r == 1) break;
    const int err = SSL_get_error(ssl.get(), r);
    short events = 0;
    if (err == SSL_ERROR_WANT_READ) events = POLLIN;
    if (err == SSL_ERROR_WANT_WRITE) events = POLLOUT;
    if (events == 0) {
      return absl::UnavailableError(
          absl::StrCat("TLS handshake failed (error ", err, "): ", net::OpenSslErrors()));
    }
    const int timeout = internal::PollTimeoutMs(deadline, 1000);
    if (timeout == 0) return absl::DeadlineExceededError("TLS handshake timed out");
    pollfd pfd{fd, events, 0};
    ::poll(&pfd, 1, timeout);
  }
  net::SetTlsPsk(ssl.get(), nullptr);
  return ssl;
}

std::string Describe(int err) {
  char buf[128];
  return strerror_r(err, buf, sizeof(buf));
}

class TcpTransport;

class TcpPair final : public EnginePair {
 public:
  TcpPair(EngineTransport* transport, int peer, int channel, int fd, std::vector<char>* bounce)
      : EnginePair(transport, peer, channel), fd_(fd), bounce_(bounce) {}
  ~TcpPair() override { Close(); }

  int fd() const { return fd_; }

  // Encrypts from now on (TcpOptions::tls), after the handshake.
  void SetTls(SslPtr ssl) { ssl_ = std::move(ssl); }
  // Decrypted bytes wait inside OpenSSL: poll would not see them.
  bool HasBufferedInput() const { return ssl_ && SSL_has_pending(ssl_.get()); }

  void Close() {
    ssl_.reset();
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }

  void ShutdownAndClose() {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    Close();
  }

  // Alternates between the two directions in slices of at most kSliceBytes,
  // so that both flow at once: a rank that spent a long time in one big
  // send() would leave its peer blocked on a full receive buffer.
  bool Progress() override {
    if (fd_ < 0) {
      Fail(absl::UnavailableError(
          absl::StrCat("connection to rank ", peer(), " (channel ", channel(), ") is closed")));
      return false;
    }
    bool moved = false;
    bool send_blocked = sends_.empty();
    bool recv_blocked = recvs_.empty();
    while (!send_blocked || !recv_blocked) {
      if (!send_blocked) {
        if (!SendSlice(&send_blocked, &moved)) return moved;
        send_blocked = send_blocked || sends_.empty();
      }
      if (!recv_blocked) {
        if (!RecvSlice(&recv_blocked, &moved)) return moved;
        recv_blocked = recv_blocked || recvs_.empty();
      }
    }
    return moved;
  }

 private:
  static constexpr size_t kSliceBytes = 256 << 10;

  // One send() of up to kSliceBytes of the oldest send. Sets *blocked when
  // the socket takes nothing more now and *moved when bytes went out. False
  // after a failure.
  bool SendSlice(bool* blocked, bool* moved) {
    internal::SendOp& op = sends_.front();
    const size_t want = std::min(op.bytes - op.done, kSliceBytes);
    if (ssl_) return SendTls(op, want, blocked, moved);
    ssize_t n = ::send(fd_, op.data + op.done, want, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *moved = true;
      op.done += static_cast<size_t>(n);
      if (op.done == op.bytes) CompleteFrontSend();
      *blocked = static_cast<size_t>(n) < want;  // the socket buffer is full
      return true;
    }
    if (n < 0 && (errno == EINTR)) return true;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *blocked = true;
      return true;
    }
    int err = errno;
    Fail(absl::UnavailableError(absl::StrCat("sending to rank ", peer(), " (channel ", channel(),
                                             ") failed: ", Describe(err),
                                             "; the peer probably exited")));
    return false;
  }

  // One recv() of up to kSliceBytes (or the bounce buffer) into the oldest
  // receive. Sets *blocked when nothing more is there and *moved when bytes
  // came in. False after a failure.
  bool RecvSlice(bool* blocked, bool* moved) {
    internal::RecvOp& op = recvs_.front();
    size_t want = std::min(op.bytes - op.done - op.carry_len, kSliceBytes);
    if (ssl_) return RecvTls(op, want, blocked, moved);
    ssize_t n;
    if (op.combiner == nullptr) {
      n = ::recv(fd_, op.data + op.done, want, MSG_DONTWAIT);
      if (n > 0) op.done += static_cast<size_t>(n);
    } else {
      want = std::min(want, bounce_->size());
      n = ::recv(fd_, bounce_->data(), want, MSG_DONTWAIT);
      if (n > 0) internal::Deliver(op, bounce_->data(), static_cast<size_t>(n));
    }
    if (n > 0) {
      *moved = true;
      if (op.done == op.bytes) CompleteFrontRecv();
      *blocked = static_cast<size_t>(n) < want;  // drained the socket
      return true;
    }
    if (n < 0 && errno == EINTR) return true;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *blocked = true;
      return true;
    }
    int err = n == 0 ? 0 : errno;
    Fail(absl::UnavailableError(
        absl::StrCat("connection to rank ", peer(), " (channel ", channel(), ") ",
                     err == 0 ? "closed by the peer" : absl::StrCat("failed: ", Describe(err)),
                     " with ", op.bytes - op.done, " of ", op.bytes,
                     " bytes of a receive outstanding; the peer probably exited or aborted")));
    return false;
  }

  // SendSlice / RecvSlice over TLS. A direction is blocked only when OpenSSL
  // wants the socket (WANT_READ / WANT_WRITE): a short read may leave
  // decrypted bytes of the record inside OpenSSL.
  bool SendTls(internal::SendOp& op, size_t want, bool* blocked, bool* moved) {
    ERR_clear_error();
    const int n = SSL_write(ssl_.get(), op.data + op.done, static_cast<int>(want));
    if (n > 0) {
      *moved = true;
      op.done += static_cast<size_t>(n);
      if (op.done == op.bytes) CompleteFrontSend();
      return true;
    }
    const int err = SSL_get_error(ssl_.get(), n);
    if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) {
      *blocked = true;
      return true;
    }
    Fail(absl::UnavailableError(absl::StrCat("sending to rank ", peer(), " (channel ", channel(),
                                             ") over TLS failed: ", TlsError(err),
                                             "; the peer probably exited")));
    return false;
  }

  bool RecvTls(internal::RecvOp& op, size_t want, bool* blocked, bool* moved) {
    ERR_clear_error();
    int n;
    if (op.combiner == nullptr) {
      n = SSL_read(ssl_.get(), op.data + op.done, static_cast<int>(want));
      if (n > 0) op.done += static_cast<size_t>(n);
    } else {
      want = std::min(want, bounce_->size());
      n = SSL_read(ssl_.get(), bounce_->data(), static_cast<int>(want));
      if (n > 0) internal::Deliver(op, bounce_->data(), static_cast<size_t>(n));
    }
    if (n > 0) {
      *moved = true;
      if (op.done == op.bytes) CompleteFrontRecv();
      return true;
    }
    const int err = SSL_get_error(ssl_.get(), n);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      *blocked = true;
      return true;
    }
    Fail(absl::UnavailableError(
        absl::StrCat("TLS connection to rank ", peer(), " (channel ", channel(), ") ",
                     err == SSL_ERROR_ZERO_RETURN ? "closed by the peer" : TlsError(err), " with ",
                     op.bytes - op.done, " of ", op.bytes,
                     " bytes of a receive outstanding; the peer probably exited or aborted")));
    return false;
  }

  static std::string TlsError(int err) {
    if (err == SSL_ERROR_SYSCALL) {
      return errno == 0 ? std::string("closed by the peer") : Describe(errno);
    }
    return absl::StrCat("TLS error ", err, ": ", net::OpenSslErrors());
  }

  int fd_;
  std::vector<char>* bounce_;
  SslPtr ssl_;
};

class TcpTransport final : public PairGridTransport<TcpPair> {
 public:
  TcpTransport(const TransportOptions& options, const TcpOptions& tcp)
      : PairGridTransport(options),
        bounce_(std::max<size_t>(tcp.bounce_bytes, 64)),
        secret_(tcp.secret),
        tls_(tcp.tls) {}

  ~TcpTransport() override {
    // Pairs close their sockets as they are destroyed.
  }

  absl::Status Connect(const TransportOptions& options, const TcpOptions& tcp);

 private:
  // The connecting side's handshake on `fd` with `peer` (at `address`).
  // Sets *tls_key to the connection's TLS pre-shared key.
  absl::Status ConnectHandshake(int fd, int peer, int channel, const std::string& address,
                                const TransportOptions& options, std::string* tls_key);
  // The accepting side's, after the header and nonce_c from `peer` arrived.
  absl::Status AcceptHandshake(int fd, int peer, int channel, const std::string& nonce_c,
                               const TransportOptions& options, absl::Time deadline,
                               std::string* tls_key);

 public:
  const char* name() const override { return "tcp"; }

 protected:
  void Block(uint64_t token, absl::Time deadline) override {
    fds_.clear();
    for (EnginePair* p : pairs()) {
      if (!p->has_pending()) continue;
      auto* tp = static_cast<TcpPair*>(p);
      if (tp->fd() < 0) return;  // Progress reports it
      if (tp->has_pending_recvs() && tp->HasBufferedInput()) return;
      short events = 0;
      if (tp->has_pending_recvs()) events |= POLLIN;
      if (tp->has_pending_sends()) events |= POLLOUT;
      fds_.push_back(pollfd{tp->fd(), events, 0});
    }
    if (fds_.empty()) return;
    ::poll(fds_.data(), fds_.size(), internal::PollTimeoutMs(deadline, 1000));
  }

  void OnAbort(const absl::Status& reason) override {
    ForEachPair([](TcpPair& p) { p.ShutdownAndClose(); });
  }

 private:
  std::vector<char> bounce_;
  const std::string secret_;
  const bool tls_;
  std::shared_ptr<SSL_CTX> tls_context_;  // when tls_
  std::vector<pollfd> fds_;
};

absl::Status ConfigureSocket(int fd, const TcpOptions& tcp) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return ErrnoToStatus(errno, "setsockopt(TCP_NODELAY)");
  }
  if (tcp.socket_buffer_bytes > 0) {
    int size = tcp.socket_buffer_bytes;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }
  return internal::SetNonBlocking(fd, true);
}

absl::Status TcpTransport::Connect(const TransportOptions& options, const TcpOptions& tcp) {
  const absl::Time deadline = options.deadline;
  const std::string key_prefix = absl::StrCat("tcp/", options.job_id, "/");
  if (tls_) {
    DT_ASSIGN_OR_RETURN(tls_context_, NewTlsContext());
  }

  // Listen on an ephemeral port of the chosen address.
  DT_ASSIGN_OR_RETURN(internal::SocketAddress local, internal::ResolveAddress(tcp.host, 0));
  int listener = ::socket(local.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener < 0) return ErrnoToStatus(errno, "socket");
  struct ListenerCloser {
    int fd;
    ~ListenerCloser() { ::close(fd); }
  } closer{listener};
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (tcp.socket_buffer_bytes > 0) {  // accepted sockets inherit; set before listen
    int size = tcp.socket_buffer_bytes;
    ::setsockopt(listener, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    ::setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }
  if (::bind(listener, reinterpret_cast<const sockaddr*>(&local.storage), local.length) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bind to ", internal::FormatAddress(local, 0)));
  }
  if (::listen(listener, SOMAXCONN) != 0) return ErrnoToStatus(errno, "listen");
  sockaddr_storage bound;
  socklen_t bound_len = sizeof(bound);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  DT_RETURN_IF_ERROR(
      options.store->Set(absl::StrCat(key_prefix, rank_), internal::FormatAddress(local, port)));

  auto add_pair = [&](int peer, int channel, int fd) {
    SetPair(peer, channel, std::make_unique<TcpPair>(this, peer, channel, fd, &bounce_));
  };

  // Connect to lower-ranked peers.
  int expected_incoming = 0;
  for (int peer : options.peers) {
    if (peer > rank_) {
      expected_incoming += channels_;
      continue;
    }
    absl::Duration left = deadline - absl::Now();
    absl::StatusOr<std::string> address =
        options.store->Get(absl::StrCat(key_prefix, peer), std::max(left, absl::ZeroDuration()));
    if (!address.ok()) {
      return Annotate(address.status(), absl::StrCat("waiting for the address of rank ", peer));
    }
    DT_ASSIGN_OR_RETURN(internal::SocketAddress remote, internal::ParseAddress(*address));
    for (int channel = 0; channel < channels_; ++channel) {
      absl::StatusOr<int> fd = internal::ConnectWithDeadline(remote, deadline);
      if (!fd.ok()) {
        return Annotate(fd.status(), absl::StrCat("connecting to rank ", peer, " at ", *address));
      }
      add_pair(peer, channel, *fd);  // owns fd from here on
      DT_RETURN_IF_ERROR(ConfigureSocket(*fd, tcp));
      std::string tls_key;
      DT_RETURN_IF_ERROR(ConnectHandshake(*fd, peer, channel, *address, options, &tls_key));
      if (tls_) {
        absl::StatusOr<SslPtr> ssl =
            StartTls(tls_context_.get(), *fd, /*server=*/false, &tls_key, deadline);
        if (!ssl.ok()) {
          return Annotate(ssl.status(), absl::StrCat("TLS with rank ", peer, " at ", *address));
        }
        pair(peer, channel)->SetTls(*std::move(ssl));
      }
    }
  }

  // Accept the higher-ranked peers.
  while (expected_incoming > 0) {
    pollfd pfd{listener, POLLIN, 0};
    int timeout = internal::PollTimeoutMs(deadline, 1000);
    if (::poll(&pfd, 1, timeout) <= 0) {
      if (timeout == 0) {
        std::string missing;
        for (int peer : options.peers) {
          if (peer <= rank_) continue;
          for (int c = 0; c < channels_; ++c) {
            if (pair(peer, c) == nullptr) {
              absl::StrAppend(&missing, missing.empty() ? "" : ", ", peer);
              break;
            }
          }
        }
        return absl::DeadlineExceededError(
            absl::StrCat("rank ", rank_, " timed out waiting for ranks ", missing, " to connect"));
      }
      continue;
    }
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return ErrnoToStatus(errno, "accept");
    }
    const absl::Time hs_deadline = std::min(deadline, absl::Now() + kHandshakeTimeout);
    Handshake hs;
    absl::Status read = internal::ReadFull(fd, &hs, sizeof(hs), hs_deadline);
    std::string job_id;
    std::string nonce_c(kNonceBytes, '\0');
    if (read.ok() && hs.magic == kHandshakeMagic && hs.job_id_length < 4096) {
      job_id.resize(hs.job_id_length);
      read = internal::ReadFull(fd, job_id.data(), job_id.size(), hs_deadline);
      if (read.ok()) read = internal::ReadFull(fd, &nonce_c[0], kNonceBytes, hs_deadline);
    }
    // Unsigned comparisons: a rank or channel of 2^31 or more from the network
    // is not a negative int (tests/fuzz/handshake_fuzzer found that crash).
    const bool valid =
        read.ok() && hs.magic == kHandshakeMagic && job_id == options.job_id &&
        hs.rank > static_cast<uint32_t>(rank_) && hs.rank < static_cast<uint32_t>(size_) &&
        hs.channel < static_cast<uint32_t>(channels_) && pair(hs.rank, hs.channel) == nullptr;
    if (!valid) {  // a stray or stale connection; not ours
      ::close(fd);
      continue;
    }
    std::string tls_key;
    absl::Status proof =
        AcceptHandshake(fd, static_cast<int>(hs.rank), static_cast<int>(hs.channel), nonce_c,
                        options, hs_deadline, &tls_key);
    absl::StatusOr<SslPtr> ssl;
    if (proof.ok() && tls_) {
      ssl = StartTls(tls_context_.get(), fd, /*server=*/true, &tls_key, hs_deadline);
      proof = ssl.status();
    }
    if (!proof.ok()) {  // an intruder, or a rank of another attempt
      DT_LOG(WARNING) << "collective rank " << rank_ << ": refused a connection claiming rank "
                      << hs.rank << " (channel " << hs.channel << "): " << proof.message();
      ::close(fd);
      continue;
    }
    add_pair(static_cast<int>(hs.rank), static_cast<int>(hs.channel), fd);
    if (tls_) pair(hs.rank, hs.channel)->SetTls(*std::move(ssl));
    DT_RETURN_IF_ERROR(ConfigureSocket(fd, tcp));
    --expected_incoming;
  }
  return absl::OkStatus();
}

absl::Status TcpTransport::ConnectHandshake(int fd, int peer, int channel,
                                            const std::string& address,
                                            const TransportOptions& options, std::string* tls_key) {
  const absl::Time deadline = options.deadline;
  const std::string what = absl::StrCat("handshake with rank ", peer, " at ", address);
  const std::string nonce_c = Nonce();
  Handshake hs{kHandshakeMagic, static_cast<uint32_t>(rank_), static_cast<uint32_t>(channel),
               static_cast<uint32_t>(options.job_id.size())};
  std::string message(reinterpret_cast<const char*>(&hs), sizeof(hs));
  message += options.job_id;
  message += nonce_c;
  DT_RETURN_IF_ERROR(
      Annotate(internal::WriteFull(fd, message.data(), message.size(), deadline), what));
  std::string reply(kNonceBytes + kMacBytes, '\0');
  absl::Status read = internal::ReadFull(fd, &reply[0], reply.size(), deadline);
  if (!read.ok()) {
    return Annotate(read, absl::StrCat(what,
                                       ": it closed the connection or did not answer; it "
                                       "belongs to another job or attempt, or exited"));
  }
  const std::string nonce_a = reply.substr(0, kNonceBytes);
  const std::string want =
      HandshakeMac(secret_, tls_, "accept", options.job_id, peer, rank_, channel, nonce_c, nonce_a);
  if (!SameMac(reply.substr(kNonceBytes), want)) {
    return absl::PermissionDeniedError(absl::StrCat(
        what,
        ": the peer did not prove it holds this attempt's collective secret (or it was "
        "started with TLS ",
        tls_ ? "off" : "on", " and this rank with TLS ", tls_ ? "on" : "off",
        "); no tensor data was sent to it"));
  }
  const std::string mine = HandshakeMac(secret_, tls_, "connect", options.job_id, peer, rank_,
                                        channel, nonce_c, nonce_a);
  DT_RETURN_IF_ERROR(Annotate(internal::WriteFull(fd, mine.data(), mine.size(), deadline), what));
  char verdict = 0;
  read = internal::ReadFull(fd, &verdict, 1, deadline);
  if (!read.ok() || verdict != 1) {
    return absl::PermissionDeniedError(absl::StrCat(
        what,
        ": the peer refused this rank's proof of the attempt's collective secret; this "
        "process was not given the secret of the job's current attempt "
        "(Assignment.collective_secret), so it cannot join the job's collectives (or the "
        "ranks disagree about collective TLS)"));
  }
  *tls_key =
      HandshakeMac(secret_, tls_, "tls", options.job_id, peer, rank_, channel, nonce_c, nonce_a);
  return absl::OkStatus();
}

absl::Status TcpTransport::AcceptHandshake(int fd, int peer, int channel,
                                           const std::string& nonce_c,
                                           const TransportOptions& options, absl::Time deadline,
                                           std::string* tls_key) {
  const std::string nonce_a = Nonce();
  std::string reply = nonce_a;
  reply +=
      HandshakeMac(secret_, tls_, "accept", options.job_id, rank_, peer, channel, nonce_c, nonce_a);
  DT_RETURN_IF_ERROR(internal::WriteFull(fd, reply.data(), reply.size(), deadline));
  std::string got(kMacBytes, '\0');
  DT_RETURN_IF_ERROR(internal::ReadFull(fd, &got[0], got.size(), deadline));
  const std::string want = HandshakeMac(secret_, tls_, "connect", options.job_id, rank_, peer,
                                        channel, nonce_c, nonce_a);
  const bool ok = SameMac(got, want);
  const char verdict = ok ? 1 : 0;
  absl::Status sent = internal::WriteFull(fd, &verdict, 1, deadline);
  if (!ok) {
    return absl::PermissionDeniedError(
        "it does not hold this attempt's collective secret, or disagrees about TLS (wrong MAC)");
  }
  *tls_key =
      HandshakeMac(secret_, tls_, "tls", options.job_id, rank_, peer, channel, nonce_c, nonce_a);
  return sent;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateTcpTransport(const TransportOptions& options,
                                                              const TcpOptions& tcp) {
  if (options.store == nullptr) return absl::InvalidArgumentError("TCP transport needs a store");
  auto transport = std::make_unique<TcpTransport>(options, tcp);
  DT_RETURN_IF_ERROR(transport->Connect(options, tcp));
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace collective
}  // namespace dtrain
