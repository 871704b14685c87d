#!/usr/bin/env bash
# up.sh - bring up a throw-away, real SLURM cluster of N nodes on this one machine, for drun's
# [slurm] tests and for trying drun under srun/sbatch (adapted from shared/reference/slurm/up.sh).
#
# One slurmctld on the host side of a private bridge ($SUBNET.1) and one slurmd per node, each in
# its own network namespace (own IP $SUBNET.(10+i), own hostname n<i>, via nsenter + unshare --uts)
# and its own mount namespace, where a private hosts file naming every node is bind-mounted over
# /etc/hosts: every node resolves every other node's name (the first node hosts drun's
# rendezvous), and the machine's /etc/hosts and /etc/slurm are never touched.
#
# Everything (config, munge key + socket, state, logs, pid files) lives under DIR (the argument,
# else $DRUN_SLURM_DIR). The names of what lives outside any directory (bridge, veths, network
# namespaces) carry a short hash of DIR, and the subnet and slurmctld's port are picked from it
# (the next free ones when taken): two clusters in two directories run side by side.
# Idempotent: a healthy cluster of the same shape is left as it is; stale state is torn down first
# (down.sh). Every wait is bounded. Prints "export SLURM_CONF=..." on success; on failure exits 1
# with "up.sh: ERROR: ..." (and the last log lines once daemons were started).
#
# Usage: up.sh [DIR]
# Knobs (all optional):
#   DRUN_SLURM_DIR=/tmp/drun-slurm    working directory when no DIR is given (absolute, at most
#                                     80 characters, every directory above it traversable by all:
#                                     munged's socket is there)
#   DRUN_SLURM_PREFIX=ds<hash>        the names' prefix, 1-8 of [a-z0-9] (default: "ds" and 6 hex
#                                     digits of DIR's sha256): bridge <P>-br, namespaces <P>-n<i>
#   DRUN_SLURM_NODES=2                nodes n1..nN (1..16)
#   DRUN_SLURM_CPUS=8                 CPUs each node declares (config_overrides: more than the
#                                     machine has is fine; drun's workers are not CPU-bound here)
#   DRUN_SLURM_CTLD_PORT=16817+h      slurmctld's TCP port on the host side (not SLURM's 6817, so
#                                     a real SLURM on the machine is left alone); by default
#                                     16817 + (hash mod 500), the next free one when taken
#   DRUN_SLURM_SUBNET=10.233.h        /24 of the bridge (tests/support/netns uses 10.231.0); by
#                                     default the third number from the hash (20-219), the next
#                                     free /24 when taken
#   DRUN_SLURM_APT=0                  1: apt-get install the packages when missing
#   DRUN_SLURM_SMOKE=1                run `srun -N$NODES hostname` at the end
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -le 1 ] || { echo "usage: up.sh [DIR]" >&2; exit 2; }
DIR=${1:-${DRUN_SLURM_DIR:-/tmp/drun-slurm}}
export DRUN_SLURM_DIR="$DIR"   # down.sh's, when up.sh calls it
# shellcheck source=names.sh
. "$HERE/names.sh"             # NAME BR NSP VETH HASH from DIR (and DRUN_SLURM_PREFIX)
NODES=${DRUN_SLURM_NODES:-2}
CPUS=${DRUN_SLURM_CPUS:-8}
CTLD_PORT=${DRUN_SLURM_CTLD_PORT:-$((16817 + HASH % 500))}
SUBNET=${DRUN_SLURM_SUBNET:-10.233.$((20 + HASH % 200))}
APT=${DRUN_SLURM_APT:-0}
SMOKE=${DRUN_SLURM_SMOKE:-1}
PREFIX=n
TAG="DRUN_SLURM_TAG=$DIR"

T0=$(date +%s%N)
say() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf 'up.sh: [%3d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"; }
DUMP_LOGS=0
die() {
  echo "up.sh: ERROR: $*" >&2
  if [ "$DUMP_LOGS" = 1 ]; then
    for f in "$DIR"/log/*.log "$DIR"/log/*.stderr "$DIR"/munge/munged.log; do
      [ -s "$f" ] || continue
      echo "---- last lines of $f ----" >&2; tail -n 5 "$f" >&2
    done
  fi
  exit 1
}
# wait_for SECONDS DESCRIPTION COMMAND...   (polls every 0.2 s)
wait_for() {
  local secs=$1 what=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  while ! "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$end" ] && die "timed out after ${secs}s waiting for: $what"
    sleep 0.2
  done
}

[ "$(id -u)" -eq 0 ] || die "must run as root"
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 16 ] || die "DRUN_SLURM_NODES must be 1..16 (got '$NODES')"
[[ "$CPUS" =~ ^[0-9]+$ ]] && [ "$CPUS" -ge 1 ] && [ "$CPUS" -le 256 ] || die "DRUN_SLURM_CPUS must be 1..256 (got '$CPUS')"
[[ "$CTLD_PORT" =~ ^[0-9]+$ ]] && [ "$CTLD_PORT" -ge 1024 ] && [ "$CTLD_PORT" -le 65535 ] || die "DRUN_SLURM_CTLD_PORT must be 1024..65535"
[[ "$SUBNET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "DRUN_SLURM_SUBNET must look like 10.233.0 (got '$SUBNET')"
[[ "$DIR" = /* && "$DIR" != *[[:space:]]* ]] || die "DRUN_SLURM_DIR must be an absolute path without blanks"
[ ${#DIR} -le 80 ] || die "DRUN_SLURM_DIR is too long for munge's socket path (at most 80 characters): $DIR"
[[ "$NAME" =~ ^[a-z0-9]{1,8}$ ]] || die "DRUN_SLURM_PREFIX must be 1-8 of [a-z0-9] (got '$NAME')"

# ---------------------------------------------------------------- packages
PKGS=(slurmctld slurmd slurm-client munge)
need_pkgs() { for b in slurmctld slurmd srun sbatch scontrol sinfo squeue scancel munged munge unmunge; do command -v "$b" >/dev/null 2>&1 || return 0; done; return 1; }
if need_pkgs; then
  [ "$APT" = 1 ] || die "SLURM binaries missing: install ${PKGS[*]} (scripts/setup.sh --tests does) or set DRUN_SLURM_APT=1"
  say "installing ${PKGS[*]} (apt-get, no recommends)"
  mkdir -p "$DIR"
  export DEBIAN_FRONTEND=noninteractive
  apt-cache show slurmd >/dev/null 2>&1 || timeout 300 apt-get update -q >"$DIR/apt-update.log" 2>&1 || die "apt-get update failed (see $DIR/apt-update.log)"
  timeout 600 apt-get install -y -q --no-install-recommends "${PKGS[@]}" >"$DIR/apt-install.log" 2>&1 \
    || die "apt-get install failed (see $DIR/apt-install.log)"
  need_pkgs && die "packages installed but binaries still missing"
fi
for b in ip nsenter unshare ss mount; do command -v "$b" >/dev/null 2>&1 || die "missing tool: $b"; done

export SLURM_CONF="$DIR/etc/slurm.conf"

# ---------------------------------------------------------------- already up?
alive_tagged() { # pidfile expected-comm
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm")" = "$2" ] || return 1
  { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "$TAG"
}
healthy() {
  [ -f "$DIR/up.ok" ] || return 1
  alive_tagged "$DIR/run/munged.pid" munged || return 1
  alive_tagged "$DIR/run/slurmctld.pid" slurmctld || return 1
  local i
  for i in $(seq 1 "$(cat "$DIR/nodes")"); do alive_tagged "$DIR/run/slurmd-$PREFIX$i.pid" slurmd || return 1; done
  timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
  ! timeout 10 sinfo -h -N -o '%T' 2>/dev/null | grep -qvE '^(idle|allocated|mixed|completing)$'
}
SHAPE_KEY="nodes=$NODES cpus=$CPUS ctld_port=${DRUN_SLURM_CTLD_PORT:-auto} subnet=${DRUN_SLURM_SUBNET:-auto} names=$NAME"
if healthy; then
  if [ "$(cat "$DIR/shape" 2>/dev/null)" = "$SHAPE_KEY" ]; then
    say "cluster in $DIR is already up ($SHAPE_KEY); nothing to do"
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  say "cluster in $DIR is up with a different shape ($(cat "$DIR/shape" 2>/dev/null)); restarting"
fi
if [ -d "$DIR/run" ] || [ -f "$DIR/netns.created" ] || [ -f "$DIR/nodes" ]; then
  say "tearing down stale/partial cluster state in $DIR"
  DRUN_SLURM_DIR="$DIR" timeout 120 bash "$HERE/down.sh" || die "down.sh failed while cleaning stale state"
fi

# ---------------------------------------------------------------- fresh dirs
# munged's socket under DIR too: munged wants every directory above it traversable by all, which
# DIR's parents need not be (a mktemp -d checkout is 0700); --force (below) lets it start anyway,
# which is fine for a cluster whose clients all run as root.
MRUN="$DIR/munge-run"
rm -rf "$DIR/ctld" "$DIR/spool" "$DIR/run" "$DIR/log" "$DIR/etc" "$DIR/munge" "$MRUN" "$DIR/up.ok"
mkdir -p "$DIR"/{ctld,spool,run,log,etc,munge,jobs} "$MRUN"
chmod 755 "$DIR" "$MRUN" "$DIR/etc" "$DIR/run"
chmod 1777 "$DIR/jobs"
chmod 700 "$DIR/munge"
for i in $(seq 1 "$NODES"); do mkdir -p "$DIR/spool/$PREFIX$i"; done
echo "$NODES" >"$DIR/nodes"; echo "$SHAPE_KEY" >"$DIR/shape"
export DRUN_SLURM_TAG="$DIR"   # inherited by every daemon (and slurmstepd): down.sh matches on it

# ---------------------------------------------------------------- ports, names
port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
subnet_busy() { ip -br addr | grep -qF " $1."; }
# Picked from the hash (no knob given): the next free one when another cluster (or anything) has it.
if [ -z "${DRUN_SLURM_CTLD_PORT:-}" ]; then
  for _ in $(seq 1 50); do port_busy "$CTLD_PORT" || break; CTLD_PORT=$((CTLD_PORT + 1)); done
fi
if [ -z "${DRUN_SLURM_SUBNET:-}" ]; then
  third=${SUBNET##*.}
  for _ in $(seq 1 50); do subnet_busy "$SUBNET" || break; third=$(( (third - 20 + 1) % 200 + 20 )); SUBNET=10.233.$third; done
fi
port_busy "$CTLD_PORT" && die "TCP port $CTLD_PORT (slurmctld) is already in use: $(ss -Hltnp "sport = :$CTLD_PORT")"
ip link show "$BR" >/dev/null 2>&1 && die "bridge $BR already exists (a cluster in another directory with the same DRUN_SLURM_PREFIX? its down.sh removes it)"
subnet_busy "$SUBNET" && die "some interface already has an address in $SUBNET.0/24"
for i in $(seq 1 "$NODES"); do [ -e "/run/netns/$NSP$i" ] && die "network namespace $NSP$i already exists"; done
echo "bridge=$BR subnet=$SUBNET ctld_port=$CTLD_PORT" >"$DIR/names"

# ---------------------------------------------------------------- munge
say "starting munged (private key + socket in $DIR)"
DUMP_LOGS=1
dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$DIR/munge/munge.key"
MSOCK="$MRUN/munge.socket"
/usr/sbin/munged --force --socket="$MSOCK" --key-file="$DIR/munge/munge.key" \
  --pid-file="$DIR/run/munged.pid" --log-file="$DIR/munge/munged.log" \
  --seed-file="$DIR/munge/munged.seed" </dev/null >"$DIR/log/munged.stderr" 2>&1 \
  || die "munged failed to start: $(cat "$DIR/log/munged.stderr")"
wait_for 10 "munged pid file" alive_tagged "$DIR/run/munged.pid" munged
munge_ok() { munge -S "$MSOCK" -n | unmunge -S "$MSOCK"; }
wait_for 10 "munge credential round trip" munge_ok

# ---------------------------------------------------------------- network
CTLD_HOST=$(hostname -s 2>/dev/null || hostname)
CTLD_ADDR="$SUBNET.1"
say "creating bridge $BR ($CTLD_ADDR/24) and $NODES network namespaces"
: >"$DIR/netns.created"
ip link add "$BR" type bridge || die "cannot create bridge $BR"
echo "bridge $BR" >>"$DIR/netns.created"
ip addr add "$CTLD_ADDR/24" dev "$BR"
ip link set "$BR" up
for i in $(seq 1 "$NODES"); do
  ns="$NSP$i"
  ip netns add "$ns" || die "cannot create netns $ns"
  echo "netns $ns" >>"$DIR/netns.created"
  ip link add "$VETH$i" type veth peer name eth0 netns "$ns" || die "cannot create veth $VETH$i"
  echo "link $VETH$i" >>"$DIR/netns.created"
  ip link set "$VETH$i" master "$BR" up
  ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

# The nodes' /etc/hosts (bind-mounted inside each node's mount namespace only).
{
  cat /etc/hosts
  echo "# drun SLURM test cluster ($DIR)"
  echo "$CTLD_ADDR $CTLD_HOST-ctld"
  for i in $(seq 1 "$NODES"); do echo "$SUBNET.$((10 + i)) $PREFIX$i"; done
} >"$DIR/etc/hosts"
chmod 644 "$DIR/etc/hosts"

# ---------------------------------------------------------------- slurm.conf
cat >"$SLURM_CONF" <<CONF
# generated by $HERE/up.sh ($NODES nodes) - do not edit
ClusterName=drunslurm
SlurmctldHost=$CTLD_HOST($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MSOCK
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
KillWait=5
CONF
for i in $(seq 1 "$NODES"); do
  echo "NodeName=$PREFIX$i NodeHostname=$PREFIX$i NodeAddr=$SUBNET.$((10 + i)) CPUs=$CPUS RealMemory=1000 State=UNKNOWN" >>"$SLURM_CONF"
done
echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$SLURM_CONF"
chmod 644 "$SLURM_CONF"

# ---------------------------------------------------------------- slurmctld
say "starting slurmctld ($CTLD_HOST, $CTLD_ADDR:$CTLD_PORT)"
slurmctld -f "$SLURM_CONF" </dev/null >"$DIR/log/slurmctld.stderr" 2>&1 \
  || die "slurmctld failed to start: $(cat "$DIR/log/slurmctld.stderr")"
wait_for 15 "slurmctld pid file" alive_tagged "$DIR/run/slurmctld.pid" slurmctld
ctld_up() { timeout 5 scontrol ping | grep -q 'is UP'; }
wait_for 20 "scontrol ping -> UP" ctld_up

# ---------------------------------------------------------------- slurmd(s)
say "starting $NODES slurmd"
for i in $(seq 1 "$NODES"); do
  n="$PREFIX$i"
  # nsenter (not `ip netns exec`, which remounts /sys and hides the cgroup mounts slurmd 22.05
  # needs); unshare --mount gives the node its own /etc/hosts (private propagation: the machine's
  # mounts do not change).
  nsenter --net="/run/netns/$NSP$i" unshare --uts --mount \
    sh -c 'mount --bind "$3" /etc/hosts && hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "$n" "$SLURM_CONF" "$DIR/etc/hosts" \
    </dev/null >"$DIR/log/slurmd-$n.stderr" 2>&1 \
    || die "slurmd -N $n (netns $NSP$i) failed to start: $(cat "$DIR/log/slurmd-$n.stderr")"
done
for i in $(seq 1 "$NODES"); do wait_for 15 "slurmd $PREFIX$i pid file" alive_tagged "$DIR/run/slurmd-$PREFIX$i.pid" slurmd; done
all_idle() { local s; s=$(timeout 5 sinfo -h -N -o '%T') || return 1; [ "$(echo "$s" | grep -c '^idle$')" -eq "$NODES" ]; }
wait_for 30 "all $NODES nodes idle (sinfo)" all_idle

cat >"$DIR/env.sh" <<ENV
export SLURM_CONF=$SLURM_CONF
ENV

# ---------------------------------------------------------------- smoke test
if [ "$SMOKE" = 1 ]; then
  out=$(cd "$DIR/jobs" && timeout 30 srun -N"$NODES" --ntasks-per-node=1 -t 1 hostname 2>&1) \
    || die "smoke test 'srun -N$NODES --ntasks-per-node=1 hostname' failed: $out"
  [ "$(echo "$out" | sort -u | wc -l)" -eq "$NODES" ] || die "smoke test ran on unexpected nodes: $out"
  say "smoke test ok: tasks ran on $(echo "$out" | sort | tr '\n' ' ')"
fi

date -u +%FT%TZ >"$DIR/up.ok"
say "cluster up: nodes $PREFIX[1-$NODES], controller $CTLD_HOST($CTLD_ADDR:$CTLD_PORT), bridge $BR, namespaces $NSP[1-$NODES]"
echo "export SLURM_CONF=$SLURM_CONF"
