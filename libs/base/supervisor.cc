#include "libs/base/supervisor.h"

#include <signal.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

const char* SignalName(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGABRT:
      return "SIGABRT";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return nullptr;
  }
}

// "0s", "3.2s", "1h2m".
std::string FormatUptime(absl::Duration up) {
  if (up < absl::Milliseconds(100)) return "0s";
  return absl::FormatDuration(absl::Trunc(up, absl::Milliseconds(100)));
}

}  // namespace

std::string DescribeExit(const ExitStatus& status) {
  if (status.signaled()) {
    const char* name = SignalName(status.signal());
    return name != nullptr ? absl::StrCat("killed by ", name)
                           : absl::StrCat("killed by signal ", status.signal());
  }
  return absl::StrCat("exited with status ", status.exit_code());
}

void Supervisor::Adopt(std::string name, std::unique_ptr<Subprocess> child,
                       SubprocessOptions restart_options, absl::Time started) {
  SupervisedProcess p;
  p.name = std::move(name);
  p.pid = child->pid();
  processes_.push_back(std::move(p));
  Child c;
  c.process = std::move(child);
  c.restart_options = std::move(restart_options);
  c.started = started;
  c.backoff = options_.initial_backoff;
  children_.push_back(std::move(c));
}

std::vector<std::string> Supervisor::Poll(absl::Time now) {
  std::vector<std::string> events;
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    SupervisedProcess& p = processes_[i];
    if (c.process != nullptr && !c.process->Running()) {
      absl::StatusOr<ExitStatus> status = c.process->Wait(absl::ZeroDuration());
      c.process.reset();
      p.last_exit = status.ok() ? DescribeExit(*status) : std::string(status.status().message());
      p.last_exit_time = now;
      const absl::Duration up = now - c.started;
      std::string event =
          absl::StrCat(p.name, " (pid ", p.pid, ") ", p.last_exit, " after up ", FormatUptime(up));
      if (options_.restart == RestartPolicy::kAlways) {
        if (up >= options_.reset_backoff_after) c.backoff = options_.initial_backoff;
        p.state = SupervisedProcess::State::kRestarting;
        p.next_start = now + c.backoff;
        absl::StrAppend(&event, "; restarting in ", absl::FormatDuration(c.backoff));
        c.backoff = std::min(c.backoff * 2, options_.max_backoff);
      } else {
        p.state = SupervisedProcess::State::kExited;
        absl::StrAppend(&event, "; not restarted (restart policy never)");
      }
      events.push_back(std::move(event));
    }
    if (p.state == SupervisedProcess::State::kRestarting && now >= p.next_start) {
      ++p.restarts;
      absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(c.restart_options);
      if (child.ok()) {
        c.process = *std::move(child);
        c.started = now;
        p.pid = c.process->pid();
        p.state = SupervisedProcess::State::kRunning;
        p.next_start = absl::InfiniteFuture();
        events.push_back(
            absl::StrCat("restarted ", p.name, " (pid ", p.pid, ", restart ", p.restarts, ")"));
      } else {
        p.last_exit = absl::StrCat("cannot start: ", child.status().message());
        p.last_exit_time = now;
        p.next_start = now + c.backoff;
        events.push_back(absl::StrCat(p.name, ": ", p.last_exit, "; trying again in ",
                                      absl::FormatDuration(c.backoff)));
        c.backoff = std::min(c.backoff * 2, options_.max_backoff);
      }
    }
  }
  return events;
}

bool Supervisor::AnyLeft() const {
  return std::any_of(processes_.begin(), processes_.end(), [](const SupervisedProcess& p) {
    return p.state != SupervisedProcess::State::kExited;
  });
}

void Supervisor::ReleaseAll() {
  for (Child& c : children_) {
    if (c.process != nullptr) c.process->Release();
  }
}

}  // namespace dtrain
