// Reading whole files, and files that readers must never see half-written: port files, cluster
// descriptions, small state files.
//
//   DT_RETURN_IF_ERROR(WriteFileAtomically("/var/run/kvstore.port", "7070"));
//
// Readers see either the old file (or none) or the whole new one, and after
// a crash the new contents are on disk once the call returned OK.
#ifndef DTRAIN_LIBS_BASE_FILES_H_
#define DTRAIN_LIBS_BASE_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// Writes `contents` (exactly; no newline is added) to a temporary file in
// the directory of `path`, fsyncs it, renames it over `path` and fsyncs the
// directory. On failure the temporary file is removed and `path` is left as
// it was; the error follows errno (ErrnoToStatus: kPermissionDenied,
// kNotFound, ...) and names the path and the failing step.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// The whole file at `path`. The error follows errno (ErrnoToStatus:
// kNotFound, kPermissionDenied, ...) and names the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// `dir` as a directory no other user may use: created 0700 if missing;
// kFailedPrecondition naming it when it is not a directory of this uid
// closed to others (a symbolic link is not followed).
absl::Status EnsurePrivateDir(const std::string& dir);

// This uid's private directory `name` for sockets and caches:
// $XDG_RUNTIME_DIR/<name>, else /tmp/<name>-<uid> (EnsurePrivateDir).
absl::StatusOr<std::string> PrivateRuntimeDir(absl::string_view name);

// This boot's id (/proc/sys/kernel/random/boot_id); "" when unknown.
std::string BootId();

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_FILES_H_
