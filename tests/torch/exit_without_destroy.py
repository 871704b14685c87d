#!/usr/bin/python3
"""A program on the backend "drun" that ends without destroy_process_group, with Future callbacks
(Python functions) on its last collectives, as many training scripts end: it must exit 0, never
abort in the interpreter's finalization (a group's queue thread completing a Future there).

    exit_without_destroy.py STORE_FILE      (RANK, WORLD_SIZE in the environment)

Also forks a child that ends through sys.exit (as a DataLoader worker may): it must exit 0 within
30 s. Prints `EXIT rank=R sum=S child_status=C` (C: the child's wait status, -1 when it hung)
before it returns from main.
"""
import datetime
import os
import sys
import time

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
    # A forked child (a DataLoader worker) that ends through Python's own exit holds copies of
    # the groups without their threads: it must exit as promptly, touching none of the rank's.
    child = os.fork()
    if child == 0:
        sys.exit(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(child, 9)
        os.waitpid(child, 0)
        status = -1
    print(f"EXIT rank={rank} sum={total:.0f} child_status={status}", flush=True)


if __name__ == "__main__":
    main()
