// Helpers of the end-to-end tests: runfiles, temporary directories, running
// trainctl, reading `trainctl cluster up`'s cluster.json and the logs and
// metrics of its processes. (test_cluster.h: the cluster every e2e test
// uses, built on these.)
#ifndef DTRAIN_TESTS_E2E_E2E_UTIL_H_
#define DTRAIN_TESTS_E2E_E2E_UTIL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {
namespace e2e {

// `path` (e.g. "services/trainctl/trainctl") in the test's runfiles.
std::string Runfile(const std::string& path);

// $TEST_TMPDIR/<name>, created.
std::string TmpDir(const std::string& name);

// Runs `command` with sh -c; returns stdout and stderr together and sets *rc
// (the exit status, -1 if it did not exit).
std::string Run(const std::string& command, int* rc);

// Mutual TLS for this test process and every process it starts: a CA and an
// admin certificate under $TEST_TMPDIR/test-certs (made on the first call),
// exported as DTRAIN_CA, DTRAIN_CERT and DTRAIN_KEY (children inherit them)
// and set as rpc::DefaultCredentials (stubs, ServerProcess). Returns that
// directory (more certificates: security::IssueCert).
std::string UseTestCredentials();

// The same with the admin credential of the cluster `trainctl cluster up`
// made in `dir` (dir/certs). Trainctl() calls it after a successful
// `cluster up --dir=...`.
void UseClusterCredentials(const std::string& dir);

// Runs the trainctl binary with `args` (shell words). After a successful
// `cluster up --dir=D`, the test uses D's admin credential
// (UseClusterCredentials).
std::string Trainctl(const std::string& args, int* rc);

// The job id in `trainctl submit` output (its "submitted <id>" line), or "".
std::string SubmittedId(const std::string& submit_output);

// `trainctl -o json get` of the job `submit_output` submitted, through the
// scheduler at `scheduler` (one line of JSON; empty when it fails).
std::string JobJson(const std::string& scheduler, const std::string& submit_output);

// One process of a cluster.json.
struct ClusterProcess {
  std::string name, role, address, metrics_url;
  int pid = -1;
};

// The processes listed in <dir>/cluster.json (empty if none or unreadable).
std::vector<ClusterProcess> ReadCluster(const std::string& dir);

// A trainer daemon of a cluster: its process and its log file.
struct TrainerProcess {
  int pid = -1;
  std::string log_path;
};

// The trainers of the cluster in `dir`, by the id each registered as (the
// "registered as <id>;" lines of its log). A trainer that has not logged its
// registration yet is missing.
std::map<std::string, TrainerProcess> Trainers(const std::string& dir);

// The same, id -> pid.
std::map<std::string, int> TrainerPids(const std::string& dir);

// The lines of every trainer log of the cluster in `dir` that hold all of
// `parts` (e.g. {"job-000002 rank", "resumed from"}).
std::vector<std::string> TrainerLogLines(const std::string& dir,
                                         const std::vector<std::string>& parts);

// The number right after `key` in `text` (-1 when absent), e.g.
// NumberAfter(line, "draining after ").
int64_t NumberAfter(const std::string& text, const std::string& key);

// The pids of the running processes (not this one) whose command line
// mentions `text` (e.g. a cluster's directory: its supervisor and processes).
std::vector<int> PidsMentioning(const std::string& text);

// Whether `pid` runs (a zombie does not).
bool ProcessAlive(int pid);

// The text of the file at `path` ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// VmRSS of `pid` in bytes (from /proc/<pid>/status), or -1.
int64_t ResidentBytes(int pid);

// The port of a "http://127.0.0.1:<port>/metrics" URL (a cluster.json
// metrics_url), or 0.
int PortOfUrl(const std::string& url);

// The value of the sample `series` (a name with its labels exactly as
// exposed) that the /metrics endpoint on 127.0.0.1:<port> serves, or -1 when
// it cannot be scraped or has no such sample.
double ScrapeSample(int port, const std::string& series);

// The number `key` of a one-line JSON object `json` (e.g. "test_accuracy"),
// or `fallback`.
double JsonNumber(const std::string& json, const std::string& key, double fallback);

}  // namespace e2e
}  // namespace dtrain

#endif  // DTRAIN_TESTS_E2E_E2E_UTIL_H_
