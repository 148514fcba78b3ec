// Levelled, timestamped logging to stderr.
//
//   DT_LOG(INFO) << "listening on " << address;
//   DT_LOG(WARNING) << "slow step: " << ms << " ms";
//   DT_CHECK(index < size) << "index " << index;   // our own invariants only
//
// A line reads "I1129 09:15:01.123456 4242 server.cc:42] listening on ..."
// (level, month-day, wall time, thread id, file:line, message). The minimum
// level comes from the environment variable DTRAIN_LOG_LEVEL (DEBUG, INFO,
// WARNING, ERROR; default INFO) or SetMinLogLevel(). FATAL logs and aborts.
// Thread-safe: each line is written with a single write(2).
//
// DT_CHECK is for invariants of this code base. Input from users, files or the
// network is validated and answered with an absl::Status instead.
#ifndef DTRAIN_LIBS_BASE_LOGGING_H_
#define DTRAIN_LIBS_BASE_LOGGING_H_

#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace dtrain {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

// Parses "DEBUG", "info", "Warning", ... Returns false on an unknown name.
bool ParseLogLevel(absl::string_view name, LogLevel* level);

namespace internal {

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogLevel level);
  ~LogMessage();  // Emits the line; aborts for kFatal.
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream expression when a level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace dtrain

#define DT_LOG_LEVEL_DEBUG ::dtrain::LogLevel::kDebug
#define DT_LOG_LEVEL_INFO ::dtrain::LogLevel::kInfo
#define DT_LOG_LEVEL_WARNING ::dtrain::LogLevel::kWarning
#define DT_LOG_LEVEL_ERROR ::dtrain::LogLevel::kError
#define DT_LOG_LEVEL_FATAL ::dtrain::LogLevel::kFatal

#define DT_LOG(level)                              \
  (DT_LOG_LEVEL_##level < ::dtrain::MinLogLevel()) \
      ? (void)0                                    \
      : ::dtrain::internal::LogVoidify() &         \
            ::dtrain::internal::LogMessage(__FILE__, __LINE__, DT_LOG_LEVEL_##level).stream()

#define DT_CHECK(cond)                                                                        \
  (cond) ? (void)0                                                                            \
         : ::dtrain::internal::LogVoidify() &                                                 \
               ::dtrain::internal::LogMessage(__FILE__, __LINE__, ::dtrain::LogLevel::kFatal) \
                       .stream()                                                              \
                   << "Check failed: " #cond " "

#endif  // DTRAIN_LIBS_BASE_LOGGING_H_
