// The C ABI of c_api.h over SavedModel.
#include "libs/graph/c_api.h"

#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/graph/serialize.h"

struct dt_model {
  std::unique_ptr<dtrain::graph::SavedModel> model;
  dtrain::Tensor input;  // reused while the input shape stays the same
};

namespace {

thread_local std::string g_last_error;

void SetError(std::string message) { g_last_error = std::move(message); }

// Runs `body` (returning T), turning exceptions (allocation failures) into
// `on_error` with a message: nothing may unwind into C.
template <typename T, typename Body>
T Guard(T on_error, Body body) {
  try {
    g_last_error.clear();
    return body();
  } catch (const std::bad_alloc&) {
    SetError("out of memory");
  } catch (const std::exception& e) {
    SetError(absl::StrCat("internal error: ", e.what()));
  } catch (...) {
    SetError("internal error");
  }
  return on_error;
}

}  // namespace

extern "C" {

dt_model* dt_model_load(const char* path) {
  return Guard<dt_model*>(nullptr, [&]() -> dt_model* {
    if (path == nullptr) {
      SetError("dt_model_load: path is NULL");
      return nullptr;
    }
    absl::StatusOr<std::unique_ptr<dtrain::graph::SavedModel>> m =
        dtrain::graph::SavedModel::Load(path);
    if (!m.ok()) {
      SetError(m.status().ToString());
      return nullptr;
    }
    auto* model = new dt_model;
    model->model = std::move(*m);
    return model;
  });
}

int dt_model_run(dt_model* model, const float* input, const int64_t* shape, int ndim, float* output,
                 int64_t output_capacity, int64_t* output_len) {
  return Guard<int>(-1, [&]() -> int {
    if (model == nullptr || input == nullptr || shape == nullptr || output == nullptr) {
      SetError("dt_model_run: model, input, shape and output must not be NULL");
      return -1;
    }
    if (ndim < 1 || ndim > 8) {
      SetError(absl::StrCat("dt_model_run: ndim ", ndim, " is outside 1..8"));
      return -1;
    }
    dtrain::Shape s;
    int64_t count = 1;
    for (int i = 0; i < ndim; ++i) {
      if (shape[i] <= 0 || shape[i] > (int64_t{1} << 31) || count > (int64_t{1} << 40) / shape[i]) {
        SetError(absl::StrCat("dt_model_run: bad dimension ", shape[i], " at ", i));
        return -1;
      }
      count *= shape[i];
      s.push_back(shape[i]);
    }
    if (!model->input.defined() || model->input.shape() != s) {
      absl::StatusOr<dtrain::Tensor> t = dtrain::Tensor::TryEmpty(s);
      if (!t.ok()) {
        SetError(t.status().ToString());
        return -1;
      }
      model->input = *t;
    }
    std::memcpy(model->input.raw_data(), input, static_cast<size_t>(count) * sizeof(float));
    absl::StatusOr<dtrain::Tensor> y = model->model->Run(model->input);
    if (!y.ok()) {
      SetError(y.status().ToString());
      return -1;
    }
    const int64_t n = y->numel();
    if (output_len != nullptr) *output_len = n;
    if (y->dtype() != dtrain::DType::kF32) {
      SetError("dt_model_run: the model's output is not float32");
      return -1;
    }
    if (output_capacity < n) {
      SetError(absl::StrCat("dt_model_run: the output has ", n, " elements (shape ",
                            dtrain::ShapeToString(y->shape()), "), the buffer room for ",
                            output_capacity));
      return -1;
    }
    absl::Status st = y->CopyToHost(output);
    if (!st.ok()) {
      SetError(st.ToString());
      return -1;
    }
    return 0;
  });
}

void dt_model_free(dt_model* model) {
  g_last_error.clear();
  delete model;
}

const char* dt_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
