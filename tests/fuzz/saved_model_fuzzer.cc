// Fuzz target: the saved-model loader (libs/graph/serialize.h), past the
// container's checksums. The input is a graph in the saved model's text
// encoding, then optionally a 0 byte and tensor headers:
//
//   repeated { u8 name_length, name, u8 dtype code, u8 rank, rank x u32 dim (LE) }
//
// The harness writes a real .dtmodel (checkpoint::WriteCheckpoint, so every
// CRC is right) whose tensors have those names, dtypes and shapes and
// generated element bytes, then loads it with LoadGraph; a graph that loads
// is compiled as SavedModel::FromGraph does and run once on zeros. The
// container itself is checkpoint_fuzzer's.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/checkpoint/checkpoint.h"
#include "libs/graph/serialize.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/tensor.h"

namespace {

using dtrain::DType;
using dtrain::Shape;
using dtrain::Tensor;

// Largest tensor (elements) a test case may describe, and the largest input
// a loaded model is run on.
constexpr int64_t kMaxElements = int64_t{1} << 20;

std::string Path() {
  static const std::string path =
      absl::StrCat("/dev/shm/saved_model_fuzzer.", getpid(), ".dtmodel");
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t zero = input.find('\0');
  dtrain::checkpoint::Checkpoint ckpt;
  ckpt.metadata["format"] = "dtrain.saved_model";
  ckpt.metadata["format_version"] = "1";
  ckpt.metadata["graph"] = input.substr(0, zero);
  if (zero != std::string::npos) {
    size_t p = zero + 1;
    auto byte = [&]() -> int { return p < input.size() ? static_cast<uint8_t>(input[p++]) : -1; };
    uint32_t fill = 1;
    while (p < input.size()) {
      dtrain::checkpoint::TensorRecord rec;
      const int name_length = byte();
      if (name_length <= 0 || p + name_length > input.size()) break;
      rec.name = input.substr(p, name_length);
      p += name_length;
      const int dtype = byte();
      const int rank = byte();
      if (dtype < 0 || rank < 0 || rank > 8 || p + 4 * rank > input.size()) break;
      rec.dtype = dtype;
      int64_t elements = 1;
      for (int d = 0; d < rank; ++d) {
        uint32_t dim = 0;
        for (int k = 0; k < 4; ++k) dim |= uint32_t{static_cast<uint8_t>(input[p++])} << (8 * k);
        rec.shape.push_back(dim);
        elements = dim == 0 ? 0 : (elements > kMaxElements ? elements : elements * dim);
      }
      if (elements > kMaxElements) break;
      const size_t width =
          dtype < dtrain::kNumDTypes ? dtrain::DTypeSize(static_cast<DType>(dtype)) : 4;
      rec.data.resize(static_cast<size_t>(elements) * width);
      for (char& c : rec.data) c = static_cast<char>((fill = fill * 1103515245u + 12345u) >> 24);
      bool duplicate = false;
      for (const auto& t : ckpt.tensors) duplicate |= t.name == rec.name;
      if (!duplicate) ckpt.tensors.push_back(std::move(rec));
    }
  }
  if (!dtrain::checkpoint::WriteCheckpoint(Path(), ckpt).ok()) return 0;
  absl::StatusOr<dtrain::graph::Graph> graph = dtrain::graph::LoadGraph(Path());
  if (!graph.ok()) return 0;
  absl::StatusOr<std::unique_ptr<dtrain::graph::SavedModel>> model =
      dtrain::graph::SavedModel::FromGraph(*std::move(graph));
  if (!model.ok()) return 0;
  const Shape shape = (*model)->input_shape();
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > kMaxElements / d)) return 0;
    n *= d;
  }
  if (n > kMaxElements) return 0;
  Tensor x = Tensor::Zeros(shape);
  (*model)->Run(x).IgnoreError();
  return 0;
}
