#include "libs/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/metrics/scrape.h"

namespace dtrain {
namespace metrics {
namespace {

TEST(MetricsServerTest, ServesRegistryAndCallbacksOverHttp) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& requests = AddCounter(*registry, "dtrain_test_requests_total", "Requests handled.");
  requests.Add({{"method", "Push"}, {"code", "OK"}}).Increment(3);
  auto& held = AddGauge(*registry, "dtrain_test_held_bytes", "Bytes held.");
  held.Add({{"job", "a"}}).Set(4096);
  auto& latency = AddHistogram(*registry, "dtrain_test_request_duration_seconds", "Latency.");
  auto& h = latency.Add({{"method", "Push"}}, LatencyBuckets());
  h.Observe(0.00003);
  h.Observe(0.2);
  auto& sizes = AddHistogram(*registry, "dtrain_test_request_size_bytes", "Sizes.");
  sizes.Add({}, SizeBuckets()).Observe(1000);

  auto callback = std::make_shared<CallbackCollectable>([] {
    return std::vector<prometheus::MetricFamily>{
        MakeFamily("dtrain_test_keys", "Keys held.", prometheus::MetricType::Gauge,
                   {{{{"job", "a"}}, 7}, {{{"job", "b"}}, 2}}),
        MakeFamily("dtrain_test_rounds_completed_total", "Rounds.", prometheus::MetricType::Counter,
                   {{{}, 11}})};
  });

  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  (*server)->Expose(registry);
  (*server)->Expose(callback);

  absl::StatusOr<std::string> text = Scrape((*server)->port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*SampleValue(*text, "dtrain_test_requests_total{code=\"OK\",method=\"Push\"}"), 3);
  EXPECT_EQ(*SampleValue(*text, "dtrain_test_held_bytes{job=\"a\"}"), 4096);
  EXPECT_EQ(*SampleValue(*text, "dtrain_test_request_duration_seconds_count{method=\"Push\"}"), 2);
  EXPECT_EQ(*SampleValue(
                *text, "dtrain_test_request_duration_seconds_bucket{method=\"Push\",le=\"5e-05\"}"),
            1);
  EXPECT_EQ(*SampleValue(*text, "dtrain_test_keys{job=\"b\"}"), 2);
  EXPECT_EQ(*SampleValue(*text, "dtrain_test_rounds_completed_total"), 11);
  EXPECT_TRUE(absl::StrContains(*text, "# TYPE dtrain_test_request_duration_seconds histogram"));

  absl::StatusOr<bool> linted = PromtoolCheck(*text);
  ASSERT_TRUE(linted.ok()) << linted.status() << "\n" << *text;
  if (!*linted) std::cerr << "promtool not installed: lint skipped\n";
}

// Issue 16: slow clients must not hold /metrics. 64 clients (twice the
// connection cap) trickle endless request heads or send nothing; scrapes
// still answer within 1 s each, and the server closes the slow connections
// (request_timeout, or to make room at the cap).
TEST(MetricsServerTest, SlowClientsDoNotHoldTheServer) {
  auto registry = std::make_shared<prometheus::Registry>();
  AddCounter(*registry, "dtrain_test_scrapes_total", "Scrapes.").Add({}).Increment(5);
  MetricsServerOptions options;
  options.max_connections = 32;
  options.request_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", options);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Expose(registry);
  {
    SlowClients slow((*server)->port(), 64, absl::Milliseconds(20));
    absl::SleepFor(absl::Milliseconds(300));  // all connected, the cap reached
    for (int i = 0; i < 20; ++i) {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::string> text = Scrape((*server)->port());
      const absl::Duration took = absl::Now() - start;
      ASSERT_TRUE(text.ok()) << "scrape " << i << ": " << text.status();
      EXPECT_EQ(*SampleValue(*text, "dtrain_test_scrapes_total"), 5);
      EXPECT_LT(took, absl::Seconds(1)) << "scrape " << i;
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_GE(slow.opened(), 64);
    // 64 clients for a cap of 32 and a 500 ms request deadline: the server
    // has closed many of them by now.
    EXPECT_GE(slow.closed_by_server(), 32);
  }
}

// A client that sends nothing is closed once request_timeout passes, and
// one that trickles bytes forever too (the deadline is for the whole head).
TEST(MetricsServerTest, RequestTimeoutClosesSilentAndTricklingClients) {
  MetricsServerOptions options;
  options.request_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto open = [&] {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>((*server)->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  };
  const absl::Time start = absl::Now();
  int silent = open();
  int trickle = open();
  bool trickle_closed = false;
  absl::Time trickle_closed_at;
  const std::string head = "GET /metrics HTTP/1.0\r\nX-Slow: ";
  for (size_t i = 0; !trickle_closed && absl::Now() - start < absl::Seconds(5); ++i) {
    char byte = i < head.size() ? head[i] : 'x';
    if (send(trickle, &byte, 1, MSG_NOSIGNAL) < 0) {
      trickle_closed = true;
    } else {
      char c;
      ssize_t r = recv(trickle, &c, 1, MSG_DONTWAIT);
      trickle_closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    if (trickle_closed) trickle_closed_at = absl::Now();
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(trickle_closed) << "a client trickling a request head was never closed";
  EXPECT_GE(trickle_closed_at - start, absl::Milliseconds(250));
  EXPECT_LT(trickle_closed_at - start, absl::Seconds(2));
  char c;
  EXPECT_EQ(recv(silent, &c, 1, 0), 0) << "the silent client is closed, with no reply";
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  close(silent);
  close(trickle);
}

TEST(MetricsServerTest, RejectsBadOptions) {
  MetricsServerOptions options;
  options.max_connections = 0;
  EXPECT_EQ(MetricsServer::Start("127.0.0.1:0", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsServerTest, BucketsIncrease) {
  for (const auto& buckets : {LatencyBuckets(), SizeBuckets()}) {
    ASSERT_GT(buckets.size(), 5u);
    for (size_t i = 1; i < buckets.size(); ++i) EXPECT_LT(buckets[i - 1], buckets[i]);
  }
  EXPECT_LE(LatencyBuckets().front(), 1e-5);
  EXPECT_GE(SizeBuckets().back(), double(1 << 30));
}

TEST(MetricsServerTest, RejectsMalformedAddress) {
  for (const char* address : {"", "localhost", "127.0.0.1:http", "1.2.3.4:99999", ":"}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(address);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << address;
  }
}

TEST(MetricsServerTest, ReportsPortInUse) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  int port = ntohs(addr.sin_port);
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable) << server.status();
  EXPECT_TRUE(absl::StrContains(server.status().message(), absl::StrCat(port)));
  close(fd);
}

TEST(MetricsServerTest, ScrapeOfUnknownPathFails) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::string> text = Scrape((*server)->port(), "/nothing");
  EXPECT_FALSE(text.ok());
}

}  // namespace
}  // namespace metrics
}  // namespace dtrain
