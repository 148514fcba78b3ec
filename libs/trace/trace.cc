#include "libs/trace/trace.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace dtrain {
namespace trace {

int64_t NowMicros() { return absl::GetCurrentTimeNanos() / 1000; }

Recorder::Recorder(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void Recorder::Add(Span span) {
  absl::MutexLock lock(&mu_);
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(span));
    return;
  }
  ring_[next_] = std::move(span);
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

std::vector<Span> Recorder::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<Span> out;
  out.reserve(ring_.size());
  for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
  return out;
}

int64_t Recorder::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

ScopedSpan::ScopedSpan(Recorder* recorder, std::string name, std::string track, int64_t step)
    : recorder_(recorder) {
  if (recorder_ == nullptr) return;
  span_.name = std::move(name);
  span_.track = std::move(track);
  span_.step = step;
  span_.start_us = NowMicros();
}

ScopedSpan::~ScopedSpan() {
  if (recorder_ == nullptr) return;
  span_.duration_us = std::max<int64_t>(0, NowMicros() - span_.start_us);
  recorder_->Add(std::move(span_));
}

namespace {

void AppendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          static const char kHex[] = "0123456789abcdef";
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 15]);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// Sort key of a track: step, compute tracks, communication, the rest.
std::pair<int, std::string> TrackOrder(const std::string& track) {
  if (track == kTrackStep) return {0, track};
  if (track == kTrackCompute) return {1, track};
  if (track == kTrackCommunication) return {2, track};
  return {3, track};
}

void AppendMetadata(std::vector<std::string>* events, const char* what, int pid, int tid,
                    const std::string& name, int sort_index) {
  std::string e = absl::StrCat("{\"ph\":\"M\",\"name\":\"", what, "_name\",\"pid\":", pid,
                               ",\"tid\":", tid, ",\"args\":{\"name\":");
  AppendJsonString(&e, name);
  e += "}}";
  events->push_back(std::move(e));
  events->push_back(absl::StrCat("{\"ph\":\"M\",\"name\":\"", what, "_sort_index\",\"pid\":", pid,
                                 ",\"tid\":", tid, ",\"args\":{\"sort_index\":", sort_index, "}}"));
}

}  // namespace

std::string ChromeTraceJson(const std::vector<RankSpans>& ranks) {
  std::vector<std::string> events;
  for (const RankSpans& r : ranks) {
    std::map<std::pair<int, std::string>, int> tids;
    for (const Span& s : r.spans) tids.emplace(TrackOrder(s.track), 0);
    int tid = 1;
    for (auto& [key, id] : tids) id = tid++;
    std::string process = absl::StrCat("rank ", r.rank);
    if (!r.label.empty()) absl::StrAppend(&process, " (", r.label, ")");
    if (r.dropped > 0) absl::StrAppend(&process, " [", r.dropped, " older spans dropped]");
    AppendMetadata(&events, "process", r.rank, 0, process, r.rank);
    for (const auto& [key, id] : tids)
      AppendMetadata(&events, "thread", r.rank, id, key.second, id);
    for (const Span& s : r.spans) {
      std::string e = "{\"ph\":\"X\",\"name\":";
      AppendJsonString(&e, s.name);
      e += ",\"cat\":";
      AppendJsonString(&e, s.track);
      absl::StrAppend(&e, ",\"pid\":", r.rank, ",\"tid\":", tids[TrackOrder(s.track)],
                      ",\"ts\":", s.start_us - r.clock_offset_us, ",\"dur\":", s.duration_us,
                      ",\"args\":{\"step\":", s.step, "}}");
      events.push_back(std::move(e));
    }
  }
  return absl::StrCat("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n",
                      absl::StrJoin(events, ",\n"), "\n]}\n");
}

}  // namespace trace
}  // namespace dtrain
