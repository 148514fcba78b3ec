// round_floor: what this machine allows for kvstore_bench's small rounds.
//
//   bazel run //tests/bench/kvstore:round_floor -- --workers=2 --replicas=1,2
//       [--spin_us=0,20,50,200] [--cohost] [--head=poll,threads,threads_per_push,completer]
//
// Runs the processes and messages of a kvstore_bench round with no work in
// them: --workers worker threads in this process; per shard a head process
// and, with 2 replicas, a tail process; Unix stream sockets between them. A
// worker sends its share of --bytes to every shard and waits for every
// shard's answer. A head (by default one thread, all its workers' sockets in
// one poll) answers once each worker has pushed and, with 2 replicas, the tail has
// acknowledged the round's one batch. No TLS, no parsing, no store, one
// batch per round: the cheapest way to run the round, so what kvstore_bench
// measures above it is the kvstore's own cost.
//
// Waits spin the way the kvstore's do (kvstore_server --replica_spin_us):
// the head waiting for the tail's acknowledgement and the tail waiting for
// its next batch poll for --spin_us, yielding the CPU between polls, before
// they sleep; the head waits for requests without polling, as the data
// port's connections from clients do. A list of spins runs each.
//
// --head picks how a head is built:
//   poll     one thread polls all its workers' sockets and answers them all
//            (the cheapest; the default);
//   threads  the kvstore's data port: a thread per worker connection; the
//            thread of the push that completes the round wakes the others
//            (a condition variable), and each answers its own worker;
//   threads_per_push  as threads, and with 2 replicas every push goes down
//            the chain as its own batch when it arrives (one in flight at a
//            time), as the kvstore's Replicator did, instead of one batch
//            per round;
//   completer  a thread per worker connection, and the thread of the push
//            that completes the round answers every worker; the others go
//            back to reading their sockets at once (no thread is woken to
//            answer: what the kvstore's data port does).
// A list runs each; the lines then say head=<mode>.
//
// --cohost (2 replicas): two server processes instead of one per replica,
// each running a shard's head and the other shard's tail as threads (as a
// deployment that puts R replicas of n shards on n servers would).
//
// kvstore_bench's keys=1 round uses one shard and its keys=8 round (with 2
// servers) both shards, so for each replica count and spin this prints
//
//   round_floor workers=<w> shards=<1|2> replicas=<r> head=<h> bytes=<b> spin_us=<s>
//       cohost=<0|1> p50_us=<x> p99_us=<y>
//   round_floor_ratio replicas=<r> head=<h> spin_us=<s> shards2_over_shards1_p50=<x>
//
// the ratio being the floor of compare.sh's keys8_over_keys1_p50, and with
// several spins the lowest p50 of each shape over them:
//
//   round_floor_best replicas=<r> head=<h> shards1_p50_us=<x> shards2_p50_us=<y>
//
// Each figure is the median of --repeats runs (the shapes alternate, so a
// slow spell of the machine does not land on one of them).
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

ABSL_FLAG(int, workers, 2, "worker threads");
ABSL_FLAG(std::string, replicas, "1,2", "replica counts to run (1 or 2 each)");
ABSL_FLAG(int, bytes, 4096,
          "bytes each worker pushes (and pulls) per round, split over the shards");
ABSL_FLAG(int, rounds, 20000, "rounds per run (the first tenth untimed)");
ABSL_FLAG(std::string, spin_us, "50",
          "how long a head or tail polls before it sleeps (as --replica_spin_us), in us; a "
          "comma-separated list runs each");
ABSL_FLAG(bool, cohost, false, "2 replicas: a process hosts one shard's head and the other's tail");
ABSL_FLAG(int, repeats, 3, "runs of each shape; the figures are their medians");
ABSL_FLAG(
    std::string, head, "poll",
    "how a head serves its workers: poll, threads, threads_per_push or completer (see the top of "
    "round_floor.cc); a comma-separated list runs each");

namespace {

// Reads or writes all n bytes; a dead peer ends this process (a child's
// peer is gone when the measurement is over).
void Full(int fd, char* p, size_t n, bool read_it) {
  while (n > 0) {
    const ssize_t got = read_it ? read(fd, p, n) : write(fd, p, n);
    if (got <= 0) _exit(0);
    p += got;
    n -= static_cast<size_t>(got);
  }
}

// Until one of `fds` is readable (polling for `spin` first); its index.
size_t WaitReadable(std::vector<pollfd>& fds, absl::Duration spin) {
  const absl::Time end = absl::Now() + spin;
  for (;;) {
    for (pollfd& p : fds) p.revents = 0;
    const bool polling = spin > absl::ZeroDuration() && absl::Now() < end;
    if (poll(fds.data(), fds.size(), polling ? 0 : -1) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0) return i;
      }
    }
    if (polling) sched_yield();
  }
}

struct Figures {
  double p50 = 0, p99 = 0;
};

enum class Head { kPoll, kThreads, kThreadsPerPush, kCompleter, kTailAnswers, kTailPulls };

const char* HeadName(Head head) {
  switch (head) {
    case Head::kPoll:
      return "poll";
    case Head::kThreads:
      return "threads";
    case Head::kThreadsPerPush:
      return "threads_per_push";
    case Head::kCompleter:
      return "completer";
    case Head::kTailAnswers:
      return "tail_answers";
    case Head::kTailPulls:
      return "tail_pulls";
  }
  return "?";
}

// Sends `n` bytes down the chain and waits for the tail's one-byte answer.
void ChainRoundTrip(int chain_fd, const char* p, size_t n, absl::Duration spin) {
  Full(chain_fd, const_cast<char*>(p), n, false);
  std::vector<pollfd> ack_fd{{chain_fd, POLLIN, 0}};
  WaitReadable(ack_fd, spin);
  char ack;
  Full(chain_fd, &ack, 1, true);
}

// A head as the kvstore's data port builds one: a thread per worker
// connection (see --head).
void ThreadedHead(const std::vector<int>& head_fds, int chain_fd, int share, bool batch_per_push,
                  bool completer_answers, bool ack_only, absl::Duration spin) {
  const int workers = static_cast<int>(head_fds.size());
  std::vector<char> values(static_cast<size_t>(share) * workers);
  std::mutex mu;
  std::condition_variable round_done;
  int arrived = 0;
  uint64_t completed = 0;  // rounds answered
  std::mutex chain_mu;     // one batch in flight
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      char* mine = values.data() + static_cast<size_t>(share) * w;
      for (uint64_t round = 1;; ++round) {
        Full(head_fds[w], mine, share, true);
        if (batch_per_push && chain_fd >= 0) {
          std::lock_guard<std::mutex> lock(chain_mu);
          ChainRoundTrip(chain_fd, mine, share, spin);
        }
        bool last;
        {
          std::lock_guard<std::mutex> lock(mu);
          last = ++arrived == workers;
          if (last) arrived = 0;
        }
        if (last) {
          if (!batch_per_push && chain_fd >= 0) {
            ChainRoundTrip(chain_fd, values.data(), values.size(), spin);
          }
          if (ack_only) continue;  // the tail answered the pulls
          if (completer_answers) {
            for (int other = 0; other < workers; ++other) {
              if (other != w) {
                Full(head_fds[other], values.data() + static_cast<size_t>(share) * other, share,
                     false);
              }
            }
            Full(head_fds[w], mine, share, false);
            continue;
          }
          {
            std::lock_guard<std::mutex> lock(mu);
            completed = round;
          }
          round_done.notify_all();
        } else if (completer_answers) {
          continue;  // the round's last push answers this worker
        } else {
          std::unique_lock<std::mutex> lock(mu);
          round_done.wait(lock, [&] { return completed >= round; });
        }
        Full(head_fds[w], mine, share, false);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

Figures RunOnce(int workers, int shards, int replicas, int bytes, int rounds, absl::Duration spin,
                bool cohost, Head head) {
  const int share = std::max(1, bytes / shards);
  std::vector<std::vector<int>> worker_fds(workers, std::vector<int>(shards));
  // kTailAnswers with 2 replicas: each worker's connection to each shard's tail.
  const bool tail_pulls = head == Head::kTailPulls && replicas == 2;
  const bool tail_answers = (head == Head::kTailAnswers || tail_pulls) && replicas == 2;
  std::vector<std::vector<int>> worker_tail_fds(workers, std::vector<int>(shards, -1));
  std::vector<pid_t> children;
  // roles[p]: the loops process p runs (one thread each).
  int processes = cohost && replicas == 2 ? std::max(2, shards) : shards * replicas;
  std::vector<std::vector<std::function<void()>>> roles(processes);
  std::vector<std::vector<int>> to_close(processes);
  std::vector<int> all_server_fds;
  for (int s = 0; s < shards; ++s) {
    std::vector<int> head_fds(workers);
    for (int w = 0; w < workers; ++w) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) _exit(1);
      worker_fds[w][s] = sv[0];
      head_fds[w] = sv[1];
      all_server_fds.push_back(sv[1]);
    }
    std::vector<int> tail_fds;
    if (tail_answers) {
      for (int w = 0; w < workers; ++w) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) _exit(1);
        worker_tail_fds[w][s] = sv[0];
        tail_fds.push_back(sv[1]);
        all_server_fds.push_back(sv[1]);
      }
    }
    int chain[2] = {-1, -1};
    if (replicas == 2 && socketpair(AF_UNIX, SOCK_STREAM, 0, chain) != 0) _exit(1);
    if (replicas == 2) {
      all_server_fds.push_back(chain[0]);
      all_server_fds.push_back(chain[1]);
    }
    const int head_process = cohost ? s : s * replicas;
    const int tail_process = cohost ? (s + 1) % processes : s * replicas + 1;
    if (tail_pulls) {
      // The tail: a thread per worker connection reads its pull request
      // and parks it; the chain's thread answers parked pulls (or a pull
      // that comes after its round's batch answers itself).
      const size_t batch_bytes = static_cast<size_t>(share) * workers;
      roles[tail_process].push_back([=] {
        std::mutex mu;
        std::vector<char> batch(batch_bytes);
        uint64_t applied = 0;                      // rounds whose batch arrived
        std::vector<uint64_t> parked(workers, 0);  // round a worker's pull waits for
        std::vector<std::thread> threads;
        for (int w = 0; w < workers; ++w) {
          threads.emplace_back([&, w] {
            for (uint64_t round = 1;; ++round) {
              char request[16];
              Full(tail_fds[w], request, sizeof request, true);
              std::lock_guard<std::mutex> lock(mu);
              if (applied >= round) {
                Full(tail_fds[w], batch.data() + static_cast<size_t>(share) * w, share, false);
              } else {
                parked[w] = round;
              }
            }
          });
        }
        std::vector<pollfd> fds{{chain[1], POLLIN, 0}};
        for (;;) {
          WaitReadable(fds, spin);
          std::lock_guard<std::mutex> lock(mu);
          Full(chain[1], batch.data(), batch.size(), true);
          ++applied;
          for (int w = 0; w < workers; ++w) {
            if (parked[w] == applied) {
              Full(tail_fds[w], batch.data() + static_cast<size_t>(share) * w, share, false);
              parked[w] = 0;
            }
          }
          char ack = 1;
          Full(chain[1], &ack, 1, false);
        }
      });
    } else if (replicas == 2) {
      const size_t batch_bytes =
          static_cast<size_t>(share) * (head == Head::kThreadsPerPush ? 1 : workers);
      roles[tail_process].push_back([=] {
        std::vector<char> batch(batch_bytes);
        std::vector<pollfd> fds{{chain[1], POLLIN, 0}};
        for (;;) {
          WaitReadable(fds, spin);
          Full(chain[1], batch.data(), batch.size(), true);
          for (size_t w = 0; w < tail_fds.size(); ++w) {
            Full(tail_fds[w], batch.data() + static_cast<size_t>(share) * w, share, false);
          }
          char ack = 1;
          Full(chain[1], &ack, 1, false);
        }
      });
    }
    if (head != Head::kPoll) {
      const int chain_fd = replicas == 2 ? chain[0] : -1;
      roles[head_process].push_back([=] {
        ThreadedHead(
            head_fds, chain_fd, share, head == Head::kThreadsPerPush,
            head == Head::kCompleter || head == Head::kTailAnswers || head == Head::kTailPulls,
            (head == Head::kTailAnswers || head == Head::kTailPulls) && chain_fd >= 0, spin);
      });
      continue;
    }
    roles[head_process].push_back([=] {
      std::vector<char> values(static_cast<size_t>(share) * workers);
      std::vector<pollfd> from_workers;
      for (int fd : head_fds) from_workers.push_back({fd, POLLIN, 0});
      for (;;) {
        for (int pushed = 0; pushed < workers; ++pushed) {
          const size_t w = WaitReadable(from_workers, absl::ZeroDuration());
          Full(head_fds[w], values.data() + share * w, share, true);
          from_workers[w].events = 0;  // its next push is the next round's
        }
        for (pollfd& p : from_workers) p.events = POLLIN;
        if (replicas == 2) ChainRoundTrip(chain[0], values.data(), values.size(), spin);
        for (int fd : head_fds) Full(fd, values.data(), share, false);
      }
    });
  }
  for (auto& process : roles) {
    if (process.empty()) continue;
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<std::thread> loops;
      for (auto& role : process) loops.emplace_back(role);
      for (std::thread& t : loops) t.join();
      _exit(0);
    }
    children.push_back(pid);
  }
  for (int fd : all_server_fds) close(fd);
  std::vector<std::vector<double>> took(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<char> buffer(share);
      for (int r = 0; r < rounds; ++r) {
        const absl::Time start = absl::Now();
        if (tail_pulls) {
          char request[16] = {};
          for (int s = 0; s < shards; ++s) {
            Full(worker_tail_fds[w][s], request, sizeof request, false);
          }
        }
        for (int s = 0; s < shards; ++s) Full(worker_fds[w][s], buffer.data(), share, false);
        if (tail_answers) {
          for (int s = 0; s < shards; ++s) {
            Full(worker_tail_fds[w][s], buffer.data(), share, true);
          }
        } else {
          for (int s = 0; s < shards; ++s) Full(worker_fds[w][s], buffer.data(), share, true);
        }
        if (r >= rounds / 10) took[w].push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (pid_t child : children) kill(child, SIGKILL);
  for (pid_t child : children) waitpid(child, nullptr, 0);
  for (auto* all_fds : {&worker_fds, &worker_tail_fds}) {
    for (auto& fds : *all_fds) {
      for (int fd : fds) {
        if (fd >= 0) close(fd);
      }
    }
  }
  std::vector<double> all;
  for (const auto& t : took) all.insert(all.end(), t.begin(), t.end());
  std::sort(all.begin(), all.end());
  return {all[all.size() / 2], all[all.size() * 99 / 100]};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A comma-separated list of non-negative integers into `out`; false if not.
bool ParseList(absl::string_view text, std::vector<int>* out) {
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(item, &n) || n < 0) return false;
    out->push_back(n);
  }
  return !out->empty();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int workers = absl::GetFlag(FLAGS_workers);
  const int bytes = absl::GetFlag(FLAGS_bytes);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const bool cohost = absl::GetFlag(FLAGS_cohost);
  if (workers < 1 || bytes < 2 || rounds < 10 || repeats < 1) {
    fprintf(stderr,
            "round_floor: needs --workers >= 1, --bytes >= 2, --rounds >= 10 and --repeats >= 1\n");
    return 2;
  }
  std::vector<int> spins;
  if (!ParseList(absl::GetFlag(FLAGS_spin_us), &spins)) {
    fprintf(stderr, "round_floor: --spin_us takes microseconds >= 0, comma-separated; got '%s'\n",
            absl::GetFlag(FLAGS_spin_us).c_str());
    return 2;
  }
  std::vector<int> replica_counts;
  if (!ParseList(absl::GetFlag(FLAGS_replicas), &replica_counts) ||
      std::any_of(replica_counts.begin(), replica_counts.end(),
                  [](int n) { return n != 1 && n != 2; })) {
    fprintf(stderr, "round_floor: --replicas takes 1 and 2 (comma-separated), got '%s'\n",
            absl::GetFlag(FLAGS_replicas).c_str());
    return 2;
  }
  std::vector<Head> heads;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_head), ',')) {
    if (name == "poll") {
      heads.push_back(Head::kPoll);
    } else if (name == "threads") {
      heads.push_back(Head::kThreads);
    } else if (name == "threads_per_push") {
      heads.push_back(Head::kThreadsPerPush);
    } else if (name == "completer") {
      heads.push_back(Head::kCompleter);
    } else if (name == "tail_answers") {
      heads.push_back(Head::kTailAnswers);
    } else if (name == "tail_pulls") {
      heads.push_back(Head::kTailPulls);
    } else {
      fprintf(stderr,
              "round_floor: --head takes poll, threads, threads_per_push and completer "
              "(comma-separated), "
              "got '%s'\n",
              absl::GetFlag(FLAGS_head).c_str());
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  for (int replicas : replica_counts) {
    for (Head head : heads) {
      double best[2] = {1e30, 1e30};  // per shape, over the spins
      for (int spin_us : spins) {
        std::vector<double> p50[2], p99[2];
        for (int i = 0; i < repeats; ++i) {
          for (int shards = 1; shards <= 2; ++shards) {
            const Figures f = RunOnce(workers, shards, replicas, bytes, rounds,
                                      absl::Microseconds(spin_us), cohost, head);
            p50[shards - 1].push_back(f.p50);
            p99[shards - 1].push_back(f.p99);
          }
        }
        for (int shards = 1; shards <= 2; ++shards) {
          const double m = Median(p50[shards - 1]);
          best[shards - 1] = std::min(best[shards - 1], m);
          printf(
              "round_floor workers=%d shards=%d replicas=%d head=%s bytes=%d spin_us=%d cohost=%d "
              "p50_us=%.0f p99_us=%.0f\n",
              workers, shards, replicas, HeadName(head), bytes, spin_us, cohost ? 1 : 0, m,
              Median(p99[shards - 1]));
        }
        printf("round_floor_ratio replicas=%d head=%s spin_us=%d shards2_over_shards1_p50=%.2f\n",
               replicas, HeadName(head), spin_us, Median(p50[1]) / Median(p50[0]));
        fflush(stdout);
      }
      if (spins.size() > 1) {
        printf("round_floor_best replicas=%d head=%s shards1_p50_us=%.0f shards2_p50_us=%.0f\n",
               replicas, HeadName(head), best[0], best[1]);
        fflush(stdout);
      }
    }
  }
  return 0;
}
