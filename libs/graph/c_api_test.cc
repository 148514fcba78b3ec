// The C ABI: in process (C++), and from a plain C program linked against
// libdtrain_c.so (c_api_check.c) run as a child process.
#include "libs/graph/c_api.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/graph/hybridize.h"
#include "libs/graph/serialize.h"
#include "libs/nn/models.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace graph {
namespace {

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Saves `name` hybridized at `shape`; returns the path.
std::string SaveModel(const std::string& name, const Shape& shape) {
  absl::StatusOr<std::shared_ptr<nn::Module>> m = nn::MakeModel(name);
  EXPECT_TRUE(m.ok());
  nn::InitParameters(m->get(), nn::Init::kKaiming, 1);
  absl::StatusOr<std::unique_ptr<HybridModule>> h = HybridModule::Create(m->get(), shape);
  EXPECT_TRUE(h.ok()) << h.status();
  const std::string path = TestTmpPath(name + ".dtmodel");
  EXPECT_TRUE(SaveGraph((*h)->graph(), path).ok());
  return path;
}

std::string Runfile(const std::string& name) { return RunfilePath("libs/graph/" + name); }

TEST(CApiTest, PlainCProgramLoadsAndRunsSavedModels) {
  struct Case {
    std::string model;
    Shape shape;
  };
  for (const Case& c : {Case{"mlp_chapter", {1, 512}}, Case{"lenet", {2, 1, 28, 28}}}) {
    SCOPED_TRACE(c.model);
    const std::string path = SaveModel(c.model, c.shape);
    // Expected outputs, computed here in C++ (same library, same kernels).
    Tensor x = Tensor::Empty(c.shape);
    ops::RandomUniform(&x, -1.0f, 1.0f, 5);
    absl::StatusOr<std::unique_ptr<SavedModel>> m = SavedModel::Load(path);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<Tensor> y = (*m)->Run(x);
    ASSERT_TRUE(y.ok());
    const std::string input = TestTmpPath(c.model + ".in.f32");
    const std::string expected = TestTmpPath(c.model + ".out.f32");
    WriteFile(input, Floats(x.ToVector<float>()));
    WriteFile(expected, Floats(y->ToVector<float>()));
    std::string bytes = ReadFile(path);
    const std::string corrupt = TestTmpPath(c.model + ".corrupt.dtmodel");
    const std::string truncated = TestTmpPath(c.model + ".truncated.dtmodel");
    std::string flipped = bytes;
    flipped[flipped.size() / 2] ^= 0x40;
    WriteFile(corrupt, flipped);
    WriteFile(truncated, bytes.substr(0, bytes.size() * 2 / 3));
    std::string shape;
    for (int64_t d : c.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);

    const std::string cmd = Runfile("c_api_check") + " " + path + " " + input + " " + shape + " " +
                            expected + " " + corrupt + " " + truncated + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    int rc = pclose(p);
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << out;
    EXPECT_NE(out.find("c_api_check: ok"), std::string::npos) << out;
  }
}

TEST(CApiTest, InProcessErrorsAreClearAndPerThread) {
  const std::string path = SaveModel("mlp_chapter", {1, 512});
  dt_model* m = dt_model_load(path.c_str());
  ASSERT_NE(m, nullptr) << dt_last_error();
  std::vector<float> x(512, 0.5f), y(2);
  const int64_t shape[2] = {1, 512};
  int64_t len = 0;
  ASSERT_EQ(dt_model_run(m, x.data(), shape, 2, y.data(), 2, &len), 0) << dt_last_error();
  EXPECT_EQ(len, 2);
  EXPECT_STREQ(dt_last_error(), "");
  // Batch 3 through the same model: planned again.
  std::vector<float> x3(3 * 512, 0.5f), y3(6);
  const int64_t shape3[2] = {3, 512};
  ASSERT_EQ(dt_model_run(m, x3.data(), shape3, 2, y3.data(), 6, &len), 0) << dt_last_error();
  EXPECT_EQ(len, 6);
  EXPECT_EQ(y3[4], y[0]);
  EXPECT_EQ(y3[5], y[1]);

  const int64_t wrong[2] = {1, 100};
  EXPECT_EQ(dt_model_run(m, x.data(), wrong, 2, y.data(), 2, &len), -1);
  const std::string message = dt_last_error();
  EXPECT_NE(message.find("linear"), std::string::npos) << message;
  // Another thread has its own (empty) last error.
  std::string other = "unset";
  std::thread([&] { other = dt_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(dt_last_error(), message);
  dt_model_free(m);

  EXPECT_EQ(dt_model_load(TestTmpPath("nope.dtmodel").c_str()), nullptr);
  EXPECT_NE(std::string(dt_last_error()).find("nope.dtmodel"), std::string::npos);
}

}  // namespace
}  // namespace graph
}  // namespace dtrain
