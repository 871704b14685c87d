#!/usr/bin/env bash
# Chaos driver for drun's elastic core: random faults on network-namespace hosts, and
# the invariants every run must keep, checked after each iteration.
#
#   sudo scripts/bench/chaos.sh [--iterations N] [--seed S] [--kind KIND] [--time-budget SECONDS]
#   KEEP_LOGS=1 scripts/bench/chaos.sh --seed 1234 --iterations 1        # replay one iteration
#
# Hosts: 8 namespaces (scripts/netns.sh) made once per run: agents on hosts 0-3, newcomers on 4-6,
# drun-rendezvous (when the plan says so) on 7. Iteration i uses seed S+i (S random unless given;
# printed): fault kind = KINDS[seed % 8], everything else from random.Random(seed), so one seed
# replays one iteration's plan (the processes' own timing is not replayable). Each iteration is a
# fresh job (its own --rdzv-id, worker lifetime 1.5-2.5 s, 1-2 workers per node, --max-restarts 3,
# rdzv_conf join_timeout=6,last_call_timeout=500ms,close_timeout=3,heartbeat_interval=500ms,
# heartbeat_timeout=2,read_timeout=5): --nnodes 2:3 or 3:3 with MAX+1 agents (one spare), the
# store embedded in host 0's agent or in drun-rendezvous, and 1-2 faults of one kind at random
# times from 0.2 s to the job's end:
#
#   worker_kill    SIGKILL to a live worker              agent_kill   SIGKILL to an agent
#   agent_stop     SIGSTOP an agent 0.1-3 s, SIGCONT     store_slow   SIGSTOP the store 0.1-1.5 s
#   link_cut       a host's switch port down 0.5-5 s     newcomer     one more agent arrives
#   newcomers_min  MIN more agents arrive at once        duplicate    the same command again on a host
#
# (tc netem is not used: this kernel has no sch_netem; a port taken down drops everything.)
# Workers (chaos_worker.sh) log start / alive every 100 ms / term / end with wall time, host, pid,
# agent pid, TORCHELASTIC_RESTART_COUNT, GROUP_RANK, RANK, WORLD_SIZE, MASTER_ADDR:PORT.
# Invariants (chaos_checks.py has the exact rules):
#   1 one round at a time: a round (MASTER_ADDR:PORT, restart count, world size) never starts
#     while a worker of another still runs (no tolerance: workers write their last line before
#     they exit and agents rejoin after their workers exited; the driver prints the closest
#     gap it saw, 2.8-3.6 ms on the landed code), unless the
#     straggler's agent was frozen or cut off (it fences within heartbeat_timeout + 1 s of the
#     SIGCONT / the link's return) or SIGKILLed (its watchdog: 0.5 s). Both rounds with a live
#     rank 0: "split brain". Also: no rank twice in a round, restart counts never go back nor
#     beyond --max-restarts.
#   2 every agent exits within --hang-bound (30 s) of the last fault.
#   3 when the last round ended on every rank, every agent exits 0 (except those killed, frozen or
#     cut off for heartbeat_timeout or more, or started after the job's end); no agent exits 0
#     when it did not.
#   4 every agent that prints a root cause prints the same one (rank, node, status, pid, time) and
#     its workers saw the same last restart count.
#   5 2 s after the last agent's exit no process carrying the iteration's CHAOS_TAG is alive and
#     no /dev/shm entry names the job.
# Output: one line per iteration; each violation with its seed and the directory of its logs
# (agent-*.log at debug level, host*.log, timeline.txt: every event by time); then the table of
# fault kind x outcome (succeeded / failed, expected / failed, unexpected: a failure no planned
# fault explains, shown but not counted as a violation / one column per violation kind).
# Exit status: 0 no violation; 1 violations (or the time budget ended the run early); 2 usage;
# 77 cannot run here (not root, no `ip netns`, drun not built; no etcd with --store etcd).
#
#   sudo scripts/bench/chaos.sh --store etcd [--iterations N] [--seed S] [--kind KIND]
#
# runs every job with --rdzv-backend etcd on a 3-member etcd cluster made once per run on hosts
# 8-10 (scripts/etcd/up.sh with MEMBER_NETNS; the lease TTL is heartbeat_timeout, 2 s), with the
# same faults and invariants, except: store_slow freezes one member (not the store: the job goes
# on), link_cut may cut a member's host, and no host's loss takes the store with it (h0 is an
# agent like the others). A replay needs the same --store.
# Environment: DRUN_BIN_DIR (build/bin), KEEP_LOGS (0: keep only violating iterations' logs).
#
#   sudo scripts/bench/chaos.sh --recovery in-process [--iterations N] [--seed S] [--kind KIND]
#
# runs jobs under drun --recovery in-process whose workers use drun.torch.resilient
# (scripts/bench/time_lost_train.py), with faults during their recoveries and the invariants of
# in-process recovery (one generation at a time, equal parameters across ranks after each
# recovery, every recovery formed or fallen back to a restart): scripts/bench/chaos_inprocess.py
# describes them. It exits 77 (skipped) where drun has no --recovery or drun.torch no resilient.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
DRUN_BIN_DIR=${DRUN_BIN_DIR:-$repo/build/bin}
readonly kSkip=77

skip() { echo "chaos.sh: SKIPPED: $*"; exit "$kSkip"; }
[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces)"
ip netns list >/dev/null 2>&1 || skip "'ip netns' is not available"
etcd_args=()
needed=(drun drun-rendezvous)
if [[ " $* " == *" --store etcd "* || " $* " == *" --store=etcd "* ]]; then
  command -v etcd >/dev/null || [[ -x /usr/bin/etcd ]] || skip "etcd is not installed (--store etcd)"
  etcd_args=(--etcd-scripts "$repo/scripts/etcd")
  needed=(drun)  # no drun-rendezvous: every job's store is etcd
fi
for program in "${needed[@]}"; do
  [[ -x "$DRUN_BIN_DIR/$program" ]] || skip "no $DRUN_BIN_DIR/$program (build first, or set DRUN_BIN_DIR)"
done
[[ -x /usr/bin/python3 ]] || skip "no /usr/bin/python3"
if [[ " $* " == *" in-process "* || " $* " == *" --recovery=in-process "* ]]; then
  "$DRUN_BIN_DIR/drun" --help 2>/dev/null | grep -q -- '--recovery' \
    || skip "this drun has no --recovery (in-process recovery is not built)"
  PYTHONPATH="$DRUN_BIN_DIR/../lib/drun/python" /usr/bin/python3 -c \
    'import drun.torch; drun.torch.resilient' >/dev/null 2>&1 \
    || skip "drun.torch does not import or has no resilient (torch, drun_torch_backend)"
fi
probe="dchaosprobe$$"
if ! scripts/netns.sh -p "$probe" up 1 >/dev/null 2>&1; then
  scripts/netns.sh -p "$probe" down >/dev/null 2>&1 || true
  skip "cannot create network namespaces here"
fi
scripts/netns.sh -p "$probe" down

work=$(mktemp -d /tmp/drun-chaos.XXXXXX)
chmod 755 "$work"
status=0
/usr/bin/python3 scripts/bench/chaos_driver.py --drun-bin "$(realpath -m "$DRUN_BIN_DIR")" \
  --netns "$repo/scripts/netns.sh" --work-dir "$work" --keep-logs "${KEEP_LOGS:-0}" "${etcd_args[@]}" "$@" \
  || status=$?
# Only violating iterations left logs (unless KEEP_LOGS=1): keep the directory when it has any.
if [[ -z "$(ls -A "$work")" ]]; then rmdir "$work"; else echo "chaos.sh: logs in $work"; fi
exit "$status"
