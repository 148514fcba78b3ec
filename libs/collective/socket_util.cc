#include "libs/collective/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/base/status.h"

namespace dtrain {
namespace collective {
namespace internal {

int PollTimeoutMs(absl::Time deadline, int cap_ms) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, cap_ms));
}

absl::StatusOr<SocketAddress> ResolveAddress(const std::string& host_in, int port) {
  std::string host = host_in;
  if (host.empty()) {
    char name[256] = {0};
    if (::gethostname(name, sizeof(name) - 1) != 0) return ErrnoToStatus(errno, "gethostname");
    host = name;
  }
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  std::string port_text = absl::StrCat(port);
  int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve host '", host, "': ", ::gai_strerror(rc)));
  }
  SocketAddress out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.length = result->ai_addrlen;
  out.family = result->ai_family;
  ::freeaddrinfo(result);
  return out;
}

std::string FormatAddress(const SocketAddress& address, int port) {
  char host[NI_MAXHOST] = {0};
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&address.storage), address.length, host,
                sizeof(host), nullptr, 0, NI_NUMERICHOST);
  return absl::StrCat(host, " ", port);
}

absl::StatusOr<SocketAddress> ParseAddress(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ' ');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad TCP address '", text, "'"));
  }
  return ResolveAddress(parts[0], port);
}

absl::Status SetNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) return ErrnoToStatus(errno, "fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) != 0) return ErrnoToStatus(errno, "fcntl(F_SETFL)");
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLOUT, 0};
      int timeout = PollTimeoutMs(deadline, 1000);
      if (timeout == 0) return absl::DeadlineExceededError("timed out writing to a socket");
      ::poll(&pfd, 1, timeout);
      continue;
    }
    return ErrnoToStatus(errno, "send");
  }
  return absl::OkStatus();
}

absl::Status ReadFull(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError("connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pfd{fd, POLLIN, 0};
      int timeout = PollTimeoutMs(deadline, 1000);
      if (timeout == 0) return absl::DeadlineExceededError("timed out reading from a socket");
      ::poll(&pfd, 1, timeout);
      continue;
    }
    return ErrnoToStatus(errno, "recv");
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ConnectWithDeadline(const SocketAddress& address, absl::Time deadline) {
  absl::Duration pause = absl::Milliseconds(1);
  while (true) {
    int fd = ::socket(address.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ErrnoToStatus(errno, "socket");
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      while (true) {
        int timeout = PollTimeoutMs(deadline, 1000);
        int n = ::poll(&pfd, 1, timeout);
        if (n > 0) break;
        if (n < 0 && errno == EINTR) continue;
        if (timeout == 0) {
          ::close(fd);
          return absl::DeadlineExceededError("timed out connecting");
        }
      }
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) return fd;
    ::close(fd);
    if (err != ECONNREFUSED && err != ECONNRESET && err != ETIMEDOUT) {
      return ErrnoToStatus(err, "connect");
    }
    absl::Time now = absl::Now();
    if (now >= deadline) return ErrnoToStatus(err, "connect (until the deadline)");
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
}

}  // namespace internal
}  // namespace collective
}  // namespace dtrain
