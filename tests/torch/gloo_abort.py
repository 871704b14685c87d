#!/usr/bin/python3
"""drun.torch._backend.abort_gloo, which the generation watcher calls on a gloo group when a new
generation begins: rank 0 waits in a recv that rank 1 never answers (rank 1 is alive, waiting on
a store key); another thread of rank 0 aborts the group after ABORT_AFTER_S; the recv must raise
within a second of that, and a later collective at once. Run on 2 ranks.

Prints `GLOOABORT rank=0 sockets=N recv_s=T later_s=U`, `GLOOABORT rank=1 done=1`.
"""
import datetime
import threading
import time

import torch
import torch.distributed as dist

from drun.torch import _backend

ABORT_AFTER_S = 1.0

dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
store = dist.distributed_c10d._get_default_store()
rank = dist.get_rank()
if rank == 0:
    group = dist.distributed_c10d._get_default_group()
    shut = []
    abort = threading.Timer(ABORT_AFTER_S, lambda: shut.append(_backend.abort_gloo(group)))
    abort.start()
    started = time.monotonic()
    try:
        dist.recv(torch.zeros(1), 1)
        raise SystemExit("GLOOABORT the recv returned")
    except RuntimeError:
        recv_s = time.monotonic() - started
    abort.join()
    started = time.monotonic()
    try:
        dist.all_reduce(torch.zeros(1))
        raise SystemExit("GLOOABORT an all_reduce on the aborted group returned")
    except RuntimeError:
        later_s = time.monotonic() - started
    print(f"GLOOABORT rank=0 sockets={shut[0]} recv_s={recv_s:.2f} later_s={later_s:.2f}", flush=True)
    store.set("gloo_abort/done", "1")
else:
    store.wait(["gloo_abort/done"])
    print("GLOOABORT rank=1 done=1", flush=True)
