#include "services/kvstore/testing/server_process.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/base/ports.h"
#include "libs/base/status.h"

namespace dtrain {
namespace kvstore {
namespace {

bool Executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

}  // namespace

absl::StatusOr<std::string> KVStoreServerBinary(const char* argv0) {
  return RunfilesBinary("services/kvstore/kvstore_server", argv0);
}

absl::StatusOr<std::string> RunfilesBinary(const std::string& path, const char* argv0) {
  const std::string kRunfilesPath = "dtrain/" + path;
  std::vector<std::string> candidates;
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* dir = std::getenv(var))
      candidates.push_back(absl::StrCat(dir, "/", kRunfilesPath));
  }
  if (argv0 != nullptr) candidates.push_back(absl::StrCat(argv0, ".runfiles/", kRunfilesPath));
  for (const std::string& c : candidates) {
    if (Executable(c)) return c;
  }
  return absl::NotFoundError(absl::StrCat(
      path, " not found in runfiles (looked for ", kRunfilesPath,
      " under $TEST_SRCDIR, $RUNFILES_DIR and <argv0>.runfiles); add it as a data dependency"));
}

ServerProcess::~ServerProcess() {
  child_.reset();  // kills and reaps a child still running
  if (!port_file_.empty()) unlink(port_file_.c_str());
}

std::string ServerProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::Status ServerProcess::Start(const std::string& binary, std::vector<std::string> flags,
                                  absl::Duration timeout) {
  if (child_) return absl::FailedPreconditionError("server process already running");
  binary_ = binary;
  flags_ = std::move(flags);
  const char* tmp = std::getenv("TEST_TMPDIR");
  static int counter = 0;
  port_file_ = absl::StrCat(tmp ? tmp : "/tmp", "/kvstore_port.", getpid(), ".", counter++);
  port_ = 0;
  return Spawn(timeout);
}

absl::Status ServerProcess::Restart(absl::Duration timeout) {
  if (child_) return absl::FailedPreconditionError("server process still running");
  if (binary_.empty()) return absl::FailedPreconditionError("Restart before Start");
  return Spawn(timeout);
}

absl::Status ServerProcess::Spawn(absl::Duration timeout) {
  unlink(port_file_.c_str());
  SubprocessOptions options;
  // First start: a port below the ephemeral range, so Restart finds it free
  // (libs/base/ports.h).
  if (port_ == 0) port_ = PickRestartablePort();
  options.argv = {binary_, absl::StrCat("--listen=127.0.0.1:", port_),
                  absl::StrCat("--port_file=", port_file_)};
  options.argv.insert(options.argv.end(), flags_.begin(), flags_.end());
  DT_ASSIGN_OR_RETURN(child_, Subprocess::Start(options));
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream f(port_file_);
    std::stringstream text;
    text << f.rdbuf();
    int port = 0;
    if (f && absl::SimpleAtoi(absl::StripAsciiWhitespace(text.str()), &port) && port > 0) {
      port_ = port;
      return absl::OkStatus();
    }
    if (!child_->Running()) {
      const ExitStatus status = *child_->Wait(absl::ZeroDuration());
      child_.reset();
      return absl::UnavailableError(
          absl::StrCat(binary_, " exited before serving (", status.ToString(), ")"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(binary_, " did not start serving in time"));
}

absl::Status ServerProcess::Kill(int signal) {
  if (!child_) return absl::FailedPreconditionError("no server process");
  return child_->Signal(signal);
}

absl::StatusOr<int> ServerProcess::Wait(absl::Duration timeout) {
  if (!child_) return absl::FailedPreconditionError("no server process");
  absl::StatusOr<ExitStatus> status = child_->Wait(timeout);
  if (!status.ok()) return status.status();
  child_.reset();
  return status->wait_status();
}

}  // namespace kvstore
}  // namespace dtrain
