#!/bin/bash
# Recovery benchmark (issue #15): how long a 2-trainer CPU LeNet ALLREDUCE job
# takes to recover in place from a SIGKILL of its rank 0 trainer, over RUNS
# runs, and how long the same job takes to finish after the same kill with
# checkpoint-restart (--recover_in_place=false) in the same invocation.
# Modes async and bounded time the same kill and in-place recovery of a
# KVSTORE job whose weights the kvstore holds (one shard, lr 0.02:
# ASYNCHRONOUS, or BOUNDED_DELAY with --max_staleness=2).
#
#   bazel build //services/trainctl //services/trainer //services/scheduler:scheduler_server \
#     //services/kvstore:kvstore_server
#   tests/bench/recovery/run.sh [RUNS] [inplace|requeue|both|async|bounded|kvstore]
#   (both: inplace and requeue; kvstore: async and bounded)
#
# Each run: `trainctl cluster up --restart=never --trainers=3
# --heartbeat_timeout_s=3` (one spare), the job (3 epochs of 48 steps, a
# checkpoint every epoch), SIGKILL of rank 0's trainer once the job is at
# epoch 2 step >= 10, then polling until the job ends. Prints one `run ...`
# line per run, then key=value lines:
#   recovery_seconds_p50/p90/max  JobStatus.last_recovery_seconds (in place:
#                                 the failed step to the next completed step)
#   async_recovery_seconds_*, bounded_recovery_seconds_*   the same for the
#                                 KVSTORE modes (from the victim's last
#                                 heartbeat to the replacement's first step)
#   inplace_finish_after_kill_s_p50, requeue_finish_after_kill_s_p50
#   requeue_over_inplace_finish   ratio of the two medians (> 1: in place
#                                 finishes sooner)
#   inplace_attempts_max, inplace_steps_lost_max, *_failed (runs not SUCCEEDED)
# Needs python3 (JSON). Binaries from bazel-bin (TRAINCTL overrides).
set -u
RUNS=${1:-10}
MODES=${2:-both}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
T=${TRAINCTL:-$ROOT/bazel-bin/services/trainctl/trainctl}
[ -x "$T" ] || { echo "no trainctl at $T: build //services/trainctl first" >&2; exit 1; }
WORK=$(mktemp -d /tmp/dtrain-recovery-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results"
: >"$RESULTS"

field() {  # JSON on stdin -> the named fields, space-separated
  python3 -c '
import json, sys
d = json.load(sys.stdin)
out = []
for k in sys.argv[1:]:
    v = d.get(k)
    if v is None:  # proto3 JSON: camelCase names, zero values left out
        parts = k.split("_")
        v = d.get(parts[0] + "".join(p.title() for p in parts[1:]), 0)
    if isinstance(v, list): v = v[0] if v else "-"
    out.append(str(v))
print(" ".join(out))' "$@"
}

one_run() {  # MODE I
  local mode=$1 i=$2 d="$WORK/$1-$2" flags="" id st ep step t0 pid k e j
  local sync="--sync=ALLREDUCE --lr=0.05"
  case "$mode" in
    requeue) flags="--recover_in_place=false" ;;
    async | bounded)
      flags="--kvstore_shards=1 --kvstore_replicas=1"
      sync="--sync=KVSTORE --lr=0.02 --consistency=ASYNCHRONOUS"
      [ "$mode" = bounded ] && sync="--sync=KVSTORE --lr=0.02 --consistency=BOUNDED_DELAY --max_staleness=2"
      ;;
  esac
  local out
  out=$("$T" cluster up --restart=never --trainers=3 --heartbeat_timeout_s=3 $flags --dir="$d" 2>&1) || {
    echo "cluster up failed: $out" >&2; return 1; }
  eval "$(echo "$out" | grep '^export ')"
  # shellcheck disable=SC2086
  id=$("$T" submit -o json --name=bench --model=lenet --epochs=3 --batch_size=128 $sync \
      --momentum=0.9 --init=kaiming --seed=3 --train_limit=6144 --test_limit=2000 --threads=1 \
      --num_trainers=2 --checkpoint_interval_epochs=1 | field id)
  local deadline=$((SECONDS + 120))
  while :; do
    read -r st ep step t0 <<<"$("$T" get "$id" -o json | field state epoch step trainers)"
    [ "$st" = RUNNING ] && [ "$ep" = 1 ] && [ "$step" -ge 10 ] && break
    if [ "$SECONDS" -gt "$deadline" ] || [ "$ep" -ge 2 ] 2>/dev/null; then
      echo "run $mode $i: missed the kill point (state $st epoch $ep step $step)" >&2
      "$T" cluster down --grace_s=3 --dir="$d" >/dev/null 2>&1
      return 1
    fi
    sleep 0.02
  done
  # The pid of the process whose log says it registered as rank 0's trainer.
  local log
  log=$(grep -l "registered as $t0;" "$d"/trainer-*.log | head -1)
  pid=$(python3 -c '
import json, sys
d, log = sys.argv[1], sys.argv[2]
for p in json.load(open(d + "/cluster.json"))["processes"]:
    if d + "/" + p["name"] + ".log" == log: print(int(p["pid"]))' "$d" "$log")
  kill -9 "$pid"
  k=$(date +%s.%N)
  deadline=$((SECONDS + 180))
  while :; do
    j=$("$T" get "$id" -o json)
    st=$(echo "$j" | field state)
    case "$st" in SUCCEEDED | FAILED | CANCELLED) break ;; esac
    [ "$SECONDS" -gt "$deadline" ] && break
    sleep 0.05
  done
  e=$(date +%s.%N)
  read -r st att rec last lost acc <<<"$(echo "$j" | field state attempts recoveries last_recovery_seconds steps_lost test_accuracy)"
  local fin
  fin=$(python3 -c "print(round($e - $k, 2))")
  echo "run mode=$mode i=$i kill_epoch=$((ep + 1)) kill_step=$step state=$st finish_after_kill_s=$fin attempts=$att recoveries=$rec last_recovery_seconds=$last steps_lost=$lost test_accuracy=$acc"
  echo "$mode $st $fin $att $rec $last $lost" >>"$RESULTS"
  "$T" cluster down --grace_s=3 --dir="$d" >/dev/null 2>&1
}

case "$MODES" in
  both) set -- inplace requeue ;;
  kvstore) set -- async bounded ;;
  inplace | requeue | async | bounded) set -- "$MODES" ;;
  *) echo "unknown mode '$MODES' (inplace, requeue, both, async, bounded or kvstore)" >&2; exit 2 ;;
esac
for mode in "$@"; do
  for i in $(seq "$RUNS"); do one_run "$mode" "$i"; done
done

python3 - "$RESULTS" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def pct(v, p):
    v = sorted(v)
    if not v: return float("nan")
    i = min(len(v) - 1, max(0, int(round(p / 100 * (len(v) - 1)))))
    return v[i]
out = {}
for mode in ("inplace", "requeue", "async", "bounded"):
    mine = [r for r in rows if r[0] == mode]
    if not mine: continue
    ok = [r for r in mine if r[1] == "SUCCEEDED"]
    out[f"{mode}_runs"] = len(mine)
    out[f"{mode}_failed"] = len(mine) - len(ok)
    fin = [float(r[2]) for r in ok]
    out[f"{mode}_finish_after_kill_s_p50"] = round(pct(fin, 50), 2)
    out[f"{mode}_finish_after_kill_s_max"] = round(max(fin), 2) if fin else float("nan")
    out[f"{mode}_attempts_max"] = max(int(r[3]) for r in ok) if ok else 0
    if mode != "requeue":
        pre = "" if mode == "inplace" else mode + "_"
        rec = [float(r[5]) for r in ok if float(r[5]) > 0]
        out[f"{pre}recovery_samples"] = len(rec)
        for p in (50, 90):
            out[f"{pre}recovery_seconds_p{p}"] = round(pct(rec, p), 2)
        out[f"{pre}recovery_seconds_min"] = round(min(rec), 2) if rec else float("nan")
        out[f"{pre}recovery_seconds_max"] = round(max(rec), 2) if rec else float("nan")
        out[f"{mode}_steps_lost_max"] = max(int(r[6]) for r in ok) if ok else 0
        out[f"{mode}_recoveries_max"] = max(int(r[4]) for r in ok) if ok else 0
if "inplace_finish_after_kill_s_p50" in out and "requeue_finish_after_kill_s_p50" in out:
    out["requeue_over_inplace_finish"] = round(
        out["requeue_finish_after_kill_s_p50"] / out["inplace_finish_after_kill_s_p50"], 3)
for k, v in out.items(): print(f"{k}={v}")
PY
