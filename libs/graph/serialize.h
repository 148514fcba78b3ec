// Saved models: a hybridized graph and its weights in one versioned file,
// loadable with no model code (no libs/nn), to run inference.
//
//   // Saving (after HybridModule::Create in inference mode):
//   DT_RETURN_IF_ERROR(SaveGraph(hybrid->graph(), "/models/lenet.dtmodel"));
//
//   // Loading, in any process:
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<SavedModel> m, SavedModel::Load(path));
//   DT_ASSIGN_OR_RETURN(Tensor y, m->Run(x));
//
// File format. The container is libs/checkpoint's (checkpoint.h): magic
// bytes, format version, CRC-32C over the header, every entry and every
// tensor, and the file size in header and footer, so corruption and
// truncation are detected before anything is parsed. Inside it:
//   metadata "format"          "dtrain.saved_model"
//   metadata "format_version"  the graph encoding's version ("1")
//   metadata "graph"           the graph (below)
//   tensors                    one per bound value (parameter, state,
//                              constant), named as the value, dtype code =
//                              DType's value
// The graph encoding, version 1, is whitespace-separated text:
//   dtrain-graph 1
//   values <n>, then per value: <kind> <dtype> <rank> <dims...> <name>
//   inputs <n> <ids...>
//   outputs <n> <ids...>
//   nodes <n>, then per node: <op> <n_in> <ids...> <n_out> <ids...> followed
//     by every attribute: kernel stride padding relu transpose_a
//     transpose_b alpha momentum eps sgd.lr sgd.momentum sgd.weight_decay
//     sgd.nesterov <n_shape> <dims...> <n_program> (<op> <a> <b> <imm>)...
// Names are written as <length>:<bytes>; floats as the decimal value of
// their IEEE-754 bits (exact); kinds, dtypes and ops by name. A reader
// accepts its own version and rejects newer ones (kFailedPrecondition).
//
// Loading validates everything (the graph with Graph::Validate, tensors
// against their values' types) and returns an error for any file it does
// not accept: it never crashes on one.
//
// Thread-safety: SaveGraph / LoadGraph are thread-safe; a SavedModel is used
// by one thread at a time.
#ifndef DTRAIN_LIBS_GRAPH_SERIALIZE_H_
#define DTRAIN_LIBS_GRAPH_SERIALIZE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/graph/executor.h"
#include "libs/graph/ir.h"

namespace dtrain {
namespace graph {

inline constexpr int kSavedModelFormatVersion = 1;

// Writes `graph` (which must be valid) and its bound tensors to `path`,
// atomically (checkpoint::WriteCheckpoint). Values holding non-CPU tensors
// are copied to the host.
absl::Status SaveGraph(const Graph& graph, const std::string& path);

// Reads a graph written by SaveGraph. Bound tensors are on the CPU. Errors
// start with "saved model <path>: " and keep the container's codes:
// kNotFound, kInvalidArgument (not a dtrain file / not a saved model),
// kFailedPrecondition (newer version), kDataLoss (corrupt, truncated, or
// a graph that does not parse or validate).
absl::StatusOr<Graph> LoadGraph(const std::string& path);

// A loaded inference graph, ready to run: one f32 input, outputs returned
// in order. The plan is made for the saved input shape and made again (by
// shape inference) when an input of another shape arrives, so a model saved
// at batch 1 runs at any batch its ops allow.
class SavedModel {
 public:
  static absl::StatusOr<std::unique_ptr<SavedModel>> Load(const std::string& path,
                                                          const ExecutorOptions& options = {});
  // Wraps an already loaded (or built) graph.
  static absl::StatusOr<std::unique_ptr<SavedModel>> FromGraph(Graph graph,
                                                               const ExecutorOptions& options = {});

  // Runs on `x` (f32, CPU). Returns output 0, a view of the plan's memory
  // valid until the next Run (output(i) for the others). kInvalidArgument
  // when no plan fits x's shape (the message names the op that rejects it).
  absl::StatusOr<Tensor> Run(const Tensor& x);
  int num_outputs() const { return static_cast<int>(graph_.outputs().size()); }
  // Output i of the last Run. REQUIRES: a successful Run.
  const Tensor& output(int i) const { return exe_->output(i); }

  // The graph as saved (input shape: the saved one).
  const Graph& graph() const { return graph_; }
  // The input shape of the current plan.
  const Shape& input_shape() const { return exe_->graph().value(exe_->graph().inputs()[0]).shape; }

 private:
  SavedModel() = default;
  Graph graph_;
  ExecutorOptions options_;
  std::unique_ptr<Executable> exe_;
};

}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_SERIALIZE_H_
