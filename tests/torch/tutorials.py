#!/usr/bin/python3
"""The tutorial programs one after the other in one process group: importing torch costs
seconds, so a test checks them all in one job. Each still runs alone (python3 sgd.py under
drun or torchrun); this only saves the start-ups.

    tutorials.py [NAME ...]     default: all of point_to_point reductions synchronizing
                                group_all_reduce sgd
Prints `TUTORIALS rank=R done=N` at the end.
"""
import importlib
import sys

import torch.distributed as dist

import dist_env

ALL = ["point_to_point", "reductions", "synchronizing", "group_all_reduce", "sgd"]


def main(names):
    rank, size = dist_env.init()
    for name in names:
        importlib.import_module(name).run(rank, size)
        dist.barrier()  # one program's messages never meet the next one's
    print(f"TUTORIALS rank={rank} done={len(names)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:] or ALL)
