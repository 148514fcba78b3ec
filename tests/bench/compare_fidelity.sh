#!/usr/bin/env bash
# Accuracy fidelity of dtrain's LeNet against PyTorch 1.13 (Debian's
# /usr/bin/python3), from the same initial weights and in the same data order.
#
#   tests/bench/compare_fidelity.sh [--epochs 10] [--seed 0 | --seeds 0,1,2] [--threads 2]
#   BAZEL="bazel --output_base=/root/.cache/bazel-ob-fid" tests/bench/compare_fidelity.sh
#
# Settings: the chapter's (batch 256, lr 0.2, plain SGD, init normal std 0.01
# with zero biases, mean softmax cross-entropy). Steps:
#   1. bazel build //services/trainer:train_local ($BAZEL, default `bazel`);
#   2. train_local --model=lenet ... --save_initial=$tmp/init.ckpt -o json
#      (the weights dtrain initialized from --seed, before step 1);
#   3. tests/bench/torch_fidelity.py --init_from $tmp/init.ckpt with the same
#      epochs / seed (hence the same epoch_order) / threads.
# Single seed (--seed S, the default): both sides' raw output is echoed, then
#   fidelity epoch=<e> dtrain_test_acc=<a> pytorch_test_acc=<b> diff=<|a-b|>
#   fidelity_detail epoch=<e> dtrain_loss=... pytorch_loss=... \
#     dtrain_train_acc=... pytorch_train_acc=...
# and finally
#   fidelity dtrain_test_acc_epoch4=<a> dtrain_test_acc_epoch10=<a>
#   fidelity max_diff=<m> limit=0.02 verdict=PASS|FAIL
# (an epoch beyond --epochs is reported as "n/a"). Exit status: 0 for PASS,
# 1 for FAIL or a failed step, 2 for bad arguments.
# Several seeds (--seeds S1,S2,...; same --epochs and --threads for each):
# steps 2-3 run per seed (raw output echoed), then for each seed the lines
# above with seed=<s> after the line's first word, e.g.
#   fidelity seed=<s> epoch=<e> dtrain_test_acc=<a> pytorch_test_acc=<b> diff=<d>
#   fidelity_seed seed=<s> max_diff=<m> limit=0.02 verdict=PASS|FAIL
# then per epoch the mean test accuracy over the seeds of each framework
# (means and their differences with 6 decimals, not rounded to 1/10000)
#   fidelity_mean epoch=<e> dtrain_mean=<a> pytorch_mean=<b> diff=<|a-b|> seeds=<n>
# and finally
#   fidelity_mean dtrain_mean_epoch4=<a> dtrain_mean_epoch10=<a>
#   fidelity_mean max_diff=<m> limit=0.02 verdict=PASS|FAIL
# Exit status with --seeds: 0 when the fidelity_mean verdict is PASS (even if
# a single seed's verdict is FAIL), 1 when it is FAIL or a step failed, 2 for
# bad arguments.
set -euo pipefail
cd "$(dirname "$0")/../.."

epochs=10
seed=0
seeds=""
threads=2
limit=0.02
BAZEL=${BAZEL:-bazel}
PY=/usr/bin/python3   # Debian's python3 has torch 1.13; the PATH one may not

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=${2-}; shift 2 || usage ;;
    --seed) seed=${2-}; seeds=""; shift 2 || usage ;;
    --seeds) seeds=${2-}; shift 2 || usage ;;
    --threads) threads=${2-}; shift 2 || usage ;;
    -h|--help) usage ;;
    *) echo "compare_fidelity.sh: unknown argument $1" >&2; usage ;;
  esac
done
multi=0
if [ -n "$seeds" ]; then
  multi=1
  [[ "$seeds" =~ ^[0-9]+(,[0-9]+)*$ ]] || {
    echo "compare_fidelity.sh: --seeds wants a comma-separated list of numbers: $seeds" >&2; exit 2; }
  IFS=, read -r -a seed_list <<<"$seeds"
  if [ "$(printf '%s\n' "${seed_list[@]}" | sort -n | uniq -d | wc -l)" -ne 0 ]; then
    echo "compare_fidelity.sh: --seeds has a repeated seed: $seeds" >&2; exit 2
  fi
else
  seed_list=("$seed")
fi
for v in "$epochs" "$threads" "${seed_list[@]}"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "compare_fidelity.sh: not a number: $v" >&2; exit 2; }
done
[ "$epochs" -ge 1 ] || { echo "compare_fidelity.sh: --epochs must be >= 1" >&2; exit 2; }
[ "$threads" -ge 1 ] || { echo "compare_fidelity.sh: --threads must be >= 1" >&2; exit 2; }

tmp=$(mktemp -d /tmp/compare_fidelity.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

if [ "$multi" = 1 ]; then
  seed_desc="seeds=$(IFS=,; echo "${seed_list[*]}")"
else
  seed_desc="seed=$seed"
fi
echo "# compare_fidelity.sh: lenet, batch_size=256 lr=0.2 sgd init=normal(0,0.01)+zero_bias" \
     "epochs=$epochs $seed_desc threads=$threads limit=$limit"
echo "# git=$(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "dirty_files=$(git status --porcelain 2>/dev/null | wc -l)"

# 1. Build.
if ! $BAZEL build --noshow_progress //services/trainer:train_local >"$tmp/build.log" 2>&1; then
  echo "compare_fidelity.sh: bazel build //services/trainer:train_local failed:" >&2
  tail -n 40 "$tmp/build.log" >&2
  exit 1
fi
bin=$($BAZEL info bazel-bin 2>/dev/null)/services/trainer/train_local
[ -x "$bin" ] || { echo "compare_fidelity.sh: no binary at $bin" >&2; exit 1; }

# Steps 2 and 3 for one seed; outputs in $tmp/<seed>/.
run_seed() {
  local s=$1 d="$tmp/$1" tag="" t0
  [ "$multi" = 1 ] && tag=" seed=$s"
  mkdir -p "$d"
  # 2. dtrain.
  local dtrain_cmd=("$bin" --model=lenet --batch_size=256 --lr=0.2 --momentum=0 --weight_decay=0
                    --init=normal --init_std=0.01 --epochs="$epochs" --threads="$threads"
                    --seed="$s" --save_initial="$d/init.ckpt" -o json)
  echo "# dtrain$tag: ${dtrain_cmd[*]}"
  t0=$(date +%s)
  if ! "${dtrain_cmd[@]}" >"$d/dtrain.json" 2>"$d/dtrain.err"; then
    echo "compare_fidelity.sh: train_local failed (seed $s):" >&2
    cat "$d/dtrain.err" >&2
    return 1
  fi
  echo "# dtrain$tag took $(( $(date +%s) - t0 ))s"
  cat "$d/dtrain.json"

  # 3. PyTorch from dtrain's initial weights.
  local torch_cmd=("$PY" tests/bench/torch_fidelity.py --epochs "$epochs" --seed "$s"
                   --threads "$threads" --batch_size 256 --lr 0.2 --init_from "$d/init.ckpt")
  echo "# pytorch$tag: ${torch_cmd[*]}"
  t0=$(date +%s)
  if ! "${torch_cmd[@]}" >"$d/torch.txt" 2>"$d/torch.err"; then
    echo "compare_fidelity.sh: torch_fidelity.py failed (seed $s):" >&2
    cat "$d/torch.err" >&2
    return 1
  fi
  echo "# pytorch$tag took $(( $(date +%s) - t0 ))s"
  cat "$d/torch.txt"
}

compare_args=()
for s in "${seed_list[@]}"; do
  run_seed "$s" || exit 1
  compare_args+=("$s" "$tmp/$s/dtrain.json" "$tmp/$s/torch.txt")
done

# 4. Compare.
"$PY" - "$multi" "$epochs" "$limit" "${compare_args[@]}" <<'EOF'
import json
import re
import sys

multi, epochs, limit = sys.argv[1] == "1", int(sys.argv[2]), float(sys.argv[3])
rest = sys.argv[4:]
runs = [(int(rest[i]), rest[i + 1], rest[i + 2]) for i in range(0, len(rest), 3)]


def verdict_of(max_diff):
    # Accuracies are multiples of 1/10000; round so that e.g. 0.0200 passes.
    return "PASS" if round(max_diff, 6) <= limit else "FAIL"


def load(dtrain_path, torch_path):
    with open(dtrain_path) as f:
        ours = {e["epoch"]: e for e in json.load(f)["epochs"]}
    theirs = {}
    with open(torch_path) as f:
        for line in f:
            if line.startswith("epoch="):
                kv = dict(re.findall(r"(\w+)=(\S+)", line))
                theirs[int(kv["epoch"])] = kv
    return ours, theirs


acc = {}  # seed -> {epoch: (dtrain, pytorch)}
verdicts = []
for seed, dtrain_path, torch_path in runs:
    ours, theirs = load(dtrain_path, torch_path)
    missing = [e for e in range(1, epochs + 1) if e not in ours or e not in theirs]
    if missing:
        print("compare_fidelity.sh: epochs missing from the output (seed %d): %s"
              % (seed, missing), file=sys.stderr)
        sys.exit(1)
    tag = " seed=%d" % seed if multi else ""
    max_diff = 0.0
    acc[seed] = {}
    for e in range(1, epochs + 1):
        a, b = ours[e]["test_accuracy"], float(theirs[e]["test_acc"])
        acc[seed][e] = (a, b)
        d = abs(a - b)
        max_diff = max(max_diff, d)
        print("fidelity%s epoch=%d dtrain_test_acc=%.4f pytorch_test_acc=%.4f diff=%.4f"
              % (tag, e, a, b, d))
        print("fidelity_detail%s epoch=%d dtrain_loss=%.6f pytorch_loss=%s "
              "dtrain_train_acc=%.4f pytorch_train_acc=%s"
              % (tag, e, ours[e]["loss"], theirs[e]["loss"],
                 ours[e]["train_accuracy"], theirs[e]["train_acc"]))
    at = lambda e: "%.4f" % ours[e]["test_accuracy"] if e in ours else "n/a"
    print("fidelity%s dtrain_test_acc_epoch4=%s dtrain_test_acc_epoch10=%s" % (tag, at(4), at(10)))
    verdict = verdict_of(max_diff)
    verdicts.append(verdict)
    if multi:
        print("fidelity_seed seed=%d max_diff=%.4f limit=%g verdict=%s"
              % (seed, max_diff, limit, verdict))
    else:
        print("fidelity max_diff=%.4f limit=%g verdict=%s" % (max_diff, limit, verdict))

if not multi:
    sys.exit(0 if verdicts[0] == "PASS" else 1)

n = len(runs)
means = {}
max_diff = 0.0
for e in range(1, epochs + 1):
    a = sum(acc[s][e][0] for s in acc) / n
    b = sum(acc[s][e][1] for s in acc) / n
    means[e] = (a, b)
    d = abs(a - b)
    max_diff = max(max_diff, d)
    print("fidelity_mean epoch=%d dtrain_mean=%.6f pytorch_mean=%.6f diff=%.6f seeds=%d"
          % (e, a, b, d, n))
at = lambda e: "%.6f" % means[e][0] if e in means else "n/a"
print("fidelity_mean dtrain_mean_epoch4=%s dtrain_mean_epoch10=%s" % (at(4), at(10)))
verdict = verdict_of(max_diff)
print("fidelity_mean max_diff=%.6f limit=%g verdict=%s" % (max_diff, limit, verdict))
sys.exit(0 if verdict == "PASS" else 1)
EOF
