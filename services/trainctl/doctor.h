// `trainctl doctor`: this machine's figures (libs/doctor) next to the
// chapter's table of latency numbers, and link figures to a peer.
//
//   trainctl doctor [--peer=HOST:PORT] [--quick]   measure; -o json for scripts
//   trainctl doctor serve --listen=HOST:PORT        the peer's side
#ifndef DTRAIN_SERVICES_TRAINCTL_DOCTOR_H_
#define DTRAIN_SERVICES_TRAINCTL_DOCTOR_H_

#include <string>
#include <vector>

namespace dtrain {
namespace trainctl {

// args: what follows "doctor" ("" or "serve"). Returns the exit status.
int DoctorMain(const std::vector<std::string>& args, bool json);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_DOCTOR_H_
