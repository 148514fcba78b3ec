// Subprocess: a child process that dtrain starts and owns (`trainctl cluster
// up`, tests that start servers as real processes).
//
//   SubprocessOptions options;
//   options.argv = {"/path/to/kvstore_server", "--listen=127.0.0.1:0"};
//   options.env = {{"OMP_WAIT_POLICY", "PASSIVE"}};
//   options.output_file = "/tmp/kvstore.log";     // stdout and stderr, appended
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> child, Subprocess::Start(options));
//   DT_RETURN_IF_ERROR(child->Signal(SIGTERM));
//   DT_ASSIGN_OR_RETURN(ExitStatus status, child->Wait(absl::Seconds(10)));
//   if (!status.success()) DT_LOG(ERROR) << "kvstore_server " << status.ToString();
//
// The child runs in a process group of its own (in a session of its own
// with new_session), so Signal reaches what it starts too and a Ctrl-C on
// the parent's terminal does not. Its stdin is /dev/null. A program that
// cannot be executed fails Start (the exec error travels back through a
// close-on-exec pipe) rather than leaving a child that exits 127.
//
// Destroying a Subprocess whose child still runs kills its process group
// (SIGKILL) and reaps it, unless Release() handed the child over (a cluster
// that outlives `trainctl cluster up`).
//
// Thread-compatible: one thread at a time per Subprocess.
#ifndef DTRAIN_LIBS_BASE_SUBPROCESS_H_
#define DTRAIN_LIBS_BASE_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {

struct SubprocessOptions {
  // The program (a path; PATH is not searched) and its arguments: argv[0]
  // is executed and passed as the child's argv[0].
  std::vector<std::string> argv;
  // Set in the child's environment (replacing inherited values); the rest of
  // the parent's environment is inherited.
  std::vector<std::pair<std::string, std::string>> env;
  // stdout and stderr are appended to this file (created 0644); empty: the
  // parent's stdout and stderr.
  std::string output_file;
  // setsid(): a new session (no controlling terminal) as well as a new
  // process group. For daemons that outlive the parent.
  bool new_session = false;
};

// How a child ended (a wait(2) status).
class ExitStatus {
 public:
  explicit ExitStatus(int wait_status) : wait_status_(wait_status) {}
  bool exited() const;    // exit() or return from main
  int exit_code() const;  // when exited(); else -1
  bool signaled() const;  // killed by a signal
  int signal() const;     // when signaled(); else 0
  bool success() const { return exited() && exit_code() == 0; }
  int wait_status() const { return wait_status_; }
  // "exited with status 3", "killed by signal 9 (Killed)".
  std::string ToString() const;

 private:
  int wait_status_;
};

class Subprocess {
 public:
  // Starts the child. Errors: kInvalidArgument for an empty argv or an
  // environment name with '=', the output file's open error, and the exec
  // error naming the program (kNotFound, kPermissionDenied, ...).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const SubprocessOptions& options);

  // Kills and reaps a child that still runs, unless released.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Sends `signal` to the child's process group. kFailedPrecondition once
  // the child was reaped (a pid may be reused then).
  absl::Status Signal(int signal);

  // Waits up to `timeout` for the child to end and reaps it; later calls
  // return the same status. kDeadlineExceeded if it still runs.
  absl::StatusOr<ExitStatus> Wait(absl::Duration timeout = absl::InfiniteDuration());

  // Reaps the child if it ended; true while it runs.
  bool Running();

  // Signals SIGTERM, waits up to `grace`, then SIGKILL; returns how it
  // ended.
  absl::StatusOr<ExitStatus> Stop(absl::Duration grace);

  // Gives the child up: the destructor leaves it running and unreaped (it
  // belongs to whoever reaps it, e.g. init once this process exits).
  void Release() { released_ = true; }

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}

  pid_t pid_;
  std::optional<ExitStatus> exit_;
  bool released_ = false;
};

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_SUBPROCESS_H_
