#include "libs/base/status.h"

#include <cerrno>
#include <cstring>

namespace dtrain {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

absl::Status ErrnoToStatus(int errno_value, absl::string_view what) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  const char* msg = strerror_r(errno_value, buf, sizeof(buf));
  std::string text = absl::StrCat(what, ": ", msg);
  switch (errno_value) {
    case ENOENT:
      return absl::NotFoundError(text);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(text);
    case EEXIST:
      return absl::AlreadyExistsError(text);
    case EINVAL:
      return absl::InvalidArgumentError(text);
    case EISDIR:
    case ENOTDIR:
      return absl::FailedPreconditionError(text);
    case ENOSPC:
    case ENOMEM:
      return absl::ResourceExhaustedError(text);
    case ETIMEDOUT:
      return absl::DeadlineExceededError(text);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EAGAIN:
      return absl::UnavailableError(text);
    default:
      return absl::InternalError(text);
  }
}

}  // namespace dtrain
