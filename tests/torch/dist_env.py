"""The start every tutorial program shares: torchrun (or drun) gave this process RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; init_process_group("gloo", init_method="env://") reads them.
TUTORIAL_BACKEND=drun changes the one word: init_process_group("drun") after `import drun.torch`
(drun's own collective runtime, python/drun/torch).

Every program here prints its results as `TAG rank=R key=value ...` lines that the tests parse
(tests/torch_test.cpp). Each wait inside torch.distributed has a deadline (TIMEOUT), so a broken
launcher shows up as a failure, never a hang.
"""
import datetime
import os

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("TUTORIAL_TIMEOUT_S", "60")))
BACKEND = os.environ.get("TUTORIAL_BACKEND", "gloo")


def init():
    """Joins the job's process group; returns (rank, world size) as the process group sees them."""
    if BACKEND == "drun":
        import drun.torch  # noqa: F401 (registers the backend "drun")
    dist.init_process_group(BACKEND, init_method="env://", timeout=TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    # The launcher's variables and the process group must agree.
    assert rank == int(os.environ["RANK"]), (rank, os.environ["RANK"])
    assert size == int(os.environ["WORLD_SIZE"]), (size, os.environ["WORLD_SIZE"])
    return rank, size


def main(run):
    """What each tutorial's `if __name__ == "__main__"` does: init, run(rank, size), clean up."""
    rank, size = init()
    run(rank, size)
    dist.destroy_process_group()
