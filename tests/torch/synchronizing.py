#!/usr/bin/python3
"""Barrier-synchronised tasks (the torchrun tutorial's synchronizing.py --barrier): each rank's
task takes a different time, and dist.barrier() keeps the tasks in step, so no rank ends task t
before every rank has started it. Prints `SYNC rank=R task=T start=<wall s> end=<wall s>`
(hosts share one clock here: one machine, or network namespaces on it).
"""
import time

import torch.distributed as dist

import dist_env

TASKS = 2


def run(rank, size):
    for task in range(TASKS):
        start = time.time()
        time.sleep(0.05 * (rank + 1))  # task takes different lengths of time on different ranks
        dist.barrier()
        end = time.time()
        print(f"SYNC rank={rank} task={task} start={start:.6f} end={end:.6f}", flush=True)


if __name__ == "__main__":
    dist_env.main(run)
