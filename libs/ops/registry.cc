#include "libs/ops/registry.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "libs/base/logging.h"

namespace dtrain {
namespace ops {
namespace {

struct Table {
  mutable absl::Mutex mu;
  std::map<std::pair<std::string, int>, void*> kernels ABSL_GUARDED_BY(mu);
};

Table& GetTable() {
  static Table* t = new Table();
  return *t;
}

const char* DeviceTypeName(DeviceType t) { return t == DeviceType::kCPU ? "cpu" : "cuda"; }

}  // namespace

KernelRegistry& KernelRegistry::Global() {
  static KernelRegistry* r = new KernelRegistry();
  return *r;
}

void KernelRegistry::Register(const char* op, DeviceType device, void* fn) {
  Table& t = GetTable();
  absl::MutexLock lock(&t.mu);
  auto key = std::make_pair(std::string(op), static_cast<int>(device));
  DT_CHECK(t.kernels.find(key) == t.kernels.end())
      << "kernel for op '" << op << "' on " << DeviceTypeName(device) << " registered twice";
  t.kernels[key] = fn;
}

void* KernelRegistry::Find(const char* op, DeviceType device) const {
  Table& t = GetTable();
  absl::MutexLock lock(&t.mu);
  auto it = t.kernels.find(std::make_pair(std::string(op), static_cast<int>(device)));
  return it == t.kernels.end() ? nullptr : it->second;
}

std::vector<KernelInfo> KernelRegistry::List() const {
  Table& t = GetTable();
  absl::MutexLock lock(&t.mu);
  std::vector<KernelInfo> out;
  for (const auto& [key, fn] : t.kernels) {
    out.push_back(KernelInfo{key.first, static_cast<DeviceType>(key.second)});
  }
  return out;
}

void* ResolveKernelOrDie(const char* op, const Device& device) {
  void* fn = KernelRegistry::Global().Find(op, device.type);
  DT_CHECK(fn != nullptr) << "no kernel for op '" << op << "' on " << device.ToString()
                          << " in this build (is the backend library linked?)";
  return fn;
}

}  // namespace ops
}  // namespace dtrain
