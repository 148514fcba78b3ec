// run_saved_model: loads a saved model (serialize.h) and runs it once, with
// no model code linked in.
//
//   run_saved_model --model=/models/mlp.dtmodel --shape=1,512 \
//       [--input=x.f32] [--threads=1]
//
// --input is a file of little-endian f32 values, as many as the shape
// holds; without it, element i of the input is sin(0.01 * i) computed in
// double and rounded to float. Prints:
//   input_shape=[1, 512]
//   output_shape=[1, 2]
//   output=<values, space separated, %.9g: exact for f32>
// Exit status: 0 on success, 1 when the model cannot be loaded or run (the
// error on stderr), 2 for bad arguments.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "libs/graph/serialize.h"
#include "libs/ops/ops.h"

ABSL_FLAG(std::string, model, "", "saved model file");
ABSL_FLAG(std::string, shape, "", "input shape, comma separated (default: the saved one)");
ABSL_FLAG(std::string, input, "", "file of little-endian f32 input values");
ABSL_FLAG(int, threads, 1, "CPU threads for kernels");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using dtrain::Shape;
  using dtrain::Tensor;
  const std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty() || absl::GetFlag(FLAGS_threads) <= 0) {
    std::fprintf(stderr, "usage: run_saved_model --model=PATH [--shape=N,...] [--input=FILE]\n");
    return 2;
  }
  dtrain::ops::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  absl::StatusOr<std::unique_ptr<dtrain::graph::SavedModel>> model =
      dtrain::graph::SavedModel::Load(path);
  if (!model.ok()) {
    std::fprintf(stderr, "run_saved_model: %s\n", model.status().ToString().c_str());
    return 1;
  }
  Shape shape = (*model)->input_shape();
  if (!absl::GetFlag(FLAGS_shape).empty()) {
    shape.clear();
    for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_shape), ',')) {
      int64_t v;
      if (!absl::SimpleAtoi(d, &v) || v <= 0) {
        std::fprintf(stderr, "run_saved_model: bad --shape '%s'\n",
                     absl::GetFlag(FLAGS_shape).c_str());
        return 2;
      }
      shape.push_back(v);
    }
  }
  const int64_t n = dtrain::NumElements(shape);
  std::vector<float> values(static_cast<size_t>(n));
  if (!absl::GetFlag(FLAGS_input).empty()) {
    std::ifstream f(absl::GetFlag(FLAGS_input), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) {
      std::fprintf(stderr, "run_saved_model: cannot read %s\n", absl::GetFlag(FLAGS_input).c_str());
      return 2;
    }
    if (bytes.size() != values.size() * sizeof(float)) {
      std::fprintf(stderr, "run_saved_model: %s has %zu bytes, the shape needs %zu\n",
                   absl::GetFlag(FLAGS_input).c_str(), bytes.size(), values.size() * sizeof(float));
      return 2;
    }
    std::memcpy(values.data(), bytes.data(), bytes.size());
  } else {
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(std::sin(0.01 * i));
  }
  absl::StatusOr<Tensor> y = (*model)->Run(Tensor::FromVector(values, shape));
  if (!y.ok()) {
    std::fprintf(stderr, "run_saved_model: %s\n", y.status().ToString().c_str());
    return 1;
  }
  std::printf("input_shape=%s\n", dtrain::ShapeToString(shape).c_str());
  std::printf("output_shape=%s\n", dtrain::ShapeToString(y->shape()).c_str());
  std::printf("output=");
  std::vector<float> out = y->ToVector<float>();
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%.9g", i == 0 ? "" : " ", out[i]);
  std::printf("\n");
  return 0;
}
