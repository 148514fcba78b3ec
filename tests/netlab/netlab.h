// Emulated hosts for tests: tools/netlab from C++. A test binary enters a
// private network and mount namespace first thing (netlab_main.cc does it
// before any thread starts), then makes hosts, runs each service in its
// host, shapes, drops and cuts links:
//
//   if (!netlab::PrivateNetwork().ok()) GTEST_SKIP() << netlab::PrivateNetwork();
//   DT_ASSIGN_OR_RETURN(auto lab, netlab::Lab::Create(Runfile("tools/netlab"), 3, "1gbit"));
//   options.argv = lab->InHost(1, {kvstore_bin, "--listen=" + lab->Ip(1) + ":7070"});
//   DT_RETURN_IF_ERROR(lab->Partition(1));   // host 1 unreachable
//   DT_RETURN_IF_ERROR(lab->Heal(1));
//
// Host i is the network namespace hi with address 10.77.0.(i+1) on a bridge;
// the test process itself is on the bridge too, at Lab::kConsoleIp, and
// reaches every host. Everything vanishes with the test process (the
// namespaces live in its private mount namespace); ~Lab also deletes them.
#ifndef DTRAIN_TESTS_NETLAB_NETLAB_H_
#define DTRAIN_TESTS_NETLAB_NETLAB_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain {
namespace netlab {

// Enters a private network and mount namespace (unshare) with loopback up
// and a private /run/netns. Call before any thread starts; later calls
// return the first call's result. An error names why (no CAP_SYS_ADMIN,
// the kernel refuses namespaces): tests skip with it.
absl::Status EnterPrivateNetwork();
// The result of EnterPrivateNetwork (FailedPrecondition if never called).
absl::Status PrivateNetwork();

class Lab {
 public:
  static constexpr const char* kConsoleIp = "10.77.0.254";

  // `script`: the path of tools/netlab. Creates hosts h0..h(hosts-1), links
  // shaped to `rate` ("" or "none": unshaped).
  static absl::StatusOr<std::unique_ptr<Lab>> Create(const std::string& script, int hosts,
                                                     const std::string& rate = "");
  ~Lab();
  Lab(const Lab&) = delete;
  Lab& operator=(const Lab&) = delete;

  int hosts() const { return hosts_; }
  // "10.77.0.<host+1>".
  std::string Ip(int host) const;
  // `argv` run inside `host` (ip netns exec hN argv...; the same process,
  // so its pid is the service's).
  std::vector<std::string> InHost(int host, std::vector<std::string> argv) const;

  // tools/netlab shape | loss | partition | heal. Errors carry its output.
  absl::Status Shape(int host, const std::string& rate);
  absl::Status Loss(int host, double percent);
  // Drops every packet to and from `host` (link_down: takes its link down).
  absl::Status Partition(int host, bool link_down = false);
  absl::Status Heal(int host);
  // Packets the loss rule of `host` dropped since Loss last set it.
  absl::StatusOr<int64_t> Dropped(int host) const;
  // Packets that reached `host`'s loss rule (dropped or not) since Loss last
  // set it. iptables sees a GSO packet (up to 64 KiB of TCP segments) as one,
  // so compare drops with this, not with the bytes sent.
  absl::StatusOr<int64_t> LossChainPackets(int host) const;

 private:
  Lab(std::string script, int hosts) : script_(std::move(script)), hosts_(hosts) {}
  absl::Status Netlab(const std::string& args) const;

  std::string script_;
  int hosts_;
};

}  // namespace netlab
}  // namespace dtrain

#endif  // DTRAIN_TESTS_NETLAB_NETLAB_H_
