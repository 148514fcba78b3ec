// Helpers of the end-to-end tests: runfiles, temporary directories, running
// trainctl and reading `trainctl cluster up`'s cluster.json.
#ifndef DTRAIN_TESTS_E2E_E2E_UTIL_H_
#define DTRAIN_TESTS_E2E_E2E_UTIL_H_

#include <string>
#include <vector>

namespace dtrain {
namespace e2e {

// `path` (e.g. "services/trainctl/trainctl") in the test's runfiles.
std::string Runfile(const std::string& path);

// $TEST_TMPDIR/<name>, created.
std::string TmpDir(const std::string& name);

// Runs `command` with sh -c; returns stdout and stderr together and sets *rc
// (the exit status, -1 if it did not exit).
std::string Run(const std::string& command, int* rc);

// Runs the trainctl binary with `args` (shell words).
std::string Trainctl(const std::string& args, int* rc);

// One process of a cluster.json.
struct ClusterProcess {
  std::string name, role, address, metrics_url;
  int pid = -1;
};

// The processes listed in <dir>/cluster.json (empty if none or unreadable).
std::vector<ClusterProcess> ReadCluster(const std::string& dir);

// Whether `pid` runs (a zombie does not).
bool ProcessAlive(int pid);

// The number `key` of a one-line JSON object `json` (e.g. "test_accuracy"),
// or `fallback`.
double JsonNumber(const std::string& json, const std::string& key, double fallback);

}  // namespace e2e
}  // namespace dtrain

#endif  // DTRAIN_TESTS_E2E_E2E_UTIL_H_
