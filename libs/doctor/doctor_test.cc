#include "libs/doctor/doctor.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace doctor {
namespace {

TEST(DoctorTest, MemoryFartherAwayIsSlower) {
  // A chain in L1 against one far beyond any cache: the levels the chapter's
  // table lists differ by more than an order of magnitude on any machine.
  const double l1 = ChaseLatencyNs(16 << 10);
  const double mem = ChaseLatencyNs(64 << 20);
  // Loose bounds: the machine may be busy (a best of several runs).
  EXPECT_GT(l1, 0.1);
  EXPECT_LT(l1, 50);
  EXPECT_GT(mem, 3 * l1) << "l1=" << l1 << " mem=" << mem;
  EXPECT_LT(mem, 1000);
}

TEST(DoctorTest, MemcpyBandwidthIsPlausible) {
  const double bps = MemcpyBytesPerSecond(64 << 20);
  EXPECT_GT(bps, 0.3e9);
  EXPECT_LT(bps, 1e12);
}

TEST(DoctorTest, LoopbackLinkMeasured) {
  auto server = LinkServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_NE((*server)->address(), "127.0.0.1:0");
  LinkOptions options;
  options.pings = 200;
  options.bulk_bytes = 32 << 20;
  auto link = MeasureLink((*server)->address(), options);
  ASSERT_TRUE(link.ok()) << link.status();
  // Loopback: a round trip through the kernel takes microseconds, and TCP
  // moves at least a few hundred MB/s even on a busy 2-core machine.
  EXPECT_GT(link->latency_s, 1e-7);
  EXPECT_LT(link->latency_s, 5e-3);
  EXPECT_GT(link->bytes_per_second, 100e6);
  // The server serves one client after another.
  auto again = MeasureLink((*server)->address(), options);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(DoctorTest, BadAddressesNamed) {
  auto bad = MeasureLink("no-port", {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("no-port"), std::string::npos);
  // Nothing listens there: UNAVAILABLE naming the address and what to run.
  uint16_t port;
  {
    auto server = LinkServer::Start("127.0.0.1:0");
    ASSERT_TRUE(server.ok());
    port = std::stoi((*server)->address().substr(10));
  }
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto refused = MeasureLink(address, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find(address), std::string::npos);
  EXPECT_NE(refused.status().message().find("trainctl doctor serve"), std::string::npos);
}

TEST(DoctorTest, HostFiguresNextToTheChapter) {
  HostOptions options;
  options.latency_bytes = {16 << 10, 1 << 20};
  options.memcpy_bytes = 16 << 20;
  options.pings = 100;
  options.loopback_bytes = 16 << 20;
  std::vector<Figure> figures = MeasureHost(options);
  ASSERT_EQ(figures.size(), 5u);
  EXPECT_EQ(figures[0].name, "memory_latency_ns_16KiB");
  EXPECT_NE(figures[0].chapter.find("L1"), std::string::npos);
  EXPECT_EQ(figures[1].name, "memory_latency_ns_1MiB");
  EXPECT_NE(figures[1].chapter.find("L3 cache"), std::string::npos);
  EXPECT_EQ(figures[2].unit, "GB/s");
  EXPECT_EQ(figures[3].name, "loopback_latency_us");
  EXPECT_EQ(figures[4].name, "loopback_GBps");
  for (const Figure& f : figures) EXPECT_GT(f.value, 0) << f.name;
}

}  // namespace
}  // namespace doctor
}  // namespace dtrain
