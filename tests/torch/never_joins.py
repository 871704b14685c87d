#!/usr/bin/python3
"""A program that never uses drun.torch, run under `drun --recovery in-process`: on the job's
first attempt rank FAILING_RANK exits with code 3; the other ranks and its replacement (started
with DRUN_GENERATION > 0) wait to be stopped, taking no part in the recovery, so drun falls back
to a restart. The restarted job (TORCHELASTIC_RESTART_COUNT > 0, DRUN_GENERATION=0) finishes.

    never_joins.py FAILING_RANK

Prints `NEVERJOINS rank=R restart=N generation=G` as each process starts.
"""
import os
import sys
import time

rank = int(os.environ["RANK"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
generation = int(os.environ.get("DRUN_GENERATION", "0"))
print(f"NEVERJOINS rank={rank} restart={restart} generation={generation}", flush=True)
if restart > 0 and generation == 0:
    sys.exit(0)  # the restarted job
if rank == int(sys.argv[1]) and generation == 0:
    sys.exit(3)
time.sleep(60)
sys.exit(f"rank {rank} was not stopped within 60 s")
