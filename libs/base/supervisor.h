// Supervisor: keeps child processes running, as a Kubernetes controller keeps
// a Deployment's pods (`trainctl cluster up` runs one for a local cluster).
//
//   SupervisorOptions options;                      // restart always, 1 s .. 30 s
//   Supervisor supervisor(options);
//   supervisor.Adopt("kvstore-0", std::move(child), restart_options, absl::Now());
//   for (;;) {
//     for (const std::string& event : supervisor.Poll(absl::Now())) DT_LOG(INFO) << event;
//     Save(supervisor.processes());                 // pids, restarts, last exits
//     absl::SleepFor(absl::Milliseconds(100));
//   }
//
// A child that exits (whatever the status: a server that returns is as
// gone as one that crashed) is started again with its restart options after
// a backoff: `initial_backoff`, doubled after each restart up to
// `max_backoff`, and back to `initial_backoff` once a run lasted
// `reset_backoff_after`. A restart that cannot even exec is retried the same
// way. With RestartPolicy::kNever an exit is recorded and the child stays
// down.
//
// Time comes from the caller (Poll's `now`), so tests can step through the
// backoff; exits are real (waitpid). Destroying a Supervisor kills the
// children still running (Subprocess's destructor) unless ReleaseAll() gave
// them up. Thread-compatible.
#ifndef DTRAIN_LIBS_BASE_SUPERVISOR_H_
#define DTRAIN_LIBS_BASE_SUPERVISOR_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "libs/base/subprocess.h"

namespace dtrain {

enum class RestartPolicy { kAlways, kNever };

struct SupervisorOptions {
  RestartPolicy restart = RestartPolicy::kAlways;
  absl::Duration initial_backoff = absl::Seconds(1);
  absl::Duration max_backoff = absl::Seconds(30);
  // A run at least this long starts the backoff over at initial_backoff.
  absl::Duration reset_backoff_after = absl::Minutes(1);
};

// One supervised child, as Poll left it.
struct SupervisedProcess {
  enum class State {
    kRunning,     // pid runs
    kRestarting,  // exited; started again at next_start
    kExited,      // exited; RestartPolicy::kNever
  };
  std::string name;
  pid_t pid = -1;  // the current child, or the last one
  State state = State::kRunning;
  int restarts = 0;       // starts after the first one (failed ones too)
  std::string last_exit;  // DescribeExit, or "cannot start: ..."; empty: none yet
  absl::Time last_exit_time = absl::InfinitePast();
  absl::Time next_start = absl::InfiniteFuture();  // kRestarting
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options) : options_(options) {}
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Takes over `child`, started at `started` (by the caller, who may have
  // waited for it to serve); it is restarted with `restart_options` (e.g.
  // the ports it got the first time instead of port 0).
  void Adopt(std::string name, std::unique_ptr<Subprocess> child, SubprocessOptions restart_options,
             absl::Time started);

  // Reaps the children that exited and starts those whose backoff ended by
  // `now`. Returns one line per change ("kvstore-0 (pid 12) killed by
  // SIGKILL after up 3.2s; restarting in 1s", "restarted kvstore-0 (pid
  // 15, restart 1)"); empty when nothing changed.
  std::vector<std::string> Poll(absl::Time now);

  // In the order adopted.
  const std::vector<SupervisedProcess>& processes() const { return processes_; }

  // Whether any child runs or will be started again.
  bool AnyLeft() const;

  // Gives the children up: they keep running after the Supervisor is gone
  // (someone else stops them, by their pids).
  void ReleaseAll();

 private:
  struct Child {
    std::unique_ptr<Subprocess> process;  // null while down
    SubprocessOptions restart_options;
    absl::Time started;
    absl::Duration backoff;
  };

  SupervisorOptions options_;
  std::vector<SupervisedProcess> processes_;
  std::vector<Child> children_;  // parallel to processes_
};

// "killed by SIGKILL", "killed by signal 40", "exited with status 3".
std::string DescribeExit(const ExitStatus& status);

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_SUPERVISOR_H_
