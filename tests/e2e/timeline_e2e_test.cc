// End to end: `trainctl timeline` of a finished 2-trainer ALLREDUCE job (a
// real cluster: scheduler and two trainer daemons, mutual TLS) is a valid
// Chrome trace with one process per rank, each rank's step, compute and
// communication spans, ranks aligned on one clock, and gradient buckets
// reduced while backward still runs (the overlap the data-parallel step
// promises). Only the job's owner and admins may read it. The job's status
// carries its achieved model FLOP/s and MFU.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

struct Event {
  std::string name, track;
  int pid = -1;
  int64_t ts = 0, dur = 0, step = -1;
  int64_t end() const { return ts + dur; }
};

// The "X" events of a Chrome trace, with their track (thread) names; the
// process names by pid.
bool ParseTrace(const std::string& json, std::vector<Event>* events,
                std::map<int, std::string>* processes, std::string* error) {
  google::protobuf::Struct root;
  auto st = google::protobuf::util::JsonStringToMessage(json, &root);
  if (!st.ok()) {
    *error = st.ToString();
    return false;
  }
  if (!root.fields().count("traceEvents")) {
    *error = "no traceEvents";
    return false;
  }
  std::map<std::pair<int, int>, std::string> threads;
  std::vector<google::protobuf::Struct> xs;
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    const std::string ph = f.at("ph").string_value();
    const int pid = static_cast<int>(f.at("pid").number_value());
    const int tid = static_cast<int>(f.at("tid").number_value());
    if (ph == "M" && f.at("name").string_value() == "thread_name") {
      threads[{pid, tid}] = f.at("args").struct_value().fields().at("name").string_value();
    } else if (ph == "M" && f.at("name").string_value() == "process_name") {
      (*processes)[pid] = f.at("args").struct_value().fields().at("name").string_value();
    } else if (ph == "X") {
      xs.push_back(v.struct_value());
    }
  }
  for (const auto& x : xs) {
    const auto& f = x.fields();
    Event e;
    e.name = f.at("name").string_value();
    e.pid = static_cast<int>(f.at("pid").number_value());
    e.track = threads[{e.pid, static_cast<int>(f.at("tid").number_value())}];
    e.ts = static_cast<int64_t>(f.at("ts").number_value());
    e.dur = static_cast<int64_t>(f.at("dur").number_value());
    e.step = static_cast<int64_t>(f.at("args").struct_value().fields().at("step").number_value());
    events->push_back(e);
  }
  return true;
}

class TimelineE2eTest : public ClusterTest {
 protected:
  void SetUp() override { Up({.name = "timeline-cluster", .trainers = 2, .down_grace_s = 10}); }
  std::string Ctl(const std::string& args, int* rc) {
    return Trainctl(absl::StrCat("--scheduler=", scheduler(), " ", args), rc);
  }
};

TEST_F(TimelineE2eTest, TwoTrainerJobIsOneAlignedChromeTraceWithOverlap) {
  int rc;
  // 16 steps of 64 samples per rank; 64 KiB buckets split LeNet's 61.7k
  // parameters into several buckets (the last layers' first).
  std::string out =
      Ctl("submit --name=traced --model=lenet --epochs=1 --batch_size=128 --lr=0.1 --init=kaiming"
          " --train_limit=2048 --test_limit=200 --threads=1 --num_trainers=2 --sync=ALLREDUCE"
          " --bucket_bytes=65536 --wait",
          &rc);
  ASSERT_EQ(rc, 0) << out;
  ASSERT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  const std::string id = SubmittedId(out);
  ASSERT_FALSE(id.empty()) << out;

  // MFU in the job status: LeNet's training step is 13,258,800 FLOPs per
  // sample (libs/graph/flops_test counts it by hand), times samples/s.
  const std::string status = JobJson(scheduler(), out);
  const double sps = JsonNumber(status, "samples_per_second", -1);
  const double gflops = JsonNumber(status, "achieved_gflops", -1);
  const double mfu = JsonNumber(status, "mfu", -1);
  ASSERT_GT(sps, 0) << status;
  EXPECT_NEAR(gflops * 1e9 / sps, 13258800, 1) << status;
  EXPECT_GT(mfu, 0) << status;
  EXPECT_LT(mfu, 2) << status;  // of a peak measured on a busy machine
  // The two trainers started together and took one peak (measured once on
  // this host), not two measured at the same moment, each about half.
  std::vector<std::string> peaks;
  for (const ClusterProcess& p : ReadCluster(dir())) {
    if (p.role != "trainer") continue;
    const std::string log = ReadFile(dir() + "/" + p.name + ".log");
    const size_t at = log.find("CPU peak");
    ASSERT_NE(at, std::string::npos) << p.name << " logged no CPU peak";
    const size_t colon = log.find(": ", at);
    peaks.push_back(log.substr(colon + 2, log.find(" GFLOP/s", colon) - colon - 2));
  }
  ASSERT_EQ(peaks.size(), 2u);
  EXPECT_EQ(peaks[0], peaks[1]) << "each trainer measured its own peak";

  const std::string path = dir() + "/trace.json";
  out = Ctl(absl::StrCat("timeline ", id, " --out=", path), &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("2 ranks"), std::string::npos) << out;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<Event> events;
  std::map<int, std::string> processes;
  std::string error;
  ASSERT_TRUE(ParseTrace(ss.str(), &events, &processes, &error)) << error;
  ASSERT_EQ(processes.size(), 2u);
  EXPECT_EQ(processes[0].rfind("rank 0 (trainer ", 0), 0u) << processes[0];
  EXPECT_EQ(processes[1].rfind("rank 1 (trainer ", 0), 0u) << processes[1];

  // Per rank and step: the step span, forward+backward, every bucket.
  constexpr int kSteps = 16;
  std::map<std::pair<int, int64_t>, Event> steps, compute;
  std::map<std::pair<int, int64_t>, std::vector<Event>> buckets;
  std::set<std::string> bucket_names;
  for (const Event& e : events) {
    if (e.track == "step" && e.name == "step") steps[{e.pid, e.step}] = e;
    if (e.track == "compute" && e.name == "forward+backward") compute[{e.pid, e.step}] = e;
    if (e.track == "communication") {
      EXPECT_TRUE(absl::StartsWith(e.name, "allreduce bucket ")) << e.name;
      buckets[{e.pid, e.step}].push_back(e);
      bucket_names.insert(e.name);
    }
  }
  EXPECT_GE(bucket_names.size(), 2u) << "64 KiB buckets: LeNet has several";
  int overlapped = 0;
  for (int rank = 0; rank < 2; ++rank) {
    for (int64_t s = 0; s < kSteps; ++s) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " step ", s));
      ASSERT_TRUE(steps.count(std::make_pair(rank, s)));
      ASSERT_TRUE(compute.count(std::make_pair(rank, s)));
      const Event& step = steps[{rank, s}];
      const Event& fb = compute[{rank, s}];
      ASSERT_EQ(buckets[std::make_pair(rank, s)].size(), bucket_names.size());
      // Phases and reductions lie within their step.
      EXPECT_GE(fb.ts, step.ts);
      EXPECT_LE(fb.end(), step.end());
      bool early = false;
      for (const Event& b : buckets[{rank, s}]) {
        EXPECT_GE(b.ts, step.ts);
        EXPECT_LE(b.end(), step.end());
        // Reduced while this rank's backward of the same step still ran.
        if (b.ts < fb.end()) early = true;
      }
      overlapped += early;
    }
    // Aligned clocks: every step of rank 0 meets rank 1's same step (the
    // allreduce makes them wait for each other).
    for (int64_t s = 0; s < kSteps; ++s) {
      const Event& a = steps[{0, s}];
      const Event& b = steps[{1, s}];
      EXPECT_LT(a.ts, b.end()) << "step " << s;
      EXPECT_LT(b.ts, a.end()) << "step " << s;
    }
  }
  std::fprintf(stderr, "%d of %d rank-steps reduced a bucket before backward ended\n", overlapped,
               2 * kSteps);
  EXPECT_GT(overlapped, 0);

  // -o json: a summary for scripts; no --out: the trace on stdout.
  out = Ctl(absl::StrCat("-o json timeline ", id, " --out=", path), &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"ranks\":2"), std::string::npos) << out;
  out = Ctl(absl::StrCat("timeline ", id), &rc);
  ASSERT_EQ(rc, 0);
  events.clear();
  processes.clear();
  EXPECT_TRUE(ParseTrace(out, &events, &processes, &error)) << error;
  EXPECT_EQ(processes.size(), 2u);

  // An unknown job: NOT_FOUND, and trainctl says so.
  out = Ctl("timeline job-999999", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  out = Ctl("timeline", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("timeline needs one job id"), std::string::npos) << out;

  // Another user may not read it (the admin submitted it).
  const std::string certs = dir() + "/certs";
  out = Trainctl(absl::StrCat("certs issue --dir=", certs, " --name=bob --role=user"), &rc);
  ASSERT_EQ(rc, 0) << out;
  out = Ctl(absl::StrCat("--ca=", certs, "/ca.pem --cert=", certs, "/bob.pem --key=", certs,
                         "/bob.key timeline ", id),
            &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("PERMISSION_DENIED"), std::string::npos) << out;
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
