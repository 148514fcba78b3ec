#include "libs/trace/trace.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace dtrain {
namespace trace {
namespace {

Span At(const std::string& name, const std::string& track, int64_t start, int64_t dur,
        int64_t step) {
  Span s;
  s.name = name;
  s.track = track;
  s.start_us = start;
  s.duration_us = dur;
  s.step = step;
  return s;
}

TEST(RecorderTest, KeepsTheNewestSpansOldestFirst) {
  Recorder r(3);
  for (int i = 0; i < 5; ++i) r.Add(At("s", kTrackStep, i, 1, i));
  std::vector<Span> got = r.Snapshot();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].step, 2);
  EXPECT_EQ(got[1].step, 3);
  EXPECT_EQ(got[2].step, 4);
  EXPECT_EQ(r.dropped(), 2);
  Recorder partial(8);
  partial.Add(At("a", kTrackStep, 1, 1, 0));
  partial.Add(At("b", kTrackStep, 2, 1, 1));
  ASSERT_EQ(partial.Snapshot().size(), 2u);
  EXPECT_EQ(partial.Snapshot()[0].name, "a");
  EXPECT_EQ(partial.dropped(), 0);
}

TEST(RecorderTest, ScopedSpanMeasuresItsScopeAndNullRecordsNothing) {
  Recorder r;
  const int64_t before = NowMicros();
  {
    ScopedSpan s(&r, "backward", kTrackCompute, 7);
    absl::SleepFor(absl::Milliseconds(20));
  }
  { ScopedSpan none(nullptr, "ignored", kTrackStep); }
  std::vector<Span> got = r.Snapshot();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].name, "backward");
  EXPECT_EQ(got[0].track, "compute");
  EXPECT_EQ(got[0].step, 7);
  EXPECT_GE(got[0].start_us, before);
  EXPECT_GE(got[0].duration_us, 20000);
  EXPECT_LT(got[0].duration_us, 2000000);
}

TEST(RecorderTest, ConcurrentWritersLoseNothingButTheOverwritten) {
  Recorder r(1000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 500; ++i) r.Add(At("x", kTrackCommunication, i, 1, t));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(r.Snapshot().size(), 1000u);
  EXPECT_EQ(r.dropped(), 1000);
}

// The trace as JSON objects: events by phase.
google::protobuf::Struct Parse(const std::string& json) {
  google::protobuf::Struct root;
  auto st = google::protobuf::util::JsonStringToMessage(json, &root);
  EXPECT_TRUE(st.ok()) << st.ToString() << "\n" << json;
  return root;
}

TEST(ChromeTraceTest, OneProcessPerRankOneThreadPerTrackOffsetsApplied) {
  RankSpans r0;
  r0.rank = 0;
  r0.label = "trainer \"a\"";
  r0.spans = {At("step", kTrackStep, 1000, 500, 0), At("backward", kTrackCompute, 1100, 300, 0),
              At("reduce bucket 0", kTrackCommunication, 1200, 100, 0)};
  RankSpans r1;
  r1.rank = 1;
  r1.clock_offset_us = 250;  // its clock runs 250 us ahead
  r1.dropped = 3;
  r1.spans = {At("reduce bucket 0", kTrackCommunication, 1450, 100, 0),
              At("step", kTrackStep, 1250, 500, 0)};
  google::protobuf::Struct root = Parse(ChromeTraceJson({r0, r1}));
  ASSERT_TRUE(root.fields().count("traceEvents"));
  std::map<std::pair<int, int>, std::string> threads;  // (pid, tid) -> name
  std::map<int, std::string> processes;
  std::vector<google::protobuf::Struct> spans;
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    const std::string ph = f.at("ph").string_value();
    const int pid = static_cast<int>(f.at("pid").number_value());
    const int tid = static_cast<int>(f.at("tid").number_value());
    if (ph == "M" && f.at("name").string_value() == "process_name") {
      processes[pid] = f.at("args").struct_value().fields().at("name").string_value();
    } else if (ph == "M" && f.at("name").string_value() == "thread_name") {
      threads[{pid, tid}] = f.at("args").struct_value().fields().at("name").string_value();
    } else if (ph == "X") {
      spans.push_back(v.struct_value());
    }
  }
  EXPECT_EQ(processes[0], "rank 0 (trainer \"a\")");
  EXPECT_EQ(processes[1], "rank 1 [3 older spans dropped]");
  // Step first, then compute, then communication.
  EXPECT_EQ(threads[std::make_pair(0, 1)], "step");
  EXPECT_EQ(threads[std::make_pair(0, 2)], "compute");
  EXPECT_EQ(threads[std::make_pair(0, 3)], "communication");
  EXPECT_EQ(threads[std::make_pair(1, 1)], "step");
  EXPECT_EQ(threads[std::make_pair(1, 2)], "communication");
  ASSERT_EQ(spans.size(), 5u);
  for (const auto& s : spans) {
    const auto& f = s.fields();
    const int pid = static_cast<int>(f.at("pid").number_value());
    const int tid = static_cast<int>(f.at("tid").number_value());
    EXPECT_EQ(threads[std::make_pair(pid, tid)], f.at("cat").string_value());
    EXPECT_EQ(f.at("args").struct_value().fields().at("step").number_value(), 0);
    if (pid == 1 && f.at("name").string_value() == "step") {
      // Aligned with rank 0's step: 1250 - 250.
      EXPECT_EQ(f.at("ts").number_value(), 1000);
      EXPECT_EQ(f.at("dur").number_value(), 500);
    }
  }
}

TEST(ChromeTraceTest, EmptyIsStillAValidTrace) {
  google::protobuf::Struct root = Parse(ChromeTraceJson({}));
  EXPECT_EQ(root.fields().at("traceEvents").list_value().values_size(), 0);
}

}  // namespace
}  // namespace trace
}  // namespace dtrain
