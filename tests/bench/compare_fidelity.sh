#!/usr/bin/env bash
# Accuracy fidelity of dtrain's LeNet against PyTorch 1.13 (Debian's
# /usr/bin/python3), from the same initial weights and in the same data order.
#
#   tests/bench/compare_fidelity.sh [--epochs 10] [--seed 0] [--threads 2]
#   BAZEL="bazel --output_base=/root/.cache/bazel-ob-fid" tests/bench/compare_fidelity.sh
#
# Settings: the chapter's (batch 256, lr 0.2, plain SGD, init normal std 0.01
# with zero biases, mean softmax cross-entropy). Steps:
#   1. bazel build //services/trainer:train_local ($BAZEL, default `bazel`);
#   2. train_local --model=lenet ... --save_initial=$tmp/init.ckpt -o json
#      (the weights dtrain initialized from --seed, before step 1);
#   3. tests/bench/torch_fidelity.py --init_from $tmp/init.ckpt with the same
#      epochs / seed (hence the same epoch_order) / threads.
# Both sides' raw output is echoed, then per epoch
#   fidelity epoch=<e> dtrain_test_acc=<a> pytorch_test_acc=<b> diff=<|a-b|>
#   fidelity_detail epoch=<e> dtrain_loss=... pytorch_loss=... \
#     dtrain_train_acc=... pytorch_train_acc=...
# and finally
#   fidelity dtrain_test_acc_epoch4=<a> dtrain_test_acc_epoch10=<a>
#   fidelity max_diff=<m> limit=0.02 verdict=PASS|FAIL
# (an epoch beyond --epochs is reported as "n/a"). Exit status: 0 for PASS,
# 1 for FAIL or a failed step, 2 for bad arguments.
set -euo pipefail
cd "$(dirname "$0")/../.."

epochs=10
seed=0
threads=2
limit=0.02
BAZEL=${BAZEL:-bazel}
PY=/usr/bin/python3   # Debian's python3 has torch 1.13; the PATH one may not

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "compare_fidelity.sh: unknown argument $1" >&2; usage ;;
  esac
done
for v in "$epochs" "$seed" "$threads"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "compare_fidelity.sh: not a number: $v" >&2; exit 2; }
done
[ "$epochs" -ge 1 ] || { echo "compare_fidelity.sh: --epochs must be >= 1" >&2; exit 2; }

tmp=$(mktemp -d /tmp/compare_fidelity.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

echo "# compare_fidelity.sh: lenet, batch_size=256 lr=0.2 sgd init=normal(0,0.01)+zero_bias" \
     "epochs=$epochs seed=$seed threads=$threads limit=$limit"
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

# 2. dtrain.
dtrain_cmd=("$bin" --model=lenet --batch_size=256 --lr=0.2 --momentum=0 --weight_decay=0
            --init=normal --init_std=0.01 --epochs="$epochs" --threads="$threads"
            --seed="$seed" --save_initial="$tmp/init.ckpt" -o json)
echo "# dtrain: ${dtrain_cmd[*]}"
t0=$(date +%s)
if ! "${dtrain_cmd[@]}" >"$tmp/dtrain.json" 2>"$tmp/dtrain.err"; then
  echo "compare_fidelity.sh: train_local failed:" >&2
  cat "$tmp/dtrain.err" >&2
  exit 1
fi
echo "# dtrain took $(( $(date +%s) - t0 ))s"
cat "$tmp/dtrain.json"

# 3. PyTorch from dtrain's initial weights.
torch_cmd=("$PY" tests/bench/torch_fidelity.py --epochs "$epochs" --seed "$seed"
           --threads "$threads" --batch_size 256 --lr 0.2 --init_from "$tmp/init.ckpt")
echo "# pytorch: ${torch_cmd[*]}"
t0=$(date +%s)
if ! "${torch_cmd[@]}" >"$tmp/torch.txt" 2>"$tmp/torch.err"; then
  echo "compare_fidelity.sh: torch_fidelity.py failed:" >&2
  cat "$tmp/torch.err" >&2
  exit 1
fi
echo "# pytorch took $(( $(date +%s) - t0 ))s"
cat "$tmp/torch.txt"

# 4. Compare.
"$PY" - "$tmp/dtrain.json" "$tmp/torch.txt" "$epochs" "$limit" <<'EOF'
import json
import re
import sys

dtrain_path, torch_path, epochs, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with open(dtrain_path) as f:
    ours = {e["epoch"]: e for e in json.load(f)["epochs"]}
theirs = {}
with open(torch_path) as f:
    for line in f:
        if line.startswith("epoch="):
            kv = dict(re.findall(r"(\w+)=(\S+)", line))
            theirs[int(kv["epoch"])] = kv
missing = [e for e in range(1, epochs + 1) if e not in ours or e not in theirs]
if missing:
    print("compare_fidelity.sh: epochs missing from the output: %s" % missing, file=sys.stderr)
    sys.exit(1)
max_diff = 0.0
for e in range(1, epochs + 1):
    a, b = ours[e]["test_accuracy"], float(theirs[e]["test_acc"])
    d = abs(a - b)
    max_diff = max(max_diff, d)
    print("fidelity epoch=%d dtrain_test_acc=%.4f pytorch_test_acc=%.4f diff=%.4f" % (e, a, b, d))
    print("fidelity_detail epoch=%d dtrain_loss=%.6f pytorch_loss=%s dtrain_train_acc=%.4f "
          "pytorch_train_acc=%s" % (e, ours[e]["loss"], theirs[e]["loss"],
                                    ours[e]["train_accuracy"], theirs[e]["train_acc"]))
at = lambda e: "%.4f" % ours[e]["test_accuracy"] if e in ours else "n/a"
print("fidelity dtrain_test_acc_epoch4=%s dtrain_test_acc_epoch10=%s" % (at(4), at(10)))
# Accuracies are multiples of 1/10000; round so that e.g. 0.0200 passes.
verdict = "PASS" if round(max_diff, 6) <= limit else "FAIL"
print("fidelity max_diff=%.4f limit=%g verdict=%s" % (max_diff, limit, verdict))
sys.exit(0 if verdict == "PASS" else 1)
EOF
