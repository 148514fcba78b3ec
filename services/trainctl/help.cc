#include "services/trainctl/help.h"

#include <algorithm>
#include <cstring>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace trainctl {
namespace {

struct Command {
  const char* name;
  const char* synopsis;     // after "trainctl "
  const char* description;  // what it does, a few lines
  std::vector<const char*> flags;
  const char* example;
};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"submit",
       "submit [-f job.yaml] [--FLAG=VALUE ...] [--wait]",
       "Queues a training job. The job is a JobSpec: from a job file (-f, YAML or JSON,\n"
       "with the JobSpec's field names or these flags' names) and the flags below, which\n"
       "override the file's fields. With --wait, shows a progress bar until the job ends\n"
       "(exit 0 only if it SUCCEEDED). --model_file trains your own model, an ONNX file\n"
       "(docs/models.md): checked here, uploaded to the scheduler, named by its digest.",
       {"f",
        "wait",
        "name",
        "model",
        "model_file",
        "data_dir",
        "epochs",
        "batch_size",
        "lr",
        "momentum",
        "weight_decay",
        "num_trainers",
        "min_trainers",
        "max_trainers",
        "devices_per_trainer",
        "device_kind",
        "sync",
        "consistency",
        "max_staleness",
        "gradient_compression",
        "hybridize",
        "sync_batch_norm",
        "collective_tls",
        "seed",
        "checkpoint_interval_epochs",
        "keep_epoch_checkpoints",
        "priority",
        "queue",
        "train_limit",
        "test_limit",
        "init",
        "threads",
        "bucket_bytes",
        "watch_timeout_s"},
       "trainctl submit --name=lenet1 --model=lenet --epochs=5 --batch_size=256 --lr=0.2 \\\n"
       "      --num_trainers=2 --sync=KVSTORE --wait\n"
       "  trainctl submit -f job.yaml --epochs=10\n"
       "  trainctl submit --name=mine --model_file=net.onnx --epochs=5 --batch_size=256 --lr=0.1"},
      {"export",
       "export JOB --out=trained.onnx [--epoch=E]",
       "Writes a job's trained weights as an ONNX file: its model file's graph with the\n"
       "weights of the job's newest checkpoint (a built-in model: its ONNX export). The\n"
       "checkpoint directory must be readable here (the trainers' shared one).",
       {"out", "epoch"},
       "trainctl export job-000001 --out=trained.onnx"},
      {"get",
       "get JOB",
       "A job's status: state, progress, placement, events, why it waits (with queues:\n"
       "its queue, its position there and the quota that holds it), and its loss curve\n"
       "(rank 0's loss of each step: the first 100 steps and the newest 100).",
       {},
       "trainctl get job-000001 -o json"},
      {"list",
       "list [--state=STATE]",
       "Every job (all pages), one line each (with queues: the queue, a waiting job's\n"
       "position and the quota that holds it).",
       {"state"},
       "trainctl list --state=RUNNING"},
      {"cancel",
       "cancel JOB [--reason=TEXT]",
       "Cancels a job; the reason is recorded in its events.",
       {"reason"},
       "trainctl cancel job-000001 --reason='wrong lr'"},
      {"watch",
       "watch JOB",
       "Follows a job until it ends (a progress bar on a terminal, a line per epoch in a\n"
       "log); reconnects when the scheduler restarts. Exit 0 only if it SUCCEEDED.",
       {"watch_timeout_s"},
       "trainctl watch job-000001"},
      {"timeline",
       "timeline JOB [--out=trace.json]",
       "Every rank's spans (steps, forward, backward, each bucket's reduction,\n"
       "checkpoints) as one Chrome trace: open it in ui.perfetto.dev or chrome://tracing.",
       {"out"},
       "trainctl timeline job-000001 --out=trace.json"},
      {"trainers",
       "trainers",
       "Trainers with their state (IDLE, BUSY, DRAINING, LOST) and jobs.",
       {},
       "trainctl trainers -o json"},
      {"kvstore",
       "kvstore",
       "The kvstore shard map: each shard's chain of replicas (head, middle, tail;\n"
       "joining ones catching up) and the map's version.",
       {},
       "trainctl kvstore"},
      {"queues",
       "queues | queues apply -f FILE",
       "The queues (docs/queues.md): per queue and resource its quota, what its running\n"
       "jobs use, what it borrows from and lends to its cohort, what it could start now,\n"
       "its pending and admitted jobs and the preemptions that took from it (by reason:\n"
       "within_queue, reclaim_within_cohort, shrink); for admins, -o json also has each\n"
       "user's device-seconds per queue since the scheduler started. `apply`\n"
       "(admins) replaces the queues file at run time; kept in the scheduler's job log\n"
       "across restarts. Refused, changing nothing: a malformed file (the line and the\n"
       "problem) or one that would strand running jobs (the queue, resource and numbers).",
       {"f"},
       "trainctl queues -o json\n"
       "  trainctl queues apply -f queues.yaml"},
      {"drain",
       "drain TRAINER",
       "No new work on the trainer (id or name); its job drains (a checkpoint at a\n"
       "step) and resumes on other trainers without counting a failed attempt.",
       {},
       "trainctl drain trainer-0"},
      {"cluster",
       "cluster up|status|down --dir=DIR [...]",
       "A local cluster on this machine: `up` starts the scheduler, kvstore shards and\n"
       "trainers (loopback ports, data and logs under DIR, mutual TLS unless --insecure)\n"
       "under a supervisor that restarts what exits, and prints the endpoints and the\n"
       "environment to use them; `status` shows each process (alive, answering, restarts,\n"
       "last exit); `down` stops them (SIGTERM, then SIGKILL after --grace_s).",
       {"dir", "trainers", "devices_per_trainer", "kvstore_shards", "kvstore_replicas",
        "kvstore_data_path", "data_roots", "restart", "heartbeat_timeout_s", "max_attempts",
        "max_model_bytes", "recover_in_place", "queues", "start_timeout_s", "grace_s",
        "scheduler_bin", "trainer_bin", "kvstore_bin"},
       "trainctl cluster up --dir=/tmp/c --trainers=2 --kvstore_shards=2\n"
       "  eval \"$(trainctl cluster up --dir=/tmp/c | grep ^export)\"\n"
       "  trainctl cluster down --dir=/tmp/c"},
      {"doctor",
       "doctor [--peer=HOST:PORT] [--quick] | doctor serve --listen=HOST:PORT",
       "This machine's memory latency, memcpy and loopback figures (and a link to a\n"
       "peer's `trainctl doctor serve`), next to the chapter's table of latency numbers.",
       {"peer", "listen", "link_bytes", "pings", "quick", "link_only"},
       "trainctl doctor --quick -o json"},
      {"certs",
       "certs init --dir=D [--san=NAMES] | certs issue --dir=D --name=N --role=ROLE",
       "`init`: a CA, the scheduler, kvstore and admin certificates and the cluster\n"
       "secret in D. `issue`: D/N.pem and D/N.key signed by D's CA, for a user, admin,\n"
       "trainer, kvstore or scheduler.",
       {"dir", "name", "role", "san", "valid_days"},
       "trainctl certs issue --dir=/etc/dtrain/certs --name=alice --role=user"},
  };
  return *commands;
}

constexpr const char* kCommonFlags[] = {"scheduler", "o",   "timeout_s", "ca",
                                        "cert",      "key", "insecure"};

std::string FlagLine(const char* name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return "";  // not linked into this binary
  const std::string dash = std::strlen(name) == 1 ? "-" : "--";
  std::string line = absl::StrCat("  ", dash, name);
  const std::string def = flag->DefaultValue();
  if (!def.empty() && def != "0" && def != "false") absl::StrAppend(&line, "=", def);
  if (line.size() < 28) {
    line.resize(28, ' ');
  } else {
    absl::StrAppend(&line, "\n", std::string(28, ' '));
  }
  // Drop the "submit: " style prefix the flag's help carries for --helpfull.
  std::string help = flag->Help();
  if (size_t colon = help.find(": "); colon != std::string::npos && colon < 24 &&
                                      help.substr(0, colon).find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyz ,") == std::string::npos) {
    help = help.substr(colon + 2);
  }
  return absl::StrCat(line, help, "\n");
}

}  // namespace

std::string OverviewHelp() {
  std::string out = "trainctl: the dtrain scheduler's client.\n\nCommands:\n";
  for (const Command& c : Commands()) {
    std::string first_line = c.description;
    first_line = first_line.substr(0, first_line.find('\n'));
    std::string name = absl::StrCat("  ", c.name);
    name.resize(12, ' ');
    absl::StrAppend(&out, name, first_line, "\n");
  }
  absl::StrAppend(&out,
                  "\n`trainctl COMMAND --help` shows a command's flags and an example.\n"
                  "\nFlags of every command:\n");
  for (const char* f : kCommonFlags) absl::StrAppend(&out, FlagLine(f));
  absl::StrAppend(&out,
                  "\nThe scheduler's address: --scheduler, else $DTRAIN_SCHEDULER, else "
                  "127.0.0.1:7000;\ncredentials: --ca --cert --key, else $DTRAIN_CA $DTRAIN_CERT "
                  "$DTRAIN_KEY.\n");
  return out;
}

std::string CommandHelp(absl::string_view command) {
  for (const Command& c : Commands()) {
    if (command != c.name) continue;
    std::string out = absl::StrCat("usage: trainctl ", c.synopsis, "\n\n", c.description, "\n");
    if (!c.flags.empty()) {
      absl::StrAppend(&out, "\nFlags:\n");
      for (const char* f : c.flags) absl::StrAppend(&out, FlagLine(f));
    }
    absl::StrAppend(&out, "\nExample:\n  ", c.example, "\n\nFlags of every command: ",
                    absl::StrJoin(kCommonFlags, " ",
                                  [](std::string* o, const char* f) {
                                    absl::StrAppend(o, std::strlen(f) == 1 ? "-" : "--", f);
                                  }),
                    " (trainctl --help)\n");
    return out;
  }
  return "";
}

std::string HelpRequested(int argc, char** argv) {
  bool help = false;
  std::string command;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpfull" || a == "--helpshort") {
      help = true;
    } else if (a == "help" && command.empty()) {
      help = true;
    } else if (!a.empty() && a[0] != '-' && command.empty()) {
      command = std::string(a);
    }
  }
  if (!help) return "";
  std::string out = CommandHelp(command);
  return out.empty() ? OverviewHelp() : out;
}

}  // namespace trainctl
}  // namespace dtrain
