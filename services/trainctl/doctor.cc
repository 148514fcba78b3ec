#include "services/trainctl/doctor.h"

#include <csignal>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "libs/doctor/doctor.h"

ABSL_FLAG(std::string, peer, "",
          "doctor: also measure the link to `trainctl doctor serve` at host:port");
ABSL_FLAG(std::string, listen, "", "doctor serve: host:port to answer link measurements on");
ABSL_FLAG(int64_t, link_bytes, 64 << 20,
          "doctor: bytes of the link bandwidth stream (a 100 Mbit/s link takes ~0.1 s per MiB)");
ABSL_FLAG(int, pings, 500, "doctor: ping-pongs of the --peer link's latency");
ABSL_FLAG(bool, quick, false, "doctor: smaller buffers (memory levels up to 64 MiB), ~2 s");
ABSL_FLAG(bool, link_only, false, "doctor: only the --peer link (what scripts need for a model)");

namespace dtrain {
namespace trainctl {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

absl::Notification* stop_serving = nullptr;
void OnSignal(int) {
  if (stop_serving != nullptr && !stop_serving->HasBeenNotified()) stop_serving->Notify();
}

int Serve() {
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (listen.empty()) {
    std::fprintf(stderr, "trainctl: doctor serve needs --listen=HOST:PORT (e.g. 10.77.0.2:7999)\n");
    return 2;
  }
  auto server = doctor::LinkServer::Start(listen);
  if (!server.ok()) {
    std::fprintf(stderr, "trainctl: doctor serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("doctor serving link measurements on %s (Ctrl-C stops)\n",
              (*server)->address().c_str());
  std::fflush(stdout);
  absl::Notification stop;
  stop_serving = &stop;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  stop.WaitForNotification();
  return 0;
}

}  // namespace

int DoctorMain(const std::vector<std::string>& args, bool json) {
  if (args.size() == 1 && args[0] == "serve") return Serve();
  if (!args.empty()) {
    std::fprintf(stderr, "trainctl: doctor takes no arguments but 'serve' (got '%s')\n",
                 args[0].c_str());
    return 2;
  }
  const std::string peer = absl::GetFlag(FLAGS_peer);
  if (absl::GetFlag(FLAGS_link_only) && peer.empty()) {
    std::fprintf(stderr, "trainctl: doctor --link_only needs --peer=HOST:PORT\n");
    return 2;
  }
  std::vector<doctor::Figure> figures;
  if (!absl::GetFlag(FLAGS_link_only)) {
    if (!json) std::fprintf(stderr, "measuring this machine (a few seconds)...\n");
    doctor::HostOptions options;
    if (absl::GetFlag(FLAGS_quick)) {
      options.latency_bytes = {16 << 10, 256 << 10, 4 << 20, 64 << 20};
      options.memcpy_bytes = 64 << 20;
      options.loopback_bytes = 64 << 20;
      options.pings = 500;
    }
    figures = doctor::MeasureHost(options);
  }
  if (!peer.empty()) {
    doctor::LinkOptions options;
    options.bulk_bytes = absl::GetFlag(FLAGS_link_bytes);
    options.pings = absl::GetFlag(FLAGS_pings);
    auto link = doctor::MeasureLink(peer, options);
    if (!link.ok()) {
      std::fprintf(stderr, "trainctl: doctor: link to %s: %s\n", peer.c_str(),
                   link.status().ToString().c_str());
      return 1;
    }
    figures.push_back({"link_latency_us", link->latency_s * 1e6, "us",
                       "One-way ping within same datacenter ~250 us"});
    figures.push_back(
        {"link_GBps", link->bytes_per_second / 1e9, "GB/s", "1-10GbE: 0.1-1 GB/s effective"});
  }
  // The GPU's figures (libs/doctor MeasureGpu: transfers, device memory,
  // kernel launches), or one "gpu" line saying why there are none.
  if (!absl::GetFlag(FLAGS_link_only)) {
    doctor::GpuOptions gpu;
    if (absl::GetFlag(FLAGS_quick)) {
      gpu.transfer_bytes = 16 << 20;
      gpu.device_copy_bytes = 64 << 20;
      gpu.launches = 500;
      gpu.repeats = 3;
    }
    for (doctor::Figure& f : doctor::MeasureGpu(gpu)) figures.push_back(std::move(f));
  }
  if (json) {
    std::string out = "{";
    for (size_t i = 0; i < figures.size(); ++i) {
      const auto& f = figures[i];
      if (f.name == "gpu") {
        absl::StrAppend(&out, i ? "," : "", "\"gpu\":", JsonString(f.chapter));
        continue;
      }
      absl::StrAppend(&out, i ? "," : "", JsonString(f.name), ":",
                      absl::StrFormat("%.6g", f.value));
    }
    std::printf("%s}\n", out.c_str());
    return 0;
  }
  std::printf("%-28s %12s  %s\n", "figure", "this machine", "the chapter's table");
  for (const auto& f : figures) {
    if (f.name == "gpu") {
      std::printf("%-28s %12s  %s\n", "gpu", "-", f.chapter.c_str());
      continue;
    }
    std::printf("%-28s %9.4g %-3s %s\n", f.name.c_str(), f.value, f.unit.c_str(),
                f.chapter.c_str());
  }
  return 0;
}

}  // namespace trainctl
}  // namespace dtrain
