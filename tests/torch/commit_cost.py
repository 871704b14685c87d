#!/usr/bin/python3
"""What drun.torch.State.commit() costs when nothing fails: the DDP tutorial's model (ToyModel:
Linear(10,10), ReLU, Linear(10,5); SGD, and SGD with momentum, whose state holds tensors too) in
a one-rank gloo group, a training step with and without a commit, N steps each, interleaved.

    commit_cost.py [N]

Prints `COMMIT_COST model=... step_us=S commit_us=C share_of_50ms=P%` per optimizer.
"""
import datetime
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import drun.torch
from resilient_train import ToyModel

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000


def measure(momentum):
    torch.manual_seed(0)
    model = DDP(ToyModel())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum)
    state = drun.torch.State()
    state.track(model=model, optimizer=opt)
    x, y = torch.randn(20, 10), torch.randn(20, 5)
    steps, commits = [], []
    for _ in range(N):
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        t1 = time.perf_counter()
        state.commit()
        t2 = time.perf_counter()
        steps.append(t1 - t0)
        commits.append(t2 - t1)
    step_us = statistics.median(steps) * 1e6
    commit_us = statistics.median(commits) * 1e6
    print(f"COMMIT_COST model=ToyModel momentum={momentum} step_us={step_us:.0f} "
          f"commit_us={commit_us:.0f} p99_commit_us={sorted(commits)[int(0.99 * N)] * 1e6:.0f} "
          f"share_of_50ms={commit_us / 50000 * 100:.2f}%", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    measure(0.0)
    measure(0.9)
    dist.destroy_process_group()
