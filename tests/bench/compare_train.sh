#!/usr/bin/env bash
# Training throughput of dtrain vs PyTorch 1.13 (Debian's python3-torch) on
# this machine, same models, batch size and thread count, run back to back.
# Prints each side's key=value lines and one summary line per model:
#   compare model=lenet threads=2 dtrain_sps=... pytorch_sps=... ratio=... \
#     dtrain_rss_mb=... pytorch_rss_mb=...
#   mfu model=lenet flops_per_sample=... peak_gflops=... dtrain_achieved_gflops=... \
#     dtrain_mfu=... pytorch_achieved_gflops=... pytorch_mfu=...
# MFU of both sides uses the same FLOP count (train_bench's flops_per_sample,
# from dtrain's graph of the model) and the same measured GEMM peak.
#
#   tests/bench/compare_train.sh [--threads N] [--models "mlp lenet resnet18"] [--bin TRAIN_BENCH]
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=2
models="mlp lenet resnet18"
bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;  # a built train_bench: no setup, no bazel (to time on an otherwise idle machine)
    *) echo "compare_train.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  tools/setup --bench
  bazel build --noshow_progress //tests/bench:train_bench 2>&1 | grep -E '^(ERROR|FAILED)' >&2 || true
  bin=$(bazel info bazel-bin 2>/dev/null)/tests/bench/train_bench
fi
for m in $models; do
  case "$m" in
    resnet18) steps=5; warmup=1 ;;
    lenet) steps=40; warmup=5 ;;
    *) steps=100; warmup=5 ;;
  esac
  ours=$("$bin" --model="$m" --batch_size=256 --steps=$steps --warmup=$warmup --threads="$threads")
  theirs=$(/usr/bin/python3 tests/bench/torch_train_bench.py --model "$m" --batch_size 256 \
             --steps $steps --warmup $warmup --threads "$threads")
  echo "$ours"
  echo "$theirs"
  get() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" <<<"$1" | tail -1; }
  a=$(get "$ours" samples_per_second); b=$(get "$theirs" samples_per_second)
  ra=$(get "$ours" peak_rss_mb); rb=$(get "$theirs" peak_rss_mb)
  echo "compare model=$m threads=$threads dtrain_sps=$a pytorch_sps=$b ratio=$(awk "BEGIN{printf \"%.2f\", $a/$b}") dtrain_rss_mb=$ra pytorch_rss_mb=$rb"
  f=$(get "$ours" flops_per_sample); p=$(get "$ours" peak_gflops)
  echo "mfu model=$m flops_per_sample=$f peak_gflops=$p $(awk "BEGIN{printf \"dtrain_achieved_gflops=%.2f dtrain_mfu=%.4f pytorch_achieved_gflops=%.2f pytorch_mfu=%.4f\", $a*$f/1e9, $a*$f/1e9/$p, $b*$f/1e9, $b*$f/1e9/$p}")"
done
