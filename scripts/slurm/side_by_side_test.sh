#!/usr/bin/env bash
# side_by_side_test.sh: two test clusters (up.sh DIR) at once, in two directories under a 0700
# parent (as a mktemp -d checkout is). Each comes up and runs a job; their bridges, namespaces,
# subnets and slurmctld ports differ; every path of theirs (slurm.conf's files, munged's socket,
# key, pid and log) lies under its own DIR and nothing goes to /tmp/drun-munge-*; down.sh DIR
# removes each one's network and processes while the other runs on.
# Exit 0: all held; 1: one failed (says which); 77: SLURM, root or network namespaces missing.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
skip() { echo "side_by_side_test: SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, slurmd)"
for b in slurmctld slurmd srun munged ip nsenter unshare sha256sum; do
  command -v "$b" >/dev/null 2>&1 || skip "'$b' is not installed"
done
probe="dsprobe-$$"
ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces here"
ip netns del "$probe"

top=$(mktemp -d /tmp/drun-slurm-pair.XXXXXX)   # 0700
A=$top/a B=$top/b
cleanup() {
  DRUN_SLURM_DIR= timeout 120 bash "$HERE/down.sh" "$A" >/dev/null 2>&1
  DRUN_SLURM_DIR= timeout 120 bash "$HERE/down.sh" "$B" >/dev/null 2>&1
  rm -rf "$top"
}
trap cleanup EXIT
fail() { echo "side_by_side_test: FAILED: $*" >&2; for d in "$A" "$B"; do tail -n 5 "$d"/log/*.log 2>/dev/null >&2; done; exit 1; }

names_of() { (DIR=$1; . "$HERE/names.sh"; echo "$BR $NSP"); }
read -r brA nspA <<<"$(names_of "$A")"
read -r brB nspB <<<"$(names_of "$B")"
[ "$brA" != "$brB" ] && [ "$nspA" != "$nspB" ] || fail "the names of $A and $B collide: $brA/$nspA"

for d in "$A" "$B"; do
  DRUN_SLURM_NODES=2 DRUN_SLURM_SMOKE=1 timeout 150 bash "$HERE/up.sh" "$d" >"$top/up-$(basename "$d").out" 2>&1 ||
    fail "up.sh $d: $(tail -n 20 "$top/up-$(basename "$d").out")"
done
for pair in "$A $brA $nspA" "$B $brB $nspB"; do
  read -r d br nsp <<<"$pair"
  ip link show "$br" >/dev/null 2>&1 || fail "$d: no bridge $br"
  [ -e "/run/netns/${nsp}1" ] && [ -e "/run/netns/${nsp}2" ] || fail "$d: no namespaces ${nsp}1, ${nsp}2"
  out=$(cd "$d/jobs" && SLURM_CONF=$d/etc/slurm.conf timeout 30 srun -N2 --ntasks-per-node=1 -t 1 hostname 2>&1) ||
    fail "$d: srun while both clusters run: $out"
  [ "$(sort -u <<<"$out" | tr '\n' ' ')" = "n1 n2 " ] || fail "$d: srun ran on: $out"
  # Every absolute path the cluster uses lies under its DIR.
  for path in $(grep -oE '(=|socket=)/[^ ,()]*' "$d/etc/slurm.conf" | sed 's/^[a-z]*=//; s/^=//' | grep -vE '^/(usr|bin)/'); do
    [[ $path == "$d"/* ]] || fail "$d: slurm.conf names $path, outside $d"
  done
  pid=$(cat "$d/run/munged.pid") || fail "$d: no munged pid file"
  for path in $(tr '\0' '\n' <"/proc/$pid/cmdline" | grep -oE '/[^=]*$' | grep -v '^/usr/'); do
    [[ $path == "$d"/* ]] || fail "$d: munged uses $path, outside $d"
  done
  [ ! -e "/tmp/drun-munge-$(printf %s "$d" | cksum | cut -d' ' -f1)" ] || fail "$d: a munge directory under /tmp"
done
[ "$(grep -o 'subnet=[^ ]*' "$A/names")" != "$(grep -o 'subnet=[^ ]*' "$B/names")" ] || fail "both clusters on one subnet"
[ "$(grep -o 'ctld_port=[^ ]*' "$A/names")" != "$(grep -o 'ctld_port=[^ ]*' "$B/names")" ] || fail "both on one port"

# One goes down; the other still runs jobs, and then goes down too.
DRUN_SLURM_DIR= timeout 120 bash "$HERE/down.sh" "$A" >"$top/down-a.out" 2>&1 || fail "down.sh $A: $(cat "$top/down-a.out")"
! ip link show "$brA" >/dev/null 2>&1 || fail "down.sh $A left the bridge $brA"
[ ! -e "/run/netns/${nspA}1" ] || fail "down.sh $A left the namespace ${nspA}1"
out=$(cd "$B/jobs" && SLURM_CONF=$B/etc/slurm.conf timeout 30 srun -N2 --ntasks-per-node=1 -t 1 hostname 2>&1) ||
  fail "$B: srun after $A went down: $out"
DRUN_SLURM_DIR= timeout 120 bash "$HERE/down.sh" "$B" >"$top/down-b.out" 2>&1 || fail "down.sh $B: $(cat "$top/down-b.out")"
! ip link show "$brB" >/dev/null 2>&1 || fail "down.sh $B left the bridge $brB"
echo "side_by_side_test: two clusters ($brA, $brB) ran side by side, each within its directory"
