#!/usr/bin/env bash
# The chapter's scaling argument, measured: the time to synchronize one
# step's gradient (--bytes of float32) among n = 2, 4, 8 workers, each on its
# own emulated host (tools/netlab) whose link is shaped to --rates, by
#   ring        libs/collective's ring allreduce over TCP,
#   ps_one      push-pull through one kvstore server (on its own host),
#   ps_sharded  push-pull through n kvstore shards (each on its own host; the
#               gradient is sliced evenly over them),
# next to the alpha-beta model's prediction, alpha (one-way latency) and beta
# (bandwidth) of a link measured by `trainctl doctor --peer` on the same lab:
#   ring        2(n-1) alpha + 2(n-1)/n * bytes/beta
#   ps_one      2 alpha + 2n * bytes/beta      (the server's link carries every push and pull)
#   ps_sharded  2 alpha + 2 * bytes/beta       (each shard's link: 1/n of n pushes and pulls)
# One line per point, then the ratios the issue asks for:
#   scaling method=ring workers=2 link_gbps=0.1 sync_seconds=0.71 model_seconds=0.70
#   scaling_growth method=ring link_gbps=0.1 ratio_8_over_2=1.7 model_ratio=1.75
#   scaling_model_error link_gbps=0.1 max_rel=0.08
# sync_seconds: per round the slowest worker's time (every round starts after
# a barrier), the median over --rounds rounds. Mutual TLS on the kvstore.
#
#   tests/bench/scaling/run.sh [--quick] [--rates=100mbit,1gbit] [--workers=2,4,8]
#                              [--methods=ring,ps_one,ps_sharded] [--bytes=N] [--rounds=N]
#                              [--out=DIR] [--no_build]
# --quick: 100mbit only, 4 MiB, 2 rounds (about a minute). --out: where the
# lines (scaling.txt) and the plot (scaling.png, with python3-matplotlib from
# tools/setup --bench) go. Time it on an otherwise idle machine with --no_build after
# building: bazel build //tests/bench/scaling:scaling_worker
# //services/kvstore:kvstore_server //services/trainctl. Needs root (network
# namespaces).
set -euo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD

methods=ring,ps_one,ps_sharded rates=100mbit,1gbit workers=2,4,8 bytes=$((8 << 20)) rounds=3 out="" build=1 inside=0
for a in "$@"; do
  case "$a" in
    --quick) rates=100mbit bytes=$((4 << 20)) rounds=2 ;;
    --rates=*) rates=${a#*=} ;;
    --workers=*) workers=${a#*=} ;;
    --methods=*) methods=${a#*=} ;;
    --bytes=*) bytes=${a#*=} ;;
    --rounds=*) rounds=${a#*=} ;;
    --out=*) out=${a#*=} ;;
    --no_build) build=0 ;;
    --inside) inside=1 ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$a' (try --help)" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a rate_list <<<"$rates"
IFS=, read -r -a n_list <<<"$workers"
IFS=, read -r -a method_list <<<"$methods"
for m in "${method_list[@]}"; do
  case "$m" in ring|ps_one|ps_sharded) ;; *) echo "run.sh: bad method '$m' (ring, ps_one, ps_sharded)" >&2; exit 2 ;; esac
done
max_n=0
for n in "${n_list[@]}"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || { echo "run.sh: bad worker count '$n'" >&2; exit 2; }
  [ "$n" -gt "$max_n" ] && max_n=$n
done

if [ "$inside" = 0 ]; then
  if [ "$build" = 1 ]; then
    bazel build --noshow_progress //tests/bench/scaling:scaling_worker \
      //services/kvstore:kvstore_server //services/trainctl 2>&1 | grep -E '^(ERROR|FAILED)' >&2 || true
  fi
  [ -n "$out" ] || out=$(mktemp -d /tmp/scaling.XXXXXX)
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  tools/netlab check >/dev/null || { tools/netlab check; exit 1; }
  # Hosts h0..h(max-1) for workers, h(max)..h(2max-1) for the shards (the
  # one server of ps_one on h(max)).
  tools/netlab run $((2 * max_n)) -- "$0" --inside "--rates=$rates" "--workers=$workers" \
    "--bytes=$bytes" "--rounds=$rounds" "--out=$out" "--methods=$methods" | tee "$out/scaling.txt"
  py=python3
  [ -x /usr/bin/python3 ] && py=/usr/bin/python3  # Debian's, where python3-matplotlib is
  if $py -c 'import matplotlib' 2>/dev/null; then
    $py tests/bench/scaling/plot.py "$out/scaling.txt" "$out/scaling.png" &&
      echo "plot: $out/scaling.png"
  else
    echo "plot: skipped (python3-matplotlib missing: tools/setup --bench)"
  fi
  exit 0
fi

# ---- inside the lab ----
bin=$repo/bazel-bin
worker=$bin/tests/bench/scaling/scaling_worker
kvstore=$bin/services/kvstore/kvstore_server
trainctl=$bin/services/trainctl/trainctl
for b in "$worker" "$kvstore" "$trainctl"; do
  [ -x "$b" ] || { echo "run.sh: $b is not built (drop --no_build)" >&2; exit 1; }
done
nl=$repo/tools/netlab
tmp=$(mktemp -d /tmp/scaling-lab.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip_of() { echo "10.77.0.$(($1 + 1))"; }

sans=$(for ((i = 0; i < 2 * max_n; i++)); do printf '%s,' "$(ip_of $i)"; done)
"$trainctl" certs init --dir="$tmp/certs" --san="${sans%,}" >/dev/null
"$trainctl" certs issue --dir="$tmp/certs" --name=worker --role=trainer >/dev/null
export DTRAIN_CA=$tmp/certs/ca.pem DTRAIN_CERT=$tmp/certs/worker.pem DTRAIN_KEY=$tmp/certs/worker.key

# Starts a kvstore shard in host $1 as shard $2; waits until it listens.
start_shard() {
  local h=$1 idx=$2
  local pf=$tmp/port-$h-$RANDOM
  "$nl" exec "$h" "$kvstore" --listen="$(ip_of "$h"):7070" --shard_index="$idx" \
    --port_file="$pf" --ca="$DTRAIN_CA" --cert="$tmp/certs/kvstore.pem" \
    --key="$tmp/certs/kvstore.key" >"$tmp/kvstore-$h.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$pf" ] && return 0; sleep 0.1; done
  echo "run.sh: kvstore in h$h did not start:" >&2
  tail -5 "$tmp/kvstore-$h.log" >&2
  exit 1
}
stop_shards() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
}

# Runs n workers of method $1 (ring|ps) with extra flags $3...; prints the
# synchronization time: per round the slowest worker, median over rounds.
run_workers() {
  local method=$1 n=$2; shift 2
  local dir=$tmp/run-$RANDOM i wp=()
  mkdir -p "$dir/store"
  for ((i = 0; i < n; i++)); do
    "$nl" exec "h$i" "$worker" --method="$method" --rank=$i --workers="$n" \
      --store_dir="$dir/store" --host="$(ip_of $i)" --bytes="$bytes" --rounds="$rounds" \
      "$@" >"$dir/w$i.out" 2>"$dir/w$i.err" &
    wp+=($!)
  done
  local failed=0
  for p in "${wp[@]}"; do wait "$p" || failed=1; done
  if [ "$failed" = 1 ]; then
    echo "run.sh: $method with $n workers failed:" >&2
    cat "$dir"/w*.err >&2
    exit 1
  fi
  cat "$dir"/w*.out | python3 -c '
import sys, statistics
rows = [list(map(float, l.split("seconds=")[1].split(","))) for l in sys.stdin if "seconds=" in l]
print("%.4f" % statistics.median(max(r[k] for r in rows) for k in range(len(rows[0]))))'
}

model() {  # method n alpha beta
  awk -v m="$1" -v n="$2" -v a="$3" -v b="$4" -v s="$bytes" 'BEGIN {
    if (m == "ring") t = 2 * (n - 1) * a + 2 * (n - 1) / n * s / b;
    else if (m == "ps_one") t = 2 * a + 2 * n * s / b;
    else t = 2 * a + 2 * s / b;
    printf "%.4f", t }'
}

gbps_of() {  # a tc rate (100mbit, 1gbit) in Gbit/s
  awk -v r="$1" 'BEGIN { v = r + 0; if (r ~ /mbit/) v /= 1000; else if (r ~ /kbit/) v /= 1e6; else if (r !~ /gbit/) v /= 1e9; printf "%g", v }'
}

declare -A sync_s model_s
for rate in "${rate_list[@]}"; do
  for ((i = 0; i < 2 * max_n; i++)); do "$nl" shape "h$i" "$rate"; done
  gbps=$(gbps_of "$rate")
  # alpha and beta of one link (h0 -> h1), by trainctl doctor; the bulk
  # stream lasts about a second at the rate.
  link_bytes=$(awk -v g="$gbps" 'BEGIN { printf "%d", g * 1e9 / 8 }')
  "$nl" exec h1 "$trainctl" doctor serve --listen="$(ip_of 1):7999" >/dev/null 2>&1 &
  dp=$!
  sleep 0.3
  dj=$("$nl" exec h0 "$trainctl" -o json doctor --link_only --peer="$(ip_of 1):7999" --link_bytes="$link_bytes")
  kill "$dp"; wait "$dp" 2>/dev/null || true
  alpha=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["link_latency_us"] / 1e6)' "$dj")
  beta=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["link_GBps"] * 1e9)' "$dj")
  echo "scaling_link link_gbps=$gbps alpha_us=$(awk -v a="$alpha" 'BEGIN { printf "%.1f", a * 1e6 }') beta_MBps=$(awk -v b="$beta" 'BEGIN { printf "%.2f", b / 1e6 }') bytes=$bytes rounds=$rounds"
  for n in "${n_list[@]}"; do
    for m in "${method_list[@]}"; do
      case "$m" in
        ring) t=$(run_workers ring "$n") ;;
        ps_one)
          start_shard "$max_n" 0
          t=$(run_workers ps "$n" --servers="$(ip_of "$max_n"):7070" --job="one$n")
          stop_shards ;;
        ps_sharded)
          servers=""
          for ((i = 0; i < n; i++)); do
            start_shard $((max_n + i)) "$i"
            servers+="$(ip_of $((max_n + i))):7070,"
          done
          t=$(run_workers ps "$n" --servers="${servers%,}" --job="sharded$n")
          stop_shards ;;
      esac
      sync_s[$m,$n,$gbps]=$t
      model_s[$m,$n,$gbps]=$(model "$m" "$n" "$alpha" "$beta")
    done
    for m in "${method_list[@]}"; do
      echo "scaling method=$m workers=$n link_gbps=$gbps sync_seconds=${sync_s[$m,$n,$gbps]} model_seconds=${model_s[$m,$n,$gbps]}"
    done
  done
done

# Growth from the fewest to the most workers, and the largest model error.
lo=${n_list[0]} hi=${n_list[-1]}
for rate in "${rate_list[@]}"; do
  gbps=$(gbps_of "$rate")
  max_rel=0
  for m in "${method_list[@]}"; do
    echo "scaling_growth method=$m link_gbps=$gbps ratio_${hi}_over_${lo}=$(awk -v a="${sync_s[$m,$hi,$gbps]}" -v b="${sync_s[$m,$lo,$gbps]}" 'BEGIN { printf "%.2f", a / b }') model_ratio=$(awk -v a="${model_s[$m,$hi,$gbps]}" -v b="${model_s[$m,$lo,$gbps]}" 'BEGIN { printf "%.2f", a / b }')"
    for n in "${n_list[@]}"; do
      max_rel=$(awk -v s="${sync_s[$m,$n,$gbps]}" -v p="${model_s[$m,$n,$gbps]}" -v r="$max_rel" 'BEGIN { e = (s - p) / p; if (e < 0) e = -e; printf "%.3f", (e > r ? e : r) }')
    done
  done
  echo "scaling_model_error link_gbps=$gbps max_rel=$max_rel"
done
