#!/usr/bin/env bash
# Recovery benchmark of the elastic core: drun beside torchrun 1.13 (c10d, its default
# --monitor_interval 5 and --monitor_interval 0.1), same run, same namespace hosts. Prints one table.
#
#   sudo scripts/bench/recovery.sh                          # all scenarios, 5 trials each
#   scripts/bench/recovery.sh failure exit                  # some scenarios
#   DRUN_BIN_DIR=/tmp/bin TRIALS=7 TORCH_TRIALS=3 TORCH=0 scripts/bench/recovery.sh sigkill
#
# Needs root (network namespaces, scripts/netns.sh) and the built drun (DRUN_BIN_DIR, default
# build/bin; nothing is built here). torchrun runs under /usr/bin/python3 through
# scripts/bench/torchrun_compat.py. The hosts are namespaces 10.231.0.1, .2, ...; host 0 is the
# rendezvous endpoint (10.231.0.1:29400), whose agent hosts the store. Each trial gets fresh
# namespaces and a fresh job; NPROC (2) workers per host; --max-restarts 3.
#
# Every worker is a bash script whose first action appends
# `START <host> <restart count> <rank> <world size> <pid> <$EPOCHREALTIME>` to the trial's log (a
# /tmp file: the namespaces share the file system and the wall clock); then it sleeps (300 s), or
# in the exit scenario sleeps 1-2 s (random per trial, the same for all), appends `END ...` and
# exits 0. The harness waits until the first round is complete (every worker started with the
# expected WORLD_SIZE, nothing new for 0.5 s), pauses a random 0-1 s (so that the fault falls at
# no fixed phase of a periodic timer: heartbeats, torchrun's monitor loop), takes the wall time,
# injects the fault at once, and waits for the new round: one START after the
# fault from every worker of the expected hosts with the expected WORLD_SIZE. It reports the first
# of those starts minus the fault time ("drun": the number the target is about; "drun all": the
# last of them, the whole new round running). A new round must span all the expected hosts: a node
# that only restarts its own workers has not recovered the job.
#
#   failure  2 hosts, --nnodes 2. SIGKILL to one worker on host 1 (not the store host).
#            New round: 2 hosts, world 2*NPROC, every worker restarted.      target <= 200 ms
#   sigkill  3 hosts, --nnodes 2:3. SIGKILL to host 2's agent.
#            New round: hosts 0 and 1, world 2*NPROC.                        target <= 1 s
#   linkcut  3 hosts, --nnodes 2:3, rdzv_conf heartbeat_timeout=2. Host 2's switch port goes down
#            (`ip link set v2 down` in the hub namespace: host 2 keeps its address, its packets are
#            dropped, nobody gets a reset). New round: hosts 0 and 1.        target <= 2.5 s
#   scaleup  3 hosts, --nnodes 2:4, last_call_timeout=1; hosts 0 and 1 run the job, then host 2's
#            agent is started (fault time = just before its start, so its start-up counts).
#            New round: 3 hosts, world 3*NPROC (below MAX, so the last call applies). target <= 1.5 s
#   daemon   2 hosts, --nnodes 2, rdzv_conf is_host=0: the store is a drun-rendezvous daemon on
#            host 0 (same endpoint). SIGKILL to the daemon, then a new one on the same port (empty);
#            fault time = the new daemon's start. The agents fence, reconnect (reconnect_timeout)
#            and refill the store: new round on hosts 0 and 1 with the restart count carried.
#            torchrun has no counterpart (its cells show "skipped").         target <= 2 s
#   exit     2 hosts, --nnodes 2; every worker exits 0 after 1-2 s. From the last worker's END to
#            the last agent process's exit (the harness waits on each agent's pidfd; "drun all" is
#            the first agent's exit there).                                  target <= 100 ms
#
# sigkill and linkcut leave 2 of MIN:MAX=2:3 nodes. drun re-forms as soon as every survivor is
# back (no last-call wait); torchrun 1.13 would wait for the last call. Both get
# last_call_timeout=LOSS_LAST_CALL (1 s, the smallest torchrun 1.13 takes) there.
# torch 1.13 ignores heartbeat_timeout (keep-alive fixed at 5 s x 3 = 15 s);
# it is passed anyway so that both get the same command line. torch 1.13 cannot tell which
# namespace hosts the store (they share one hostname): it gets is_host=1 on host 0, 0 elsewhere.
#
# A cell (scenario x launcher) whose first trial does not recover within its cap (DRUN_CAP 10 s,
# TORCH_CAP 30 s, from the fault) is not tried again and shows "no recovery within N s"; later
# failed trials show as "(k/n recovered)". The verdict is MET when drun's median is within the
# target and every trial recovered. torchrun 1.13 never notices a lost node by itself (only a
# failing worker or a node in its wait list restarts it), so expect no recovery there for sigkill
# and linkcut: those cells cost one cap each. Below the table: TORCHELASTIC_RESTART_COUNT of the
# new round by host (drun's budget is the job's: every host should show the same count).
# Run time with the defaults: about 12 minutes on a loaded 2-core machine, 10 of them torchrun;
# TORCH=0: under a minute.
#
# Environment: DRUN_BIN_DIR, TRIALS (5), TORCH_TRIALS (=TRIALS), TORCH (1; 0 = drun only),
# DRUN (1; 0 = torchrun only), ETCD (1; 0 = no drun etcd column), NPROC (2), DRUN_CAP (10), TORCH_CAP (30), LOSS_LAST_CALL (1),
# KEEP_LOGS (0; 1 keeps, per trial, each agent's output and timeline.txt: the workers' lines, the
# fault and each agent's start and exit, by time; it prints where).
#
#   storehost  3 hosts, --nnodes 2:3, reconnect_timeout=3. SIGKILL to host 0's agent, the one
#            that hosts the c10d store: with c10d the job ends (the cell shows the survivors' exit
#            codes); with etcd the survivors (hosts 1 and 2) re-form.        target <= 2.5 s (etcd)
#
# The column "drun etcd" runs every scenario but daemon with --rdzv-backend etcd: a 3-member etcd
# cluster (scripts/etcd/up.sh) on 3 more namespace hosts per trial, heartbeat_timeout=2 (the lease
# TTL: a SIGKILLed agent is noticed when its lease ends) where the scenario sets none. ETCD=0
# leaves it out (it is left out, with a note, where etcd is not installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
DRUN_BIN_DIR=${DRUN_BIN_DIR:-$repo/build/bin}
PYTHON=${PYTHON:-/usr/bin/python3}
TRIALS=${TRIALS:-5}

die() { echo "recovery.sh: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
[[ "${DRUN:-1}" == 0 || -x "$DRUN_BIN_DIR/drun" ]] || die "no $DRUN_BIN_DIR/drun (build first, or set DRUN_BIN_DIR)"
[[ -x "$PYTHON" ]] || die "no $PYTHON"
ETCD=${ETCD:-1}
if [[ "$ETCD" != 0 ]] && ! command -v etcd >/dev/null && [[ ! -x /usr/bin/etcd ]]; then
  echo "recovery.sh: etcd is not installed (scripts/setup.sh --tests): no drun etcd column" >&2
  ETCD=0
fi
if [[ "${TORCH:-1}" != 0 ]]; then
  "$PYTHON" -c 'import torch.distributed.run' 2>/dev/null \
    || die "$PYTHON cannot import torch.distributed.run (TORCH=0 runs drun only)"
fi

work=$(mktemp -d /tmp/drun-recovery.XXXXXX)
chmod 755 "$work"
cleanup() {
  if [[ "${KEEP_LOGS:-0}" == 0 ]]; then rm -rf "$work"; fi
}
trap cleanup EXIT

# The harness kills what it started and removes its namespaces itself (also on SIGINT/SIGTERM).
"$PYTHON" scripts/bench/recovery_bench.py \
  --drun-bin "$(realpath -m "$DRUN_BIN_DIR")" \
  --netns "$repo/scripts/netns.sh" \
  --torchrun-compat "$repo/scripts/bench/torchrun_compat.py" \
  --python "$PYTHON" \
  --work-dir "$work" \
  --trials "$TRIALS" \
  --torch-trials "${TORCH_TRIALS:-$TRIALS}" \
  --torch "${TORCH:-1}" \
  --drun "${DRUN:-1}" \
  --etcd "$ETCD" \
  --keep-logs "${KEEP_LOGS:-0}" \
  --nproc "${NPROC:-2}" \
  --drun-cap "${DRUN_CAP:-10}" \
  --torch-cap "${TORCH_CAP:-30}" \
  --loss-last-call "${LOSS_LAST_CALL:-1}" \
  "$@"
