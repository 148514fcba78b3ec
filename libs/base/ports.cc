#include "libs/base/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace dtrain {

int PickRestartablePort() {
  static absl::Mutex mu(absl::kConstInit);
  static std::mt19937* rng = nullptr;
  absl::MutexLock lock(&mu);
  if (rng == nullptr) {
    rng = new std::mt19937(static_cast<uint32_t>(getpid()) ^
                           static_cast<uint32_t>(absl::ToUnixNanos(absl::Now())));
  }
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = 20000 + static_cast<int>((*rng)() % 12000);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (free) return port;
  }
  return 0;
}

}  // namespace dtrain
