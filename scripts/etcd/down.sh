#!/usr/bin/env bash
# Stops the cluster scripts/etcd/up.sh started in DIR (by the PIDs it recorded) and removes DIR.
#   scripts/etcd/down.sh DIR [--keep]
# Without --keep the data goes anyway, so the members get SIGKILL at once (a graceful stop takes
# seconds per member); with --keep, SIGTERM first (2.5 s), then SIGKILL.
set -uo pipefail
dir=${1:?usage: down.sh DIR [--keep]}
signal=KILL
[[ "${2:-}" == "--keep" ]] && signal=TERM
pids=()
for pidfile in "$dir"/m*.pid; do
  [[ -f "$pidfile" ]] || continue
  pid=$(cat "$pidfile")
  # Only a process that is still the etcd we started (the pid may have been reused).
  if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--data-dir $dir/"; then
    kill "-$signal" "$pid" 2>/dev/null || true
    pids+=("$pid")
  fi
  rm -f "$pidfile"
done
for pid in "${pids[@]}"; do
  for _ in $(seq 50); do
    # Gone, or a zombie its new parent has not reaped yet (up.sh's shell exited long ago).
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo gone)
    [[ "$state" == gone || "$state" == Z ]] && break
    sleep 0.05
  done
  kill -KILL "$pid" 2>/dev/null || true
done
# up.sh's watcher of the cluster's owner (OWNER_PID), unless this is that watcher stopping it.
if [[ -f "$dir/watcher.pid" && -z "${DRUN_ETCD_WATCHER:-}" ]]; then
  watcher=$(cat "$dir/watcher.pid")
  if [[ -r /proc/$watcher/cmdline ]] && tr '\0' ' ' <"/proc/$watcher/cmdline" | grep -q "up.sh"; then
    kill "$watcher" 2>/dev/null || true
  fi
  rm -f "$dir/watcher.pid"
fi
[[ "${2:-}" == "--keep" ]] || rm -rf "$dir"
