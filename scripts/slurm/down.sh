#!/usr/bin/env bash
# down.sh - stop only what up.sh started and remove the network it made (adapted from
# shared/reference/slurm/down.sh).
#
# A process is "ours" only if (a) its pid is in a pid file under $DRUN_SLURM_DIR (or it is a
# slurm/munge process found in a /proc sweep) AND (b) its environment holds
# DRUN_SLURM_TAG=$DRUN_SLURM_DIR, which up.sh exports to every daemon it starts (slurmstepd
# inherits it from slurmd). Processes are signalled by PID only. Every wait is bounded.
# Idempotent. Keeps logs and the generated config for inspection. Exits 1 if a daemon survives.
# Usage: down.sh [DIR] (default $DRUN_SLURM_DIR, else /tmp/drun-slurm), the DIR given to up.sh.
set -uo pipefail
[ $# -le 1 ] || { echo "usage: down.sh [DIR]" >&2; exit 2; }
DIR=${1:-${DRUN_SLURM_DIR:-/tmp/drun-slurm}}
TAG="DRUN_SLURM_TAG=$DIR"
say() { echo "down.sh: $*"; }
[ "$(id -u)" -eq 0 ] || { echo "down.sh: ERROR: must run as root" >&2; exit 1; }
[ -d "$DIR" ] || { say "nothing to do ($DIR does not exist)"; exit 0; }
export SLURM_CONF="$DIR/etc/slurm.conf"

ours() { # pid [comm]
  local pid=$1 comm=${2:-}
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  [ -z "$comm" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
  { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "$TAG"   # fails for zombies too
}
# stop SECONDS "pid comm" ...   : SIGTERM all, wait (bounded), SIGKILL survivors
stop() {
  local secs=$1; shift
  local pc pid comm sent=()
  for pc in "$@"; do
    pid=${pc% *}; comm=${pc#* }
    if ours "$pid" "$comm"; then kill -TERM "$pid" 2>/dev/null && sent+=("$pc") && say "SIGTERM $comm ($pid)"; fi
  done
  [ ${#sent[@]} -gt 0 ] || return 0
  local end=$(( $(date +%s) + secs )) left
  while :; do
    left=0
    for pc in "${sent[@]}"; do [ -d "/proc/${pc% *}" ] && ours "${pc% *}" "${pc#* }" && left=1; done
    [ $left = 0 ] && return 0
    [ "$(date +%s)" -ge "$end" ] && break
    sleep 0.1
  done
  for pc in "${sent[@]}"; do
    pid=${pc% *}; comm=${pc#* }
    if ours "$pid" "$comm"; then kill -KILL "$pid" 2>/dev/null; say "SIGKILL $comm ($pid) after ${secs}s"; fi
  done
  sleep 0.3
}
pidof_file() { cat "$1" 2>/dev/null; }
# all tagged processes with one of the given comm names (pgrep only lists: signals go by PID)
sweep() {
  local name p c
  for p in $(for name in "$@"; do pgrep -x "$name"; done); do   # (pgrep patterns: <= 15 chars)
    c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    ours "$p" "$c" && echo "$p $c"
  done
  return 0
}

# 1. cancel jobs while the controller is still alive (bounded)
if ours "$(pidof_file "$DIR/run/slurmctld.pid")" slurmctld; then
  ids=$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${ids// /}" ]; then
    say "cancelling jobs: $ids"
    timeout 10 scancel $ids 2>/dev/null
    end=$(( $(date +%s) + 15 ))
    while [ -n "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.3; done
  fi
fi

# 2. controller, then node daemons, then anything tagged that is left, then munge
stop 15 "$(pidof_file "$DIR/run/slurmctld.pid") slurmctld"
pcs=()
for f in "$DIR"/run/slurmd-*.pid; do [ -f "$f" ] && pcs+=("$(pidof_file "$f") slurmd"); done
[ ${#pcs[@]} -gt 0 ] && stop 10 "${pcs[@]}"
mapfile -t left < <(sweep slurmctld slurmscriptd slurmd slurmstepd)
if [ ${#left[@]} -gt 0 ]; then
  # also the (untagged) task processes whose parent is one of our leftover slurmstepd
  kids=()
  for pc in "${left[@]}"; do
    [ "${pc#* }" = slurmstepd ] || continue
    for c in $(cat "/proc/${pc% *}/task/"*/children 2>/dev/null); do kids+=("$c $(cat "/proc/$c/comm" 2>/dev/null)"); done
  done
  say "stopping leftover tagged processes: ${left[*]}"
  stop 5 "${left[@]}"
  for pc in "${kids[@]}"; do   # children were started by our slurmstepd: kill by PID
    pid=${pc% *}; [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null && say "SIGKILL task $pc"
  done
fi
stop 10 "$(pidof_file "$DIR/run/munged.pid") munged"
mapfile -t left < <(sweep munged)
[ ${#left[@]} -gt 0 ] && stop 5 "${left[@]}"

# 3. network namespaces / bridge / veths recorded by up.sh: veths first (ip netns del cleans up
# asynchronously), then namespaces, then the bridge.
if [ -f "$DIR/netns.created" ]; then
  # (A state directory from before the bridge had a kind of its own lists it as "link drunslurm-br".)
  is_bridge() { [ "$1" = bridge ] || { [ "$1" = link ] && [ "$2" = drunslurm-br ]; }; }
  while read -r kind name; do [ "$kind" = link ] && ! is_bridge "$kind" "$name" && ip link del "$name" 2>/dev/null && say "deleted link $name"; done <"$DIR/netns.created"
  while read -r kind name; do [ "$kind" = netns ] && ip netns del "$name" 2>/dev/null && say "deleted netns $name"; done <"$DIR/netns.created"
  while read -r kind name; do is_bridge "$kind" "$name" && ip link del "$name" 2>/dev/null && say "deleted bridge $name"; done <"$DIR/netns.created"
  rm -f "$DIR/netns.created"
fi

# 4. runtime markers (logs and the generated config are kept for inspection); /tmp/drun-munge-*
# is where an older up.sh put munged's socket.
rm -rf "$DIR/run" "$DIR/munge-run" "/tmp/drun-munge-$(printf %s "$DIR" | cksum | cut -d' ' -f1)" \
  "$DIR/up.ok" "$DIR/nodes" "$DIR/shape" "$DIR/env.sh" "$DIR/names"

mapfile -t left < <(sweep munged slurmctld slurmscriptd slurmd slurmstepd)
if [ ${#left[@]} -gt 0 ]; then echo "down.sh: ERROR: still running: ${left[*]}" >&2; exit 1; fi
say "done"
