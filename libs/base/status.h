// Status helpers shared by every library.
//
// Errors cross library boundaries as absl::Status / absl::StatusOr<T>. These
// macros keep call sites short:
//
//   absl::StatusOr<Tensor> Load(const std::string& path) {
//     DT_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
//     DT_RETURN_IF_ERROR(Validate(bytes));
//     ...
//   }
//
// Conversion to and from grpc::Status lives in grpc_status.h, the one place
// that knows about gRPC.
#ifndef DTRAIN_LIBS_BASE_STATUS_H_
#define DTRAIN_LIBS_BASE_STATUS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// Returns `status` with `context` prepended to its message ("context: message"),
// keeping the code. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Returns a Status for a failed POSIX call: the code follows errno (ENOENT is
// NotFound, EACCES PermissionDenied, ...) and the message names `what` and the
// system's description of `errno_value`.
absl::Status ErrnoToStatus(int errno_value, absl::string_view what);

}  // namespace dtrain

#define DT_STATUS_CONCAT_INNER_(a, b) a##b
#define DT_STATUS_CONCAT_(a, b) DT_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the caller if not OK.
#define DT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status _dt_status = (expr);      \
    if (!_dt_status.ok()) return _dt_status; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the caller, otherwise moves the value into `lhs` (which may declare it).
#define DT_ASSIGN_OR_RETURN(lhs, rexpr) \
  DT_ASSIGN_OR_RETURN_IMPL_(DT_STATUS_CONCAT_(_dt_statusor_, __LINE__), lhs, rexpr)

#define DT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

#endif  // DTRAIN_LIBS_BASE_STATUS_H_
