#!/usr/bin/python3
"""A program whose failure torchrun users diagnose through @record: the decorator
(torch.distributed.elastic.multiprocessing.errors.record) writes the exception to the file named
by TORCHELASTIC_ERROR_FILE, and the launcher's failure summary shows it.

    record_error.py FAILING_RANK MESSAGE

Every rank joins the process group and does one all_reduce (the job really ran); then
FAILING_RANK raises ValueError(MESSAGE) while the others wait (bounded) for the launcher to
stop them. They wait outside torch.distributed: a collective would fail as soon as the failing
rank's sockets close, and that second failure must not race the first for the root cause.
"""
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

import dist_env


@record
def main():
    failing_rank, message = int(sys.argv[1]), sys.argv[2]
    rank, size = dist_env.init()
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"RECORD rank={rank} sum={total[0].item():g}", flush=True)
    if rank == failing_rank:
        raise ValueError(message)
    time.sleep(60)  # the launcher stops this rank long before
    sys.exit(f"rank {rank} was not stopped within 60 s of rank {failing_rank}'s failure")


if __name__ == "__main__":
    main()
