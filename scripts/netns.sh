#!/usr/bin/env bash
# netns.sh: a throw-away "cluster" of N hosts made of Linux network namespaces, for multi-node
# tests on one machine.
#
#   scripts/netns.sh [-p PREFIX] up N      create hosts PREFIX-0 .. PREFIX-(N-1); prints PREFIX
#   scripts/netns.sh -p PREFIX addr I      the address of host I (10.231.0.(I+1))
#   scripts/netns.sh -p PREFIX exec I CMD  run CMD inside host I
#   scripts/netns.sh -p PREFIX down        remove every namespace of PREFIX (idempotent)
#
# Layout: a hub namespace PREFIX-hub holds a bridge; each host namespace PREFIX-I has eth0 (a veth
# whose other end is enslaved to the bridge) with 10.231.0.(I+1)/24, and lo up. Nothing is created
# in the root namespace, so the subnet cannot clash with the machine's own networks nor with a
# concurrent run (each run has its own hub), and no traffic leaves the namespaces.
# PREFIX defaults to drun-<pid of this script>; names stay short (interface names are ≤ 15 chars).
# Needs root and iproute2 with `ip netns`. Exit codes: 0 ok, 1 failure, 2 usage.
set -euo pipefail

readonly kMaxHosts=32
readonly kSubnet=10.231.0
prefix="drun-$$"

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() { echo "netns.sh: $*" >&2; exit 1; }

while getopts "p:h" opt; do
  case "$opt" in
    p) prefix="$OPTARG" ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[[ $# -ge 1 ]] || usage
[[ "$prefix" =~ ^[A-Za-z0-9_.-]{1,24}$ ]] || die "bad prefix '$prefix' (letters, digits, _.- only)"

host_ns() { echo "${prefix}-$1"; }
hub_ns() { echo "${prefix}-hub"; }
host_addr() { echo "${kSubnet}.$(($1 + 1))"; }

check_index() {
  [[ "$1" =~ ^[0-9]+$ ]] || die "host index '$1' is not a number"
  (( $1 < kMaxHosts )) || die "host index $1 out of range (max $((kMaxHosts - 1)))"
}

namespaces_of_prefix() {
  # `ip netns list` prints "name" or "name (id: N)".
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix//./\\.}-(hub|[0-9]+)$" || true
}

cmd_down() {
  local ns
  for ns in $(namespaces_of_prefix); do
    ip netns del "$ns" 2>/dev/null || true
  done
}

cmd_up() {
  local n="${1:-}"
  [[ "$n" =~ ^[0-9]+$ ]] && (( n >= 1 && n <= kMaxHosts )) || die "up needs N in 1..$kMaxHosts"
  [[ $(id -u) -eq 0 ]] || die "needs root"
  ip netns list >/dev/null 2>&1 || die "'ip netns' is not available"
  [[ -z "$(namespaces_of_prefix)" ]] || die "namespaces with prefix '$prefix' already exist"
  # Any failure below leaves nothing behind.
  trap 'cmd_down' ERR
  local hub i ns
  hub=$(hub_ns)
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$hub" link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "v$i" master br0
    ip -n "$hub" link set "v$i" up
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  trap - ERR
  echo "$prefix"
}

cmd_exec() {
  [[ $# -ge 2 ]] || usage
  check_index "$1"
  local ns
  ns=$(host_ns "$1")
  shift
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "no namespace $ns (run up first)"
  exec ip netns exec "$ns" "$@"
}

action="$1"
shift
case "$action" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  addr) [[ $# -eq 1 ]] || usage; check_index "$1"; host_addr "$1" ;;
  exec) cmd_exec "$@" ;;
  *) usage ;;
esac
