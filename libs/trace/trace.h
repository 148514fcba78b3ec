// A trainer's timeline: spans (a step, its phases, each gradient bucket's
// reduction or kvstore round, checkpoints, recoveries) kept in a bounded ring
// buffer, and the Chrome trace (JSON that chrome://tracing and Perfetto
// load) of several ranks' spans.
//
//   trace::Recorder rec(8192);
//   {
//     trace::ScopedSpan s(&rec, "step", trace::kTrackStep, step);
//     ...
//   }
//   std::vector<trace::Span> spans = rec.Snapshot();
//
// Clocks: a span's start is the wall clock (Unix microseconds) of the process
// that recorded it. Spans of several machines line up once each rank's
// clock offset against a common reference (RankSpans::clock_offset_us, e.g.
// estimated against the scheduler's clock) is added; on one machine the
// offsets are zero.
//
// Cost: recording a span takes a mutex and copies its name; a trainer
// records a few dozen spans per step.
//
// Thread-safety: Recorder is thread-safe.
#ifndef DTRAIN_LIBS_TRACE_TRACE_H_
#define DTRAIN_LIBS_TRACE_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {
namespace trace {

// Track names: a Chrome trace shows each track of a rank as one row
// ("thread"). Other names may be used (they sort after these).
inline constexpr char kTrackStep[] = "step";
inline constexpr char kTrackCompute[] = "compute";
inline constexpr char kTrackCommunication[] = "communication";

struct Span {
  std::string name;         // "step", "forward+backward", "allreduce bucket 0", ...
  std::string track;        // kTrackStep, kTrackCompute, kTrackCommunication, ...
  int64_t start_us = 0;     // Unix microseconds (the recording process's clock)
  int64_t duration_us = 0;  // >= 0
  int64_t step = -1;        // the trainer's step count the span belongs to; -1: none
};

// Unix wall-clock microseconds.
int64_t NowMicros();

class Recorder {
 public:
  // Keeps the newest `capacity` spans (at least 1).
  explicit Recorder(size_t capacity = 8192);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void Add(Span span);
  // The spans kept, oldest first.
  std::vector<Span> Snapshot() const;
  // Spans the ring buffer overwrote.
  int64_t dropped() const;
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<Span> ring_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // where the next span goes once full
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// Records [construction, destruction) as one span; a null recorder records
// nothing (so call sites need no branch).
class ScopedSpan {
 public:
  ScopedSpan(Recorder* recorder, std::string name, std::string track, int64_t step = -1);
  ~ScopedSpan();
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  Recorder* const recorder_;
  Span span_;
};

// One rank's spans, as the Chrome trace shows them: process `rank`, named
// "rank <rank>" plus `label` (e.g. the trainer), one thread per track.
struct RankSpans {
  int rank = 0;
  std::string label;
  // Added to every span's start: this rank's clock minus the reference.
  int64_t clock_offset_us = 0;
  int64_t dropped = 0;  // shown in the process name when non-zero
  std::vector<Span> spans;
};

// The Chrome trace event format ("X" complete events, microseconds, plus
// process_name / thread_name metadata): {"traceEvents": [...],
// "displayTimeUnit": "ms"}. Tracks are ordered step, compute,
// communication, then any other (by name). A span's step is in its args.
std::string ChromeTraceJson(const std::vector<RankSpans>& ranks);

}  // namespace trace
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRACE_TRACE_H_
