#!/usr/bin/python3
"""all_reduce within a group (the tutorials' dist.new_group([0, 1])): only ranks 0 and 1 sum
their tensors of ones; the other ranks keep theirs. Every rank calls new_group, as torch
requires. Prints `GROUP rank=R member=0|1 value=V`.
"""
import torch
import torch.distributed as dist

import dist_env


def run(rank, size):
    members = [0, 1]
    group = dist.new_group(members)
    tensor = torch.ones(1)
    if rank in members:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    print(f"GROUP rank={rank} member={int(rank in members)} value={tensor[0].item():g}", flush=True)


if __name__ == "__main__":
    dist_env.main(run)
