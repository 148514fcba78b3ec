#include "libs/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace engine {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr milliseconds kLongTimeout{10000};  // "never" for a correct engine

// A one-shot gate operations can block on.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // True once open; false if still closed after `timeout`.
  bool Wait(milliseconds timeout = kLongTimeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// `parties` threads meet; Arrive() returns true if all of them arrived within
// the timeout (so two operations really overlapped).
class Rendezvous {
 public:
  explicit Rendezvous(int parties) : parties_(parties) {}
  bool Arrive(milliseconds timeout = kLongTimeout) {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrived_;
    cv_.notify_all();
    return cv_.wait_for(lock, timeout, [this] { return arrived_ >= parties_; });
  }

 private:
  const int parties_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
};

// Polls `cond` until it holds or `timeout` passes; returns its last value.
// Used only to wait for something that a correct engine makes happen.
template <typename Cond>
bool Eventually(Cond cond, milliseconds timeout = kLongTimeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return cond();
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

absl::Status Ok() { return absl::OkStatus(); }

// Aborts the test binary, naming what was running, when Pet() is not called
// for `limit`: a deadlocked engine fails fast with its seed instead of
// running into the test timeout.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit) : limit_(limit), thread_([this] { Watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }
  void Pet(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    what_ = std::move(what);
    ++pets_;
    cv_.notify_all();
  }

 private:
  void Watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      const int64_t seen = pets_;
      if (!cv_.wait_for(lock, limit_, [&] { return stop_ || pets_ != seen; })) {
        std::fprintf(stderr, "no progress for %llds in %s: deadlock?\n",
                     static_cast<long long>(limit_.count()), what_.c_str());
        std::abort();
      }
    }
  }

  const std::chrono::seconds limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t pets_ = 0;
  std::string what_;
  std::thread thread_;  // last: starts after the fields it reads
};

// ---------------------------------------------------------------------------
// Property test: random graphs give exactly the results of serial execution.

struct OpSpec {
  std::vector<int> reads;   // as pushed: may repeat, may overlap writes
  std::vector<int> writes;  // as pushed: may repeat
  int queue = 0;
  int sleep_us = 0;
  bool fail = false;
};

struct Step {
  enum Kind { kPush, kWaitToRead, kWaitAll } kind;
  int index;  // op index for kPush, variable for kWaitToRead
};

struct Graph {
  std::vector<int> var_len;
  std::vector<int> queue_threads;
  int max_pending = 1024;
  std::vector<OpSpec> ops;
  std::vector<Step> steps;
};

Graph RandomGraph(std::mt19937_64& rng, bool with_failures) {
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };
  Graph g;
  g.var_len.resize(uniform(1, 10));
  for (int& len : g.var_len) len = uniform(1, 3);
  g.queue_threads.resize(uniform(1, 3));
  for (int& t : g.queue_threads) t = uniform(1, 4);
  const int bounds[] = {1, 2, 4, 16, 1024};
  g.max_pending = bounds[uniform(0, 4)];
  const int num_vars = static_cast<int>(g.var_len.size());
  g.ops.resize(uniform(1, 80));
  for (int i = 0; i < static_cast<int>(g.ops.size()); ++i) {
    OpSpec& op = g.ops[i];
    op.reads.resize(uniform(0, 4));
    for (int& r : op.reads) r = uniform(0, num_vars - 1);
    op.writes.resize(uniform(0, 3));
    for (int& w : op.writes) w = uniform(0, num_vars - 1);
    op.queue = uniform(0, static_cast<int>(g.queue_threads.size()) - 1);
    if (chance(0.15)) op.sleep_us = uniform(1, 30);
    op.fail = with_failures && chance(0.05);
    g.steps.push_back({Step::kPush, i});
    if (chance(0.05)) g.steps.push_back({Step::kWaitToRead, uniform(0, num_vars - 1)});
    if (chance(0.01)) g.steps.push_back({Step::kWaitAll, 0});
  }
  return g;
}

using Values = std::vector<std::vector<uint64_t>>;

std::string OpName(int id) { return absl::StrCat("op", id); }

// The body of operation `id`: a deterministic, order-sensitive function of
// everything it reads, written into everything it writes. Fails (writing
// nothing) when the spec says so.
absl::Status Apply(const OpSpec& op, int id, Values* vals) {
  uint64_t h = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(id);
  for (int r : op.reads) {
    for (uint64_t x : (*vals)[r]) h = (h ^ x) * 0x100000001b3ull;
    h = (h ^ static_cast<uint64_t>(r + 1)) * 0x100000001b3ull;
  }
  if (op.fail) return absl::InternalError(absl::StrCat("boom ", id));
  for (int w : op.writes) {
    std::vector<uint64_t>& v = (*vals)[w];
    for (size_t i = 0; i < v.size(); ++i) v[i] = v[i] * 31 + h + static_cast<uint64_t>(id) + i;
  }
  return absl::OkStatus();
}

std::set<int> Distinct(const std::vector<int>& v) { return std::set<int>(v.begin(), v.end()); }

// Serial execution in push order, with the engine's error semantics.
class SerialModel {
 public:
  explicit SerialModel(const Graph& g) : vals_(InitialValues(g)), poison_(g.var_len.size()) {}

  static Values InitialValues(const Graph& g) {
    Values vals(g.var_len.size());
    for (size_t v = 0; v < vals.size(); ++v) vals[v].assign(g.var_len[v], v + 1);
    return vals;
  }

  void Run(const OpSpec& op, int id) {
    std::set<int> all = Distinct(op.reads);
    for (int w : op.writes) all.insert(w);
    const Poison* cause = nullptr;
    for (int v : all) {
      if (poison_[v] && (cause == nullptr || poison_[v]->seq < cause->seq)) cause = &*poison_[v];
    }
    absl::Status status;
    std::optional<Poison> new_poison;
    if (cause != nullptr) {
      ++skipped_;
      new_poison = *cause;
      status = absl::InternalError(absl::StrCat("op '", OpName(id), "' skipped: ", cause->message));
    } else {
      status = Apply(op, id, &vals_);
      if (!status.ok()) {
        ++failed_;
        status =
            absl::InternalError(absl::StrCat("op '", OpName(id), "' failed: ", status.message()));
        new_poison = Poison{id, std::string(status.message())};
      }
    }
    if (new_poison) {
      for (int w : op.writes) poison_[w] = new_poison;
    }
    if (!status.ok() && unreported_.ok()) unreported_ = status;
  }

  absl::Status VarStatus(int v) const {
    return poison_[v] ? absl::InternalError(poison_[v]->message) : absl::OkStatus();
  }
  // What WaitAll returns now (and forgets).
  absl::Status TakeUnreported() { return std::exchange(unreported_, absl::OkStatus()); }

  const Values& vals() const { return vals_; }
  int failed() const { return failed_; }
  int skipped() const { return skipped_; }

 private:
  struct Poison {
    int seq;
    std::string message;
  };
  Values vals_;
  std::vector<std::optional<Poison>> poison_;
  absl::Status unreported_;
  int failed_ = 0;
  int skipped_ = 0;
};

// Checks, from inside operations, that writers run alone.
class AccessMonitor {
 public:
  explicit AccessMonitor(int num_vars) : readers_(num_vars), writers_(num_vars) {}

  void Enter(const std::set<int>& reads, const std::set<int>& writes) {
    for (int w : writes) {
      if (writers_[w].fetch_add(1) != 0 || readers_[w].load() != 0) violation_ = true;
    }
    for (int r : reads) {
      readers_[r].fetch_add(1);
      if (writers_[r].load() != 0) violation_ = true;
    }
  }
  void Exit(const std::set<int>& reads, const std::set<int>& writes) {
    for (int w : writes) writers_[w].fetch_sub(1);
    for (int r : reads) readers_[r].fetch_sub(1);
  }
  bool violation() const { return violation_.load(); }

 private:
  std::vector<std::atomic<int>> readers_;
  std::vector<std::atomic<int>> writers_;
  std::atomic<bool> violation_{false};
};

void RunGraphAndCompare(const Graph& g) {
  const int num_vars = static_cast<int>(g.var_len.size());
  SerialModel model(g);
  Values vals = SerialModel::InitialValues(g);  // written only by the engine's ops
  AccessMonitor monitor(num_vars);

  auto eng = Engine::Create({g.max_pending});
  std::vector<QueueId> queues;
  for (size_t q = 0; q < g.queue_threads.size(); ++q) {
    queues.push_back(eng->AddQueue(absl::StrCat("q", q), g.queue_threads[q]));
  }
  std::vector<VarHandle> vars;
  for (int v = 0; v < num_vars; ++v) vars.push_back(eng->NewVar(absl::StrCat("v", v)));

  for (const Step& step : g.steps) {
    if (step.kind == Step::kPush) {
      const int id = step.index;
      const OpSpec& op = g.ops[id];
      model.Run(op, id);
      std::set<int> writes = Distinct(op.writes);
      std::set<int> reads;
      for (int r : op.reads) {
        if (!writes.count(r)) reads.insert(r);
      }
      std::vector<VarHandle> read_handles, write_handles;
      for (int r : op.reads) read_handles.push_back(vars[r]);
      for (int w : op.writes) write_handles.push_back(vars[w]);
      eng->Push(
          [&op, id, reads, writes, &vals, &monitor]() {
            monitor.Enter(reads, writes);
            if (op.sleep_us > 0) std::this_thread::sleep_for(microseconds(op.sleep_us));
            absl::Status status = Apply(op, id, &vals);
            monitor.Exit(reads, writes);
            return status;
          },
          std::move(read_handles), std::move(write_handles), queues[op.queue], OpName(id));
    } else if (step.kind == Step::kWaitToRead) {
      const int v = step.index;
      absl::Status status = eng->WaitToRead(vars[v]);
      EXPECT_EQ(status, model.VarStatus(v)) << "var v" << v;
      // Pending ops may read v now, but none writes it.
      EXPECT_EQ(vals[v], model.vals()[v]) << "var v" << v << " after WaitToRead";
    } else {
      EXPECT_EQ(eng->WaitAll(), model.TakeUnreported());
    }
  }
  EXPECT_EQ(eng->WaitAll(), model.TakeUnreported());
  for (int v = 0; v < num_vars; ++v) {
    EXPECT_EQ(vals[v], model.vals()[v]) << "var v" << v;
    EXPECT_EQ(eng->WaitToRead(vars[v]), model.VarStatus(v)) << "var v" << v;
  }
  EXPECT_FALSE(monitor.violation()) << "a writer overlapped another access";
  const EngineStats stats = eng->stats();
  EXPECT_EQ(stats.ops_pushed, static_cast<int64_t>(g.ops.size()));
  EXPECT_EQ(stats.ops_completed, static_cast<int64_t>(g.ops.size()));
  EXPECT_EQ(stats.ops_failed, model.failed());
  EXPECT_EQ(stats.ops_skipped, model.skipped());
  EXPECT_LE(stats.max_in_flight, g.max_pending);
  EXPECT_EQ(stats.frontends_blocked, 0);
}

TEST(EnginePropertyTest, RandomGraphsMatchSerialExecution) {
  // About 10 s, also under ThreadSanitizer.
  constexpr int kGraphs = 4000;
  Watchdog watchdog(std::chrono::seconds(60));
  for (int i = 0; i < kGraphs; ++i) {
    const uint64_t seed = 0x5eed0000 + i;
    std::mt19937_64 rng(seed);
    Graph g = RandomGraph(rng, /*with_failures=*/i % 3 == 0);
    const std::string trace =
        absl::StrCat("graph seed ", seed, ": ", g.ops.size(), " ops on ", g.var_len.size(),
                     " vars, ", g.queue_threads.size(), " queues, max_pending ", g.max_pending);
    SCOPED_TRACE(trace);
    watchdog.Pet(trace);
    RunGraphAndCompare(g);
    if (HasFailure()) break;  // one seed is enough to debug
  }
}

// Several frontend threads push at once: per-thread chains stay in order,
// shared counters see every increment once, and the bound holds globally.
// Ops writing two shared variables would deadlock if two pushes could
// register on them in different orders.
void RunConcurrentFrontends(int max_pending) {
  constexpr int kThreads = 4;
  constexpr int kOps = 1000;
  auto eng = Engine::Create({max_pending});
  QueueId q0 = eng->AddQueue("q0", 2);
  QueueId q1 = eng->AddQueue("q1", 1);
  VarHandle shared1 = eng->NewVar("shared1"), shared2 = eng->NewVar("shared2");
  VarHandle config = eng->NewVar("config");
  std::vector<VarHandle> own;
  for (int t = 0; t < kThreads; ++t) own.push_back(eng->NewVar(absl::StrCat("own", t)));
  int64_t shared1_value = 0, shared2_value = 0;
  const uint64_t config_value = 7;
  std::vector<uint64_t> own_value(kThreads, 1);
  std::atomic<int> shared_writers{0};
  std::atomic<bool> violation{false};

  std::vector<std::thread> frontends;
  for (int t = 0; t < kThreads; ++t) {
    frontends.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        std::vector<VarHandle> writes = {own[t]};
        const bool bump = i % 3 == 0;
        if (bump) {
          // Both orders, so registration order cannot come from the list.
          writes.push_back(i % 2 ? shared1 : shared2);
          writes.push_back(i % 2 ? shared2 : shared1);
        }
        eng->Push(
            [&, t, i, bump] {
              own_value[t] = own_value[t] * 31 + i + config_value;
              if (bump) {
                if (shared_writers.fetch_add(1) != 0) violation = true;
                shared1_value += 1;
                shared2_value += 2;
                shared_writers.fetch_sub(1);
              }
              return Ok();
            },
            {config, own[t]}, std::move(writes), i % 2 ? q0 : q1, absl::StrCat("t", t, "_", i));
      }
    });
  }
  for (std::thread& f : frontends) f.join();
  ASSERT_TRUE(eng->WaitAll().ok());
  for (int t = 0; t < kThreads; ++t) {
    uint64_t expect = 1;
    for (int i = 0; i < kOps; ++i) expect = expect * 31 + i + config_value;
    EXPECT_EQ(own_value[t], expect) << "thread " << t;
  }
  const int bumps = kThreads * ((kOps + 2) / 3);
  EXPECT_EQ(shared1_value, bumps);
  EXPECT_EQ(shared2_value, 2 * bumps);
  EXPECT_FALSE(violation);
  EngineStats stats = eng->stats();
  EXPECT_EQ(stats.ops_completed, kThreads * kOps);
  EXPECT_LE(stats.max_in_flight, max_pending);
}

TEST(EngineTest, ConcurrentFrontends) {
  Watchdog watchdog(std::chrono::seconds(60));
  for (int max_pending : {1024, 3}) {
    SCOPED_TRACE(absl::StrCat("max_pending=", max_pending));
    watchdog.Pet(absl::StrCat("ConcurrentFrontends max_pending=", max_pending));
    RunConcurrentFrontends(max_pending);
  }
}

// ---------------------------------------------------------------------------
// WaitToRead

TEST(EngineTest, WaitToReadReturnsOnlyAfterTheWrites) {
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 2);
  VarHandle u = eng->NewVar("u"), v = eng->NewVar("v");
  Gate gate;
  int u_value = 0, v_value = 0;
  eng->Push(
      [&] {
        EXPECT_TRUE(gate.Wait());
        u_value = 41;
        return Ok();
      },
      {}, {u}, q, "slow_u");
  // v's write depends on u's: WaitToRead(v) must wait for both.
  eng->Push(
      [&] {
        v_value = u_value + 1;
        return Ok();
      },
      {u}, {v}, q, "v_from_u");
  std::atomic<bool> returned{false};
  std::thread reader([&] {
    EXPECT_TRUE(eng->WaitToRead(v).ok());
    returned = true;
    EXPECT_EQ(v_value, 42);
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned) << "WaitToRead returned while v's write was blocked";
  gate.Open();
  reader.join();
  EXPECT_TRUE(returned);
  EXPECT_TRUE(eng->WaitAll().ok());
}

TEST(EngineTest, WaitToReadDoesNotWaitForReadersOrUnrelatedOps) {
  auto eng = Engine::Create({});
  QueueId q0 = eng->AddQueue("q0", 1), q1 = eng->AddQueue("q1", 1);
  VarHandle u = eng->NewVar("u"), v = eng->NewVar("v");
  Gate gate;
  int v_value = 0;
  eng->Push(
      [&] {
        v_value = 3;
        return Ok();
      },
      {}, {v}, q1, "write_v");
  // Blocked ops that only read v, or touch only u.
  eng->Push([&] { return gate.Wait() ? Ok() : absl::DeadlineExceededError("gate"); }, {v}, {}, q0,
            "blocked_reader");
  eng->Push([&] { return gate.Wait() ? Ok() : absl::DeadlineExceededError("gate"); }, {}, {u}, q1,
            "blocked_other");
  std::atomic<bool> returned{false};
  std::thread reader([&] {
    EXPECT_TRUE(eng->WaitToRead(v).ok());
    returned = true;
  });
  EXPECT_TRUE(Eventually([&] { return returned.load(); }))
      << "WaitToRead waited for a reader or an unrelated op";
  gate.Open();
  reader.join();
  EXPECT_EQ(v_value, 3);
  EXPECT_TRUE(eng->WaitAll().ok());
}

// ---------------------------------------------------------------------------
// Read/write semantics

TEST(EngineTest, ReadersOfOneVariableRunConcurrently) {
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 2);
  VarHandle v = eng->NewVar("v");
  Rendezvous both(2);
  std::atomic<int> met{0};
  for (int i = 0; i < 2; ++i) {
    eng->Push(
        [&] {
          if (both.Arrive()) ++met;
          return Ok();
        },
        {v}, {}, q, absl::StrCat("reader", i));
  }
  EXPECT_TRUE(eng->WaitAll().ok());
  EXPECT_EQ(met.load(), 2) << "two reads of the same variable did not overlap";
}

TEST(EngineTest, WritersAreExclusiveAndOrdered) {
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 4);
  VarHandle v = eng->NewVar("v");
  std::atomic<int> active{0};
  std::atomic<int> max_writers{0};
  std::atomic<bool> reader_overlapped_writer{false};
  std::vector<int> order;  // guarded by v
  for (int i = 0; i < 8; ++i) {
    eng->Push(
        [&, i] {
          int now = active.fetch_add(1) + 1;
          int seen = max_writers.load();
          while (now > seen && !max_writers.compare_exchange_weak(seen, now)) {
          }
          std::this_thread::sleep_for(milliseconds(3));
          order.push_back(i);
          active.fetch_sub(1);
          return Ok();
        },
        {}, {v, v}, q, absl::StrCat("writer", i));
    eng->Push(
        [&] {
          if (active.load() != 0) reader_overlapped_writer = true;
          std::this_thread::sleep_for(milliseconds(1));
          if (active.load() != 0) reader_overlapped_writer = true;
          return Ok();
        },
        {v}, {}, q, absl::StrCat("reader", i));
  }
  ASSERT_TRUE(eng->WaitAll().ok());
  EXPECT_EQ(max_writers.load(), 1);
  EXPECT_FALSE(reader_overlapped_writer);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(EngineTest, WriterWaitsForEarlierReaders) {
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 2);
  VarHandle v = eng->NewVar("v");
  Gate gate;
  std::atomic<bool> writer_ran{false};
  eng->Push([&] { return gate.Wait() ? Ok() : absl::DeadlineExceededError("gate"); }, {v}, {}, q,
            "reader");
  eng->Push(
      [&] {
        writer_ran = true;
        return Ok();
      },
      {v}, {v}, q, "writer");  // read+write counts as write
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(writer_ran) << "a write overtook an earlier read";
  gate.Open();
  EXPECT_TRUE(eng->WaitAll().ok());
  EXPECT_TRUE(writer_ran);
}

TEST(EngineTest, OpsWithoutVariablesRunAndDuplicatesAreHarmless) {
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 1);
  VarHandle v = eng->NewVar("v");
  int value = 0;
  std::atomic<int> free_ops{0};
  eng->Push(
      [&] {
        ++free_ops;
        return Ok();
      },
      {}, {}, q, "no_vars");
  eng->Push(
      [&] {
        value = 5;
        return Ok();
      },
      {v, v, v}, {v, v}, q, "dup");
  EXPECT_TRUE(eng->WaitToRead(v).ok());
  EXPECT_EQ(value, 5);
  EXPECT_TRUE(eng->WaitAll().ok());
  EXPECT_EQ(free_ops.load(), 1);
}

// ---------------------------------------------------------------------------
// Errors

TEST(EngineTest, ErrorsPropagateAndNameTheFailedOp) {
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 2);
  VarHandle a = eng->NewVar("a"), b = eng->NewVar("b"), c = eng->NewVar("c"), d = eng->NewVar("d");
  std::atomic<bool> b_ran{false}, d_ran{false}, overwrite_ran{false};
  int c_value = 0;
  eng->Push([] { return absl::InvalidArgumentError("bad shape"); }, {}, {a}, q, "forward");
  eng->Push(
      [&] {
        b_ran = true;
        return Ok();
      },
      {a}, {b}, q, "loss");
  eng->Push(
      [&] {
        c_value = 5;
        return Ok();
      },
      {}, {c}, q, "unrelated");
  eng->Push(
      [&] {
        d_ran = true;
        return Ok();
      },
      {b, c}, {d}, q, "backward");

  const absl::Status original = absl::InvalidArgumentError("op 'forward' failed: bad shape");
  EXPECT_EQ(eng->WaitToRead(d), original);
  EXPECT_EQ(eng->WaitToRead(b), original);
  EXPECT_EQ(eng->WaitToRead(a), original);
  EXPECT_TRUE(eng->WaitToRead(c).ok());
  EXPECT_EQ(c_value, 5);
  EXPECT_EQ(eng->WaitAll(), original);
  EXPECT_FALSE(b_ran);
  EXPECT_FALSE(d_ran);
  EXPECT_TRUE(eng->WaitAll().ok()) << "WaitAll reports an error once";

  // Poison is sticky, for reads and for writes.
  eng->Push(
      [&] {
        overwrite_ran = true;
        return Ok();
      },
      {}, {a}, q, "overwrite");
  EXPECT_EQ(eng->WaitAll(),
            absl::InvalidArgumentError("op 'overwrite' skipped: op 'forward' failed: bad shape"));
  EXPECT_FALSE(overwrite_ran);

  EngineStats stats = eng->stats();
  EXPECT_EQ(stats.ops_failed, 1);
  EXPECT_EQ(stats.ops_skipped, 3);
  EXPECT_EQ(stats.ops_completed, 5);
}

TEST(EngineTest, FirstErrorInPushOrderWins) {
  auto eng = Engine::Create({});
  QueueId q0 = eng->AddQueue("q0", 1), q1 = eng->AddQueue("q1", 1);
  VarHandle a = eng->NewVar("a"), b = eng->NewVar("b");
  Gate gate;
  // "early" fails last in time, "late" fails first; WaitAll names "early".
  eng->Push(
      [&] {
        gate.Wait();
        return absl::AbortedError("early");
      },
      {}, {a}, q0, "early");
  eng->Push([&] { return absl::UnavailableError("late"); }, {}, {b}, q1, "late");
  EXPECT_EQ(eng->WaitToRead(b), absl::UnavailableError("op 'late' failed: late"));
  gate.Open();
  EXPECT_EQ(eng->WaitAll(), absl::AbortedError("op 'early' failed: early"));
  EXPECT_TRUE(eng->WaitAll().ok());
}

TEST(EngineTest, ExceptionsBecomeInternalErrors) {
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 1);
  VarHandle v = eng->NewVar("v");
  eng->Push([]() -> absl::Status { throw std::runtime_error("out of range"); }, {}, {v}, q,
            "thrower");
  absl::Status s = eng->WaitToRead(v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "op 'thrower' failed: exception: out of range");
  EXPECT_FALSE(eng->WaitAll().ok());
}

// ---------------------------------------------------------------------------
// The bound

TEST(EngineTest, PushBlocksAtMaxPending) {
  auto eng = Engine::Create({/*max_pending=*/4});
  QueueId q = eng->AddQueue("q", 1);
  VarHandle v = eng->NewVar("v");
  Gate gate;
  for (int i = 0; i < 4; ++i) {
    // Independent ops (no variables): only the bound can hold up the fifth.
    eng->Push([&] { return gate.Wait() ? Ok() : absl::DeadlineExceededError("gate"); }, {}, {}, q,
              absl::StrCat("blocked", i));
  }
  EXPECT_EQ(eng->stats().pushes_blocked, 0);
  std::atomic<bool> returned{false};
  std::thread frontend([&] {
    eng->Push(Ok, {}, {v}, q, "fifth");
    returned = true;
  });
  // Either the push blocks (correct) or it returns (wrong); wait for one.
  ASSERT_TRUE(Eventually([&] { return returned || eng->stats().frontends_blocked == 1; }));
  EXPECT_FALSE(returned) << "Push returned with 4 ops pending and max_pending=4";
  gate.Open();
  frontend.join();
  EXPECT_TRUE(returned);
  EXPECT_TRUE(eng->WaitAll().ok());
  EngineStats stats = eng->stats();
  EXPECT_EQ(stats.pushes_blocked, 1);
  EXPECT_EQ(stats.frontends_blocked, 0);
  EXPECT_GT(stats.push_blocked_time, absl::ZeroDuration());
  EXPECT_LE(stats.max_in_flight, 4);
}

TEST(EngineTest, PushFromInsideAnOpIgnoresTheBound) {
  auto eng = Engine::Create({/*max_pending=*/1});
  QueueId q = eng->AddQueue("q", 1);
  VarHandle v = eng->NewVar("v");
  int value = 0;
  absl::Status inner_wait;
  eng->Push(
      [&] {
        // The outer op is pending, so a bounded push would wait for itself.
        eng->Push(
            [&] {
              value = 9;
              return Ok();
            },
            {}, {v}, q, "inner");
        inner_wait = eng->WaitAll();
        return Ok();
      },
      {}, {}, q, "outer");
  EXPECT_TRUE(eng->WaitAll().ok());
  EXPECT_TRUE(eng->WaitToRead(v).ok());
  EXPECT_EQ(value, 9);
  EXPECT_EQ(inner_wait.code(), absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------
// Lifetime

TEST(EngineTest, DestructionWaitsForPendingWork) {
  std::atomic<int> done{0};
  std::atomic<bool> gated_ran{false};
  Gate gate;
  std::thread opener;
  {
    auto eng = Engine::Create({});
    QueueId q0 = eng->AddQueue("q0", 2), q1 = eng->AddQueue("q1", 1);
    VarHandle v = eng->NewVar("v");
    std::vector<VarHandle> vars;
    for (int i = 0; i < 4; ++i) vars.push_back(eng->NewVar());
    eng->Push(
        [&] {
          if (!gate.Wait()) return absl::DeadlineExceededError("gate");
          gated_ran = true;
          return Ok();
        },
        {}, {v}, q1, "gated");
    for (int i = 0; i < 300; ++i) {
      eng->Push(
          [&, i] {
            if (i % 7 == 0) std::this_thread::sleep_for(microseconds(100));
            ++done;
            return Ok();
          },
          {vars[i % 4]}, {vars[(i + 1) % 4]}, i % 2 ? q0 : q1, "work");
    }
    opener = std::thread([&] {
      std::this_thread::sleep_for(milliseconds(20));
      gate.Open();
    });
  }  // ~Engine
  EXPECT_EQ(done.load(), 300);
  EXPECT_TRUE(gated_ran);
  opener.join();
}

TEST(EngineTest, DeleteVarLetsPendingOpsFinish) {
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 1);
  Gate gate;
  std::atomic<bool> ran{false};
  {
    VarHandle tmp = eng->NewVar("tmp");
    eng->Push(
        [&] {
          if (!gate.Wait()) return absl::DeadlineExceededError("gate");
          ran = true;
          return Ok();
        },
        {}, {tmp}, q, "uses_tmp");
    eng->DeleteVar(tmp);
  }  // last user handle gone while the op is pending
  gate.Open();
  EXPECT_TRUE(eng->WaitAll().ok());
  EXPECT_TRUE(ran);
}

TEST(EngineTest, MisuseIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto eng = Engine::Create({});
  QueueId q = eng->AddQueue("q", 1);
  VarHandle v = eng->NewVar("gone");
  eng->DeleteVar(v);
  EXPECT_DEATH(eng->Push(Ok, {v}, {}, q, "late_user"),
               "op 'late_user' uses deleted variable 'gone'");
  EXPECT_DEATH(eng->Push(Ok, {}, {VarHandle()}, q, "null_user"), "null VarHandle");
  EXPECT_DEATH(eng->Push(Ok, {}, {}, QueueId{}, "nowhere"), "unknown queue");
}

// ---------------------------------------------------------------------------
// The WorkQueue extension point: an asynchronous "device" queue that, like a
// CUDA stream, returns from the op's function after launching work and
// completes the op later, from another thread.

thread_local std::vector<std::function<void()>>* tls_launch = nullptr;

// What a pushed function calls to put work on the current fake stream.
void Launch(std::function<void()> work) { tls_launch->push_back(std::move(work)); }

class FakeStreamQueue final : public WorkQueue {
 public:
  explicit FakeStreamQueue(std::atomic<int>* device_failures) : failures_(device_failures) {
    dispatcher_ = std::thread([this] { Dispatch(); });
    device_ = std::thread([this] { Device(); });
  }
  ~FakeStreamQueue() override { Shutdown(); }

  void Enqueue(ReadyOp op) override {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(op));
    cv_.notify_all();
  }
  void Shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (dispatcher_.joinable()) dispatcher_.join();
    if (device_.joinable()) device_.join();
  }

 private:
  struct Launched {
    ReadyOp op;
    std::vector<std::function<void()>> work;
  };

  void Dispatch() {
    while (true) {
      ReadyOp op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !incoming_.empty(); });
        if (incoming_.empty()) break;
        op = std::move(incoming_.front());
        incoming_.pop_front();
      }
      std::vector<std::function<void()>> work;
      tls_launch = &work;
      absl::Status status = op.Run();  // only launches
      tls_launch = nullptr;
      if (!status.ok()) {
        op.Finish(status);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      launched_.push_back(Launched{std::move(op), std::move(work)});
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu_);
    dispatcher_done_ = true;
    cv_.notify_all();
  }

  void Device() {
    while (true) {
      Launched item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return dispatcher_done_ || !launched_.empty(); });
        if (launched_.empty()) return;
        item = std::move(launched_.front());
        launched_.pop_front();
      }
      std::this_thread::sleep_for(milliseconds(2));  // the "kernel" runs late
      for (auto& w : item.work) w();
      // The "event" fired; a device error would surface here.
      const bool fail = item.op.name() == "device_fault";
      if (fail) ++*failures_;
      item.op.Finish(fail ? absl::DataLossError("ECC error") : absl::OkStatus());
    }
  }

  std::atomic<int>* failures_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ReadyOp> incoming_;
  std::deque<Launched> launched_;
  bool stopping_ = false;
  bool dispatcher_done_ = false;
  std::thread dispatcher_;
  std::thread device_;
};

TEST(EngineTest, AsynchronousQueueCompletesWhenItsWorkIsDone) {
  std::atomic<int> device_failures{0};
  auto eng = Engine::Create({});
  QueueId gpu = eng->AddQueue(std::make_unique<FakeStreamQueue>(&device_failures));
  QueueId cpu = eng->AddQueue("cpu", 1);
  VarHandle x = eng->NewVar("x"), y = eng->NewVar("y"), z = eng->NewVar("z");
  int x_value = 2, y_value = 0, z_value = 0;
  bool z_ran = false;
  for (int i = 0; i < 20; ++i) {
    eng->Push(
        [&] {
          Launch([&] { y_value = y_value * 3 + x_value; });
          return Ok();
        },
        {x}, {y}, gpu, "kernel");
  }
  // The host-side reader must see the finished kernels, not the launch.
  eng->Push(
      [&] {
        z_value = y_value;
        return Ok();
      },
      {y}, {z}, cpu, "copy_to_host");
  EXPECT_TRUE(eng->WaitToRead(z).ok());
  int expect = 0;
  for (int i = 0; i < 20; ++i) expect = expect * 3 + 2;
  EXPECT_EQ(z_value, expect);

  // A failure reported at completion poisons the op's outputs.
  eng->Push(
      [&] {
        Launch([] {});
        return Ok();
      },
      {}, {y}, gpu, "device_fault");
  eng->Push(
      [&] {
        z_ran = true;
        return Ok();
      },
      {y}, {z}, cpu, "after_fault");
  EXPECT_EQ(eng->WaitToRead(z), absl::DataLossError("op 'device_fault' failed: ECC error"));
  EXPECT_FALSE(z_ran);
  EXPECT_EQ(device_failures.load(), 1);
  EXPECT_FALSE(eng->WaitAll().ok());
}

}  // namespace
}  // namespace engine
}  // namespace dtrain
