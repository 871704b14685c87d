#!/usr/bin/python3
"""A program that fails on its first attempt and succeeds after a restart (run it with
--max-restarts 1): on restart 0 (TORCHELASTIC_RESTART_COUNT=0) rank FAILING_RANK exits with
code 3 after the job's first all_reduce; the restarted job forms a new process group (a fresh
MASTER_PORT) and every rank finishes.

    fail_once.py FAILING_RANK

Prints `FAILONCE rank=R restart=N world=W sum=S`, S being the all_reduce of ones (= W).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import dist_env


def main():
    failing_rank = int(sys.argv[1])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank, size = dist_env.init()
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"FAILONCE rank={rank} restart={restart} world={size} sum={total[0].item():g}",
          flush=True)
    if restart == 0 and rank == failing_rank:
        print(f"FAILONCE rank={rank} fails on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    if restart == 0:
        # Wait to be stopped, outside torch.distributed (a collective would fail once the failing
        # rank's sockets close, a second failure racing the first for the root cause).
        time.sleep(60)
        sys.exit(f"rank {rank} was not stopped within 60 s of rank {failing_rank}'s failure")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
