// Static memory planning: every intermediate value of a graph gets a fixed
// place in one arena per element type, reused across values whose lifetimes
// do not overlap.
//
//   DT_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(graph));
//   // plan.value_offset[v]: byte offset of value v in plan.arena_bytes[dtype]
//
// Lifetimes are intervals over the node order: a value lives from the node
// that produces it to its last reader (graph outputs to the end). A reshape
// output is a view of its input and extends the input's lifetime instead of
// getting storage of its own. An elementwise node (OpInfo::elementwise)
// writes its output over an input whose lifetime ends at that node (same
// size and dtype, not a graph output): "in place". Then buffers are placed
// greedily, largest first, each at the offset of the smallest gap (best fit)
// among the already placed buffers whose lifetimes overlap its own, or at
// the end; offsets are 64-byte aligned.
//
// Graph inputs and bound tensors (parameters, state, constants) are not
// planned: they live outside the arena.
#ifndef DTRAIN_LIBS_GRAPH_PLANNER_H_
#define DTRAIN_LIBS_GRAPH_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/graph/ir.h"

namespace dtrain {
namespace graph {

struct PlannerOptions {
  // Share memory between values with disjoint lifetimes (off: every value
  // gets its own bytes, for comparisons and debugging).
  bool reuse = true;
  // Write elementwise outputs over dying inputs.
  bool in_place = true;
  // Alignment of every buffer's offset, in bytes (a power of two).
  int64_t alignment = 64;
};

// One block of an arena, shared by the values assigned to it.
struct PlannedBuffer {
  DType dtype = DType::kF32;
  int64_t bytes = 0;   // rounded up to the alignment
  int first = 0;       // node producing it
  int last = 0;        // last node using it (nodes().size() for graph outputs)
  int64_t offset = 0;  // in the arena of `dtype`
};

struct MemoryPlan {
  // Per value: the buffer holding it, or -1 (inputs, bound tensors, absent
  // values, and views of those).
  std::vector<int> value_buffer;
  // Per value: the value whose storage it views (a reshape's input, through
  // chains of reshapes), or -1 when it is not a view.
  std::vector<int> view_of;
  std::vector<PlannedBuffer> buffers;
  // Per node: the input position whose buffer the node's output reuses
  // (in place), or -1.
  std::vector<int> in_place_input;
  // Arena sizes by dtype (DType's numeric value), in bytes.
  int64_t arena_bytes[kNumDTypes] = {};
  // Sum of the arenas: the planned peak of intermediate memory.
  int64_t total_bytes = 0;
  // Sum of all buffers without any sharing (what allocating each
  // intermediate separately and never freeing would take).
  int64_t unshared_bytes = 0;
  // Most bytes live at any one node: no placement can do better than this
  // with these lifetimes.
  int64_t lower_bound_bytes = 0;
};

// Plans `graph`'s intermediates. `graph` must be valid (Graph::Validate).
absl::StatusOr<MemoryPlan> PlanMemory(const Graph& graph, const PlannerOptions& options = {});

}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_PLANNER_H_
