#!/usr/bin/env bash
# Starts a local dtrain cluster on loopback (scheduler_server, one
# kvstore_server shard (a chain of one replica), one trainer daemon), a real Prometheus (Debian's
# package) scraping the scheduler, the shard and the trainer every second, runs a small MLP
# job through trainctl, then asks Prometheus's HTTP API for every metric the
# rules and the dashboard name (extracted by metric_names.py) and fails unless
# each is ingested with job=<the service that should export it>. Metrics of
# other exporters (kubelet_*) are listed and skipped. Each service's /metrics
# must also pass `promtool check metrics`. Everything it starts is
# stopped at the end. Bounded: about 30-60 s.
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v prometheus >/dev/null || fail "prometheus not installed (tools/setup)"
R="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-dtrain}"
[ -d "$R/k8s" ] || R=$(cd "$(dirname "$0")/../.." && pwd)
bin() { local f="$R/$1"; [ -x "$f" ] || fail "missing $1 (build //${1%/*}:${1##*/})"; echo "$f"; }
SCHED=$(bin services/scheduler/scheduler_server)
KV=$(bin services/kvstore/kvstore_server)
TRAINER=$(bin services/trainer/trainer)
CTL=$(bin services/trainctl/trainctl)
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/ingest.XXXXXX")
# Plain text on purpose: this test is about metric ingestion (Prometheus
# scrapes /metrics over HTTP either way) and checks the gRPC health ports
# with curl over h2c. The TLS paths are tests/e2e's.
export DTRAIN_INSECURE=1
pids=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]+"${pids[@]}"}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  if [ "${keep:-0}" = 0 ]; then rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'keep=1; for f in "$dir"/*.log; do echo "--- $f"; tail -20 "$f"; done >&2' ERR

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_file() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done; fail "$2 did not start"; }

sm=$(free_port); km=$(free_port); tm=$(free_port); pp=$(free_port)
# Queues whose quotas name trainers, so every per-queue series exists (the
# shipped k8s/base/config/queues.yaml limits nothing); the job runs in
# "default" (an --insecure caller is the user "", which only "*" matches).
cat >"$dir/queues.yaml" <<EOQ
queues:
  - name: default
    cohort: all
    quota: {trainers: 1}
    users: ["*"]
  - name: spare
    cohort: all
    quota: {trainers: 1}
    users: [nobody]
EOQ
"$SCHED" --listen=127.0.0.1:0 --port_file="$dir/scheduler.port" --data_dir="$dir/scheduler" \
  --metrics_listen=127.0.0.1:$sm --queues="$dir/queues.yaml" \
  >"$dir/scheduler.log" 2>&1 & pids+=($!)
wait_file "$dir/scheduler.port" scheduler_server
# A replicated shard of one replica: it heartbeats to the scheduler, whose
# shard map metrics (dtrain_scheduler_kvstore_*) then have series.
"$KV" --listen=127.0.0.1:0 --port_file="$dir/kvstore.port" --data_dir="$dir/kvstore" \
  --shard_index=0 --replica_index=0 --num_shards=1 \
  --scheduler="127.0.0.1:$(cat "$dir/scheduler.port")" \
  --metrics_listen=127.0.0.1:$km >"$dir/kvstore.log" 2>&1 & pids+=($!)
wait_file "$dir/kvstore.port" kvstore_server
export DTRAIN_SCHEDULER="127.0.0.1:$(cat "$dir/scheduler.port")"
"$TRAINER" --scheduler="$DTRAIN_SCHEDULER" --name=trainer-0 --devices=cpu \
  --work_dir="$dir/trainer-0" --metrics_listen=127.0.0.1:$tm --health_listen=127.0.0.1:0 \
  --health_port_file="$dir/trainer-0.health_port" >"$dir/trainer-0.log" 2>&1 & pids+=($!)
wait_file "$dir/trainer-0.health_port" "trainer (health server)"

# The job labels are the ones the cluster's scrape config (and PodMonitor
# jobLabel) give the services.
cat >"$dir/prometheus.yml" <<EOC
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: dtrain-scheduler
    static_configs: [{targets: ["127.0.0.1:$sm"]}]
  - job_name: dtrain-kvstore
    static_configs: [{targets: ["127.0.0.1:$km"]}]
  - job_name: dtrain-trainer
    static_configs: [{targets: ["127.0.0.1:$tm"]}]
EOC
promtool check config "$dir/prometheus.yml" >/dev/null
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address=127.0.0.1:$pp --log.level=warn >"$dir/prometheus.log" 2>&1 & pids+=($!)
api="http://127.0.0.1:$pp"
for _ in $(seq 100); do curl -sf "$api/-/ready" >/dev/null 2>&1 && break; sleep 0.2; done
curl -sf "$api/-/ready" >/dev/null || fail "prometheus did not become ready"

timeout 90 "$CTL" submit --name=ingest --model=mlp --epochs=1 --train_limit=2048 --test_limit=500 \
  --batch_size=128 --lr=0.1 --num_trainers=1 --device_kind=cpu --wait >"$dir/trainctl.log" 2>&1 \
  || { cat "$dir/trainctl.log" >&2; fail "the job did not succeed"; }
grep -q SUCCEEDED "$dir/trainctl.log" || { cat "$dir/trainctl.log" >&2; fail "job not SUCCEEDED"; }

# One gRPC health check of each server (over h2c with curl), as the kubelet's
# probes make: the kvstore serves no other call in this allreduce job and the
# trainer's gRPC port serves only probes, and per-method RPC series appear
# with the first call.
for f in scheduler.port kvstore.port trainer-0.health_port; do
  printf '\0\0\0\0\0' | curl -sf --http2-prior-knowledge -H 'content-type: application/grpc' \
    -H 'te: trailers' --data-binary @- \
    "http://127.0.0.1:$(cat "$dir/$f")/grpc.health.v1.Health/Check" >/dev/null \
    || fail "gRPC health check of ${f%%.*}"
done

# Every endpoint's exposition passes promtool's lint (after the job, so the
# trainer's per-job series, the step phases among them, are there).
for port in $sm $km $tm; do
  curl -sf "http://127.0.0.1:$port/metrics" >"$dir/metrics.$port.txt" || fail "scraping :$port"
  promtool check metrics <"$dir/metrics.$port.txt" >"$dir/lint.$port.txt" 2>&1 \
    || { cat "$dir/lint.$port.txt" >&2; fail "promtool check metrics on :$port"; }
done
grep -q '^dtrain_trainer_step_phase_seconds_count{.*phase="forward_backward"' "$dir/metrics.$tm.txt" \
  || fail "the trainer exports no step phases"
echo "ok   promtool check metrics: scheduler, kvstore, trainer"

python3 "$R/k8s/tests/metric_names.py" "$R"/k8s/monitoring/rules/*.yml "$R"/k8s/dashboards/*.json \
  >"$dir/wanted.tsv"
[ "$(wc -l <"$dir/wanted.tsv")" -ge 10 ] || fail "too few metric names extracted"
python3 - "$api" "$dir/wanted.tsv" <<'EOP'
import json, sys, time, urllib.parse, urllib.request
api, wanted = sys.argv[1], [l.rstrip("\n").split("\t") for l in open(sys.argv[2])]
def series(match):
    q = urllib.parse.urlencode({"match[]": match, "start": time.time() - 600})
    r = json.load(urllib.request.urlopen(f"{api}/api/v1/series?{q}", timeout=10))
    assert r["status"] == "success", r
    return r["data"]
def check():
    bad, good, skipped = [], [], []
    for name, exporter in wanted:
        if exporter == "kubelet":
            skipped.append(name); continue
        if exporter in ("UNKNOWN", "UNRECORDED"):
            bad.append(f"{name}: {exporter.lower()} (no dtrain service exports it / no rule records it)"); continue
        if exporter.startswith("prometheus:"):
            job = exporter.split(":", 1)[1]
            r = json.load(urllib.request.urlopen(
                f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": f'up{{job="{job}"}}'}), timeout=10))
            vals = [s["value"][1] for s in r["data"]["result"]]
            if vals != ["1"]: bad.append(f'up{{job="{job}"}} = {vals} (want one target, up)')
            else: good.append(f'ok   up{{job="{job}"}} = 1')
            continue
        got = series(name)
        jobs = sorted({s.get("job") for s in got})
        want = sorted(exporter.split(","))
        if not got: bad.append(f"{name}: not ingested (expected from {exporter})")
        elif jobs != want: bad.append(f"{name}: ingested from job {jobs}, expected {want}")
        else: good.append(f"ok   {name:50s} job={exporter} ({len(got)} series)")
    # Label values the rules select on must exist too.
    for sel in ['dtrain_scheduler_requests_total{job="dtrain-scheduler",method="ReportProgress",code="OK"}',
                'dtrain_scheduler_jobs{job="dtrain-scheduler",state="RUNNING"}',
                'dtrain_kvstore_request_duration_seconds_bucket{job="dtrain-kvstore",method="Push"}',
                'dtrain_kvstore_request_duration_seconds_bucket{job="dtrain-kvstore",method="Pull"}',
                'dtrain_trainer_step_seconds_count{job="dtrain-trainer",phase="compute",rank="0"}',
                'dtrain_trainer_step_seconds_sum{job="dtrain-trainer",phase="communication"}',
                'dtrain_trainer_busy{job="dtrain-trainer"}',
                'dtrain_trainer_step_phase_seconds_count{job="dtrain-trainer",phase="data_wait",rank="0"}',
                'dtrain_trainer_step_phase_seconds_count{job="dtrain-trainer",phase="forward_backward",rank="0"}',
                'dtrain_trainer_step_phase_seconds_count{job="dtrain-trainer",phase="comm_wait",rank="0"}',
                'dtrain_trainer_step_phase_seconds_bucket{job="dtrain-trainer",phase="optimizer",rank="0"}',
                'dtrain_trainer_samples_total{job="dtrain-trainer",rank="0"}',
                'dtrain_trainer_samples_per_second{job="dtrain-trainer",rank="0"}',
                'dtrain_scheduler_stragglers{job="dtrain-scheduler"}',
                'dtrain_rpc_server_requests_total{job="dtrain-scheduler",grpc_service="dtrain.scheduler.v1.JobService",grpc_method="Submit",grpc_code="OK"}',
                'dtrain_rpc_server_requests_total{job="dtrain-scheduler",grpc_service="dtrain.scheduler.v1.ClusterService",grpc_method="Heartbeat",grpc_code="OK"}',
                'dtrain_rpc_server_requests_total{job="dtrain-kvstore",grpc_service="grpc.health.v1.Health",grpc_method="Check",grpc_code="OK"}',
                'dtrain_rpc_server_request_duration_seconds_bucket{job="dtrain-kvstore",grpc_service="grpc.health.v1.Health",grpc_method="Check"}',
                'dtrain_rpc_server_requests_total{job="dtrain-trainer",grpc_service="grpc.health.v1.Health",grpc_method="Check",grpc_code="OK"}']:
        if series(sel): good.append(f"ok   {sel}")
        else: bad.append(f"{sel}: no such series")
    return bad, good, skipped
deadline = time.time() + 30  # scrapes every second; the first may take a few
while True:
    bad, good, skipped = check()
    if not bad or time.time() > deadline: break
    time.sleep(1)
for g in good: print(g)
for s in skipped: print(f"skip {s:55s} (exported by the kubelet, not in this test)")
for b in bad: print("FAIL", b)
print(f"{len(good)} metrics ingested from the right service, {len(bad)} missing or wrong, {len(skipped)} external")
sys.exit(1 if bad else 0)
EOP
