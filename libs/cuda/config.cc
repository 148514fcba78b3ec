#include "libs/cuda/config.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace dtrain {
namespace cuda {
namespace {

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

std::atomic<bool>& Tf32Flag() {
  static std::atomic<bool> flag(EnvIs("DTRAIN_ALLOW_TF32", "1"));
  return flag;
}

std::atomic<int>& SearchFlag() {
  static std::atomic<int> flag(static_cast<int>(EnvIs("DTRAIN_CUDNN_BENCHMARK", "0")
                                                    ? ConvAlgoSearch::kHeuristic
                                                    : ConvAlgoSearch::kBenchmark));
  return flag;
}

std::atomic<bool>& ExactFlag() {
  static std::atomic<bool> flag(EnvIs("DTRAIN_CUDNN_F32_EXACT", "1"));
  return flag;
}

}  // namespace

void SetConvF32Exact(bool exact) { ExactFlag().store(exact, std::memory_order_relaxed); }
bool ConvF32Exact() { return ExactFlag().load(std::memory_order_relaxed); }

void SetAllowTf32(bool allow) { Tf32Flag().store(allow, std::memory_order_relaxed); }
bool AllowTf32() { return Tf32Flag().load(std::memory_order_relaxed); }

void SetConvAlgoSearch(ConvAlgoSearch search) {
  SearchFlag().store(static_cast<int>(search), std::memory_order_relaxed);
}
ConvAlgoSearch GetConvAlgoSearch() {
  return static_cast<ConvAlgoSearch>(SearchFlag().load(std::memory_order_relaxed));
}

}  // namespace cuda
}  // namespace dtrain
