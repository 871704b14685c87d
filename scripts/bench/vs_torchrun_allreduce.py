#!/usr/bin/python3
"""The PyTorch program of scripts/bench/vs-torchrun.sh, the same for drun and torchrun: join the
job with init_process_group("gloo", init_method="env://"), all_reduce a tensor of ones, check
the sum, leave.

    vs_torchrun_allreduce.py run     every rank: START, all_reduce, END, exit 0
    vs_torchrun_allreduce.py fail    as `run`, except on the first attempt: the last rank, after
                                     the all_reduce, logs FAULT and SIGKILLs itself; the others
                                     wait (bounded) to be stopped by the launcher

"The first attempt" is: no $RECOV_LOG.fault file when the worker started (the faulting rank
creates it). Not TORCHELASTIC_RESTART_COUNT: torchrun 1.13 counts restarts per agent, and an
agent restarted by another node's failure still says 0 (drun's count is the job's).

Each rank appends `START|END|FAULT <host> <restart count> <rank> <world size> <pid> <wall time>` to
$RECOV_LOG (the line format of scripts/bench/recovery_bench.py, whose trial harness runs this):
START is its first action, before torch is imported (its first line), END follows the
all_reduce. It also prints its first line to stdout, as a program would.
"""
import datetime
import os
import signal
import sys
import time

STARTED = time.time()
HOST = os.environ.get("RECOV_HOST", "0")
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def note(kind, when):
    with open(os.environ["RECOV_LOG"], "a") as log:  # one short append: one whole line
        log.write(f"{kind} {HOST} {RESTART} {RANK} {WORLD} {os.getpid()} {when:.6f}\n")


FAULT_FILE = os.environ["RECOV_LOG"] + ".fault"
FIRST_ATTEMPT = not os.path.exists(FAULT_FILE)  # created after every rank of it has started
note("START", STARTED)
print(f"rank {RANK}/{WORLD} started (restart {RESTART})", flush=True)

import torch  # noqa: E402  (after the first line: the import is what the first line precedes)
import torch.distributed as dist  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "run"
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
tensor = torch.ones(1 << 16)
dist.all_reduce(tensor)
if tensor[0].item() != WORLD:
    sys.exit(f"all_reduce gave {tensor[0].item()}, expected {WORLD}")
if mode == "fail" and FIRST_ATTEMPT:
    if RANK == WORLD - 1:
        open(FAULT_FILE, "w").close()
        note("FAULT", time.time())
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)  # stopped by the launcher long before
    sys.exit("not stopped within 120 s of the fault")
note("END", time.time())
dist.destroy_process_group()
