#!/usr/bin/env bash
# kvstore push+pull throughput vs single-stream loopback TCP (iperf3), and
# push+pull latency of a small key, measured back to back on this machine;
# each kvstore figure also with 2 replicas per shard (the kvstore_replication
# lines: the cost of chain replication in the same run).
# Every connection is mutual TLS (the default a user gets; tls=on in the lines)
# unless --notls.
# Prints the bench lines, iperf3's figure and summary lines, per replica count r:
#   compare replicas=<r> kvstore_GBps=<x> iperf3_GBps=<y> ratio=<x/y> (goal >= 1.0)
#   compare replicas=<r> latency bytes=4096 keys=1 p50_us=<a> p99_us=<b> (goals: p50 <= 100, p99 <= 300)
#   compare replicas=<r> keys8_over_keys1_p50=<c> (goal <= 1.5)
#   compare replicas=<r> ... keys=8 spread p50_us=<d> spread_over_keys1_p50=<d/a>
# (the 4 KiB keys live on the job's home shard, placement.h; the spread line
# runs the 8 keys placed by name, --colocate_below_bytes=0, so they span
# both shards: what a round that fans out costs, no goal) and, from
# round_floor (the same rounds' processes and messages doing no work: what
# this machine allows; the round_floor next to the bench binary):
#   round_floor_ratio replicas=<r> head=poll spin_us=<s> shards2_over_shards1_p50=<f>
#   compare replicas=<r> floor shards=<n> keys8_best_p50_us=<g> keys8_over_floor=<ours/g>
#       floor_keys8_over_our_keys1=<g/our keys=1 p50>
#   compare replicas=<r> floor shards=2 spread_best_p50_us=<h> spread_over_floor=<d/h>
#
#   tests/bench/kvstore/compare.sh [--workers 2] [--servers 2] [--bytes 67108864] [--seconds 3]
#                                  [--bin PATH] [--notls] [--callback_data] [--small_only]
#                                  [--data_path auto|tcp|grpc] [--repeats 1]
# --repeats N: the 4 KiB runs N times, 1 key, 8 keys and 8 spread interleaved; the
# summary lines take the median of each figure over them (on a virtual
# machine one run can land in a slow mode that the next does not).
# --data_path: the clients' data path (kvstore_bench --data_path; default auto:
# the data port over Unix sockets and shared memory; data_path= in the lines).
# --callback_data: the servers answer small (unary) pushes and pulls on
# gRPC's callback API (kvstore_server --callback_data; callback=on in the
# summary lines). --small_only: only the 4 KiB latency runs (no iperf3, no
# 64 MiB run), for comparing data paths that differ only there.
# --bin runs an already built kvstore_bench (no setup, no build: for a run
# on an otherwise idle machine; round_floor is taken from the same folder).
# Set BAZEL to use another Bazel command line.
set -euo pipefail
cd "$(dirname "$0")/../../.."
workers=2 servers=2 bytes=$((64 << 20)) seconds=3 bin= tlsflag=--tls tls=on
cbflag=--nocallback_data callback=off small_only=0 data_path=auto repeats=1
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --notls) tlsflag=--notls tls=off; shift ;;
    --callback_data) cbflag=--callback_data callback=on; shift ;;
    --small_only) small_only=1; shift ;;
    --data_path) data_path=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  bazel=${BAZEL:-bazel}
  tools/setup --bench
  $bazel build --noshow_progress //tests/bench/kvstore:kvstore_bench //tests/bench/kvstore:round_floor 2>&1 | grep -E '^(ERROR|FAILED)' >&2 || true
  bin=$($bazel info bazel-bin 2>/dev/null)/tests/bench/kvstore/kvstore_bench
fi
floor_bin=$(dirname "$bin")/round_floor
case "$repeats" in '' | *[!0-9]* | 0) echo "compare.sh: --repeats needs a positive count, not '$repeats'" >&2; exit 2 ;; esac
# The median of figure $3 over the lines of replica count $2 in $1 (the
# lower middle one for an even count).
get() {
  grep " replicas=$2 " <<<"$1" | sed -n "s/.*$3=\([0-9.]*\).*/\1/p" | sort -g |
    awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}'
}
# $1 / $2 to two decimals.
ratio() { awk "BEGIN{printf \"%.2f\", $1/$2}"; }
small= small8= spread8=
for ((i = 0; i < repeats; i++)); do
  for shape in 1 8 spread; do
    keys=${shape/spread/8} placement=
    [ "$shape" = spread ] && placement=--colocate_below_bytes=0
    out=$("$bin" --workers="$workers" --servers="$servers" --bytes=4096 --keys=$keys --replicas=1,2 "$tlsflag" "$cbflag" --data_path="$data_path" $placement)
    echo "$out"
    case $shape in 1) small+="$out"$'\n' ;; 8) small8+="$out"$'\n' ;; *) spread8+="$out"$'\n' ;; esac
  done
done
latency() {
  echo "compare replicas=$1 tls=$tls callback=$callback data_path=$data_path repeats=$repeats latency bytes=4096 keys=1 p50_us=$(get "$small" "$1" p50_us) p99_us=$(get "$small" "$1" p99_us) (goals: p50 <= 100, p99 <= 300)"
  local one
  one=$(get "$small" "$1" p50_us)
  echo "compare replicas=$1 tls=$tls callback=$callback data_path=$data_path repeats=$repeats latency bytes=4096 keys=8 shards_per_round=$(get "$small8" "$1" shards_per_round) p50_us=$(get "$small8" "$1" p50_us) keys8_over_keys1_p50=$(ratio "$(get "$small8" "$1" p50_us)" "$one") (goal <= 1.5)"
  echo "compare replicas=$1 tls=$tls callback=$callback data_path=$data_path repeats=$repeats latency bytes=4096 keys=8 spread shards_per_round=$(get "$spread8" "$1" shards_per_round) p50_us=$(get "$spread8" "$1" p50_us) spread_over_keys1_p50=$(ratio "$(get "$spread8" "$1" p50_us)" "$one")"
}
# What the machine allows for these rounds (no TLS, no work): the floor of a
# round over one shard and over two, at several spins; then our 8-key
# round's ratio to the lowest floor any spin gives for as many shards as it
# touches, and our ratio as it would be with the 8-key round at that floor
# (floor_keys8_over_our_keys1: above 1.5, the goal needs more cores than
# this machine has, whatever the kvstore does); the same for the spread
# round against the two-shard floor.
floor() {
  if [ ! -x "$floor_bin" ]; then
    echo "compare.sh: no round_floor next to $bin (bazel build //tests/bench/kvstore:round_floor)" >&2
    return 0
  fi
  local out
  out=$("$floor_bin" --workers="$workers" --bytes=4096 --replicas=1,2 --spin_us=0,20,50,200)
  echo "$out"
  for r in 1 2; do
    local f f2 n ours1 ours8 spread
    n=$(get "$small8" "$r" shards_per_round)
    [ "$n" = 1 ] || n=2
    # The lowest p50 over the spins of a round over $1 shards.
    best() { grep "^round_floor_best replicas=$r " <<<"$out" | sed -n "s/.*shards$1_p50_us=\([0-9.]*\).*/\1/p"; }
    f=$(best "$n") f2=$(best 2)
    ours1=$(get "$small" "$r" p50_us) ours8=$(get "$small8" "$r" p50_us) spread=$(get "$spread8" "$r" p50_us)
    echo "compare replicas=$r floor shards=$n keys8_best_p50_us=$f keys8_over_floor=$(ratio "$ours8" "$f") floor_keys8_over_our_keys1=$(ratio "$f" "$ours1")"
    echo "compare replicas=$r floor shards=2 spread_best_p50_us=$f2 spread_over_floor=$(ratio "$spread" "$f2")"
  done
}
if [ "$small_only" = 1 ]; then
  for r in 1 2; do latency $r; done
  floor
  exit 0
fi
command -v iperf3 >/dev/null || { echo "compare.sh: iperf3 is missing (tools/setup --bench)" >&2; exit 1; }

# Single-stream loopback TCP: iperf3 server and client on 127.0.0.1.
port=$(( 20000 + RANDOM % 20000 ))
iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
sleep 0.3
json=$(iperf3 -c 127.0.0.1 -p "$port" -P 1 -t "$seconds" -J)
wait $server 2>/dev/null || true
tcp=$(python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9))' <<<"$json")
echo "iperf3 streams=1 seconds=$seconds GBps=$tcp"

ours=$("$bin" --workers="$workers" --servers="$servers" --bytes="$bytes" --replicas=1,2 "$tlsflag" "$cbflag" --data_path="$data_path")
echo "$ours"
for r in 1 2; do
  x=$(get "$ours" $r pushpull_GBps)
  echo "compare replicas=$r tls=$tls callback=$callback data_path=$data_path kvstore_GBps=$x iperf3_GBps=$tcp ratio=$(ratio "$x" "$tcp") (goal >= 1.0)"
  latency $r
done
floor
