#include "tests/e2e/e2e_util.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "libs/base/logging.h"
#include "libs/base/testing.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "libs/security/certs.h"

namespace dtrain {
namespace e2e {
std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int64_t ResidentBytes(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    int64_t kb = 0;
    if (!absl::ConsumeSuffix(&rest, " kB") || !absl::SimpleAtoi(rest, &kb)) return -1;
    return kb * 1024;
  }
  return -1;
}

int PortOfUrl(const std::string& url) {
  absl::string_view rest = url;
  absl::ConsumePrefix(&rest, "http://127.0.0.1:");
  int port = 0;
  if (!absl::SimpleAtoi(rest.substr(0, rest.find('/')), &port)) return 0;
  return port;
}

double ScrapeSample(int port, const std::string& series) {
  absl::StatusOr<std::string> text = metrics::Scrape(port);
  if (!text.ok()) return -1;
  absl::StatusOr<double> v = metrics::SampleValue(*text, series);
  return v.ok() ? *v : -1;
}

std::string Runfile(const std::string& path) { return RunfilePath(path); }

std::string SubmittedId(const std::string& submit_output) {
  std::string id;
  for (absl::string_view line : absl::StrSplit(submit_output, '\n')) {
    if (absl::ConsumePrefix(&line, "submitted ")) id = std::string(line);
  }
  return id;
}

std::string JobJson(const std::string& scheduler, const std::string& submit_output) {
  const std::string id = SubmittedId(submit_output);
  if (id.empty()) return "";
  int rc;
  std::string json = Trainctl(absl::StrCat("--scheduler=", scheduler, " -o json get ", id), &rc);
  return rc == 0 ? json : "";
}

std::string TmpDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string p = absl::StrCat(dir ? dir : "/tmp", "/", name);
  mkdir(p.c_str(), 0755);
  return p;
}

std::string Run(const std::string& command, int* rc) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  if (p == nullptr) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

namespace {

void UseCredentials(const std::string& certs) {
  const std::string ca = certs + "/ca.pem", cert = certs + "/admin.pem", key = certs + "/admin.key";
  setenv("DTRAIN_CA", ca.c_str(), 1);
  setenv("DTRAIN_CERT", cert.c_str(), 1);
  setenv("DTRAIN_KEY", key.c_str(), 1);
  unsetenv("DTRAIN_INSECURE");
  absl::StatusOr<std::shared_ptr<const rpc::Credentials>> c =
      rpc::Credentials::Load({ca, cert, key});
  DT_CHECK(c.ok()) << "test credentials in " << certs << ": " << c.status();
  rpc::SetDefaultCredentials(*c);
}

}  // namespace

std::string UseTestCredentials() {
  const std::string certs = TmpDir("test-certs");
  struct stat st;
  if (stat((certs + "/ca.pem").c_str(), &st) != 0) {
    absl::Status s = security::InitCertDir(certs, {});
    DT_CHECK(s.ok()) << "test certificates: " << s;
  }
  UseCredentials(certs);
  return certs;
}

void UseClusterCredentials(const std::string& dir) { UseCredentials(dir + "/certs"); }

std::string Trainctl(const std::string& args, int* rc) {
  std::string out = Run(absl::StrCat(Runfile("services/trainctl/trainctl"), " ", args), rc);
  if (*rc == 0 && absl::StartsWith(args, "cluster up ") &&
      args.find(" --insecure") == std::string::npos) {
    for (absl::string_view word : absl::StrSplit(args, ' ', absl::SkipEmpty())) {
      if (absl::ConsumePrefix(&word, "--dir=")) UseClusterCredentials(std::string(word));
    }
  }
  return out;
}

std::vector<ClusterProcess> ReadCluster(const std::string& dir) {
  std::vector<ClusterProcess> out;
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(ReadFile(dir + "/cluster.json"), &root).ok()) {
    return out;
  }
  auto it = root.fields().find("processes");
  if (it == root.fields().end()) return out;
  for (const auto& v : it->second.list_value().values()) {
    const auto& f = v.struct_value().fields();
    auto str = [&](const char* k) {
      auto i = f.find(k);
      return i == f.end() ? std::string() : i->second.string_value();
    };
    ClusterProcess p;
    p.name = str("name");
    p.role = str("role");
    p.address = str("address");
    p.metrics_url = str("metrics_url");
    auto pid = f.find("pid");
    if (pid != f.end()) p.pid = static_cast<int>(pid->second.number_value());
    out.push_back(p);
  }
  return out;
}

std::map<std::string, TrainerProcess> Trainers(const std::string& dir) {
  std::map<std::string, TrainerProcess> out;
  for (const ClusterProcess& p : ReadCluster(dir)) {
    if (p.role != "trainer") continue;
    const std::string path = absl::StrCat(dir, "/", p.name, ".log");
    const std::string t = ReadFile(path);
    const std::string key = "registered as ";
    for (size_t at = t.find(key); at != std::string::npos; at = t.find(key, at + 1)) {
      size_t end = t.find(';', at);
      out[t.substr(at + key.size(), end - at - key.size())] = {p.pid, path};
    }
  }
  return out;
}

std::map<std::string, int> TrainerPids(const std::string& dir) {
  std::map<std::string, int> out;
  for (const auto& [id, t] : Trainers(dir)) out[id] = t.pid;
  return out;
}

int64_t NumberAfter(const std::string& text, const std::string& key) {
  size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  at += key.size();
  size_t end = at;
  while (end < text.size() && isdigit(static_cast<unsigned char>(text[end]))) ++end;
  int64_t n = -1;
  return absl::SimpleAtoi(text.substr(at, end - at), &n) ? n : -1;
}

std::vector<std::string> TrainerLogLines(const std::string& dir,
                                         const std::vector<std::string>& parts) {
  std::vector<std::string> out;
  for (const ClusterProcess& p : ReadCluster(dir)) {
    if (p.role != "trainer") continue;
    std::ifstream log(absl::StrCat(dir, "/", p.name, ".log"));
    for (std::string line; std::getline(log, line);) {
      bool all = true;
      for (const std::string& part : parts) all = all && line.find(part) != std::string::npos;
      if (all) out.push_back(line);
    }
  }
  return out;
}

std::vector<int> PidsMentioning(const std::string& text) {
  std::vector<int> pids;
  DIR* d = opendir("/proc");
  if (d == nullptr) return pids;
  while (dirent* e = readdir(d)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid <= 0 || pid == getpid()) continue;
    const std::string cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    if (cmdline.find(text) != std::string::npos && ProcessAlive(pid)) pids.push_back(pid);
  }
  closedir(d);
  return pids;
}

bool ProcessAlive(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  size_t paren = stat.rfind(')');
  if (paren != std::string::npos && paren + 2 < stat.size()) {
    char state = stat[paren + 2];
    if (state == 'Z' || state == 'X') return false;
  }
  return true;
}

double JsonNumber(const std::string& json, const std::string& key, double fallback) {
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(json, &root).ok()) return fallback;
  auto it = root.fields().find(key);
  if (it == root.fields().end()) return fallback;
  return it->second.number_value();
}

}  // namespace e2e
}  // namespace dtrain
