// ParseQueueYaml: block and flow forms give the same tree; every error names
// its line.
#include "libs/scheduler/queue_yaml.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

TEST(QueueYamlTest, BlockSequenceOfMappingsWithFlowValues) {
  absl::StatusOr<YamlNode> n = ParseQueueYaml(R"(# queues
queues:
  - name: team-a   # the first
    quota: {trainers: 1, cuda_devices: 8}
    users: [alice, "bob smith"]
  - name: 'team-b'
    users:
      - carol
preemption:
  within_queue: lower_priority
)");
  ASSERT_TRUE(n.ok()) << n.status();
  const YamlNode* qs = n->Find("queues");
  ASSERT_NE(qs, nullptr);
  ASSERT_TRUE(qs->is_seq());
  ASSERT_EQ(qs->elements.size(), 2u);
  const YamlNode& a = qs->elements[0];
  EXPECT_EQ(a.Find("name")->scalar, "team-a");
  EXPECT_EQ(a.Find("name")->line, 3);
  const YamlNode* quota = a.Find("quota");
  ASSERT_TRUE(quota->is_map());
  ASSERT_EQ(quota->items.size(), 2u);
  EXPECT_EQ(quota->items[0].first, "trainers");
  EXPECT_EQ(quota->items[0].second.scalar, "1");
  EXPECT_EQ(quota->items[1].first, "cuda_devices");
  EXPECT_EQ(quota->items[1].second.scalar, "8");
  const YamlNode* users = a.Find("users");
  ASSERT_TRUE(users->is_seq());
  ASSERT_EQ(users->elements.size(), 2u);
  EXPECT_EQ(users->elements[1].scalar, "bob smith");
  const YamlNode& b = qs->elements[1];
  EXPECT_EQ(b.Find("name")->scalar, "team-b");
  ASSERT_TRUE(b.Find("users")->is_seq());
  EXPECT_EQ(b.Find("users")->elements[0].scalar, "carol");
  EXPECT_EQ(b.Find("users")->elements[0].line, 8);
  EXPECT_EQ(n->Find("preemption")->Find("within_queue")->scalar, "lower_priority");
}

TEST(QueueYamlTest, SequenceAtTheKeysIndentationAndNestedFlows) {
  absl::StatusOr<YamlNode> n = ParseQueueYaml("a:\n- x\n- {k: [1, 2], j: {}}\nb: []\n");
  ASSERT_TRUE(n.ok()) << n.status();
  const YamlNode* a = n->Find("a");
  ASSERT_TRUE(a->is_seq());
  ASSERT_EQ(a->elements.size(), 2u);
  EXPECT_EQ(a->elements[0].scalar, "x");
  const YamlNode* k = a->elements[1].Find("k");
  ASSERT_TRUE(k->is_seq());
  EXPECT_EQ(k->elements[1].scalar, "2");
  EXPECT_TRUE(a->elements[1].Find("j")->is_map());
  EXPECT_TRUE(n->Find("b")->is_seq());
  EXPECT_TRUE(n->Find("b")->elements.empty());
}

TEST(QueueYamlTest, ErrorsNameTheLine) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"a: 1\nb: {x: 1\n", "line 2: expected ',' or '}'"},
      {"a: 1\n\tb: 2\n", "line 2: a tab"},
      {"a: 1\na: 2\n", "line 2: duplicate key 'a'"},
      {"a:\n  b: 1\n    c: 2\n", "line 3: unexpected indentation"},
      {"a: [x, y\n", "line 1: expected ',' or ']'"},
      {"a: 1\njust words\n", "line 2: expected 'key: value'"},
      {"a: \"open\n", "line 1: unterminated"},
      {"a: {x: 1, x: 2}\n", "line 1: duplicate key 'x'"},
      {"a: 1\n---\nb: 2\n", "line 2: several documents"},
      {"a: *ref\n", "line 1: anchors and aliases"},
      {"a:\n  - x\n  y: 1\n", "line 3: unexpected indentation"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<YamlNode> n = ParseQueueYaml(c.text);
    ASSERT_FALSE(n.ok());
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(n.status().message().find(c.want), absl::string_view::npos) << n.status();
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
