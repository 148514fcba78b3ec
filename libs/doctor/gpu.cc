// MeasureGpu (doctor.h): the GPU's figures through the CUDA driver API,
// loaded at run time with dlopen("libcuda.so.1"), so that libs/doctor (and
// trainctl) need no CUDA headers or libraries to build and run anywhere.
// The few driver types and entry points used are declared here as the
// driver's ABI has them (cuda.h; the _v2 names are what cuda.h maps
// cuMemAlloc and friends to).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/doctor/doctor.h"

namespace dtrain {
namespace doctor {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): the driver's type
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;

// The driver entry points MeasureGpu calls.
struct Driver {
  void* lib = nullptr;
  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*DriverGetVersion)(int*) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*PrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*CtxSynchronize)() = nullptr;
  CUresult (*MemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*MemFree)(CUdeviceptr) = nullptr;
  CUresult (*MemAllocHost)(void**, size_t) = nullptr;
  CUresult (*MemFreeHost)(void*) = nullptr;
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleUnload)(CUmodule) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;

  std::string Error(CUresult r) const {
    const char* s = nullptr;
    if (GetErrorString != nullptr && GetErrorString(r, &s) == 0 && s != nullptr) {
      return absl::StrCat(s, " (CUresult ", r, ")");
    }
    return absl::StrCat("CUresult ", r);
  }
};

template <typename F>
bool Bind(void* lib, const char* name, F* f, std::string* missing) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  if (*f == nullptr) absl::StrAppend(missing, missing->empty() ? "" : " ", name);
  return *f != nullptr;
}

// Loads the driver; "" on success, else why not.
std::string LoadDriver(Driver* d) {
  d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (d->lib == nullptr) {
    const char* e = dlerror();
    return absl::StrCat("no CUDA driver (", e != nullptr ? e : "dlopen libcuda.so.1 failed", ")");
  }
  std::string missing;
  Bind(d->lib, "cuInit", &d->Init, &missing);
  Bind(d->lib, "cuDriverGetVersion", &d->DriverGetVersion, &missing);
  Bind(d->lib, "cuDeviceGetCount", &d->DeviceGetCount, &missing);
  Bind(d->lib, "cuDeviceGet", &d->DeviceGet, &missing);
  Bind(d->lib, "cuDeviceGetName", &d->DeviceGetName, &missing);
  Bind(d->lib, "cuDevicePrimaryCtxRetain", &d->PrimaryCtxRetain, &missing);
  Bind(d->lib, "cuDevicePrimaryCtxRelease_v2", &d->PrimaryCtxRelease, &missing);
  Bind(d->lib, "cuCtxSetCurrent", &d->CtxSetCurrent, &missing);
  Bind(d->lib, "cuCtxSynchronize", &d->CtxSynchronize, &missing);
  Bind(d->lib, "cuMemAlloc_v2", &d->MemAlloc, &missing);
  Bind(d->lib, "cuMemFree_v2", &d->MemFree, &missing);
  Bind(d->lib, "cuMemAllocHost_v2", &d->MemAllocHost, &missing);
  Bind(d->lib, "cuMemFreeHost", &d->MemFreeHost, &missing);
  Bind(d->lib, "cuMemcpyHtoD_v2", &d->MemcpyHtoD, &missing);
  Bind(d->lib, "cuMemcpyDtoH_v2", &d->MemcpyDtoH, &missing);
  Bind(d->lib, "cuMemcpyDtoD_v2", &d->MemcpyDtoD, &missing);
  Bind(d->lib, "cuModuleLoadData", &d->ModuleLoadData, &missing);
  Bind(d->lib, "cuModuleUnload", &d->ModuleUnload, &missing);
  Bind(d->lib, "cuModuleGetFunction", &d->ModuleGetFunction, &missing);
  Bind(d->lib, "cuLaunchKernel", &d->LaunchKernel, &missing);
  Bind(d->lib, "cuGetErrorString", &d->GetErrorString, &missing);
  if (!missing.empty()) return absl::StrCat("libcuda.so.1 lacks ", missing);
  return "";
}

// An empty kernel, as PTX the driver compiles for whatever GPU it runs on.
constexpr char kNoopPtx[] =
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry dtrain_doctor_noop()\n"
    "{\n"
    "  ret;\n"
    "}\n";

// Best (smallest) seconds of `reps` runs of `f`, which returns false on a
// driver error.
template <typename F>
double Best(int reps, F f, bool* ok) {
  double best = 1e30;
  for (int i = 0; i < reps && *ok; ++i) {
    Clock::time_point t = Clock::now();
    *ok = f();
    best = std::min(best, Since(t));
  }
  return best;
}

}  // namespace

std::vector<Figure> MeasureGpu(const GpuOptions& options) {
  auto skipped = [](const std::string& why) {
    return std::vector<Figure>{{"gpu", 0, "", absl::StrCat("skipped: ", why)}};
  };
  static Driver* driver = new Driver();  // loaded once, never unloaded
  static const std::string load_error = LoadDriver(driver);
  if (!load_error.empty()) return skipped(load_error);
  const Driver& d = *driver;
  CUresult r = d.Init(0);
  if (r != 0) return skipped(absl::StrCat("cuInit: ", d.Error(r)));
  int count = 0;
  if ((r = d.DeviceGetCount(&count)) != 0) {
    return skipped(absl::StrCat("cuDeviceGetCount: ", d.Error(r)));
  }
  if (options.device < 0 || options.device >= count) {
    return skipped(absl::StrCat("no CUDA device ", options.device, " (", count, " found)"));
  }
  CUdevice dev = 0;
  char name[256] = {0};
  int version = 0;
  d.DeviceGet(&dev, options.device);
  d.DeviceGetName(name, sizeof(name) - 1, dev);
  d.DriverGetVersion(&version);
  CUcontext ctx = nullptr;
  if ((r = d.PrimaryCtxRetain(&ctx, dev)) != 0 || (r = d.CtxSetCurrent(ctx)) != 0) {
    return skipped(absl::StrCat("cuda:", options.device, " context: ", d.Error(r)));
  }

  std::vector<Figure> out;
  out.push_back({"gpu", 0, "",
                 absl::StrCat("cuda:", options.device, " ", name, ", driver API ", version / 1000,
                              ".", (version % 1000) / 10)});
  std::string failure;
  auto fail = [&](const char* what, CUresult res) {
    if (failure.empty()) {
      failure = res != 0 ? absl::StrCat(what, ": ", d.Error(res)) : absl::StrCat(what, " failed");
    }
    return false;
  };
  const size_t bytes = static_cast<size_t>(options.transfer_bytes);
  const size_t mib = size_t{1} << 20;
  CUdeviceptr dbuf = 0, dbuf2 = 0;
  void* pinned = nullptr;
  std::vector<char> pageable(bytes, 1);
  bool ok = true;
  if ((r = d.MemAlloc(&dbuf, bytes)) != 0) ok = fail("cuMemAlloc", r);
  if (ok && (r = d.MemAllocHost(&pinned, bytes)) != 0) ok = fail("cuMemAllocHost", r);
  if (ok) std::memset(pinned, 1, bytes);
  const int reps = std::max(1, options.repeats);
  auto rate = [&](double secs, size_t n) { return secs > 0 ? n / secs / 1e9 : 0.0; };
  if (ok) {
    // Warm up (first-touch mappings, the copy engines' clocks).
    ok = d.MemcpyHtoD(dbuf, pinned, bytes) == 0 && d.MemcpyDtoH(pinned, dbuf, bytes) == 0;
    const double h2d_pinned = Best(
        reps, [&] { return d.MemcpyHtoD(dbuf, pinned, bytes) == 0; }, &ok);
    const double d2h_pinned = Best(
        reps, [&] { return d.MemcpyDtoH(pinned, dbuf, bytes) == 0; }, &ok);
    const double h2d_pageable = Best(
        reps, [&] { return d.MemcpyHtoD(dbuf, pageable.data(), bytes) == 0; }, &ok);
    const double d2h_pageable = Best(
        reps, [&] { return d.MemcpyDtoH(pageable.data(), dbuf, bytes) == 0; }, &ok);
    const double one_mib = Best(
        4 * reps, [&] { return d.MemcpyHtoD(dbuf, pinned, std::min(mib, bytes)) == 0; }, &ok);
    if (ok) {
      const std::string size = absl::StrCat(bytes >> 20, "MiB");
      out.push_back({"gpu_h2d_pinned_GBps_" + size, rate(h2d_pinned, bytes), "GB/s",
                     "Transfer 1MB to/from PCI-E GPU 80 us (~12 GB/s, PCIe 3.0 x16)"});
      out.push_back({"gpu_d2h_pinned_GBps_" + size, rate(d2h_pinned, bytes), "GB/s",
                     "Transfer 1MB to/from PCI-E GPU 80 us (~12 GB/s, PCIe 3.0 x16)"});
      out.push_back({"gpu_h2d_pageable_GBps_" + size, rate(h2d_pageable, bytes), "GB/s",
                     "(pageable: staged through a pinned buffer by the driver)"});
      out.push_back({"gpu_d2h_pageable_GBps_" + size, rate(d2h_pageable, bytes), "GB/s",
                     "(pageable: staged through a pinned buffer by the driver)"});
      out.push_back({"gpu_h2d_1MiB_us", one_mib * 1e6, "us",
                     "Transfer 1MB to/from PCI-E GPU 80 us; NVLink GPU 30 us"});
    } else {
      fail("cuMemcpy", 0);
    }
  }
  // Device memory: a device-to-device copy reads and writes every byte.
  const size_t dbytes = static_cast<size_t>(options.device_copy_bytes);
  if (ok && (r = d.MemAlloc(&dbuf2, 2 * dbytes)) != 0) ok = fail("cuMemAlloc", r);
  if (ok) {
    ok = d.MemcpyDtoD(dbuf2 + dbytes, dbuf2, dbytes) == 0 && d.CtxSynchronize() == 0;
    const double secs = Best(
        reps,
        [&] { return d.MemcpyDtoD(dbuf2 + dbytes, dbuf2, dbytes) == 0 && d.CtxSynchronize() == 0; },
        &ok);
    if (ok) {
      out.push_back({absl::StrCat("gpu_device_memory_GBps_", dbytes >> 20, "MiB"),
                     rate(secs, 2 * dbytes), "GB/s",
                     "GPU Global Memory access 200 ns (latency); H200 HBM3e peak 4.8 TB/s"});
    } else {
      fail("cuMemcpyDtoD", 0);
    }
  }
  // Kernel launches: back to back (the launch rate), and each followed by a
  // synchronization (what a host that waits for every kernel pays).
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  if (ok && (r = d.ModuleLoadData(&mod, kNoopPtx)) != 0) ok = fail("cuModuleLoadData", r);
  if (ok && (r = d.ModuleGetFunction(&fn, mod, "dtrain_doctor_noop")) != 0) {
    ok = fail("cuModuleGetFunction", r);
  }
  if (ok) {
    auto launch = [&] {
      return d.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
    };
    const int n = std::max(1, options.launches);
    ok = launch() == 0 && d.CtxSynchronize() == 0;
    const double back_to_back = Best(
        reps,
        [&] {
          for (int i = 0; i < n; ++i) {
            if (launch() != 0) return false;
          }
          return d.CtxSynchronize() == 0;
        },
        &ok);
    const double synced = Best(
        reps,
        [&] {
          for (int i = 0; i < n / 10 + 1; ++i) {
            if (launch() != 0 || d.CtxSynchronize() != 0) return false;
          }
          return true;
        },
        &ok);
    if (ok) {
      out.push_back({"gpu_kernel_launch_us", back_to_back / n * 1e6, "us",
                     "Launch CUDA kernel on GPU 10 us"});
      out.push_back({"gpu_kernel_launch_sync_us", synced / (n / 10 + 1) * 1e6, "us",
                     "Launch CUDA kernel on GPU 10 us (+ waiting for it)"});
    } else {
      fail("cuLaunchKernel", 0);
    }
  }
  if (mod != nullptr) d.ModuleUnload(mod);
  if (dbuf2 != 0) d.MemFree(dbuf2);
  if (dbuf != 0) d.MemFree(dbuf);
  if (pinned != nullptr) d.MemFreeHost(pinned);
  d.PrimaryCtxRelease(dev);
  if (!failure.empty()) absl::StrAppend(&out[0].chapter, "; stopped: ", failure);
  return out;
}

}  // namespace doctor
}  // namespace dtrain
