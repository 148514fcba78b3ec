#include "libs/agent/model_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <random>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/logging.h"
#include "libs/base/sha256.h"
#include "libs/base/status.h"

namespace dtrain {
namespace agent {
namespace {

// DATA_LOSS (and the file deleted) unless `path` has `digest`.
absl::Status Verify(const std::string& path, const std::string& digest, const char* where) {
  DT_ASSIGN_OR_RETURN(std::string hex, Sha256OfFile(path));
  const std::string got = absl::StrCat("sha256:", hex);
  if (got == digest) return absl::OkStatus();
  unlink(path.c_str());
  return absl::DataLossError(absl::StrCat("model file ", path, " ", where, " has the digest ", got,
                                          ", not the job's ", digest, "; deleted it"));
}

absl::Status MakeParentDir(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (!error) return absl::OkStatus();
  return ErrnoToStatus(error.value(), absl::StrCat("creating ", dir));
}

}  // namespace

absl::Status FetchModel(ClusterClient* cluster, const std::string& trainer_id,
                        const std::string& job_id, const std::string& digest,
                        const std::string& path) {
  if (access(path.c_str(), F_OK) == 0) {
    DT_RETURN_IF_ERROR(Verify(path, digest, "(cached)"));
    DT_LOG(INFO) << "job " << job_id << ": model " << digest << " from the cache";
    return absl::OkStatus();
  }
  DT_RETURN_IF_ERROR(MakeParentDir(path));
  std::random_device rd;
  const std::string part = absl::StrFormat("%s.part-%08x", path, rd());
  const int fd = open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", part));
  int64_t bytes = 0;
  scheduler::v1::GetModelRequest req;
  req.set_trainer_id(trainer_id);
  req.set_job_id(job_id);
  req.set_digest(digest);
  absl::Status s = cluster->GetModel(req, [&](absl::string_view data) -> absl::Status {
    while (!data.empty()) {
      const ssize_t n = write(fd, data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoToStatus(errno, absl::StrCat("writing ", part));
      data.remove_prefix(static_cast<size_t>(n));
      bytes += n;
    }
    return absl::OkStatus();
  });
  if (s.ok() && fsync(fd) != 0) s = ErrnoToStatus(errno, absl::StrCat("fsync of ", part));
  close(fd);
  if (s.ok()) s = Verify(part, digest, "(fetched)");
  if (s.ok() && rename(part.c_str(), path.c_str()) != 0) {
    s = ErrnoToStatus(errno, absl::StrCat("renaming ", part, " to ", path));
  }
  if (!s.ok()) {
    unlink(part.c_str());
    return Annotate(s, absl::StrCat("fetching the model ", digest));
  }
  DT_LOG(INFO) << "job " << job_id << ": fetched model " << digest << " (" << bytes << " bytes)";
  return absl::OkStatus();
}

}  // namespace agent
}  // namespace dtrain
