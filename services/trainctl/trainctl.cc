// trainctl: the command-line client of the dtrain scheduler.
//
//   trainctl submit --name=mlp1 --model=mlp --epochs=5 --batch_size=256 --lr=0.1 [--wait]
//   trainctl submit -f job.yaml [--wait]      # a JobSpec: YAML (yaml.h) or protobuf JSON
//   trainctl submit --model_file=net.onnx ...  # your own model (docs/models.md)
//   trainctl export ID --out=trained.onnx     # the trained weights as ONNX
//   trainctl get ID | list | cancel ID | watch ID
//   trainctl -o json list                     # JSON instead of text
//   trainctl trainers                         # trainers: state (IDLE, BUSY, DRAINING,
//                                             # LOST) and jobs; -o json too
//   trainctl kvstore                          # the kvstore shard map (chains of
//                                             # replicas, states, roles); -o json too
//   trainctl drain TRAINER                    # id or name: no new work; its job is
//                                             # drained and resumes on other trainers
//   trainctl cluster up --dir=DIR --trainers=N --kvstore_shards=M [--kvstore_replicas=R]
//                       [--devices_per_trainer=K]
//   trainctl cluster status|down --dir=DIR    # see cluster.cc
//   trainctl certs init --dir=D               # a CA and service certificates
//   trainctl certs issue --dir=D --name=alice --role=user
//
// Credentials: mutual TLS with --ca, --cert and --key (else $DTRAIN_CA,
// $DTRAIN_CERT, $DTRAIN_KEY; `cluster up` prints them), or plain text with
// --insecure (libs/rpc/credential_flags.h).
//
// The scheduler's address comes from --scheduler, else $DTRAIN_SCHEDULER,
// else 127.0.0.1:7000. Every call has a deadline (--timeout_s) and is
// retried with backoff while it fails with a transient error (IsTransient,
// libs/base/retry.h: the scheduler is UNAVAILABLE, ...) (Submit carries a
// random request id, so a retry never queues a job twice); watch and submit
// --wait stream without a deadline, reconnect when the stream breaks (a
// scheduler restart) or stays silent while the scheduler does not answer
// either (--watch_timeout_s, 30 s: a stopped or hung scheduler, a half-open
// connection; HTTP/2 keepalive pings also close a dead connection) and stop
// when the job finishes. Errors
// print the gRPC status code and message. Exit status: 0 success (for
// --wait and watch: the job SUCCEEDED), 1 a failed call or a job that did
// not succeed, 2 bad usage.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "libs/base/files.h"
#include "libs/base/grpc_status.h"
#include "libs/base/retry.h"
#include "libs/base/status.h"
#include "libs/rpc/credential_flags.h"
#include "libs/rpc/credentials.h"
#include "libs/scheduler/loss_curve.h"
#include "libs/security/certs.h"
#include "libs/trace/trace.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/trainctl/cluster.h"
#include "services/trainctl/data_cmd.h"
#include "services/trainctl/doctor.h"
#include "services/trainctl/help.h"
#include "services/trainctl/jobfile.h"
#include "services/trainctl/model_cmd.h"
#include "services/trainctl/progress.h"
#include "services/trainctl/queues_view.h"
#include "services/trainctl/shard_map_view.h"

ABSL_FLAG(std::string, scheduler, "",
          "scheduler address (default: $DTRAIN_SCHEDULER, else 127.0.0.1:7000)");
ABSL_FLAG(std::string, o, "text", "output: text or json");
ABSL_FLAG(double, timeout_s, 10, "deadline of each call in seconds");
ABSL_FLAG(std::string, f, "",
          "submit: a JobSpec file, JSON or YAML (flags below override its fields); queues "
          "apply: a queues file");
ABSL_FLAG(std::string, queue, "", "submit: the queue (one of yours; default: your default queue)");
ABSL_FLAG(std::string, queues, "", "cluster up: the scheduler's queues file (docs/queues.md)");
ABSL_FLAG(bool, wait, false, "submit: watch the job until it ends");
ABSL_FLAG(std::string, reason, "", "cancel: why (recorded in the job's events)");
ABSL_FLAG(std::string, state, "", "list: only jobs in this state (QUEUED, RUNNING, ...)");
// JobSpec fields for submit. Unset flags leave the spec (or -f's) alone.
ABSL_FLAG(std::string, name, "", "submit: job name");
ABSL_FLAG(std::string, model, "", "submit: mlp, lenet or resnet18");
ABSL_FLAG(std::string, model_file, "",
          "submit: your own model, an ONNX file (docs/models.md): checked here, uploaded to the "
          "scheduler, trained instead of --model");
ABSL_FLAG(int, epoch, 0, "export: the epoch whose checkpoint to export (0: the newest)");
ABSL_FLAG(std::string, data_dir, "", "submit: Fashion-MNIST directory on the trainers");
ABSL_FLAG(std::string, data_format, "",
          "submit: idx, image_folder, webdataset or npy (docs/data.md); data check/pack: the "
          "source's format (default: guessed)");
ABSL_FLAG(std::string, data_train, "", "submit: training data location on the trainers");
ABSL_FLAG(std::string, data_test, "", "submit: test data location on the trainers");
ABSL_FLAG(std::string, data_shape, "", "submit: the model's input, CxHxW (e.g. 3x32x32)");
ABSL_FLAG(int, num_classes, 0, "submit: classes (labels must be below it)");
ABSL_FLAG(int, data_threads, 0, "submit, data check: decode threads per trainer");
ABSL_FLAG(bool, skip_corrupt, false, "submit, data check: leave corrupt images out");
ABSL_FLAG(std::string, format, "webdataset", "data pack: the output format");
ABSL_FLAG(int64_t, shard_size, 10000, "data pack: samples per shard");
ABSL_FLAG(int, jpeg_quality, 0, "data pack: 0: PNG (lossless), else JPEG at this quality");
ABSL_FLAG(int, epochs, 0, "submit: epochs");
ABSL_FLAG(int64_t, batch_size, 0, "submit: global batch size");
ABSL_FLAG(double, lr, 0, "submit: learning rate");
ABSL_FLAG(double, momentum, 0, "submit: SGD momentum");
ABSL_FLAG(double, weight_decay, 0, "submit: SGD weight decay");
ABSL_FLAG(int, num_trainers, 0, "submit: trainers (gang-scheduled)");
ABSL_FLAG(int, min_trainers, 0,
          "submit: elastic jobs: continue on as few as this many trainers when one is lost "
          "(0 = num_trainers)");
ABSL_FLAG(int, max_trainers, 0,
          "submit: elastic jobs: grow onto free trainers up to this many (0 = num_trainers)");
ABSL_FLAG(int, devices_per_trainer, 0, "submit: devices per trainer");
ABSL_FLAG(std::string, device_kind, "", "submit: cpu or cuda");
ABSL_FLAG(std::string, sync, "", "submit: ALLREDUCE or KVSTORE");
ABSL_FLAG(std::string, consistency, "", "submit: SYNCHRONOUS, ASYNCHRONOUS or BOUNDED_DELAY");
ABSL_FLAG(int, max_staleness, 0, "submit: BOUNDED_DELAY: steps a trainer may run ahead");
ABSL_FLAG(std::string, gradient_compression, "",
          "submit: KVSTORE: how gradient pushes travel: none, f16 or bf16 (half the bytes), "
          "topk or topk:<ratio> (each push sends that fraction of each slice, the largest "
          "entries, and carries the rest into the next push; topk = topk:0.01)");
ABSL_FLAG(bool, hybridize, false, "submit: compile the model");
ABSL_FLAG(bool, sync_batch_norm, false, "submit: batch norm over the global batch");
ABSL_FLAG(bool, collective_tls, false,
          "submit: encrypt the trainers' allreduce traffic (TLS; costs bandwidth)");
ABSL_FLAG(uint64_t, seed, 0, "submit: seed");
ABSL_FLAG(int, checkpoint_interval_epochs, 0, "submit: checkpoint every N epochs");
ABSL_FLAG(bool, keep_epoch_checkpoints, false,
          "submit: keep every epoch's checkpoint (for export --epoch), not only the newest");
ABSL_FLAG(int, priority, 0, "submit: priority (higher runs first)");
ABSL_FLAG(int64_t, train_limit, 0, "submit: only the first N training images");
ABSL_FLAG(int64_t, test_limit, 0, "submit: only the first N test images");
ABSL_FLAG(std::string, init, "",
          "submit: normal or kaiming; from_model: the weights of the --model_file");
ABSL_FLAG(int, threads, 0, "submit: CPU threads per trainer");
ABSL_FLAG(int64_t, bucket_bytes, 0,
          "submit: gradient bucket size in bytes (0: 1 MiB); smaller buckets start "
          "communication earlier in backward");
// cluster up|down|status (--devices_per_trainer above also sets the devices
// each trainer offers; 0: 1).
ABSL_FLAG(std::string, out, "",
          "timeline: write the Chrome trace (JSON) to this file; empty: to stdout. export: the "
          "ONNX file to write");
ABSL_FLAG(std::string, dir, "", "cluster: the cluster's directory (data, logs, cluster.json)");
ABSL_FLAG(int, trainers, 1, "cluster up: trainer daemons");
ABSL_FLAG(int, kvstore_shards, 0, "cluster up: kvstore shards");
ABSL_FLAG(int, kvstore_replicas, 0,
          "cluster up: replicas per kvstore shard (chain replication; 0: 2 when --kvstore_shards "
          "> 0; 1: unreplicated)");
ABSL_FLAG(std::string, scheduler_bin, "",
          "cluster up: scheduler_server (default: next to trainctl)");
ABSL_FLAG(std::string, trainer_bin, "", "cluster up: trainer daemon (default: next to trainctl)");
ABSL_FLAG(std::string, kvstore_bin, "", "cluster up: kvstore_server (default: next to trainctl)");
ABSL_FLAG(double, start_timeout_s, 30, "cluster up: seconds each server gets to start");
ABSL_FLAG(double, heartbeat_timeout_s, 0,
          "cluster up: seconds without a heartbeat before the scheduler declares a trainer lost "
          "(0: the scheduler's default, 10)");
ABSL_FLAG(int64_t, max_model_bytes, 0,
          "cluster up: the largest model file the scheduler accepts (0: its default, 512 MiB)");
ABSL_FLAG(int, max_attempts, 0,
          "cluster up: placements of a job before it fails for good (0: the scheduler's "
          "default, 5)");
ABSL_FLAG(bool, recover_in_place, true,
          "cluster up: a lost trainer of an ALLREDUCE job is replaced by a free one within the "
          "same attempt (false: the job is requeued from its checkpoint, as before)");
ABSL_FLAG(std::string, kvstore_data_path, "",
          "cluster up: how the trainers reach the kvstore shards: auto (the data port: shared "
          "memory on this host, else TCP with TLS), tcp (the data port over TCP) or grpc (gRPC "
          "only); empty: the trainers' default (auto)");
ABSL_FLAG(std::string, data_roots, "",
          "cluster up: the trainers' --data_roots, comma-separated absolute directories a "
          "job's data may lie under (empty: the trainers' default, /usr/share/datasets)");
ABSL_FLAG(double, grace_s, 15, "cluster down: seconds after SIGTERM before SIGKILL");
ABSL_FLAG(std::string, restart, "always",
          "cluster up: always (a process that exits is started again, on the same ports, after "
          "a backoff of 1 s doubling to 30 s) or never");
ABSL_FLAG(std::string, role, "user", "certs issue: user, admin, trainer, kvstore or scheduler");
ABSL_FLAG(std::string, san, "",
          "certs init (service certificates) and issue: more names the certificate is valid "
          "for, comma-separated DNS names or IP addresses (e.g. scheduler.dtrain.svc)");
ABSL_FLAG(int, valid_days, 365, "certs: days a certificate is valid");
ABSL_FLAG(double, watch_timeout_s, 30,
          "watch, submit --wait: a stream silent this long is checked with a Get; if the "
          "scheduler does not answer (stopped, hung, a dead connection), the stream is dropped "
          "and opened again");

namespace {

namespace v1 = dtrain::scheduler::v1;

bool Json() { return absl::GetFlag(FLAGS_o) == "json"; }

std::string ToJson(const google::protobuf::Message& m, bool multiline) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = multiline;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Runs `call` (one RPC, given a context with the remaining deadline) until
// it succeeds or fails with an error that is not transient (IsTransient:
// e.g. UNAVAILABLE while the scheduler restarts or is not reachable yet),
// with exponential backoff, within --timeout_s in all. Submit is safe to
// retry: it carries a request id.
absl::Status WithRetries(const char* what,
                         const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  dtrain::RetryPolicy policy;
  policy.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  policy.initial_backoff = absl::Milliseconds(100);
  policy.max_backoff = absl::Seconds(2);
  const absl::Time deadline = absl::Now() + policy.timeout;
  dtrain::RetryHooks hooks;
  hooks.on_retry = [](const absl::Status& error, int, absl::Duration wait) {
    std::fprintf(stderr, "trainctl: %s; retrying in %s\n", std::string(error.message()).c_str(),
                 absl::FormatDuration(absl::Trunc(wait, absl::Milliseconds(1))).c_str());
  };
  return dtrain::Retry(
      policy,
      [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(deadline));
        return dtrain::FromGrpcStatus(call(&ctx), what);
      },
      hooks);
}

// 128 random bits as hex (the Submit request id).
std::string RandomId() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "trainctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               std::string(s.message()).c_str());
  return 1;
}

// trainctl timeline: the job's spans as one Chrome trace, ranks aligned on
// the scheduler's clock (each rank's estimated offset removed).
int Timeline(v1::JobService::Stub* stub, const std::string& id) {
  v1::GetTimelineRequest req;
  req.set_id(id);
  v1::Timeline timeline;
  absl::Status s = WithRetries("JobService.GetTimeline", [&](grpc::ClientContext* ctx) {
    return stub->GetTimeline(ctx, req, &timeline);
  });
  if (!s.ok()) return Fail(s);
  std::vector<dtrain::trace::RankSpans> ranks;
  int64_t spans = 0;
  for (const v1::RankTimeline& t : timeline.ranks()) {
    dtrain::trace::RankSpans r;
    r.rank = t.rank();
    r.label = absl::StrCat("trainer ", t.trainer_id(), ", attempt ", t.attempt());
    r.clock_offset_us = t.clock_offset_us();
    r.dropped = t.dropped_spans();
    for (const v1::TraceSpan& in : t.spans()) {
      r.spans.push_back({in.name(), in.track(), in.start_unix_us(), in.duration_us(), in.step()});
    }
    spans += t.spans_size();
    ranks.push_back(std::move(r));
  }
  const std::string json = dtrain::trace::ChromeTraceJson(ranks);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fwrite(json.data(), 1, json.size(), stdout);
    return 0;
  }
  if (absl::Status w = dtrain::WriteFileAtomically(out, json); !w.ok()) return Fail(w);
  if (Json()) {
    google::protobuf::Struct summary;
    auto& f = *summary.mutable_fields();
    f["job_id"].set_string_value(id);
    f["out"].set_string_value(out);
    f["ranks"].set_number_value(timeline.ranks_size());
    f["spans"].set_number_value(static_cast<double>(spans));
    std::printf("%s\n", ToJson(summary, false).c_str());
  } else {
    std::printf(
        "%s: %d ranks, %lld spans written to %s (open it in ui.perfetto.dev or "
        "chrome://tracing)\n",
        id.c_str(), timeline.ranks_size(), static_cast<long long>(spans), out.c_str());
  }
  return 0;
}

int Usage(const std::string& why) {
  std::fprintf(stderr, "trainctl: %s\n%s", why.c_str(), dtrain::trainctl::OverviewHelp().c_str());
  return 2;
}

std::string Line(const v1::JobStatus& j) {
  std::string acc =
      j.test_accuracy() >= 0 ? absl::StrFormat("%.4f", j.test_accuracy()) : std::string("-");
  std::string per_epoch;
  if (j.epoch_seconds() > 0) per_epoch = absl::StrFormat("  %.1f s/epoch", j.epoch_seconds());
  std::string line = absl::StrFormat(
      "%-11s %-20s %-9s epoch %d/%d  loss %.4f  train_acc %.4f  test_acc %s  %.0f samples/s%s",
      j.id(), j.spec().name(), v1::JobState_Name(j.state()), j.epoch(), j.spec().epochs(), j.loss(),
      j.train_accuracy(), acc, j.samples_per_second(), per_epoch);
  // Where it stands in its queue, why it waits; which ranks are slow.
  if (const std::string place = dtrain::trainctl::QueuePlace(j); !place.empty()) {
    absl::StrAppend(&line, "  ", place);
  }
  if (j.state() == v1::QUEUED && !j.pending_reason().empty()) {
    absl::StrAppend(&line, "  waiting: ", j.pending_reason());
  }
  if (j.state() == v1::RUNNING) {
    for (const v1::Straggler& st : j.stragglers()) {
      absl::StrAppendFormat(&line, "  straggler: rank %d (%.1fx, %s)", st.rank(), st.ratio(),
                            st.phase());
    }
  }
  return line;
}

void Print(const v1::JobStatus& j, bool detail) {
  if (Json()) {
    std::printf("%s\n", ToJson(j, false).c_str());
  } else {
    std::printf("%s\n", Line(j).c_str());
    if (detail) {
      if (j.spec().min_trainers() != j.spec().max_trainers()) {
        std::printf("  elastic: %d..%d trainers, %d now\n", j.spec().min_trainers(),
                    j.spec().max_trainers(), j.trainers_size());
      }
      std::printf("  trainers: %s  (attempt %d%s)\n",
                  j.trainers().empty() ? "-" : absl::StrJoin(j.trainers(), ", ").c_str(),
                  j.attempts(),
                  j.drains() > 0 ? absl::StrCat(", ", j.drains(), " drained").c_str() : "");
      if (!j.spec().model_digest().empty()) {
        std::printf("  model: file %s (trainctl export %s --out=FILE.onnx)\n",
                    j.spec().model_digest().c_str(), j.id().c_str());
      }
      if (j.data_train_samples() > 0) {
        const v1::DataSpec& d = j.spec().data();
        std::printf(
            "  data: %s, %lld training and %lld test samples%s\n",
            d.format().empty() ? "Fashion-MNIST (idx)" : d.format().c_str(),
            static_cast<long long>(j.data_train_samples()),
            static_cast<long long>(j.data_test_samples()),
            j.data_corrupt_skipped() > 0
                ? absl::StrCat(", ", j.data_corrupt_skipped(), " corrupt images skipped").c_str()
                : "");
      }
      if (j.recoveries() > 0 || j.generation() > 0) {
        std::printf(
            "  recovered in place: %d time%s, last in %.1f s, %lld step%s lost "
            "(generation %d)\n",
            j.recoveries(), j.recoveries() == 1 ? "" : "s", j.last_recovery_seconds(),
            static_cast<long long>(j.steps_lost()), j.steps_lost() == 1 ? "" : "s", j.generation());
      }
      if (j.state() == v1::QUEUED && !j.pending_reason().empty()) {
        std::printf("  waiting: %s\n", j.pending_reason().c_str());
      }
      for (const v1::Straggler& st : j.stragglers()) {
        std::printf(
            "  straggler: rank %d on trainer %s is %.1fx slower than the median of the other "
            "ranks, in %s (since %s)\n",
            st.rank(), st.trainer().c_str(), st.ratio(), st.phase().c_str(),
            absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(st.since_unix_ms()),
                             absl::LocalTimeZone())
                .c_str());
      }
      for (int r = 0; r < j.rank_step_times_size(); ++r) {
        const v1::StepTimeSummary& t = j.rank_step_times(r);
        if (t.steps() == 0) continue;
        std::printf(
            "  rank %d step (median of %d, ms): data_wait %.1f  forward_backward %.1f  "
            "comm_wait %.1f  optimizer %.1f  busy %.1f  step %.1f  %.0f samples/s\n",
            r, t.steps(), t.data_wait_seconds() * 1e3, t.forward_backward_seconds() * 1e3,
            t.comm_wait_seconds() * 1e3, t.optimizer_seconds() * 1e3, t.busy_seconds() * 1e3,
            t.step_seconds() * 1e3, t.samples_per_second());
      }
      if (j.achieved_gflops() > 0) {
        std::printf(
            "  model FLOPs: %.2f GFLOP/s achieved, MFU %.1f%% of the trainers' measured peak\n",
            j.achieved_gflops(), 100 * j.mfu());
      }
      if (j.step_losses_size() > 0) {
        // The loss curve, 10 steps a line (1-based step numbers, as the
        // progress shows them); a gap where steps were not kept.
        std::printf("  step losses (rank 0's batch; the first %d steps and the newest %d):",
                    static_cast<int>(dtrain::scheduler::kFirstSteps),
                    dtrain::scheduler::kRecentSteps);
        int64_t prev = -1;
        int on_line = 0;
        for (const v1::StepLoss& l : j.step_losses()) {
          if (prev >= 0 && l.step() != prev + 1) {
            std::printf("\n    ...");
            on_line = 0;
          }
          if (on_line == 10) on_line = 0;
          if (on_line == 0) std::printf("\n   ");
          std::printf(" %lld:%.6g", static_cast<long long>(l.step() + 1), l.loss());
          prev = l.step();
          ++on_line;
        }
        std::printf("\n");
      }
      if (!j.checkpoint_path().empty()) {
        std::printf(
            "  checkpoint: %s (epoch %d%s)\n", j.checkpoint_path().c_str(), j.checkpoint_epoch(),
            j.checkpoint_step() > 0 ? absl::StrCat(" + ", j.checkpoint_step(), " steps").c_str()
                                    : "");
      }
      for (const auto& e : j.events()) {
        std::printf("  %s  %-9s %s\n",
                    absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(e.time_unix_ms()),
                                     absl::LocalTimeZone())
                        .c_str(),
                    v1::JobState_Name(e.state()).c_str(), e.reason().c_str());
      }
    }
  }
  std::fflush(stdout);
}

bool Final(v1::JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

// Watches one Watch stream for silence: once `limit` passed without a
// message (Touch), it asks the scheduler for the job (a Get on the same
// channel, with a deadline of a third of `limit`, started after two thirds);
// an answer means the job just did not change, no answer means the
// connection is open but nobody answers (a stopped or hung scheduler, a
// half-open connection), and the stream is cancelled, so that Read returns.
class SilenceWatchdog {
 public:
  SilenceWatchdog(v1::JobService::Stub* stub, const std::string& id, const std::string& address,
                  absl::Duration limit, grpc::ClientContext* stream)
      : last_(absl::Now()) {
    thread_ = std::thread([=] { Run(stub, id, address, limit, stream); });
  }
  ~SilenceWatchdog() {
    {
      absl::MutexLock l(&mu_);
      done_ = true;
    }
    thread_.join();
  }
  void Touch() {
    absl::MutexLock l(&mu_);
    last_ = absl::Now();
  }
  // Why the stream was cancelled; empty if it was not.
  std::string reason() {
    absl::MutexLock l(&mu_);
    return reason_;
  }

 private:
  void Run(v1::JobService::Stub* stub, const std::string& id, const std::string& address,
           absl::Duration limit, grpc::ClientContext* stream) {
    const absl::Duration probe = limit / 3;
    absl::MutexLock l(&mu_);
    while (!done_) {
      if (mu_.AwaitWithDeadline(absl::Condition(&done_), last_ + limit - probe)) break;
      if (absl::Now() < last_ + limit - probe) continue;  // touched meanwhile
      mu_.Unlock();
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + probe));
      v1::GetRequest req;
      req.set_id(id);
      v1::JobStatus job;
      const grpc::Status s = stub->Get(&ctx, req, &job);
      mu_.Lock();
      if (done_) break;
      if (s.ok() || (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
                     s.error_code() != grpc::StatusCode::UNAVAILABLE)) {
        last_ = absl::Now();  // it answers: the job just did not change
        continue;
      }
      reason_ =
          absl::StrCat("the scheduler at ", address, " sent nothing for ",
                       absl::FormatDuration(absl::Trunc(absl::Now() - last_, absl::Seconds(1))),
                       " and did not answer a Get within ", absl::FormatDuration(probe), " (",
                       s.error_message(), "): stopped, hung or unreachable; see --watch_timeout_s");
      stream->TryCancel();
      break;
    }
  }

  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  std::string reason_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Streams the job's changes until it ends; 0 when it SUCCEEDED. A stream
// silent for --watch_timeout_s whose scheduler does not answer either is
// dropped and opened again (SilenceWatchdog), as one that breaks is.
int Watch(v1::JobService::Stub* stub, const std::string& id, const std::string& address) {
  const absl::Duration silence_limit = absl::Seconds(absl::GetFlag(FLAGS_watch_timeout_s));
  v1::WatchRequest req;
  req.set_id(id);
  v1::JobStatus st;
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  int last_epoch = -1;
  const bool tty = isatty(STDOUT_FILENO) && !Json();
  dtrain::trainctl::ProgressTracker progress;
  // A stream that breaks (the scheduler restarts; jobs survive in its log)
  // is opened again, with backoff, for up to kReconnectFor without success.
  constexpr absl::Duration kReconnectFor = absl::Seconds(120);
  absl::Duration backoff = absl::Milliseconds(200);
  absl::Time failing_since = absl::InfiniteFuture();
  absl::Status s;
  for (;;) {
    grpc::ClientContext ctx;  // no deadline: a job may train for days
    auto reader = stub->Watch(&ctx, req);
    auto watchdog = std::make_unique<SilenceWatchdog>(stub, id, address, silence_limit, &ctx);
    while (reader->Read(&st)) {
      watchdog->Touch();
      failing_since = absl::InfiniteFuture();
      backoff = absl::Milliseconds(200);
      if (Json()) {
        Print(st, false);
        last = st.state();
        continue;
      }
      const std::string bar = progress.Update(st, absl::Now());
      if (st.state() != last && !Final(st.state())) {
        // A new state (QUEUED, RUNNING, requeued): its line and reason.
        std::printf("%s%-11s %-9s %s\n", tty ? "\r\033[K" : "", st.id().c_str(),
                    v1::JobState_Name(st.state()).c_str(),
                    st.events_size() > 0 ? st.events(st.events_size() - 1).reason().c_str() : "");
      }
      if (Final(st.state())) {
        std::printf("%s%s\n", tty ? "\r\033[K" : "", Line(st).c_str());
      } else if (st.state() == v1::RUNNING && tty) {
        std::printf("\r\033[K%s", bar.c_str());  // redrawn in place
      } else if (st.state() == v1::RUNNING && st.epoch() != last_epoch) {
        std::printf("%s\n", bar.c_str());  // logs: one line per epoch
      }
      std::fflush(stdout);
      last = st.state();
      last_epoch = st.epoch();
    }
    const std::string silent = watchdog->reason();
    watchdog.reset();
    s = dtrain::FromGrpcStatus(reader->Finish(), "JobService.Watch");
    if (!silent.empty()) s = absl::UnavailableError(silent);  // cancelled by the watchdog
    if (Final(last) || !(s.ok() || dtrain::IsTransient(s))) break;
    const absl::Time now = absl::Now();
    if (failing_since == absl::InfiniteFuture()) failing_since = now;
    if (now - failing_since > kReconnectFor) break;
    if (tty) std::printf("\r\033[K");
    std::fprintf(stderr, "trainctl: watch of %s interrupted (%s); reconnecting in %s\n", id.c_str(),
                 s.ok() ? "stream ended" : std::string(s.message()).c_str(),
                 absl::FormatDuration(backoff).c_str());
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  if (tty && !Final(last)) std::printf("\n");  // end the redrawn line
  if (!s.ok()) return Fail(s);
  if (!Final(last)) return Fail(absl::UnavailableError("watch ended before the job did"));
  if (!Json() && last != v1::SUCCEEDED && st.events_size() > 0) {
    std::printf("  %s\n", st.events(st.events_size() - 1).reason().c_str());
  }
  return last == v1::SUCCEEDED ? 0 : 1;
}

// `model_file`: the model file to upload (--model_file, else the job
// file's model_file), or "".
absl::Status BuildSpec(v1::JobSpec* spec, std::string* model_file) {
  const std::string file = absl::GetFlag(FLAGS_f);
  // YAML or JSON, with JobSpec's field names or the flags' (jobfile.h).
  if (!file.empty()) DT_RETURN_IF_ERROR(dtrain::trainctl::ReadJobFile(file, spec, model_file));
  if (!absl::GetFlag(FLAGS_model_file).empty()) *model_file = absl::GetFlag(FLAGS_model_file);
  if (!absl::GetFlag(FLAGS_name).empty()) spec->set_name(absl::GetFlag(FLAGS_name));
  if (!absl::GetFlag(FLAGS_model).empty()) spec->set_model(absl::GetFlag(FLAGS_model));
  if (!absl::GetFlag(FLAGS_data_dir).empty()) spec->set_data_dir(absl::GetFlag(FLAGS_data_dir));
  if (!absl::GetFlag(FLAGS_data_format).empty()) {
    spec->mutable_data()->set_format(absl::GetFlag(FLAGS_data_format));
  }
  if (!absl::GetFlag(FLAGS_data_train).empty()) {
    spec->mutable_data()->set_train(absl::GetFlag(FLAGS_data_train));
  }
  if (!absl::GetFlag(FLAGS_data_test).empty()) {
    spec->mutable_data()->set_test(absl::GetFlag(FLAGS_data_test));
  }
  if (!absl::GetFlag(FLAGS_data_shape).empty()) {
    std::vector<std::string> dims = absl::StrSplit(absl::GetFlag(FLAGS_data_shape), 'x');
    int c = 0, h = 0, w = 0;
    if (dims.size() != 3 || !absl::SimpleAtoi(dims[0], &c) || !absl::SimpleAtoi(dims[1], &h) ||
        !absl::SimpleAtoi(dims[2], &w)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data_shape must be CxHxW, e.g. 3x32x32, got '", absl::GetFlag(FLAGS_data_shape), "'"));
    }
    spec->mutable_data()->set_channels(c);
    spec->mutable_data()->set_height(h);
    spec->mutable_data()->set_width(w);
  }
  if (absl::GetFlag(FLAGS_num_classes)) {
    spec->mutable_data()->set_num_classes(absl::GetFlag(FLAGS_num_classes));
  }
  if (absl::GetFlag(FLAGS_data_threads)) {
    spec->mutable_data()->set_data_threads(absl::GetFlag(FLAGS_data_threads));
  }
  if (absl::GetFlag(FLAGS_skip_corrupt)) spec->mutable_data()->set_skip_corrupt(true);
  if (absl::GetFlag(FLAGS_epochs)) spec->set_epochs(absl::GetFlag(FLAGS_epochs));
  if (absl::GetFlag(FLAGS_batch_size)) spec->set_global_batch_size(absl::GetFlag(FLAGS_batch_size));
  if (absl::GetFlag(FLAGS_lr) != 0) spec->set_lr(absl::GetFlag(FLAGS_lr));
  if (absl::GetFlag(FLAGS_momentum) != 0) spec->set_momentum(absl::GetFlag(FLAGS_momentum));
  if (absl::GetFlag(FLAGS_weight_decay) != 0) {
    spec->set_weight_decay(absl::GetFlag(FLAGS_weight_decay));
  }
  if (absl::GetFlag(FLAGS_num_trainers)) spec->set_num_trainers(absl::GetFlag(FLAGS_num_trainers));
  if (absl::GetFlag(FLAGS_min_trainers)) spec->set_min_trainers(absl::GetFlag(FLAGS_min_trainers));
  if (absl::GetFlag(FLAGS_max_trainers)) spec->set_max_trainers(absl::GetFlag(FLAGS_max_trainers));
  if (absl::GetFlag(FLAGS_devices_per_trainer)) {
    spec->set_devices_per_trainer(absl::GetFlag(FLAGS_devices_per_trainer));
  }
  if (!absl::GetFlag(FLAGS_device_kind).empty()) {
    spec->set_device_kind(absl::GetFlag(FLAGS_device_kind));
  }
  if (!absl::GetFlag(FLAGS_sync).empty()) {
    v1::SyncMode mode;
    if (!v1::SyncMode_Parse(absl::GetFlag(FLAGS_sync), &mode)) {
      return absl::InvalidArgumentError("--sync must be ALLREDUCE or KVSTORE");
    }
    spec->mutable_sync()->set_mode(mode);
  }
  if (!absl::GetFlag(FLAGS_consistency).empty()) {
    v1::Consistency c;
    if (!v1::Consistency_Parse(absl::GetFlag(FLAGS_consistency), &c)) {
      return absl::InvalidArgumentError(
          "--consistency must be SYNCHRONOUS, ASYNCHRONOUS or BOUNDED_DELAY");
    }
    spec->mutable_sync()->set_consistency(c);
  }
  if (absl::GetFlag(FLAGS_max_staleness)) {
    spec->mutable_sync()->set_max_staleness(absl::GetFlag(FLAGS_max_staleness));
  }
  if (!absl::GetFlag(FLAGS_gradient_compression).empty()) {
    spec->mutable_sync()->set_gradient_compression(absl::GetFlag(FLAGS_gradient_compression));
  }
  if (absl::GetFlag(FLAGS_hybridize)) spec->set_hybridize(true);
  if (absl::GetFlag(FLAGS_sync_batch_norm)) spec->set_sync_batch_norm(true);
  if (absl::GetFlag(FLAGS_collective_tls)) spec->set_collective_tls(true);
  if (absl::GetFlag(FLAGS_seed)) spec->set_seed(absl::GetFlag(FLAGS_seed));
  if (absl::GetFlag(FLAGS_checkpoint_interval_epochs)) {
    spec->set_checkpoint_interval_epochs(absl::GetFlag(FLAGS_checkpoint_interval_epochs));
  }
  if (absl::GetFlag(FLAGS_keep_epoch_checkpoints)) spec->set_keep_epoch_checkpoints(true);
  if (absl::GetFlag(FLAGS_priority)) spec->set_priority(absl::GetFlag(FLAGS_priority));
  if (!absl::GetFlag(FLAGS_queue).empty()) spec->set_queue(absl::GetFlag(FLAGS_queue));
  if (absl::GetFlag(FLAGS_train_limit)) spec->set_train_limit(absl::GetFlag(FLAGS_train_limit));
  if (absl::GetFlag(FLAGS_test_limit)) spec->set_test_limit(absl::GetFlag(FLAGS_test_limit));
  if (!absl::GetFlag(FLAGS_init).empty()) spec->set_init(absl::GetFlag(FLAGS_init));
  if (absl::GetFlag(FLAGS_threads)) spec->set_threads(absl::GetFlag(FLAGS_threads));
  if (absl::GetFlag(FLAGS_bucket_bytes)) {
    spec->set_bucket_bytes(absl::GetFlag(FLAGS_bucket_bytes));
  }
  return absl::OkStatus();
}

// `trainctl certs init|issue`.
int CertsMain(const std::vector<std::string>& args) {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (args.size() != 1 || (args[0] != "init" && args[0] != "issue")) {
    return Usage("certs needs init or issue");
  }
  if (dir.empty()) return Usage("certs " + args[0] + " needs --dir");
  std::vector<std::string> sans =
      absl::StrSplit(absl::GetFlag(FLAGS_san), ',', absl::SkipWhitespace());
  if (absl::GetFlag(FLAGS_valid_days) < 1) return Usage("--valid_days must be >= 1");
  absl::Status s;
  std::string made;
  if (args[0] == "init") {
    dtrain::security::InitOptions o;
    o.service_sans = sans;
    o.valid_days = absl::GetFlag(FLAGS_valid_days);
    s = dtrain::security::InitCertDir(dir, o);
    made = absl::StrCat(dir, "/ca.pem, scheduler, kvstore and admin (.pem, .key), cluster.secret");
  } else {
    dtrain::security::CertRequest r;
    r.name = absl::GetFlag(FLAGS_name);
    if (r.name.empty()) return Usage("certs issue needs --name");
    absl::StatusOr<dtrain::security::Role> role =
        dtrain::security::ParseRole(absl::GetFlag(FLAGS_role));
    if (!role.ok()) return Usage(std::string(role.status().message()));
    r.role = *role;
    r.extra_sans = sans;
    r.valid_days = absl::GetFlag(FLAGS_valid_days);
    s = dtrain::security::IssueCert(dir, r);
    made = absl::StrCat(dir, "/", r.name, ".pem and .key (", absl::GetFlag(FLAGS_role), ")");
  }
  if (!s.ok()) {
    std::fprintf(stderr, "trainctl: certs %s: %s\n", args[0].c_str(),
                 std::string(s.message()).c_str());
    return 1;
  }
  std::printf("wrote %s\n", made.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Per-command help before absl's, which lists every command's flags.
  if (const std::string help = dtrain::trainctl::HelpRequested(argc, argv); !help.empty()) {
    std::printf("%s", help.c_str());
    return 0;
  }
  absl::SetProgramUsageMessage("trainctl COMMAND [flags]; trainctl --help lists the commands");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (!Json() && absl::GetFlag(FLAGS_o) != "text") return Usage("-o must be text or json");
  if (!(absl::GetFlag(FLAGS_timeout_s) > 0)) return Usage("--timeout_s must be > 0");
  if (args.size() < 2) return Usage("missing subcommand");
  const std::string cmd = args[1];
  if (cmd == "certs") return CertsMain(std::vector<std::string>(args.begin() + 2, args.end()));
  if (cmd == "data") {
    dtrain::trainctl::DataCommandOptions o;
    o.json = Json();
    o.data_format = absl::GetFlag(FLAGS_data_format);
    o.format = absl::GetFlag(FLAGS_format);
    o.shard_size = absl::GetFlag(FLAGS_shard_size);
    o.jpeg_quality = absl::GetFlag(FLAGS_jpeg_quality);
    o.skip_corrupt = absl::GetFlag(FLAGS_skip_corrupt);
    o.data_threads = absl::GetFlag(FLAGS_data_threads);
    return dtrain::trainctl::DataMain(std::vector<std::string>(args.begin() + 2, args.end()), o);
  }
  if (cmd == "doctor") {
    return dtrain::trainctl::DoctorMain(std::vector<std::string>(args.begin() + 2, args.end()),
                                        Json());
  }
  if (cmd == "cluster") {
    dtrain::trainctl::ClusterOptions o;
    o.dir = absl::GetFlag(FLAGS_dir);
    o.trainers = absl::GetFlag(FLAGS_trainers);
    o.kvstore_shards = absl::GetFlag(FLAGS_kvstore_shards);
    o.kvstore_replicas = absl::GetFlag(FLAGS_kvstore_replicas);
    o.devices_per_trainer = std::max(1, absl::GetFlag(FLAGS_devices_per_trainer));
    o.scheduler_binary = absl::GetFlag(FLAGS_scheduler_bin);
    o.trainer_binary = absl::GetFlag(FLAGS_trainer_bin);
    o.kvstore_binary = absl::GetFlag(FLAGS_kvstore_bin);
    o.start_timeout_s = absl::GetFlag(FLAGS_start_timeout_s);
    o.heartbeat_timeout_s = absl::GetFlag(FLAGS_heartbeat_timeout_s);
    if (o.heartbeat_timeout_s < 0) return Usage("--heartbeat_timeout_s must be >= 0");
    o.max_attempts = absl::GetFlag(FLAGS_max_attempts);
    if (o.max_attempts < 0) return Usage("--max_attempts must be >= 0");
    o.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
    if (o.max_model_bytes < 0) return Usage("--max_model_bytes must be >= 0");
    o.recover_in_place = absl::GetFlag(FLAGS_recover_in_place);
    o.queues_file = absl::GetFlag(FLAGS_queues);
    o.kvstore_data_path = absl::GetFlag(FLAGS_kvstore_data_path);
    if (!o.kvstore_data_path.empty() && o.kvstore_data_path != "auto" &&
        o.kvstore_data_path != "tcp" && o.kvstore_data_path != "grpc") {
      return Usage("--kvstore_data_path must be auto, tcp or grpc, got '" + o.kvstore_data_path +
                   "'");
    }
    o.data_roots = absl::GetFlag(FLAGS_data_roots);
    o.grace_s = absl::GetFlag(FLAGS_grace_s);
    o.restart = absl::GetFlag(FLAGS_restart);
    o.json = Json();
    o.argv0 = argv[0];
    o.insecure = dtrain::rpc::InsecureFlag();
    if (!(o.start_timeout_s > 0) || !(o.grace_s >= 0)) {
      return Usage("--start_timeout_s must be > 0 and --grace_s >= 0");
    }
    return dtrain::trainctl::ClusterMain(std::vector<std::string>(args.begin() + 2, args.end()), o);
  }
  if (absl::Status s = dtrain::rpc::UseCredentialsFromFlags("trainctl"); !s.ok()) {
    std::fprintf(stderr, "trainctl: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  std::string address = absl::GetFlag(FLAGS_scheduler);
  if (address.empty()) {
    const char* env = std::getenv("DTRAIN_SCHEDULER");
    address = env != nullptr && *env ? env : "127.0.0.1:7000";
  }
  if (!(absl::GetFlag(FLAGS_watch_timeout_s) >= 1)) return Usage("--watch_timeout_s must be >= 1");
  // HTTP/2 keepalive: a ping every 10 s while a call is open (watch), and a
  // connection whose pings go unanswered for 10 s is closed, so a dead peer
  // or a half-open connection fails the stream instead of hanging it (the
  // servers accept pings this often: libs/rpc/server.cc).
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  channel_args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  channel_args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A timeline of many ranks is larger than gRPC's default 4 MiB.
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  auto stub = v1::JobService::NewStub(dtrain::rpc::NewChannel(address, channel_args));
  auto need_id = [&]() -> std::string { return args.size() == 3 ? args[2] : ""; };

  if (cmd == "submit") {
    if (args.size() != 2) return Usage("submit takes no arguments (use flags or -f)");
    v1::SubmitRequest req;
    std::string model_file;
    absl::Status built = BuildSpec(req.mutable_spec(), &model_file);
    if (!built.ok()) {
      std::fprintf(stderr, "trainctl: %s\n", std::string(built.message()).c_str());
      return 2;
    }
    // Your own model: checked here, uploaded, then named by its digest.
    if (!model_file.empty()) {
      absl::Status up =
          dtrain::trainctl::UploadModelFile(stub.get(), model_file, req.mutable_spec(),
                                            absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
      if (!up.ok()) return Fail(up);
      if (!Json())
        std::printf("uploaded %s as %s\n", model_file.c_str(), req.spec().model_digest().c_str());
    }
    req.set_request_id(RandomId());
    v1::JobStatus job;
    absl::Status s = WithRetries("JobService.Submit", [&](grpc::ClientContext* ctx) {
      return stub->Submit(ctx, req, &job);
    });
    if (!s.ok()) return Fail(s);
    if (Json()) {
      Print(job, false);
    } else {
      std::printf("submitted %s\n", job.id().c_str());
      std::fflush(stdout);
    }
    return absl::GetFlag(FLAGS_wait) ? Watch(stub.get(), job.id(), address) : 0;
  }
  if (cmd == "get" || cmd == "cancel" || cmd == "watch") {
    std::string id = need_id();
    if (id.empty()) return Usage(cmd + " needs one job id");
    if (cmd == "watch") return Watch(stub.get(), id, address);
    v1::JobStatus job;
    absl::Status s;
    if (cmd == "get") {
      v1::GetRequest req;
      req.set_id(id);
      s = WithRetries("JobService.Get",
                      [&](grpc::ClientContext* ctx) { return stub->Get(ctx, req, &job); });
    } else {
      // Cancel is idempotent while the job runs; a retry after a cancel that
      // took effect answers FAILED_PRECONDITION (already finished).
      v1::CancelRequest req;
      req.set_id(id);
      req.set_reason(absl::GetFlag(FLAGS_reason));
      s = WithRetries("JobService.Cancel",
                      [&](grpc::ClientContext* ctx) { return stub->Cancel(ctx, req, &job); });
    }
    if (!s.ok()) return Fail(s);
    Print(job, cmd == "get");
    return 0;
  }
  if (cmd == "export") {
    std::string id = need_id();
    if (id.empty()) return Usage("export needs one job id");
    if (absl::GetFlag(FLAGS_out).empty()) return Usage("export needs --out=FILE.onnx");
    if (absl::GetFlag(FLAGS_epoch) < 0) return Usage("--epoch must be >= 0");
    absl::StatusOr<dtrain::trainctl::ExportResult> r = dtrain::trainctl::ExportJob(
        stub.get(), id, absl::GetFlag(FLAGS_out), absl::GetFlag(FLAGS_epoch),
        absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
    if (!r.ok()) return Fail(r.status());
    if (Json()) {
      google::protobuf::Struct summary;
      auto& f = *summary.mutable_fields();
      f["job_id"].set_string_value(r->job_id);
      f["out"].set_string_value(r->out);
      f["model"].set_string_value(r->model);
      f["checkpoint"].set_string_value(r->checkpoint);
      f["epoch"].set_number_value(r->epoch);
      f["bytes"].set_number_value(static_cast<double>(r->bytes));
      std::printf("%s\n", ToJson(summary, false).c_str());
    } else {
      std::printf("%s: wrote %s (%lld bytes; %s, the checkpoint of epoch %d)\n", id.c_str(),
                  r->out.c_str(), static_cast<long long>(r->bytes), r->model.c_str(), r->epoch);
    }
    return 0;
  }
  if (cmd == "timeline") {
    std::string id = need_id();
    if (id.empty()) return Usage("timeline needs one job id");
    return Timeline(stub.get(), id);
  }
  if (cmd == "list") {
    if (args.size() != 2) return Usage("list takes no arguments");
    v1::ListRequest req;
    if (!absl::GetFlag(FLAGS_state).empty()) {
      v1::JobState state;
      if (!v1::JobState_Parse(absl::GetFlag(FLAGS_state), &state)) {
        return Usage("--state must be QUEUED, RUNNING, SUCCEEDED, FAILED or CANCELLED");
      }
      req.set_state(state);
    }
    // Every page, in submission order.
    v1::ListReply reply;
    do {
      v1::ListReply page;
      absl::Status s = WithRetries(
          "JobService.List", [&](grpc::ClientContext* ctx) { return stub->List(ctx, req, &page); });
      if (!s.ok()) return Fail(s);
      for (auto& j : *page.mutable_jobs()) *reply.add_jobs() = std::move(j);
      req.set_page_token(page.next_page_token());
    } while (!req.page_token().empty());
    if (Json()) {
      std::printf("%s\n", ToJson(reply, false).c_str());
    } else {
      for (const auto& j : reply.jobs()) Print(j, false);
    }
    return 0;
  }
  if (cmd == "kvstore") {
    if (args.size() != 2) return Usage("kvstore takes no arguments");
    dtrain::kvstore::v1::ShardMap map;
    absl::Status s = WithRetries("JobService.GetKvstoreMap", [&](grpc::ClientContext* ctx) {
      return stub->GetKvstoreMap(ctx, dtrain::kvstore::v1::GetShardMapRequest(), &map);
    });
    if (!s.ok()) return Fail(s);
    if (Json()) {
      std::printf("%s\n", ToJson(map, false).c_str());
      return 0;
    }
    if (map.version() == 0) {
      std::printf(
          "no kvstore shard map yet: no replicated kvstore replica has heartbeated to this "
          "scheduler (unreplicated shards, --kvstore_replicas=1, never do)\n");
      return 0;
    }
    std::printf("%-6s %-8s %-21s %-8s %s\n", "SHARD", "REPLICA", "ADDRESS", "STATE", "ROLE");
    for (const auto& chain : map.chains()) {
      if (chain.members().empty()) {
        std::printf("%-6d %-8s %-21s %-8s %s\n", chain.shard(), "-", "-", "NONE",
                    "no replica: the shard is unavailable");
      }
      for (const std::string& line : dtrain::trainctl::ChainRows(chain)) {
        std::printf("%s\n", line.c_str());
      }
    }
    std::printf("map version %llu, %d shards\n", static_cast<unsigned long long>(map.version()),
                map.num_shards());
    return 0;
  }
  if (cmd == "trainers") {
    if (args.size() != 2) return Usage("trainers takes no arguments");
    v1::ListTrainersReply reply;
    absl::Status s = WithRetries("JobService.ListTrainers", [&](grpc::ClientContext* ctx) {
      return stub->ListTrainers(ctx, v1::ListTrainersRequest(), &reply);
    });
    if (!s.ok()) return Fail(s);
    if (Json()) {
      std::printf("%s\n", ToJson(reply, false).c_str());
    } else {
      std::printf("%-24s %-9s %-20s %-12s %s\n", "ID", "STATE", "NAME", "DEVICES", "JOB");
      for (const v1::TrainerStatus& t : reply.trainers()) {
        std::string state = v1::TrainerState_Name(t.state());
        std::printf(
            "%-24s %-9s %-20s %-12s %s\n", t.id().c_str(), state.c_str(), t.name().c_str(),
            absl::StrJoin(t.devices(), ",").c_str(),
            t.job_ids().empty()
                ? "-"
                : absl::StrCat(absl::StrJoin(t.job_ids(), ","), " rank ", t.rank()).c_str());
      }
    }
    std::fflush(stdout);
    return 0;
  }
  if (cmd == "queues") {
    const bool apply = args.size() == 3 && std::string(args[2]) == "apply";
    if (args.size() != 2 && !apply) return Usage("queues takes no arguments, or apply -f FILE");
    v1::ListQueuesReply reply;
    absl::Status s;
    if (apply) {
      const std::string file = absl::GetFlag(FLAGS_f);
      if (file.empty()) return Usage("queues apply needs -f FILE (a queues file, docs/queues.md)");
      v1::ApplyQueuesRequest req;
      std::ifstream in(file);
      std::stringstream text;
      text << in.rdbuf();
      if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read ", file)));
      req.set_yaml(text.str());
      // Idempotent: applying the same file twice changes nothing more.
      s = WithRetries("JobService.ApplyQueues", [&](grpc::ClientContext* ctx) {
        return stub->ApplyQueues(ctx, req, &reply);
      });
    } else {
      s = WithRetries("JobService.ListQueues", [&](grpc::ClientContext* ctx) {
        return stub->ListQueues(ctx, v1::ListQueuesRequest(), &reply);
      });
    }
    if (!s.ok()) return Fail(s);
    if (Json()) {
      std::printf("%s\n", ToJson(reply, false).c_str());
    } else {
      if (apply) std::printf("applied %s\n", absl::GetFlag(FLAGS_f).c_str());
      std::printf("%s", dtrain::trainctl::QueuesTable(reply).c_str());
    }
    std::fflush(stdout);
    return 0;
  }
  if (cmd == "drain") {
    std::string trainer = need_id();
    if (trainer.empty()) return Usage("drain needs one trainer id or name");
    v1::DrainTrainerRequest req;
    req.set_trainer(trainer);
    v1::TrainerStatus t;
    // Idempotent: draining a draining trainer changes nothing.
    absl::Status s = WithRetries("JobService.DrainTrainer", [&](grpc::ClientContext* ctx) {
      return stub->DrainTrainer(ctx, req, &t);
    });
    if (!s.ok()) return Fail(s);
    if (Json()) {
      std::printf("%s\n", ToJson(t, false).c_str());
    } else {
      std::printf("%s DRAINING%s\n", t.id().c_str(),
                  t.job_ids().empty()
                      ? ""
                      : absl::StrCat(": job ", absl::StrJoin(t.job_ids(), ","), " drains").c_str());
    }
    std::fflush(stdout);
    return 0;
  }
  return Usage("unknown subcommand '" + cmd + "'");
}
