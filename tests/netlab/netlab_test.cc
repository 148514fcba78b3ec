// tools/netlab through the C++ library: hosts reach each other over the
// bridge, a shaped link carries its rate (trainctl doctor's link figures
// between two hosts), a partition cuts a host off and a heal restores it,
// loss drops packets. Skips, naming the reason, where the kernel refuses
// network namespaces.
#include "tests/netlab/netlab.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/subprocess.h"
#include "tests/e2e/e2e_util.h"

namespace dtrain {
namespace netlab {
namespace {

using e2e::Runfile;

class NetlabTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = PrivateNetwork(); !s.ok()) GTEST_SKIP() << s;
    auto lab = Lab::Create(Runfile("tools/netlab"), 3, "20mbit");
    ASSERT_TRUE(lab.ok()) << lab.status();
    lab_ = std::move(*lab);
    // A link measurement server in host 1.
    SubprocessOptions options;
    options.argv = lab_->InHost(1, {Runfile("services/trainctl/trainctl"), "doctor", "serve",
                                    "--listen=" + lab_->Ip(1) + ":7999"});
    options.output_file = e2e::TmpDir("netlab") + "/serve.log";
    auto child = Subprocess::Start(options);
    ASSERT_TRUE(child.ok()) << child.status();
    server_ = std::move(*child);
    absl::SleepFor(absl::Milliseconds(300));
  }

  // `trainctl -o json doctor --link_only` from host `from` to host 1, cut
  // off after `timeout_s`; *rc is its exit status (124: timed out).
  std::string Measure(int from, int64_t bytes, int timeout_s, int* rc, int pings = 200) {
    std::vector<std::string> argv = lab_->InHost(
        from, {"timeout", std::to_string(timeout_s), Runfile("services/trainctl/trainctl"), "-o",
               "json", "doctor", "--link_only", "--peer=" + lab_->Ip(1) + ":7999",
               absl::StrCat("--link_bytes=", bytes), absl::StrCat("--pings=", pings)});
    std::string command;
    for (const auto& a : argv) absl::StrAppend(&command, a, " ");
    return e2e::Run(command, rc);
  }

  std::unique_ptr<Lab> lab_;
  std::unique_ptr<Subprocess> server_;
};

TEST_F(NetlabTest, ShapedLinkCarriesItsRate) {
  EXPECT_EQ(lab_->Ip(0), "10.77.0.1");
  EXPECT_EQ(lab_->Ip(2), "10.77.0.3");
  int rc;
  // 20 Mbit/s = 2.5 MB/s: 2 MiB streams take about a second.
  std::string out = Measure(0, 2 << 20, 20, &rc);
  ASSERT_EQ(rc, 0) << out;
  const double gbps = e2e::JsonNumber(out, "link_GBps", -1);
  // tbf counts IP packets; TCP's payload is ~95% of them.
  EXPECT_GT(gbps, 0.85 * 2.5e-3) << out;
  EXPECT_LT(gbps, 1.05 * 2.5e-3) << out;
  EXPECT_GT(e2e::JsonNumber(out, "link_latency_us", -1), 0) << out;

  // Reshaped to 5 Mbit/s both ways: a quarter.
  ASSERT_TRUE(lab_->Shape(1, "5mbit").ok());
  out = Measure(0, 2 << 20, 30, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_LT(e2e::JsonNumber(out, "link_GBps", -1), 1.05 * 0.625e-3) << out;
  EXPECT_GT(e2e::JsonNumber(out, "link_GBps", -1), 0.8 * 0.625e-3) << out;
  EXPECT_FALSE(lab_->Shape(1, "fast").ok());
}

TEST_F(NetlabTest, PartitionAndHeal) {
  for (bool link_down : {false, true}) {
    SCOPED_TRACE(link_down ? "link down" : "drop all");
    ASSERT_TRUE(lab_->Partition(1, link_down).ok());
    int rc;
    std::string out = Measure(2, 64 << 10, 2, &rc);
    EXPECT_NE(rc, 0) << out;  // unreachable: no answer (timed out) or refused
    ASSERT_TRUE(lab_->Heal(1).ok());
    out = Measure(2, 64 << 10, 10, &rc);
    EXPECT_EQ(rc, 0) << out;
  }
}

TEST_F(NetlabTest, LossDropsPackets) {
  int rc;
  ASSERT_EQ(lab_->Dropped(0).value_or(-1), 0);
  // 10% loss each way on host 0's link: TCP still gets the data through
  // (retransmissions), and the rule dropped about a tenth of the packets.
  ASSERT_TRUE(lab_->Loss(0, 10).ok());
  std::string out = Measure(0, 512 << 10, 60, &rc, /*pings=*/20);
  ASSERT_EQ(rc, 0) << out;
  absl::StatusOr<int64_t> dropped = lab_->Dropped(0);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  // About a tenth of the packets that reached the rule. (Their number
  // varies: iptables sees a GSO packet of up to 64 KiB as one.)
  absl::StatusOr<int64_t> seen = lab_->LossChainPackets(0);
  ASSERT_TRUE(seen.ok()) << seen.status();
  ASSERT_GE(*seen, 100) << out;  // ACKs and pings alone are more
  const double ratio = static_cast<double>(*dropped) / *seen;
  EXPECT_GT(ratio, 0.03) << *dropped << " of " << *seen << "\n" << out;
  EXPECT_LT(ratio, 0.25) << *dropped << " of " << *seen << "\n" << out;
  ASSERT_TRUE(lab_->Loss(0, 0).ok());
  EXPECT_FALSE(lab_->Loss(0, 150).ok());
  out = Measure(0, 64 << 10, 20, &rc, 20);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(lab_->Dropped(0).value_or(-1), 0);  // the counter went with the rule
}

}  // namespace
}  // namespace netlab
}  // namespace dtrain
