// ServerProcess: runs kvstore_server as a child process, for tests and
// benchmarks that need a real process (SIGKILL, restarts, separate address
// spaces).
//
//   DT_ASSIGN_OR_RETURN(std::string binary, KVStoreServerBinary());
//   ServerProcess shard;
//   DT_RETURN_IF_ERROR(shard.Start(binary, {"--shard_index=0", "--data_dir=" + dir}));
//   client_options.servers.push_back(shard.address());
//   shard.Kill(SIGKILL);
//   DT_RETURN_IF_ERROR(shard.Restart());     // same flags, same port
//
// Start adds --listen=127.0.0.1:<port> (port 0 the first time, the same
// port on Restart), --port_file, and the test process's credentials
// (rpc::DefaultCredentials: --insecure, or its --ca, --cert and --key), and
// waits until the server wrote its
// port. The child (a libs/base/subprocess.h Subprocess, in its own process
// group) writes to the parent's stdout and stderr. Destroying a
// ServerProcess kills a child still running (SIGKILL).
//
// Thread-compatible.
#ifndef DTRAIN_SERVICES_KVSTORE_TESTING_SERVER_PROCESS_H_
#define DTRAIN_SERVICES_KVSTORE_TESTING_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/base/subprocess.h"

namespace dtrain {
namespace kvstore {

// The kvstore_server binary in this test's or binary's runfiles
// ($TEST_SRCDIR, $RUNFILES_DIR or <argv0>.runfiles), or kNotFound.
absl::StatusOr<std::string> KVStoreServerBinary(const char* argv0 = nullptr);
// The same for any binary of the workspace, e.g.
// "services/scheduler/scheduler_server".
absl::StatusOr<std::string> RunfilesBinary(const std::string& path, const char* argv0 = nullptr);

class ServerProcess {
 public:
  ServerProcess() = default;
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts `binary` with `flags` and waits (up to `timeout`) until it
  // serves. kUnavailable naming the exit status if it died first.
  absl::Status Start(const std::string& binary, std::vector<std::string> flags,
                     absl::Duration timeout = absl::Seconds(30));

  // Starts it again with the same flags on the same port (after Kill).
  absl::Status Restart(absl::Duration timeout = absl::Seconds(30));

  // Sends `signal` (SIGKILL, SIGTERM, ...); does not wait.
  absl::Status Kill(int signal);

  // Waits for the child to exit; returns its wait(2) status.
  absl::StatusOr<int> Wait(absl::Duration timeout = absl::Seconds(30));

  int port() const { return port_; }
  std::string address() const;
  // -1 when no child runs.
  pid_t pid() const { return child_ ? child_->pid() : -1; }

 private:
  absl::Status Spawn(absl::Duration timeout);

  std::string binary_;
  std::vector<std::string> flags_;
  std::string port_file_;
  int port_ = 0;
  std::unique_ptr<Subprocess> child_;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_KVSTORE_TESTING_SERVER_PROCESS_H_
