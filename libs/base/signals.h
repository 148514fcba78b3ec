// Clean shutdown on SIGTERM and SIGINT.
//
//   dtrain::ShutdownSignal& shutdown = dtrain::ShutdownSignal::Install();
//   server->Start();
//   int sig = shutdown.Wait();            // blocks until SIGTERM/SIGINT
//   DT_LOG(INFO) << "signal " << sig << ", draining";
//   server->Shutdown();
//
// The signal handler only records the signal and writes one byte to a pipe
// (async-signal-safe); a watcher thread turns that into a notification that
// ordinary code can wait on. A second signal while shutdown is under way
// ends the process at once with exit status 128+signal, as users expect when
// they press Ctrl-C twice. Thread-safe.
#ifndef DTRAIN_LIBS_BASE_SIGNALS_H_
#define DTRAIN_LIBS_BASE_SIGNALS_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dtrain {

class ShutdownSignal {
 public:
  // Installs the handlers (once per process) and returns the process-wide
  // instance. Later calls return the same instance.
  static ShutdownSignal& Install();

  // Blocks until shutdown is requested; returns the signal number, or 0 when
  // Trigger() asked for it.
  int Wait();

  // Waits at most `timeout`; returns true if shutdown was requested.
  bool WaitFor(absl::Duration timeout);

  // True once a signal arrived or Trigger() was called.
  bool requested() const;

  // Requests shutdown from code (an RPC, a test).
  void Trigger();

 private:
  ShutdownSignal() = default;
  void Notify(int signal_number);
  static void WatchPipe();

  mutable absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  int signal_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_SIGNALS_H_
