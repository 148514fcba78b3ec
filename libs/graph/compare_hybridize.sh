#!/usr/bin/env bash
# The chapter's hybridize experiment, dtrain vs PyTorch 1.13 (Debian's
# python3-torch) on this machine, run back to back: mlp_chapter, batch 1,
# 1000 forward passes, one thread, best of 5 repetitions. Prints both sides'
# key=value lines and a summary:
#   compare dtrain_eager_us=... dtrain_hybridized_us=... pytorch_eager_us=...
#     pytorch_jit_us=... speedup_vs_pytorch_eager=... speedup_vs_pytorch_jit=...
# Goals (issue 5): at least 5x PyTorch eager and 4x torch.jit.script.
#
#   libs/graph/compare_hybridize.sh [--all]
#
# --all also runs `hybridize_bench --memory` (resnet18 training step, batch
# 32: imperative vs planned peak bytes) and `--train` (lenet, batch 256, 2
# threads: imperative vs hybridized samples/s). Extra bazel startup options
# (an --output_base, say) come from $BAZEL_STARTUP_OPTS.
set -euo pipefail
cd "$(dirname "$0")/../.."
all=0
for arg in "$@"; do
  case "$arg" in
    --all) all=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "compare_hybridize.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
bazel=(bazel ${BAZEL_STARTUP_OPTS:-})
tools/setup --bench
"${bazel[@]}" build --noshow_progress //libs/graph:hybridize_bench 2>&1 | grep -E '^(ERROR|FAILED)' >&2 || true
bin=$("${bazel[@]}" info bazel-bin 2>/dev/null)/libs/graph/hybridize_bench
ours=$("$bin")
theirs=$(/usr/bin/python3 tests/bench/torch_hybridize_bench.py --iters 1000 --reps 5)
echo "$ours"
echo "$theirs"
get() { grep -oE "(^| )$2=[0-9.]+" <<<"$1" | tail -1 | sed 's/.*=//'; }
de=$(get "$ours" eager_us_per_forward); dh=$(get "$ours" hybridized_us_per_forward)
pe=$(get "$theirs" eager_us_per_forward); pj=$(get "$theirs" jit_us_per_forward)
ratio() { awk "BEGIN{printf \"%.2f\", $1/$2}"; }
echo "compare dtrain_eager_us=$de dtrain_hybridized_us=$dh pytorch_eager_us=$pe pytorch_jit_us=$pj" \
  "speedup_vs_pytorch_eager=$(ratio "$pe" "$dh") speedup_vs_pytorch_jit=$(ratio "$pj" "$dh")" \
  "speedup_vs_dtrain_eager=$(ratio "$de" "$dh")"
if [ "$all" = 1 ]; then
  mem=$("$bin" --memory)
  echo "$mem"
  train=$("$bin" --train --reps 5 --steps 10)
  echo "$train"
  echo "compare_memory imperative_peak_bytes=$(get "$mem" imperative_peak_bytes)" \
    "planned_peak_bytes=$(get "$mem" planned_peak_bytes)"
  echo "compare_train imperative_sps=$(get "$train" imperative_samples_per_second)" \
    "hybridized_sps=$(get "$train" hybridized_samples_per_second)" \
    "speedup=$(get "$train" 'speedup') fastest_step_speedup=$(get "$train" fastest_step_speedup)"
fi
