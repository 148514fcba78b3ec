#include "tests/netlab/netlab.h"

#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace dtrain {
namespace netlab {
namespace {

absl::Status* entered = nullptr;

// Runs `command` with sh -c; its output (stdout and stderr) in *out.
int Shell(const std::string& command, std::string* out) {
  out->clear();
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

absl::Status Enter() {
  if (unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "unshare(CLONE_NEWNET | CLONE_NEWNS): ", std::strerror(errno),
        " (netlab needs root, or CAP_SYS_ADMIN and CAP_NET_ADMIN, and a kernel with network "
        "namespaces)"));
  }
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("making mounts private: ", std::strerror(errno)));
  }
  mkdir("/run/netns", 0755);
  if (mount("netlab", "/run/netns", "tmpfs", 0, nullptr) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("a private /run/netns (tmpfs): ", std::strerror(errno)));
  }
  std::string out;
  // Test environments often lack /usr/sbin (ip, tc, iptables) in PATH.
  const char* path = std::getenv("PATH");
  setenv("PATH", absl::StrCat(path ? path : "/usr/bin:/bin", ":/usr/sbin:/sbin").c_str(), 1);
  if (Shell("ip link set lo up", &out) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("ip link set lo up: ", out));
  }
  setenv("NETLAB_PRIVATE", "1", 1);
  return absl::OkStatus();
}

}  // namespace

absl::Status EnterPrivateNetwork() {
  if (entered == nullptr) entered = new absl::Status(Enter());
  return *entered;
}

absl::Status PrivateNetwork() {
  if (entered == nullptr) {
    return absl::FailedPreconditionError(
        "netlab::EnterPrivateNetwork was not called (link //tests/netlab:netlab_main)");
  }
  return *entered;
}

absl::StatusOr<std::unique_ptr<Lab>> Lab::Create(const std::string& script, int hosts,
                                                 const std::string& rate) {
  if (absl::Status s = PrivateNetwork(); !s.ok()) return s;
  std::unique_ptr<Lab> lab(new Lab(script, hosts));
  std::string args = absl::StrCat("up ", hosts);
  if (!rate.empty() && rate != "none") absl::StrAppend(&args, " --rate=", Quote(rate));
  if (absl::Status s = lab->Netlab(args); !s.ok()) {
    (void)lab->Netlab("down");
    return s;
  }
  return lab;
}

Lab::~Lab() { (void)Netlab("down"); }

std::string Lab::Ip(int host) const { return absl::StrCat("10.77.0.", host + 1); }

std::vector<std::string> Lab::InHost(int host, std::vector<std::string> argv) const {
  // The full path (test environments often lack /usr/sbin in PATH).
  std::string ip = "/usr/sbin/ip";
  for (const char* candidate : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(candidate, X_OK) == 0) {
      ip = candidate;
      break;
    }
  }
  std::vector<std::string> out = {ip, "netns", "exec", absl::StrCat("h", host)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status Lab::Netlab(const std::string& args) const {
  std::string out;
  int rc = Shell(absl::StrCat(Quote(script_), " ", args), &out);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("tools/netlab ", args, " exited ", rc, ": ", out));
  }
  return absl::OkStatus();
}

absl::Status Lab::Shape(int host, const std::string& rate) {
  return Netlab(absl::StrCat("shape ", host, " ", Quote(rate)));
}

absl::Status Lab::Loss(int host, double percent) {
  return Netlab(absl::StrFormat("loss %d %g", host, percent));
}

absl::Status Lab::Partition(int host, bool link_down) {
  return Netlab(absl::StrCat("partition ", host, link_down ? " down" : " drop"));
}

absl::Status Lab::Heal(int host) { return Netlab(absl::StrCat("heal ", host)); }

namespace {

// Packet counters of the rules of `host`'s nl_loss chain: the DROP rules'
// (drop = true) or the counting rule's, which has no target (drop = false).
absl::StatusOr<int64_t> LossRulePackets(int host, bool drop) {
  std::string out;
  int rc = Shell(absl::StrCat("ip netns exec h", host, " iptables -w -L nl_loss -v -x -n"), &out);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("iptables -L nl_loss in h", host, ": ", out));
  int64_t sum = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t packets;
    if (f.size() < 3 || !absl::SimpleAtoi(f[0], &packets)) continue;
    // A rule line: pkts bytes target prot opt ...; without a target the
    // third field is the protocol and the fourth the options ("--").
    if (drop ? f[2] == "DROP" : f.size() > 3 && f[3] == "--") sum += packets;
  }
  return sum;
}

}  // namespace

absl::StatusOr<int64_t> Lab::Dropped(int host) const { return LossRulePackets(host, true); }

absl::StatusOr<int64_t> Lab::LossChainPackets(int host) const {
  return LossRulePackets(host, false);
}

}  // namespace netlab
}  // namespace dtrain
