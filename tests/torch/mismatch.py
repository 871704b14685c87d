#!/usr/bin/python3
"""The backend "drun"'s default mismatch check: with DRUN_COMM_CHECK unset, an all_reduce of 3
floats against one of 4, and a barrier against an all_reduce, raise on every rank with an error
naming both sides' calls; a matched program around them runs on with the right results.

    mismatch.py STORE_FILE       (RANK, WORLD_SIZE = 2 in the environment)

Prints `MISMATCH rank=R check=C ok=0|1` for the checks counts, barrier and matched, and a
`MISMATCH rank=R check=C error=...` line with the message of each raised error.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import drun.torch  # noqa: F401 (registers "drun")


def raised(rank, check, call, *expected):
    try:
        call()
    except RuntimeError as e:
        text = " ".join(str(e).split())
        print(f"MISMATCH rank={rank} check={check} error={text!r}", flush=True)
        return all(part in text for part in expected)
    return False


def main():
    os.environ.pop("DRUN_COMM_CHECK", None)  # the default
    path = sys.argv[1]
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("drun", init_method="file://" + path, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    ok = {}
    x = torch.ones(4)
    ok["counts"] = raised(rank, "counts", lambda: dist.all_reduce(x[: 3 if rank == 0 else 4]),
                          "rank 0 called all_reduce of 3 float32 sum",
                          "rank 1 called all_reduce of 4 float32 sum")
    ok["barrier"] = raised(rank, "barrier",
                           lambda: dist.barrier() if rank == 0 else dist.all_reduce(x),
                           "rank 0 called barrier", "rank 1 called all_reduce of 4 float32 sum")
    # Nothing ran: the tensors are as they were, and the group goes on (across many comparisons).
    matched = bool((x == 1).all())
    for i in range(300):
        y = torch.full((4,), float(rank + i))
        dist.all_reduce(y)
        matched = matched and bool((y == sum(r + i for r in range(size))).all())
        if i % 50 == 0:
            dist.barrier()
    ok["matched"] = matched
    for check, passed in ok.items():
        print(f"MISMATCH rank={rank} check={check} ok={int(passed)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
