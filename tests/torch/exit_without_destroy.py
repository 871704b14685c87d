#!/usr/bin/python3
"""A program on the backend "drun" that ends without destroy_process_group, with Future callbacks
(Python functions) on its last collectives, as many training scripts end: it must exit 0, never
abort in the interpreter's finalization (a group's queue thread completing a Future there).

    exit_without_destroy.py STORE_FILE      (RANK, WORLD_SIZE in the environment)

Prints `EXIT rank=R sum=S` before it returns from main.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import drun.torch  # noqa: F401 (registers "drun")


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("drun", init_method="file://" + sys.argv[1], rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=30))
    group = dist.new_group(list(range(size)))  # a second group, also left to the interpreter
    futures = []
    for i in range(32):
        t = torch.full((256,), float(rank + i))
        futures.append(dist.all_reduce(t, async_op=True, group=group if i % 2 else None)
                       .get_future().then(lambda f: f.value()[0].sum().item()))
    total = sum(f.wait() for f in futures[:-4])  # the last ones still complete as Python exits
    print(f"EXIT rank={rank} sum={total:.0f}", flush=True)


if __name__ == "__main__":
    main()
