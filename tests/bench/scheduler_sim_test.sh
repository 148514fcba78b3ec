#!/usr/bin/env bash
# scheduler_sim at the issue's scale (seed 1): every figure is printed, the
# goals hold (p99 <= 10 ms, no queue below 0.9 of its fair share), preemption
# and shrinking happened, and the queues beat the one-queue reference on the
# worst queue's share.
set -euo pipefail
sim="$1"
out="$("$sim" --seed=1 --jobs=20000)"
get() {
  local v
  v="$(printf '%s\n' "$out" | sed -n "s/^$1=//p")"
  [ -n "$v" ] || { echo "scheduler_sim_test: no $1 in:"; printf '%s\n' "$out"; exit 1; }
  printf '%s' "$v"
}
check() {  # check <awk condition on x> <key>
  local x
  x="$(get "$2")"
  awk -v x="$x" "BEGIN { exit !($1) }" || { echo "scheduler_sim_test: $2=$x fails $1"; printf '%s\n' "$out"; exit 1; }
}
check 'x == 20000' jobs
check 'x == 1' goal_met
check 'x <= 10' cycle_p99_ms
check 'x >= 0.9' min_share_ratio
check 'x > 0.5 && x <= 1' utilisation
check 'x > 0' preemptions.reclaim_within_cohort
check 'x > 0' preemptions.within_queue
check 'x > 0' shrinks.reclaim_within_cohort
check 'x > 1' min_share_ratio_vs_baseline
for q in 0 1 2 3 4 5 6 7 8 9; do check 'x >= 0.9' "queue.q$q.share"; done
