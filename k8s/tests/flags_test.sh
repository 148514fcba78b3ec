#!/usr/bin/env bash
# Every flag file the manifests mount (k8s/**/*.flags) is accepted by the
# binary it configures: each is parsed by the real binary (a misspelled or
# removed flag crash-loops the pod), with paths and ports overridden so the
# process can start here; and the trainer and server flag files keep the
# endpoints the pods' probes and scrape annotations use (metrics and gRPC
# health ports, the TLS files), and the kvstore's per-job quota is not 0.
# The processes run --insecure (and without
# the cluster secret) here: the files the flags name live in the pods'
# dtrain-tls Secret.
set -uo pipefail
fail=0
R="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-dtrain}"
[ -d "$R/k8s" ] || R=$(cd "$(dirname "$0")/../.." && pwd)
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
n=0
while IFS= read -r f; do
  base=$(basename "$f" .flags)
  case "$base" in
    scheduler) bin="$R/services/scheduler/scheduler_server"
               over=(--listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 "--data_dir=$tmp/s$n" --insecure
                     --health_listen=127.0.0.1:0 --cluster_secret_file=
                     "--queues=$R/k8s/base/config/queues.yaml")
               need=(--metrics_listen=0.0.0.0:9400 --health_listen=0.0.0.0:7001
                     --cluster_secret_file=/etc/dtrain-tls/cluster.secret
                     --ca=/etc/dtrain-tls/ca.pem --cert=/etc/dtrain-tls/scheduler.pem
                     --queues=/etc/dtrain-queues/queues.yaml) ;;
    kvstore)   bin="$R/services/kvstore/kvstore_server"
               over=(--listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 "--data_dir=$tmp/k$n" --insecure
                     --health_listen=127.0.0.1:0 --cluster_secret_file=)
               need=(--metrics_listen=0.0.0.0:9401 --health_listen=0.0.0.0:7071
                     --cluster_secret_file=/etc/dtrain-tls/cluster.secret
                     --ca=/etc/dtrain-tls/ca.pem --cert=/etc/dtrain-tls/kvstore.pem) ;;
    trainer)   bin="$R/services/trainer/trainer"
               over=(--scheduler=127.0.0.1:1 --devices=cpu --metrics_listen=127.0.0.1:0
                     --health_listen=127.0.0.1:0 "--work_dir=$tmp/t$n" --insecure)
               need=(--metrics_listen=0.0.0.0:9402 --health_listen=0.0.0.0:9403
                     --ca=/etc/dtrain-tls/ca.pem --cert=/etc/dtrain-tls/trainer.pem) ;;
    *) echo "FAIL: $f: no binary known for '$base'"; fail=1; continue ;;
  esac
  n=$((n + 1))
  for want in "${need[@]}"; do
    grep -qx -- "$want" "$f" || { echo "FAIL: $f: missing $want (probes, scrapes or mutual TLS need it)"; fail=1; }
  done
  # A shard caps each job's bytes: 0 (no limit) lets one job take its memory.
  if [ "$base" = kvstore ]; then
    q=$(sed -n 's/^--quota_bytes_per_job=//p' "$f")
    [[ "$q" =~ ^[1-9][0-9]*$ ]] || { echo "FAIL: $f: --quota_bytes_per_job must be a positive byte count, not '${q:-unset}' (0: one job may take the shard's memory)"; fail=1; }
  fi
  # Later flags override the file's; run it for 2 s: a parse error exits at once.
  out=$(timeout -s TERM 2 "$bin" "--flagfile=$f" "${over[@]}" 2>&1)
  rc=$?
  if grep -qiE "unknown command line flag|illegal value|error.*flag" <<<"$out" || { [ "$rc" -ne 124 ] && [ "$rc" -ne 0 ]; }; then
    echo "FAIL: $f rejected by $(basename "$bin") (exit $rc):"
    echo "$out" | head -5
    fail=1
  else
    echo "ok   $f ($(basename "$bin"), exit $rc)"
  fi
done < <(cd "$R" && find k8s -name '*.flags' | sort | sed "s|^|$R/|")
[ "$n" -ge 4 ] || { echo "FAIL: found only $n flag files"; fail=1; }
echo "$n flag files checked"
exit $fail
