#include "libs/base/logging.h"

#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "absl/strings/ascii.h"

namespace dtrain {
namespace {

LogLevel InitialLevel() {
  const char* env = std::getenv("DTRAIN_LOG_LEVEL");
  LogLevel level = LogLevel::kInfo;
  if (env != nullptr && !ParseLogLevel(env, &level)) {
    std::fprintf(stderr,
                 "W DTRAIN_LOG_LEVEL=%s is not one of DEBUG, INFO, WARNING, ERROR; using INFO\n",
                 env);
  }
  return level;
}

std::atomic<int>& MinLevelStorage() {
  static std::atomic<int> level{static_cast<int>(InitialLevel())};
  return level;
}

const char kLevelChar[] = {'D', 'I', 'W', 'E', 'F'};

}  // namespace

void SetMinLogLevel(LogLevel level) { MinLevelStorage().store(static_cast<int>(level)); }

LogLevel MinLogLevel() {
  return static_cast<LogLevel>(MinLevelStorage().load(std::memory_order_relaxed));
}

bool ParseLogLevel(absl::string_view name, LogLevel* level) {
  std::string upper = absl::AsciiStrToUpper(name);
  if (upper == "DEBUG") {
    *level = LogLevel::kDebug;
  } else if (upper == "INFO") {
    *level = LogLevel::kInfo;
  } else if (upper == "WARNING" || upper == "WARN") {
    *level = LogLevel::kWarning;
  } else if (upper == "ERROR") {
    *level = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

namespace internal {

LogMessage::LogMessage(const char* file, int line, LogLevel level)
    : file_(file), line_(line), level_(level) {}

LogMessage::~LogMessage() {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  const char* base = std::strrchr(file_, '/');
  base = base ? base + 1 : file_;
  char prefix[128];
  std::snprintf(prefix, sizeof(prefix), "%c%02d%02d %02d:%02d:%02d.%06ld %ld %s:%d] ",
                kLevelChar[static_cast<int>(level_)], tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<long>(tv.tv_usec),
                static_cast<long>(syscall(SYS_gettid)), base, line_);
  std::string line = prefix + stream_.str() + "\n";
  // One write(2) per line keeps lines from different threads whole.
  ssize_t unused = write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace dtrain
