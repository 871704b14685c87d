#!/usr/bin/env bash
# drun vs torchrun for PyTorch programs: drun beside torchrun 1.13 for the same PyTorch
# all_reduce program (scripts/bench/vs_torchrun_allreduce.py: init_process_group("gloo") through
# env://, all_reduce, exit), from one run, on one node (4 ranks) and on two network-namespace
# hosts (2 ranks each). Prints one table, scenario x {drun, torchrun, ratio}, median of REPS:
#
#   first line from every rank       launch -> the last rank's first line (printed before
#                                    `import torch`: what the launcher costs until a program runs)
#   total job time                   launch -> the last launcher's exit (torch import, process
#                                    group, all_reduce, exit, and the launcher noticing it)
#   recovery: every rank restarted   a worker's fault (the last rank SIGKILLs itself after the
#                                    first all_reduce) -> the last rank's first line of the restart
#   recovery: all_reduce done again  the fault -> the last rank's all_reduce in the restarted job
#
# torchrun runs with its default --monitor_interval (5 s in 1.13) and with 0.1 s. Times come from
# the workers' wall-clock timestamps (the namespace hosts share this machine's clock) and the
# harness's own (launch, exit). "One node" is one namespace host too (with --nnodes 1 and the
# endpoint on it, what --standalone does), so no port of the machine is touched.
#
#   sudo scripts/bench/vs-torchrun.sh                # REPS=3: about 10 minutes on 2 cores
#   REPS=1 DRUN_BIN_DIR=/tmp/bin scripts/bench/vs-torchrun.sh
#   REPS=1 scripts/bench/vs-torchrun.sh --launchers drun --setups "two hosts" --modes fail
#
# Multi-node torchrun 1.13 needs each host to have a name of its own (it tells the workers
# MASTER_ADDR = its FQDN): every agent, drun's too, runs with its host's address as hostname (a
# UTS namespace). The fault happens once per trial, told by a file (not TORCHELASTIC_RESTART_COUNT,
# which torchrun 1.13 counts per agent: the node that did not fail still says 0 after the restart).
#
# Needs root (scripts/netns.sh), the built drun (DRUN_BIN_DIR, default build/bin; nothing is
# built here) and /usr/bin/python3 with torch (python3-torch; PYTHON overrides). The trials run
# on recovery_bench.py's harness: fresh namespaces per trial, every process killed by PID at its
# end. KEEP_LOGS=1 keeps the trials' logs.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
DRUN_BIN_DIR=${DRUN_BIN_DIR:-$repo/build/bin}
PYTHON=${PYTHON:-/usr/bin/python3}

die() { echo "vs-torchrun.sh: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
[[ -x "$DRUN_BIN_DIR/drun" ]] || die "no $DRUN_BIN_DIR/drun (build first, or set DRUN_BIN_DIR)"
[[ -x "$PYTHON" ]] || die "no $PYTHON"
"$PYTHON" -c 'import torch.distributed.run' 2>/dev/null \
  || die "$PYTHON cannot import torch.distributed.run (install python3-torch)"

work=$(mktemp -d /tmp/drun-vs-torchrun.XXXXXX)
chmod 755 "$work"
cleanup() {
  if [[ "${KEEP_LOGS:-0}" == 0 ]]; then rm -rf "$work"; else echo "logs in $work" >&2; fi
}
trap cleanup EXIT

"$PYTHON" scripts/bench/vs_torchrun_bench.py \
  --drun-bin "$(realpath -m "$DRUN_BIN_DIR")" \
  --netns "$repo/scripts/netns.sh" \
  --torchrun-compat "$repo/scripts/bench/torchrun_compat.py" \
  --python "$PYTHON" \
  --program "$repo/scripts/bench/vs_torchrun_allreduce.py" \
  --work-dir "$work" \
  --reps "${REPS:-3}" \
  "$@"
