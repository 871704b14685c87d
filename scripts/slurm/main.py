#!/usr/bin/env python3
"""Seed 000's main.py (the torch.distributed tutorial's program), unchanged in spirit: it reads
RANK and WORLD_SIZE from the environment and lets init_process_group find MASTER_ADDR and
MASTER_PORT there too, which drun sets. One all_reduce proves the ranks really talk:

    srun -N 2 --ntasks-per-node=1 bash scripts/slurm/run.sh scripts/slurm/main.py
"""
import os

import torch
import torch.distributed as dist


def run(rank, size):
    tensor = torch.ones(1) * (rank + 1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    print(f"rank {rank} of {size} on {os.uname().nodename}: all_reduce sum {int(tensor[0])}", flush=True)


if __name__ == "__main__":
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    run(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
