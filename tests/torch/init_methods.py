#!/usr/bin/python3
"""init_process_group("drun") through each init method torch offers, one after the other in the
same processes (started directly with RANK and WORLD_SIZE): file:// (then rank 0 publishes two
free ports in that store), tcp://127.0.0.1:PORT, and store= a TCPStore the program made. Each
time: an all_reduce and an all_gather_object, then destroy_process_group.

    init_methods.py STORE_FILE

Prints `INIT rank=R method=M sum=S objects=O` per method.
"""
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist

import drun.torch  # noqa: F401 (registers "drun")

TIMEOUT = datetime.timedelta(seconds=60)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exercise(rank, size, method):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "method": method})
    ranks = ",".join(str(o["rank"]) for o in objects)
    print(f"INIT rank={rank} method={method} sum={t.item():g} objects={ranks}", flush=True)
    dist.destroy_process_group()


def main():
    path = sys.argv[1]
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("drun", init_method="file://" + path, rank=rank, world_size=size,
                            timeout=TIMEOUT)
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("ports", f"{free_port()} {free_port()}")
    tcp_port, store_port = (int(p) for p in store.get("ports").decode().split())
    dist.barrier()
    exercise(rank, size, "file")

    dist.init_process_group("drun", init_method=f"tcp://127.0.0.1:{tcp_port}", rank=rank,
                            world_size=size, timeout=TIMEOUT)
    exercise(rank, size, "tcp")

    own = dist.TCPStore("127.0.0.1", store_port, size, rank == 0, TIMEOUT)
    dist.init_process_group("drun", store=own, rank=rank, world_size=size, timeout=TIMEOUT)
    exercise(rank, size, "store")


if __name__ == "__main__":
    main()
