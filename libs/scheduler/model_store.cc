#include "libs/scheduler/model_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"

namespace dtrain {
namespace scheduler {
namespace {

absl::Status MakeDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating ", dir));
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", dir));
  const int r = fsync(fd);
  const int e = errno;
  close(fd);
  if (r != 0) return ErrnoToStatus(e, absl::StrCat("fsync of ", dir));
  return absl::OkStatus();
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  return names;
}

std::string CapMessage(int64_t bytes, int64_t cap, absl::string_view what) {
  return absl::StrFormat(
      "model_file: %s %d bytes, over the scheduler's cap of %d bytes (%.1f MiB; its "
      "--max_model_bytes)",
      what, bytes, cap, static_cast<double>(cap) / (1 << 20));
}

}  // namespace

absl::Status ValidateModelDigest(absl::string_view digest, absl::string_view field) {
  absl::string_view hex = digest;
  bool ok = absl::ConsumePrefix(&hex, kModelDigestPrefix) && hex.size() == 64;
  for (char c : hex) ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (ok) return absl::OkStatus();
  const std::string shown =
      digest.size() <= 80 ? std::string(digest) : absl::StrCat(digest.substr(0, 80), "...");
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be \"sha256:\" and 64 lowercase hex digits, got '",
                   absl::CHexEscape(shown), "'"));
}

std::string ModelDigestOf(absl::string_view bytes) {
  return absl::StrCat(kModelDigestPrefix, Sha256Hex(bytes));
}

absl::StatusOr<std::unique_ptr<ModelStore>> ModelStore::Open(ModelStoreOptions options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("model store: dir is required");
  if (options.max_model_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model store: max_model_bytes must be > 0, got ", options.max_model_bytes));
  }
  DT_RETURN_IF_ERROR(MakeDir(options.dir));
  DT_RETURN_IF_ERROR(MakeDir(options.dir + "/sha256"));
  DT_RETURN_IF_ERROR(MakeDir(options.dir + "/tmp"));
  return std::unique_ptr<ModelStore>(new ModelStore(std::move(options)));
}

int ModelStore::Touch(const std::string& path) const {
  const timespec t = absl::ToTimespec(options_.now());
  const timespec times[2] = {t, t};
  return utimensat(AT_FDCWD, path.c_str(), times, 0);
}

std::string ModelStore::PathOf(absl::string_view digest) const {
  return absl::StrCat(options_.dir, "/sha256/", digest.substr(sizeof(kModelDigestPrefix) - 1));
}

absl::StatusOr<std::unique_ptr<ModelStore::Upload>> ModelStore::BeginUpload(
    const std::string& digest, int64_t total_bytes) {
  DT_RETURN_IF_ERROR(ValidateModelDigest(digest));
  if (total_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_bytes: must be > 0 (the model file's size), got ", total_bytes));
  }
  if (total_bytes > options_.max_model_bytes) {
    return absl::ResourceExhaustedError(
        CapMessage(total_bytes, options_.max_model_bytes, "the file has"));
  }
  std::unique_ptr<Upload> up(new Upload());
  up->store_ = this;
  up->digest_ = digest;
  up->total_ = total_bytes;
  // Held already: refresh it (a Submit follows) and take nothing.
  if (Touch(PathOf(digest)) == 0) {
    up->existed_ = true;
    return up;
  }
  std::random_device rd;
  up->tmp_path_ = absl::StrFormat("%s/tmp/upload-%08x%08x", options_.dir, rd(), rd());
  up->fd_ = open(up->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (up->fd_ < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", up->tmp_path_));
  return up;
}

ModelStore::Upload::~Upload() {
  if (fd_ >= 0) close(fd_);
  if (!tmp_path_.empty()) unlink(tmp_path_.c_str());
}

absl::Status ModelStore::Upload::Append(absl::string_view data) {
  const int64_t cap = store_->options_.max_model_bytes;
  if (received_ + static_cast<int64_t>(data.size()) > cap) {
    return absl::ResourceExhaustedError(
        CapMessage(received_ + static_cast<int64_t>(data.size()), cap, "received at least"));
  }
  if (received_ + static_cast<int64_t>(data.size()) > total_) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_file: more bytes than the header's total_bytes (", total_, ")"));
  }
  received_ += static_cast<int64_t>(data.size());
  if (existed_) return absl::OkStatus();  // the digest is checked against the stored file
  sha_.Update(data);
  while (!data.empty()) {
    const ssize_t n = write(fd_, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("writing ", tmp_path_));
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelStore::Stored> ModelStore::Upload::Commit() {
  if (received_ != total_) {
    return absl::InvalidArgumentError(absl::StrCat("model_file: the upload ended after ", received_,
                                                   " of the header's ", total_,
                                                   " bytes (truncated?)"));
  }
  Stored s{digest_, total_, existed_};
  if (existed_) return s;
  const std::string got = absl::StrCat(kModelDigestPrefix, sha_.HexDigest());
  if (got != digest_) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_file: the bytes' digest is ", got, ", not the header's ", digest_,
                     " (the file changed or was damaged on the way; upload it again)"));
  }
  if (fsync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync of ", tmp_path_));
  close(fd_);
  fd_ = -1;
  const std::string path = store_->PathOf(digest_);
  if (rename(tmp_path_.c_str(), path.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("renaming ", tmp_path_, " to ", path));
  }
  tmp_path_.clear();
  store_->Touch(path);
  DT_RETURN_IF_ERROR(FsyncDir(store_->options_.dir + "/sha256"));
  return s;
}

absl::StatusOr<std::string> ModelStore::Find(const std::string& digest) {
  DT_RETURN_IF_ERROR(ValidateModelDigest(digest));
  const std::string path = PathOf(digest);
  if (Touch(path) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("model ", digest, " is not in the model store"));
    }
    return ErrnoToStatus(errno, absl::StrCat("touching ", path));
  }
  return path;
}

int ModelStore::CollectGarbage(const std::set<std::string>& referenced) {
  const absl::Time now = options_.now();
  int removed = 0;
  auto older_than = [&](const std::string& path, absl::Duration age) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return false;
    return absl::TimeFromTimespec(st.st_mtim) + age < now;
  };
  for (const std::string& name : ListDir(options_.dir + "/sha256")) {
    const std::string digest = absl::StrCat(kModelDigestPrefix, name);
    if (referenced.count(digest) > 0) continue;
    const std::string path = absl::StrCat(options_.dir, "/sha256/", name);
    if (!older_than(path, options_.unreferenced_grace)) continue;
    if (unlink(path.c_str()) == 0) {
      ++removed;
      DT_LOG(INFO) << "model store: deleted " << digest << " (no retained job refers to it)";
    }
  }
  for (const std::string& name : ListDir(options_.dir + "/tmp")) {
    const std::string path = absl::StrCat(options_.dir, "/tmp/", name);
    if (older_than(path, options_.temp_max_age) && unlink(path.c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace scheduler
}  // namespace dtrain
