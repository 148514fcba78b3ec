#!/usr/bin/env bash
# kvstore push+pull throughput vs single-stream loopback TCP (iperf3), and
# push+pull latency of a small key, measured back to back on this machine;
# each kvstore figure also with 2 replicas per shard (the kvstore_replication
# lines: the cost of chain replication in the same run).
# Prints the bench lines, iperf3's figure and one summary line:
#   compare kvstore_GBps=<x> iperf3_GBps=<y> ratio=<x/y> (goal >= 0.6)
#   compare latency bytes=4096 p50_us=<a> p99_us=<b> (goals: p50 <= 200, p99 <= 1000)
#
#   tests/bench/kvstore/compare.sh [--workers 2] [--servers 2] [--bytes 67108864] [--seconds 3]
# Set BAZEL to use another Bazel command line (e.g. BAZEL="bazel --output_base=...").
set -euo pipefail
cd "$(dirname "$0")/../../.."
workers=2 servers=2 bytes=$((64 << 20)) seconds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bazel=${BAZEL:-bazel}
tools/setup --bench
command -v iperf3 >/dev/null || { echo "compare.sh: iperf3 is missing (tools/setup --bench)" >&2; exit 1; }
$bazel build --noshow_progress //tests/bench/kvstore:kvstore_bench 2>&1 | grep -E '^(ERROR|FAILED)' >&2 || true
bin=$($bazel info bazel-bin 2>/dev/null)/tests/bench/kvstore/kvstore_bench

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

ours=$("$bin" --workers="$workers" --servers="$servers" --bytes="$bytes" --replicas=1,2)
echo "$ours"
small=$("$bin" --workers="$workers" --servers="$servers" --bytes=4096 --keys=1 --replicas=1,2)
echo "$small"
# The unreplicated run's figures (replicas=1), then replication's cost.
get() { grep ' replicas=1 ' <<<"$1" | sed -n "s/.*$2=\([0-9.]*\).*/\1/p" | tail -1; }
x=$(get "$ours" pushpull_GBps)
echo "compare kvstore_GBps=$x iperf3_GBps=$tcp ratio=$(awk "BEGIN{printf \"%.2f\", $x/$tcp}") (goal >= 0.6)"
echo "compare latency bytes=4096 p50_us=$(get "$small" p50_us) p99_us=$(get "$small" p99_us) (goals: p50 <= 200, p99 <= 1000)"
