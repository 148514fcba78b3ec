#include "services/trainctl/yaml.h"

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace trainctl {
namespace {

namespace v1 = scheduler::v1;

TEST(YamlTest, AJobFileBecomesAJobSpec) {
  const char* yaml = R"(---
# LeNet on two trainers through the kvstore
name: "lenet-kv"   # quoted
model: lenet
epochs: 10
global_batch_size: 256
lr: 0.2
momentum: 0
hybridize: false
seed: 7
data_dir: '/data/it''s here'
sync:
  mode: KVSTORE
  consistency: BOUNDED_DELAY   # at most 2 behind
  max_staleness: 2
  gradient_compression: bf16
num_trainers: 2
min_trainers: 1
max_trainers: 3
)";
  absl::StatusOr<std::string> json = YamlToJson(yaml);
  ASSERT_TRUE(json.ok()) << json.status();
  v1::JobSpec spec;
  auto st = google::protobuf::util::JsonStringToMessage(*json, &spec);
  ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << *json;
  EXPECT_EQ(spec.name(), "lenet-kv");
  EXPECT_EQ(spec.model(), "lenet");
  EXPECT_EQ(spec.epochs(), 10);
  EXPECT_EQ(spec.global_batch_size(), 256);
  EXPECT_DOUBLE_EQ(spec.lr(), 0.2);
  EXPECT_EQ(spec.seed(), 7u);
  EXPECT_EQ(spec.data_dir(), "/data/it's here");
  EXPECT_EQ(spec.num_trainers(), 2);
  EXPECT_EQ(spec.min_trainers(), 1);
  EXPECT_EQ(spec.max_trainers(), 3);
  EXPECT_EQ(spec.sync().mode(), v1::KVSTORE);
  EXPECT_EQ(spec.sync().consistency(), v1::BOUNDED_DELAY);
  EXPECT_EQ(spec.sync().max_staleness(), 2);
  EXPECT_EQ(spec.sync().gradient_compression(), "bf16");
}

TEST(YamlTest, ScalarsMapToJsonTypes) {
  EXPECT_EQ(*YamlToJson("a: 1\nb: -2.5e3\nc: true\nd: ~\ne: 1.2.3\nf: 007\ng: \"x\\\"y\"\n"),
            R"({"a":1,"b":-2.5e3,"c":true,"d":null,"e":"1.2.3","f":"007","g":"x\"y"})");
  EXPECT_EQ(*YamlToJson("a:\n  b:\n    c: 1\n  d: 2\ne: 3\n"),
            R"({"a":{"b":{"c":1},"d":2},"e":3})");
  EXPECT_EQ(*YamlToJson("a: x # comment\r\n"), R"({"a":"x"})");
  // Found by the fuzzer: a number past double's range stays a string (JSON
  // has no infinity), so protobuf names the field that wants a number.
  EXPECT_EQ(*YamlToJson("a: 1e999\nb: -1e400\n"), R"({"a":"1e999","b":"-1e400"})");
  EXPECT_EQ(*YamlToJson("a: caf\xc3\xa9 \xf0\x9f\x98\x80\n"),
            "{\"a\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}");
}

TEST(YamlTest, ErrorsNameTheLine) {
  struct Case {
    const char* yaml;
    const char* want;
  } cases[] = {
      {"a: 1\n\tb: 2\n", "line 2: tabs"},
      {"a: 1\n- x\n", "line 2: sequences are not supported"},
      {"a: [1, 2]\n", "line 1: flow collections"},
      {"a: 1\na: 2\n", "line 2: duplicate key 'a'"},
      {"a: 1\njust text\n", "line 2: expected 'key: value'"},
      {"a:\n    b: 1\n  c: 2\n", "line 3: indentation 2 does not match"},
      {"a: \"open\n", "line 1: unterminated quoted string"},
      {"a: &anchor 1\n", "line 1: anchors"},
      {"  a: 1\n", "line 1: the top-level mapping must not be indented"},
      {"a: 1\n---\nb: 2\n", "line 2: only one document"},
      {"# nothing\n\n", "empty document"},
      // Found by tests/fuzz/jobfile_fuzzer: bytes that are not UTF-8 made
      // JSON that protobuf's parser rejected naming no line.
      {"a: 1\nname: \"caf\xe9\"\n", "line 2: not valid UTF-8"},
      {"a\xf7\xf7: 1\n", "line 1: not valid UTF-8"},
      {"a: \xc0\xaf\n", "line 1: not valid UTF-8"},          // overlong '/'
      {"a: \xed\xa0\x80\n", "line 1: not valid UTF-8"},      // a UTF-16 surrogate
      {"a: \xf4\x90\x80\x80\n", "line 1: not valid UTF-8"},  // past U+10FFFF
      {"a: \xe2\x82\n", "line 1: not valid UTF-8"},          // cut short
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> r = YamlToJson(c.yaml);
    ASSERT_FALSE(r.ok()) << c.yaml << " -> " << *r;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.want), std::string::npos)
        << c.yaml << " -> " << r.status();
  }
}

}  // namespace
}  // namespace trainctl
}  // namespace dtrain
