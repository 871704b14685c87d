#!/usr/bin/env bash
# CTest: scripts/etcd/up.sh with OWNER_PID stops its cluster once the owner process is gone (a
# test killed before its destructor ran down.sh), and down.sh stops that watcher when the owner
# stops the cluster itself. Exits 77 (SKIPPED) without etcd.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { echo "owner_check: $*" >&2; exit 1; }
gone() {  # gone PID: exited, or a zombie nobody reaped yet
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo gone)
  [[ "$state" == gone || "$state" == Z ]]
}
owner=""
trap '[[ -n "$owner" ]] && kill "$owner" 2>/dev/null; true' EXIT
start() {  # start: a cluster owned by a fresh `sleep`; sets owner, dir, members, watcher
  sleep 60 &
  owner=$!
  local out rc attempt
  for attempt in 1 2 3; do  # random ports, as EtcdCluster: another cluster may hold some
    rc=0
    out=$(OWNER_PID=$owner BASE_PORT=$((20000 + RANDOM % 2000 * 6)) bash scripts/etcd/up.sh 2>&1) || rc=$?
    ((rc == 77)) && { echo "SKIP: $out"; exit 77; }
    ((rc == 0)) && break
  done
  ((rc == 0)) || fail "the cluster did not come up: $out"
  dir=${out%% *}
  members=$(cat "$dir"/m*.pid)
  [[ -f "$dir/watcher.pid" ]] || { bash scripts/etcd/down.sh "$dir"; fail "up.sh started no watcher for OWNER_PID"; }
  watcher=$(cat "$dir/watcher.pid")
}

# 1. The owner dies without stopping its cluster; the watcher is not in the caller's process
# group (a kill of that group, a cancelled run, would take it along and leave the members).
start
[[ "$(ps -o pgid= -p "$watcher" | tr -d ' ')" != "$(ps -o pgid= -p $$ | tr -d ' ')" ]] ||
  { bash scripts/etcd/down.sh "$dir"; fail "the watcher $watcher is in the caller's process group"; }
kill -KILL "$owner"
wait "$owner" 2>/dev/null || true
for _ in $(seq 100); do  # the watcher checks once a second: 10 s at most
  [[ -d "$dir" ]] || break
  sleep 0.1
done
[[ ! -d "$dir" ]] || fail "$dir is still there 10 s after its owner died"
for p in $members $watcher; do gone "$p" || fail "process $p (a member or the watcher) outlived the owner"; done

# 2. The owner stops its cluster: the watcher goes too.
start
bash scripts/etcd/down.sh "$dir"
for _ in $(seq 30); do  # the watcher ends after its current 1 s sleep: 3 s at most
  gone "$watcher" && break
  sleep 0.1
done
gone "$watcher" || fail "the watcher $watcher outlived down.sh"
for p in $members; do gone "$p" || fail "member $p outlived down.sh"; done
echo "owner_check: a dead owner's cluster stopped, and down.sh stopped the watcher"
