#include "libs/metrics/scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/base/status.h"

namespace dtrain {
namespace metrics {

absl::StatusOr<std::string> Scrape(int port, absl::string_view path) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket");
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", ErrnoToStatus(e, "connect").message()));
  }
  // A server that never answers fails the scrape instead of hanging the test.
  timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = write(fd, request.data() + sent, request.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      close(fd);
      return absl::UnavailableError(ErrnoToStatus(e, "write").message());
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      return absl::UnavailableError(ErrnoToStatus(e, "read").message());
    }
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::InternalError(absl::StrCat("malformed HTTP response from port ", port));
  }
  absl::string_view status_line = absl::string_view(response).substr(0, response.find("\r\n"));
  if (status_line.find(" 200") == absl::string_view::npos) {
    return absl::InternalError(absl::StrCat("GET ", path, ": ", status_line));
  }
  return response.substr(header_end + 4);
}

absl::StatusOr<bool> PromtoolCheck(const std::string& text) {
  std::string promtool;
  for (const char* candidate : {"/usr/bin/promtool", "/usr/local/bin/promtool"}) {
    if (access(candidate, X_OK) == 0) {
      promtool = candidate;
      break;
    }
  }
  if (promtool.empty()) return false;
  const char* tmpdir = std::getenv("TEST_TMPDIR");
  std::string dir = tmpdir ? tmpdir : "/tmp";
  std::string in = absl::StrCat(dir, "/promtool_in.", getpid(), ".txt");
  std::string out = absl::StrCat(dir, "/promtool_out.", getpid(), ".txt");
  {
    std::ofstream f(in, std::ios::binary);
    f << text;
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", in));
  }
  std::string cmd = absl::StrCat(promtool, " check metrics < ", in, " > ", out, " 2>&1");
  int rc = std::system(cmd.c_str());
  std::ifstream f(out, std::ios::binary);
  std::string complaints((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::remove(in.c_str());
  std::remove(out.c_str());
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("promtool check metrics failed (status ", rc, "): ", complaints));
  }
  return true;
}

absl::StatusOr<double> SampleValue(absl::string_view text, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, series)) continue;
    if (line.empty() || line[0] != ' ') continue;
    line.remove_prefix(1);
    absl::string_view value = line.substr(0, line.find(' '));
    double v = 0;
    if (!absl::SimpleAtod(value, &v)) {
      return absl::InternalError(absl::StrCat("bad value '", value, "' for ", series));
    }
    return v;
  }
  return absl::NotFoundError(absl::StrCat("no sample ", series));
}

SlowClients::SlowClients(int port, int n, absl::Duration interval) : port_(port) {
  fds_.assign(static_cast<size_t>(n), -1);
  thread_ = std::thread([this, interval] { Run(interval); });
}

SlowClients::~SlowClients() {
  stop_.Notify();
  thread_.join();
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
}

int SlowClients::Connect() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  opened_.fetch_add(1);
  return fd;
}

void SlowClients::Run(absl::Duration interval) {
  static constexpr char kHead[] = "GET /metrics HTTP/1.0\r\nX-Slow: ";
  std::vector<size_t> sent(fds_.size(), 0);
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    for (size_t i = 0; i < fds_.size(); ++i) {
      int& fd = fds_[i];
      if (fd >= 0) {
        // Closed by the server? (A read of 0 bytes, or a reset.)
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
        bool closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        // Odd clients trickle a request head that never ends; even ones send nothing.
        if (!closed && i % 2 == 1) {
          const char byte = sent[i] < sizeof(kHead) - 1 ? kHead[sent[i]] : 'x';
          closed = send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN;
          ++sent[i];
        }
        if (closed) {
          close(fd);
          fd = -1;
          closed_by_server_.fetch_add(1);
        }
      }
      if (fd < 0) {
        fd = Connect();
        sent[i] = 0;
      }
    }
  }
}

}  // namespace metrics
}  // namespace dtrain
