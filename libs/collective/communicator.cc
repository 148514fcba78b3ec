#include "libs/collective/communicator.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/status.h"
#include "libs/collective/host_communicator.h"

namespace dtrain {
namespace collective {

const char* TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kInProcess:
      return "inprocess";
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kNccl:
      return "nccl";
  }
  return "?";
}

absl::StatusOr<TransportKind> ParseTransportKind(absl::string_view name) {
  for (TransportKind kind : {TransportKind::kInProcess, TransportKind::kShm, TransportKind::kTcp,
                             TransportKind::kNccl}) {
    if (name == TransportKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "'; expected inprocess, shm, tcp or nccl"));
}

const char* AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kBidirectionalRing:
      return "bidir_ring";
    case Algorithm::kHalvingDoubling:
      return "hd";
    case Algorithm::kRecursiveDoubling:
      return "rd";
  }
  return "?";
}

absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kBidirectionalRing,
                      Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling}) {
    if (name == AlgorithmName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm '", name, "'; expected auto, ring, bidir_ring, hd or rd"));
}

// ------------------------------------------------------------------------ Work

absl::Status Work::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(description_, " did not finish within ",
                                                    absl::FormatDuration(timeout),
                                                    " (it is still running)"));
  }
  return status_;
}

bool Work::IsCompleted() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void Work::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  status_ = std::move(status);
  done_ = true;
}

// ---------------------------------------------------------------- Communicator

namespace {

struct Registry {
  absl::Mutex mu;
  std::map<TransportKind, CommunicatorFactory> factories ABSL_GUARDED_BY(mu);
};

// Constructed on first use: factories register from static initializers of
// other libraries, in no defined order relative to this file's.
Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

bool IsHostTransport(TransportKind kind) {
  return kind == TransportKind::kInProcess || kind == TransportKind::kShm ||
         kind == TransportKind::kTcp;
}

}  // namespace

absl::Status RegisterCommunicatorFactory(TransportKind kind, CommunicatorFactory factory) {
  if (IsHostTransport(kind) || !factory) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot register a communicator factory for ", TransportKindName(kind)));
  }
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  if (!registry.factories.emplace(kind, std::move(factory)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("a communicator factory for ", TransportKindName(kind), " is registered"));
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> Communicator::NewWork(std::string description) {
  return std::shared_ptr<Work>(new Work(std::move(description)));
}

void Communicator::CompleteWork(Work& work, absl::Status status) {
  work.Complete(std::move(status));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    int rank, int size, Store* store, const CommunicatorOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of size ", size, " is not a valid position"));
  }
  if (store == nullptr) return absl::InvalidArgumentError("Communicator::Create needs a store");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("CommunicatorOptions::timeout must be positive");
  }
  if (IsHostTransport(options.transport)) {
    return internal::HostCommunicator::Create(rank, size, store, options);
  }
  CommunicatorFactory factory;
  {
    Registry& registry = GetRegistry();
    absl::MutexLock lock(&registry.mu);
    auto it = registry.factories.find(options.transport);
    if (it != registry.factories.end()) factory = it->second;
  }
  if (!factory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "transport '", TransportKindName(options.transport), "' is not linked into this binary",
        options.transport == TransportKind::kNccl
            ? " (add //libs/cuda/nccl:nccl_collective to its deps)"
            : ""));
  }
  return factory(rank, size, store, options);
}

}  // namespace collective
}  // namespace dtrain
