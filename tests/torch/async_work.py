#!/usr/bin/python3
"""The backend "drun"'s asynchronous work: a collective returns its Work before it is done and
runs while the caller computes. Deterministic without sleeps: rank 0 issues, checks, and only then
lets the other ranks issue (a store key), so rank 0's work cannot have completed in between.

    async_work.py STORE_FILE       (RANK, WORLD_SIZE in the environment)

Prints `ASYNC rank=R pending_after_issue= wait_timeout_raised= completed_after_wait= future_ok=
overlap_ok= p2p_ok= values_ok=` (each 1 when it held).
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import drun.torch  # noqa: F401 (registers "drun")


def main():
    path = sys.argv[1]
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("drun", init_method="file://" + path, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    store = dist.distributed_c10d._get_default_store()
    expected = size * (size + 1) / 2
    n = 4 << 20  # 16 MiB of float32
    r = {}

    # 1. Issue returns before completion; wait(timeout) raises while it is pending; wait() ends it.
    t = torch.full((n,), float(rank + 1))
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        r["pending_after_issue"] = not work.is_completed()
        try:
            work.wait(timeout=datetime.timedelta(milliseconds=100))
            r["wait_timeout_raised"] = False
        except RuntimeError as e:
            r["wait_timeout_raised"] = "ran out" in str(e)
        r["pending_after_issue"] &= not work.is_completed()
        store.set("issued", "1")
    else:
        store.wait(["issued"])
        work = dist.all_reduce(t, async_op=True)
        r["pending_after_issue"] = r["wait_timeout_raised"] = True  # only rank 0 can tell
    work.wait()
    # (torch 1.13 cannot hand Work.exception() to Python: is_success says it.)
    r["completed_after_wait"] = work.is_completed() and work.is_success()
    values = bool((t == expected).all())

    # 2. The Future completes without wait(): a callback chained on it sees the reduced tensor.
    u = torch.full((1 << 16,), float(rank + 1))
    fut = dist.all_reduce(u, async_op=True).get_future().then(lambda f: f.value()[0].sum().item())
    r["future_ok"] = fut.wait() == expected * u.numel()

    # 3. Several collectives in flight while the caller computes, run in issue order.
    tensors = [torch.full((1 << 18,), float(rank + i)) for i in range(6)]
    works = [dist.all_reduce(x, async_op=True) for x in tensors]
    a = torch.randn(256, 256)
    for _ in range(20):
        a = torch.tanh(a @ a)
    # Waited for last first: a wait may run a queued collective itself, but only the queue's
    # head (out of order, the ranks would pair different all_reduces).
    for w in reversed(works):
        w.wait()
    r["overlap_ok"] = all(bool((x == expected - size + i * size).all())
                          for i, x in enumerate(tensors))

    # 4. Point to point is not queued behind collectives: rank 0's send goes out while its
    # all_reduce waits for rank 1, which first receives, then joins the all_reduce.
    big = torch.ones(1 << 16)
    msg = torch.zeros(8)
    if rank == 0:
        w = dist.all_reduce(big, async_op=True)
        dist.send(torch.arange(8, dtype=torch.float32), 1)
        w.wait()
        r["p2p_ok"] = True
    elif rank == 1:
        dist.recv(msg, 0)
        dist.all_reduce(big)
        r["p2p_ok"] = bool((msg == torch.arange(8, dtype=torch.float32)).all())
    else:
        dist.all_reduce(big)
        r["p2p_ok"] = True
    values &= bool((big == size).all())
    r["values_ok"] = values

    fields = " ".join(f"{k}={int(v)}" for k, v in r.items())
    print(f"ASYNC rank={rank} {fields}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
