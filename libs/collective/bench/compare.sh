#!/bin/bash
# Compares libs/collective with Gloo: 2 processes on this host, float32 sum
# allreduce of 64 MiB, TCP on loopback for both, plus our shared-memory
# transport. Runs the two benchmarks alternately REPS times (default 5) so
# both see the same machine load, and reports the median of each:
#
#   ours tcp_busbw_GBps=... shm_busbw_GBps=...
#   gloo ring_busbw_GBps=... (gloo::allreduce, RING) ring_best_busbw_GBps=... (best Gloo ring variant)
#   ratio tcp_vs_gloo_ring=... tcp_vs_gloo_best_ring=... median_per_run=...
#
# The machine's load average goes to stderr before and after: other jobs on a
# 2-core machine move both figures a lot, the ratio less.
#
# Usage: libs/collective/bench/compare.sh   (from anywhere in the repository)
# Environment: REPS, RANKS (default 2), BYTES (default 67108864),
# BAZEL_OUTPUT_BASE (default /root/.cache/bazel-ob-coll), BENCH_DIR (skip the
# build and use the binaries there).
set -euo pipefail

cd "$(dirname "$0")/../../.."
REPS=${REPS:-5}
RANKS=${RANKS:-2}
BYTES=${BYTES:-67108864}
if [[ -z "${BENCH_DIR:-}" ]]; then
  OB=${BAZEL_OUTPUT_BASE:-/root/.cache/bazel-ob-coll}
  bazel --output_base="$OB" build -c opt //libs/collective/bench:allreduce_bench \
    //libs/collective/bench:gloo_allreduce_bench >&2
  BENCH_DIR="$(bazel --output_base="$OB" info -c opt bazel-bin 2>/dev/null)/libs/collective/bench"
fi

# Prints the value of key=value pair $2 on the summary line of output $1.
field() { sed -n "s/^summary.* $2=\([0-9.]*\).*/\1/p" <<<"$1"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

ours_tcp=() ours_shm=() gloo_ring=() gloo_best=() ratios=()
echo "load_before $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((i = 1; i <= REPS; i++)); do
  out=$("$BENCH_DIR/allreduce_bench" --ranks="$RANKS" --transports=tcp,shm \
        --min_bytes="$BYTES" --max_bytes="$BYTES")
  echo "$out" | grep -v '^summary' >&2
  ours_tcp+=("$(field "$out" tcp_busbw_GBps)")
  ours_shm+=("$(field "$out" shm_busbw_GBps)")
  out=$("$BENCH_DIR/gloo_allreduce_bench" --ranks="$RANKS" --algos=ring,ring_chunked,ring_legacy \
        --min_bytes="$BYTES" --max_bytes="$BYTES")
  echo "$out" | grep -v '^summary' >&2
  gloo_ring+=("$(field "$out" gloo_ring_busbw_GBps)")
  gloo_best+=("$(field "$out" gloo_best_busbw_GBps)")
  ratios+=("$(awk -v t="${ours_tcp[-1]}" -v b="${gloo_best[-1]}" 'BEGIN { printf "%.2f", t / b }')")
done
echo "load_after $(cut -d' ' -f1-3 /proc/loadavg)" >&2

tcp=$(echo "${ours_tcp[*]}" | median)
shm=$(echo "${ours_shm[*]}" | median)
ring=$(echo "${gloo_ring[*]}" | median)
best=$(echo "${gloo_best[*]}" | median)
echo "runs ours_tcp=[${ours_tcp[*]}] ours_shm=[${ours_shm[*]}] gloo_ring=[${gloo_ring[*]}] gloo_best_ring=[${gloo_best[*]}] per_run_ratio=[${ratios[*]}]"
echo "ours ranks=$RANKS bytes=$BYTES tcp_busbw_GBps=$tcp shm_busbw_GBps=$shm"
echo "gloo ranks=$RANKS bytes=$BYTES ring_busbw_GBps=$ring ring_best_busbw_GBps=$best"
awk -v t="$tcp" -v r="$ring" -v b="$best" \
  -v m="$(echo "${ratios[*]}" | median)" \
  'BEGIN { printf "ratio tcp_vs_gloo_ring=%.2f tcp_vs_gloo_best_ring=%.2f median_per_run=%.2f\n", t / r, t / b, m }'
