#include "libs/base/signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include "libs/base/logging.h"

namespace dtrain {
namespace {

int g_pipe[2] = {-1, -1};
std::atomic<int> g_pending{0};

void HandleSignal(int sig) {
  int expected = 0;
  if (!g_pending.compare_exchange_strong(expected, sig)) {
    // Second signal: the user insists.
    _exit(128 + sig);
  }
  unsigned char byte = static_cast<unsigned char>(sig);
  int saved = errno;
  ssize_t unused = write(g_pipe[1], &byte, 1);
  (void)unused;
  errno = saved;
}

}  // namespace

ShutdownSignal& ShutdownSignal::Install() {
  static ShutdownSignal* instance = [] {
    auto* s = new ShutdownSignal();
    DT_CHECK(pipe2(g_pipe, O_CLOEXEC) == 0) << "pipe2 failed: errno " << errno;
    struct sigaction sa = {};
    sa.sa_handler = HandleSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    DT_CHECK(sigaction(SIGTERM, &sa, nullptr) == 0);
    DT_CHECK(sigaction(SIGINT, &sa, nullptr) == 0);
    std::thread(&ShutdownSignal::WatchPipe).detach();
    return s;
  }();
  return *instance;
}

void ShutdownSignal::WatchPipe() {
  for (;;) {
    unsigned char byte = 0;
    ssize_t n = read(g_pipe[0], &byte, 1);
    if (n == 1) {
      Install().Notify(byte);
      return;
    }
    if (n < 0 && errno == EINTR) continue;
    return;
  }
}

void ShutdownSignal::Notify(int signal_number) {
  absl::MutexLock lock(&mu_);
  if (requested_) return;
  requested_ = true;
  signal_ = signal_number;
}

int ShutdownSignal::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&requested_));
  return signal_;
}

bool ShutdownSignal::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&requested_), timeout);
}

bool ShutdownSignal::requested() const {
  absl::MutexLock lock(&mu_);
  return requested_;
}

void ShutdownSignal::Trigger() {
  // A later real signal is then treated as the "second" one and exits.
  int expected = 0;
  g_pending.compare_exchange_strong(expected, -1);
  Notify(0);
}

}  // namespace dtrain
