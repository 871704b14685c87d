#!/usr/bin/python3
"""Collective communication: all_reduce (SUM) and all_gather, as in the torchrun tutorial's
reductions.py. Rank r contributes [r] * world_size to the sum and [r] to the gather.
Prints `REDUCE rank=R sum=a,b,... gathered=0,1,...`.
"""
import torch
import torch.distributed as dist

import dist_env


def run(rank, size):
    to_be_summed = torch.tensor([rank] * size)
    dist.all_reduce(to_be_summed, op=dist.ReduceOp.SUM)

    to_be_gathered = torch.tensor([rank])
    result = [torch.tensor([0]) for _ in range(size)]
    dist.all_gather(result, to_be_gathered)

    summed = ",".join(str(int(v)) for v in to_be_summed.tolist())
    gathered = ",".join(str(int(t.item())) for t in result)
    print(f"REDUCE rank={rank} sum={summed} gathered={gathered}", flush=True)


if __name__ == "__main__":
    dist_env.main(run)
