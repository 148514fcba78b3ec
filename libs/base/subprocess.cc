#include "libs/base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/base/status.h"

extern char** environ;

namespace dtrain {

bool ExitStatus::exited() const { return WIFEXITED(wait_status_); }
int ExitStatus::exit_code() const { return exited() ? WEXITSTATUS(wait_status_) : -1; }
bool ExitStatus::signaled() const { return WIFSIGNALED(wait_status_); }
int ExitStatus::signal() const { return signaled() ? WTERMSIG(wait_status_) : 0; }

std::string ExitStatus::ToString() const {
  if (exited()) return absl::StrCat("exited with status ", exit_code());
  if (signaled()) {
    return absl::StrCat("killed by signal ", signal(), " (", strsignal(signal()), ")");
  }
  return absl::StrCat("wait status ", wait_status_);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const SubprocessOptions& options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return absl::InvalidArgumentError("Subprocess: argv must name a program");
  }
  // Everything the child needs is built before fork: after fork a
  // multithreaded parent's child may only make async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (const auto& [name, value] : options.env) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("Subprocess: bad environment variable name '", name, "'"));
    }
  }
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    const bool replaced = std::any_of(options.env.begin(), options.env.end(), [&](const auto& kv) {
      return entry.size() > kv.first.size() && entry[kv.first.size()] == '=' &&
             entry.substr(0, kv.first.size()) == kv.first;
    });
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const auto& [name, value] : options.env)
    env_strings.push_back(absl::StrCat(name, "=", value));
  std::vector<char*> envp, argv;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options.argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out = -1;
  if (!options.output_file.empty()) {
    out = open(options.output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0) {
      return ErrnoToStatus(errno, absl::StrCat("cannot open output file ", options.output_file));
    }
  }
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  // The child reports a failed exec through this pipe; a successful exec
  // closes it (O_CLOEXEC) and the parent reads end-of-file.
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    const int err = errno;
    if (out >= 0) close(out);
    if (null >= 0) close(null);
    return ErrnoToStatus(err, "pipe");
  }
  const pid_t pid = fork();
  if (pid == 0) {
    if (options.new_session) {
      setsid();
    } else {
      setpgid(0, 0);
    }
    // Default dispositions and no blocked signals, whatever the parent set
    // (a parent's SIGTERM watcher must not make children immune).
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGHUP, SIGCHLD}) signal(sig, SIG_DFL);
    if (null >= 0) dup2(null, 0);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    execve(argv[0], argv.data(), envp.data());
    const int err = errno;
    (void)!write(report[1], &err, sizeof(err));
    _exit(127);
  }
  const int fork_errno = errno;
  close(report[1]);
  if (out >= 0) close(out);
  if (null >= 0) close(null);
  if (pid < 0) {
    close(report[0]);
    return ErrnoToStatus(fork_errno, "fork");
  }
  // Also set from the parent, so that Signal works even before the child
  // ran far enough to call setpgid itself.
  if (!options.new_session) setpgid(pid, pid);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(report[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    int status;
    waitpid(pid, &status, 0);
    return ErrnoToStatus(exec_errno, absl::StrCat("cannot run ", options.argv[0]));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid));
}

Subprocess::~Subprocess() {
  if (released_ || exit_.has_value()) return;
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  int status;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

absl::Status Subprocess::Signal(int signal) {
  if (exit_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("process ", pid_, " already ended (", exit_->ToString(), ")"));
  }
  // The group, or the child alone if it left the group (it called setsid).
  if (kill(-pid_, signal) != 0 && kill(pid_, signal) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("kill ", pid_));
  }
  return absl::OkStatus();
}

bool Subprocess::Running() {
  if (exit_.has_value()) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_.emplace(status);
    return false;
  }
  return true;
}

absl::StatusOr<ExitStatus> Subprocess::Wait(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration() && !exit_.has_value()) {
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return ErrnoToStatus(errno, absl::StrCat("waitpid ", pid_));
    exit_.emplace(status);
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration poll = absl::Milliseconds(1);
  while (Running()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(poll, deadline - now));
    poll = std::min(poll * 2, absl::Milliseconds(20));
  }
  return *exit_;
}

absl::StatusOr<ExitStatus> Subprocess::Stop(absl::Duration grace) {
  if (exit_.has_value()) return *exit_;
  if (absl::Status s = Signal(SIGTERM); !s.ok() && Running()) return s;
  absl::StatusOr<ExitStatus> status = Wait(grace);
  if (status.ok() || !absl::IsDeadlineExceeded(status.status())) return status;
  (void)Signal(SIGKILL);
  return Wait();
}

}  // namespace dtrain
