// Internal: small POSIX socket helpers with deadlines, for the TCP transport.
#ifndef DTRAIN_LIBS_COLLECTIVE_SOCKET_UTIL_H_
#define DTRAIN_LIBS_COLLECTIVE_SOCKET_UTIL_H_

#include <sys/socket.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {
namespace collective {
namespace internal {

// Milliseconds from now until `deadline` for poll(2): 0 when past, capped at
// `cap_ms`, rounded up so a wait never ends just before the deadline.
int PollTimeoutMs(absl::Time deadline, int cap_ms);

// A resolved socket address.
struct SocketAddress {
  sockaddr_storage storage;
  socklen_t length = 0;
  int family = 0;
};

// Resolves `host` (literal or name; empty means this host's name) and `port`.
absl::StatusOr<SocketAddress> ResolveAddress(const std::string& host, int port);

// "host port" with the numeric host of `address` and `port`.
std::string FormatAddress(const SocketAddress& address, int port);

// Parses FormatAddress's output.
absl::StatusOr<SocketAddress> ParseAddress(const std::string& text);

// Sets O_NONBLOCK on or off.
absl::Status SetNonBlocking(int fd, bool on);

// Writes / reads exactly `n` bytes on a non-blocking socket, polling until
// `deadline`. UNAVAILABLE when the peer closes, DEADLINE_EXCEEDED on time.
absl::Status WriteFull(int fd, const void* data, size_t n, absl::Time deadline);
absl::Status ReadFull(int fd, void* data, size_t n, absl::Time deadline);

// Connects a new non-blocking TCP socket to `address`, retrying refused
// connections until `deadline`. Returns the descriptor.
absl::StatusOr<int> ConnectWithDeadline(const SocketAddress& address, absl::Time deadline);

}  // namespace internal
}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_SOCKET_UTIL_H_
