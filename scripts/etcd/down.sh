#!/usr/bin/env bash
# Stops the cluster scripts/etcd/up.sh started in DIR (by the PIDs it recorded) and removes DIR.
#   scripts/etcd/down.sh DIR [--keep]
set -uo pipefail
dir=${1:?usage: down.sh DIR [--keep]}
for pidfile in "$dir"/m*.pid; do
  [[ -f "$pidfile" ]] || continue
  pid=$(cat "$pidfile")
  # Only a process that is still the etcd we started (the pid may have been reused).
  if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "data-dir $dir/"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
done
[[ "${2:-}" == "--keep" ]] || rm -rf "$dir"
