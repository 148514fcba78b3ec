#include "libs/graph/planner.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace graph {
namespace {

int64_t RoundUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

bool Overlap(const PlannedBuffer& a, const PlannedBuffer& b) {
  return !(a.last < b.first || b.last < a.first);
}

// Places the buffers of one dtype (indices `ids`); returns the arena size.
int64_t Place(std::vector<PlannedBuffer>& bufs, std::vector<int> ids, bool reuse) {
  int64_t end = 0;
  if (!reuse) {
    for (int i : ids) {
      bufs[i].offset = end;
      end += bufs[i].bytes;
    }
    return end;
  }
  // Largest first; ties by earlier start, then index (deterministic).
  std::sort(ids.begin(), ids.end(), [&](int a, int b) {
    if (bufs[a].bytes != bufs[b].bytes) return bufs[a].bytes > bufs[b].bytes;
    if (bufs[a].first != bufs[b].first) return bufs[a].first < bufs[b].first;
    return a < b;
  });
  std::vector<int> placed;  // kept sorted by offset
  for (int i : ids) {
    PlannedBuffer& b = bufs[i];
    int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max();
    int64_t prev_end = 0;
    for (int j : placed) {
      const PlannedBuffer& p = bufs[j];
      if (!Overlap(b, p)) continue;
      int64_t gap = p.offset - prev_end;
      if (gap >= b.bytes && gap < best_gap) {
        best = prev_end;
        best_gap = gap;
      }
      prev_end = std::max(prev_end, p.offset + p.bytes);
    }
    b.offset = best >= 0 ? best : prev_end;
    end = std::max(end, b.offset + b.bytes);
    auto pos = std::upper_bound(placed.begin(), placed.end(), i,
                                [&](int x, int y) { return bufs[x].offset < bufs[y].offset; });
    placed.insert(pos, i);
  }
  return end;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const Graph& graph, const PlannerOptions& options) {
  const int64_t align = options.alignment;
  if (align <= 0 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("planner: alignment ", align));
  }
  const int nv = static_cast<int>(graph.values().size());
  const int nn = static_cast<int>(graph.nodes().size());
  MemoryPlan plan;
  plan.value_buffer.assign(nv, -1);
  plan.view_of.assign(nv, -1);
  plan.in_place_input.assign(nn, -1);
  auto root = [&](int v) { return plan.view_of[v] >= 0 ? plan.view_of[v] : v; };

  // Views.
  for (const Node& n : graph.nodes()) {
    if (n.op == OpKind::kReshape && n.outputs[0] >= 0)
      plan.view_of[n.outputs[0]] = root(n.inputs[0]);
  }
  // Last use of each root value.
  std::vector<int> last(nv, -1);
  for (int i = 0; i < nn; ++i) {
    for (int id : graph.nodes()[i].inputs) {
      if (id >= 0) last[root(id)] = std::max(last[root(id)], i);
    }
  }
  for (int id : graph.outputs()) last[root(id)] = nn;

  // One buffer per planned (intermediate, non-view) value, in production
  // order; in-place outputs join their input's buffer.
  auto bytes_of = [&](const Value& v) {
    int64_t b = NumElements(v.shape) * static_cast<int64_t>(DTypeSize(v.dtype));
    return std::max(RoundUp(b, align), align);
  };
  for (int i = 0; i < nn; ++i) {
    const Node& n = graph.nodes()[i];
    const OpInfo& info = GetOpInfo(n.op);
    for (int id : n.outputs) {
      if (id < 0 || plan.view_of[id] >= 0) continue;
      const Value& v = graph.value(id);
      const int64_t bytes = bytes_of(v);
      plan.unshared_bytes += bytes;
      const int own_last = std::max(last[id], i);
      if (options.in_place && info.elementwise && n.outputs.size() == 1) {
        bool done = false;
        for (size_t k = 0; k < n.inputs.size() && !done; ++k) {
          if (n.inputs[k] < 0) continue;
          int b = plan.value_buffer[root(n.inputs[k])];
          if (b < 0) continue;
          PlannedBuffer& buf = plan.buffers[b];
          if (buf.dtype == v.dtype && buf.bytes == bytes && buf.last == i) {
            plan.value_buffer[id] = b;
            buf.last = own_last;
            plan.in_place_input[i] = static_cast<int>(k);
            done = true;
          }
        }
        if (done) continue;
      }
      PlannedBuffer buf;
      buf.dtype = v.dtype;
      buf.bytes = bytes;
      buf.first = i;
      buf.last = own_last;
      plan.value_buffer[id] = static_cast<int>(plan.buffers.size());
      plan.buffers.push_back(buf);
    }
  }
  for (int v = 0; v < nv; ++v) {
    if (plan.view_of[v] >= 0) plan.value_buffer[v] = plan.value_buffer[plan.view_of[v]];
  }

  for (int d = 0; d < kNumDTypes; ++d) {
    std::vector<int> ids;
    for (size_t i = 0; i < plan.buffers.size(); ++i) {
      if (static_cast<int>(plan.buffers[i].dtype) == d) ids.push_back(static_cast<int>(i));
    }
    plan.arena_bytes[d] = Place(plan.buffers, ids, options.reuse);
    plan.total_bytes += plan.arena_bytes[d];
  }
  // Lower bound: most bytes live at one node (a sweep over interval ends).
  std::vector<int64_t> delta(nn + 2, 0);
  for (const PlannedBuffer& b : plan.buffers) {
    delta[b.first] += b.bytes;
    delta[b.last + 1] -= b.bytes;
  }
  int64_t live = 0;
  for (int64_t d : delta) {
    live += d;
    plan.lower_bound_bytes = std::max(plan.lower_bound_bytes, live);
  }
  return plan;
}

}  // namespace graph
}  // namespace dtrain
