#!/usr/bin/env bash
# Gradient compression on a real job: LeNet on Fashion-MNIST, 2 trainers
# synchronized through the kvstore (2 shards of 2 replicas, mutual TLS: the
# cluster `trainctl cluster up` starts), once per compression, back to back
# on one cluster. Prints one line per job and one per compressed job against
# the uncompressed one:
#   compression name=<c> data_path=<p> samples_per_s=<x> test_accuracy=<a> seconds=<t> pushed_MB=<m>
#   compression_vs_none name=<c> speed_ratio=<x / x_none> accuracy_delta=<a - a_none>
#     pushed_ratio=<m / m_none>
#     (goal for f16 and bf16: |accuracy_delta| <= 0.01; top-k trades
#     accuracy for bytes, see libs/kvstore/README.md)
# pushed_MB: value bytes the shards received in pushes during the job (their
# dtrain_kvstore_push_bytes_total counters).
#
#   tests/bench/kvstore/compression.sh [--epochs 5]
#       [--compressions none,f16,bf16,topk,topk:0.1] [--data_path auto|tcp|grpc] [--bin DIR]
# --data_path: how the trainers reach the shards (trainctl cluster up
# --kvstore_data_path; default auto, the data port); grpc gives the figures
# of the gRPC data path, for a before/after in one session.
# --bin DIR: built binaries (DIR/services/trainctl/trainctl ...; a bazel-bin),
# no build (to time on an otherwise idle machine).
set -euo pipefail
cd "$(dirname "$0")/../../.."
epochs=5 compressions=none,f16,bf16 bin= data_path=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --compressions) compressions=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --data_path) data_path=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "compression.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  bazel build --noshow_progress //services/trainer:trainer //services/kvstore:kvstore_server \
    //services/scheduler:scheduler_server //services/trainctl:trainctl 2>&1 |
    grep -E '^(ERROR|FAILED)' >&2 || true
  bin=$(bazel info bazel-bin 2>/dev/null)
fi
ctl="$bin/services/trainctl/trainctl"
dir=$(mktemp -d /tmp/dtrain-compression.XXXXXX)
cleanup() { "$ctl" cluster down --dir="$dir/cluster" --grace_s=10 >/dev/null 2>&1 || true; }
trap cleanup EXIT INT TERM
up=$("$ctl" cluster up --dir="$dir/cluster" --trainers=2 --kvstore_shards=2 --kvstore_data_path="$data_path")
eval "$(grep '^export ' <<<"$up")"
metrics=$(awk '$1 ~ /^kvstore-/ {print $NF}' <<<"$up")
# Bytes pushed to the kvstore shards so far (all of them).
pushed() {
  python3 - $metrics <<'PY'
import sys, urllib.request
total = 0.0
for url in sys.argv[1:]:
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith("dtrain_kvstore_push_bytes_total"):
            total += float(line.split()[-1])
print(int(total))
PY
}

declare -A speed accuracy bytes
for c in ${compressions//,/ }; do
  b0=$(pushed)
  t0=$(date +%s.%N)
  out=$("$ctl" submit --name="lenet-${c//[:.]/-}" --model=lenet --epochs="$epochs" --batch_size=256 \
    --lr=0.2 --num_trainers=2 --devices_per_trainer=1 --device_kind=cpu --sync=KVSTORE \
    --gradient_compression="$c" --wait 2>&1) || { echo "$out" >&2; echo "compression.sh: job $c failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  id=$(sed -n 's/^submitted \([^ ]*\).*/\1/p' <<<"$out" | head -1)
  json=$("$ctl" -o json get "$id")
  read -r s a st < <(python3 -c 'import json,sys; j=json.load(sys.stdin); print(j.get("samples_per_second",0), j.get("test_accuracy",-1), j.get("state"))' <<<"$json")
  if [ "$st" != "SUCCEEDED" ]; then echo "compression.sh: job $id ($c) ended $st" >&2; exit 1; fi
  bytes[$c]=$(($(pushed) - b0))
  speed[$c]=$s accuracy[$c]=$a
  printf 'compression name=%s data_path=%s samples_per_s=%.0f test_accuracy=%.4f seconds=%.1f pushed_MB=%.1f\n' \
    "$c" "$data_path" "$s" "$a" "$(awk "BEGIN{print $t1-$t0}")" "$(awk "BEGIN{print ${bytes[$c]}/1e6}")"
done
if [ -n "${speed[none]:-}" ]; then
  for c in ${compressions//,/ }; do
    [ "$c" = none ] && continue
    awk -v c="$c" -v s="${speed[$c]}" -v s0="${speed[none]}" -v a="${accuracy[$c]}" -v a0="${accuracy[none]}" \
      -v m="${bytes[$c]}" -v m0="${bytes[none]}" \
      'BEGIN{printf "compression_vs_none name=%s speed_ratio=%.2f accuracy_delta=%+.4f pushed_ratio=%.4f\n", c, s/s0, a-a0, (m0 > 0 ? m/m0 : 0)}'
  done
fi
