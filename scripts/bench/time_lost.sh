#!/usr/bin/env bash
# Time lost to a failure in a real PyTorch program: torchrun 1.13 beside drun --recovery restart
# and drun --recovery in-process (drun and gloo backends), the same program, the same faults, one
# run; then 100 in-process recoveries in a row and what a survivor holds before and after.
#
#   sudo scripts/bench/time_lost.sh                      # the table, then the 100 recoveries
#   scripts/bench/time_lost.sh --seed 7 --scenarios node --modes torchrun,restart
#   LEAKS=0 scripts/bench/time_lost.sh                   # the table only
#   TABLE=0 RECOVERIES=20 scripts/bench/time_lost.sh     # the recoveries in a row only
#
# The program (scripts/bench/time_lost_train.py): the pytorch/examples DDP tutorial's ToyModel
# (Linear(10,10), ReLU, Linear(10,5); SGD lr 0.001), data drawn per step and rank from the seed,
# steps padded to 50 ms, written with drun.torch.resilient / state.commit() and a snapshot every
# 20 steps that a fresh start loads itself. Backend gloo, except the row that says drun.
#
# Scenarios (namespace hosts, scripts/netns.sh; host 0's agent hosts the rendezvous store):
#   node   one node x 4 workers; one rank (drawn) SIGKILLed after a drawn step in 25..39
#   hosts  two hosts x 2 workers; the same
#   agent  two hosts x 2 and a spare agent on a third host (started once the job runs, 3 s
#          before the fault); host 1 lost: its agent and its workers SIGKILLed at once after a
#          drawn step in 85..99
# Each (scenario, mode) is a fresh job, --max-restarts 3, otherwise default flags (torchrun:
# c10d on the same endpoint, monitor_interval 5 s, through scripts/bench/torchrun_compat.py).
# Columns: time lost = from the SIGKILL to the first step committed by a process that entered
# the training function after it (a replacement, a restarted rank, a survivor back from the
# recovery; workers log their own wall time, the namespaces share the clock); steps redone = the
# last step committed by a process that had not entered again since, minus the step before that
# first one; outcome =
# "in place" (every survivor kept its process) or "restarted" (with a fallback's reason), and
# the agents' exit codes; params = the sha1 of the parameters at the end (the same on every
# rank; the same in every row of one backend when the recovery lost nothing).
#
# The recoveries in a row (scripts/bench/time_lost_leaks.py): one node x 4, drun backend,
# in-process; RECOVERIES (100) times a rank other than 0 is SIGKILLed once its replacement has
# committed; rank 0's process is the survivor watched: open fds, /dev/shm entries (new since the
# job began) and RSS after the first recovery and after the last, and the median time lost.
#
# Needs root (namespaces), /usr/bin/python3 with torch, the built drun and drun.torch
# (DRUN_BIN_DIR, default build/bin; nothing is built here). The in-process rows and the
# recoveries in a row need drun's --recovery and drun.torch.resilient: without them they show
# "not measured" and the rest runs. Every wait is bounded; the harness kills only what it
# started, by PID. Run time: about 6 minutes for the table on a loaded 2-core machine (torchrun's
# rows most of it), 3-5 minutes for 100 recoveries.
# Environment: DRUN_BIN_DIR, PYTHON, TABLE (1), LEAKS (1), RECOVERIES (100), KEEP_LOGS (0),
# DRUN_EXTRA (more drun options for the table's drun rows, e.g. "--rdzv-conf standby_workers=0").
# With KEEP_LOGS=1 each job's directory keeps its agents' output, their --events files
# (events<host>.jsonl) and the workers' log (workers.log: the phases of a recovery, wall times).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
DRUN_BIN_DIR=$(realpath -m "${DRUN_BIN_DIR:-$repo/build/bin}")
PYTHON=${PYTHON:-/usr/bin/python3}
pythonpath=$(realpath -m "$DRUN_BIN_DIR/../lib/drun/python")

die() { echo "time_lost.sh: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
[[ -x "$DRUN_BIN_DIR/drun" ]] || die "no $DRUN_BIN_DIR/drun (build first, or set DRUN_BIN_DIR)"
"$PYTHON" -c 'import torch.distributed.run' 2>/dev/null || die "$PYTHON cannot import torch"
PYTHONPATH=$pythonpath "$PYTHON" -c 'import drun.torch' 2>/dev/null \
  || die "drun.torch does not import from $pythonpath (build drun_python and drun_torch_backend)"

in_process=""
if ! "$DRUN_BIN_DIR/drun" --help 2>/dev/null | grep -q -- '--recovery'; then
  in_process="this drun has no --recovery"
elif ! PYTHONPATH=$pythonpath "$PYTHON" -c 'import drun.torch; drun.torch.resilient' \
    2>/dev/null; then
  in_process="this drun.torch has no resilient"
fi

work=$(mktemp -d /tmp/drun-time-lost.XXXXXX)
chmod 755 "$work"
cleanup() { if [[ "${KEEP_LOGS:-0}" == 0 ]]; then rm -rf "$work"; else echo "logs in $work"; fi; }
trap cleanup EXIT

common=(--drun-bin "$DRUN_BIN_DIR" --netns "$repo/scripts/netns.sh"
        --torchrun-compat "$repo/scripts/bench/torchrun_compat.py"
        --train "$repo/scripts/bench/time_lost_train.py" --python "$PYTHON"
        --pythonpath "$pythonpath")
status=0
echo "# time lost to a failure, $(date -u +%FT%TZ), $(getconf _NPROCESSORS_ONLN) cores, $(uname -r)"
# What a restarted rank pays before its first line on this machine now (a loaded machine pays
# more): the restart rows depend on it, the in-process ones do not (survivors keep their imports).
import_s=$("$PYTHON" -c \
  'import time; t = time.time(); import torch.distributed; print(f"{time.time() - t:.2f}")')
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg); import torch.distributed: ${import_s} s"
if [[ "${TABLE:-1}" != 0 ]]; then
  "$PYTHON" scripts/bench/time_lost_bench.py "${common[@]}" --work-dir "$work/table" \
    --in-process "$in_process" "$@" || status=$?
fi
if [[ "${LEAKS:-1}" != 0 ]]; then
  if [[ -n "$in_process" ]]; then
    echo "recoveries in a row: not measured: $in_process"
  else
    "$PYTHON" scripts/bench/time_lost_leaks.py "${common[@]}" --work-dir "$work/leaks" \
      --recoveries "${RECOVERIES:-100}" || status=$?
  fi
fi
exit "$status"
