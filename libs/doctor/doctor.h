// The machine's figures next to the chapter's table of latency numbers
// (docs/netlab.md): what `trainctl doctor` prints, and the alpha (latency)
// and beta (bandwidth) of a link that the scaling benchmark's model uses;
// and a GPU's figures next to the chapter's GPU table (docs/gpu.md).
//
//   std::vector<doctor::Figure> figures = doctor::MeasureHost({});
//   for (doctor::Figure& f : doctor::MeasureGpu({})) figures.push_back(f);
//   DT_ASSIGN_OR_RETURN(doctor::LinkFigures link,
//                       doctor::MeasureLink("10.77.0.2:7999", {}));  // a LinkServer there
//
// Every figure is measured, none is looked up: memory latency by chasing a
// random cyclic chain of pointers through a buffer of the given size (each
// load depends on the previous one, so the time per load is the latency of
// the level the buffer fits in), memcpy bandwidth by copying a buffer larger
// than the caches, and a TCP link by 1-byte ping-pongs (latency: half the
// median round trip) and one bulk stream (bandwidth: payload bytes per
// second as the receiver acknowledges them).
#ifndef DTRAIN_LIBS_DOCTOR_DOCTOR_H_
#define DTRAIN_LIBS_DOCTOR_DOCTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {
namespace doctor {

// One measured figure, with the chapter's number for the same thing when it
// has one ("" otherwise).
struct Figure {
  std::string name;     // e.g. "memory_latency_ns_256MiB"
  double value = 0;     // in `unit`
  std::string unit;     // "ns", "GB/s", "us"
  std::string chapter;  // e.g. "256MB memory ref. (local CPU) 75 ns"
};

struct HostOptions {
  // Buffer sizes of the latency chase (the L1, L2, L3 and memory levels of
  // the chapter's table by default).
  std::vector<int64_t> latency_bytes = {16 << 10, 256 << 10, 4 << 20, 256 << 20};
  int64_t memcpy_bytes = 256 << 20;
  // Loopback TCP ping-pongs and bulk bytes (0 bulk bytes: no loopback figures).
  int pings = 2000;
  int64_t loopback_bytes = 256 << 20;
};

// Memory latency per level, memcpy bandwidth, loopback TCP latency and
// bandwidth. Takes a few seconds.
std::vector<Figure> MeasureHost(const HostOptions& options);

struct GpuOptions {
  int device = 0;                         // CUDA device index
  int64_t transfer_bytes = 64 << 20;      // host <-> device copies
  int64_t device_copy_bytes = 256 << 20;  // device -> device copy (each way)
  int launches = 2000;                    // empty kernels per timing
  int repeats = 5;                        // best of
};

// The GPU's figures, measured through the CUDA driver (libcuda.so.1, loaded
// at run time: nothing of CUDA is needed to build or run this):
//   gpu                          the device's name and the driver API version
//   gpu_h2d_pinned_GBps_<size>   host -> device, pinned (page-locked) memory
//   gpu_d2h_pinned_GBps_<size>   device -> host, pinned
//   gpu_h2d_pageable_GBps_<size> host -> device from ordinary (malloc) memory
//   gpu_d2h_pageable_GBps_<size> device -> host into ordinary memory
//   gpu_h2d_1MiB_us              one 1 MiB pinned copy (the chapter's row)
//   gpu_device_memory_GBps_<size> a device -> device copy, bytes read plus
//                                written per second
//   gpu_kernel_launch_us         an empty kernel, launched back to back
//   gpu_kernel_launch_sync_us    an empty kernel plus waiting for it
// each with the chapter's GPU table row. Copies are synchronous (timed on
// the host, best of `repeats`). Without a driver or without the device:
// one figure named "gpu" whose `chapter` is "skipped: <why>". A driver
// error midway ends the measurements; the "gpu" figure then says where.
// Takes about a second on a GPU. Safe to call from any thread; it
// synchronizes the device's primary context (other work there is waited for).
std::vector<Figure> MeasureGpu(const GpuOptions& options);

// Nanoseconds per dependent load in a random cycle through `bytes`.
double ChaseLatencyNs(int64_t bytes);
// Bytes per second of memcpy between two `bytes` buffers (best of a few).
double MemcpyBytesPerSecond(int64_t bytes);

// A TCP server the link measurements talk to: it echoes 1-byte pings and
// swallows bulk streams, acknowledging each with one byte at its end. Runs
// on its own thread until destroyed.
class LinkServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks one).
  static absl::StatusOr<std::unique_ptr<LinkServer>> Start(const std::string& address);
  ~LinkServer();
  // "host:port" with the actual port.
  const std::string& address() const { return address_; }

 private:
  LinkServer() = default;
  void Serve();
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  std::string address_;
  std::thread thread_;
};

struct LinkOptions {
  int pings = 500;
  int64_t bulk_bytes = 64 << 20;
};

struct LinkFigures {
  double latency_s = 0;         // alpha: one way, half the median round trip
  double bytes_per_second = 0;  // beta: one bulk TCP stream's payload rate
};

// Measures the link to a LinkServer at `address`. UNAVAILABLE naming the
// address when it cannot connect.
absl::StatusOr<LinkFigures> MeasureLink(const std::string& address, const LinkOptions& options);

}  // namespace doctor
}  // namespace dtrain

#endif  // DTRAIN_LIBS_DOCTOR_DOCTOR_H_
