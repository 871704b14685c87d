#!/usr/bin/python3
"""torch.distributed on the backend "drun" beside "gloo", in one job (scripts/bench/torch_backend.sh
runs it under drun): the world is a drun process group and a gloo group spans the same ranks, so
both columns come from the same processes, machine and moment. For all_reduce, all_gather and
broadcast (float32) at each size, each backend runs its warm-up and timed iterations in turn;
then the latency of a synchronous 8-byte all_reduce, LATENCY_RUNS times (each run: the median
and 90th percentile of 2000 calls timed one by one); the cost of DRUN_COMM_CHECK (a drun group
made with it on; medians of calls timed one by one) at 8 B and 1 MiB; and one DDP training step of the DDP tutorial's ToyModel, a
small MLP and a small CNN on each backend, without a comm hook and with powerSGD_hook.

Rank 0 prints one table per op (time per call, bus bandwidth as nccl-tests count it, and the
ratios drun/gloo), the latency, check and DDP tables. Sizes: SIZES (bytes, K/M suffixes) or the
default 8 B-64 MiB.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

import drun.torch

SIZES = os.environ.get("SIZES", "8 64 1K 8K 64K 256K 1M 4M 16M 64M").split()
OPS = os.environ.get("OPS", "all_reduce all_gather broadcast").split()
LATENCY_RUNS = int(os.environ.get("LATENCY_RUNS", "5"))


def parse_bytes(text):
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def iterations(nbytes):
    return 50 if nbytes <= 64 << 10 else 20 if nbytes <= 1 << 20 else 5 if nbytes <= 16 << 20 else 3


def timed(once, warmup, iters, group):
    """Mean seconds of once() over iters calls, after warmup calls and a barrier of `group`."""
    for _ in range(warmup):
        once()
    dist.barrier(group=group)
    started = time.perf_counter()
    for _ in range(iters):
        once()
    return (time.perf_counter() - started) / iters


def time_op(op, nbytes, group, size):
    """Mean seconds per call of `op` on `group` (None: the drun world), after a warm-up."""
    count = max(1, nbytes // 4)
    x = torch.ones(count)
    outs = [torch.empty(count) for _ in range(size)]

    def once():
        if op == "all_reduce":
            dist.all_reduce(x, group=group)
        elif op == "all_gather":
            dist.all_gather(outs, x, group=group)
        else:
            dist.broadcast(x, 0, group=group)
    return timed(once, 2, iterations(nbytes), group)


def busbw(op, nbytes, seconds, size):
    """GB/s as nccl-tests count it (all_gather: nbytes per rank, size x nbytes gathered)."""
    factor = {"all_reduce": 2 * (size - 1) / size, "broadcast": 1.0,
              "all_gather": (size - 1)}[op]
    return nbytes * factor / seconds / 1e9


def call_times(once, calls, group, barrier=None):
    """Median and 90th percentile seconds of once(), timed call by call after a warm-up and a
    barrier of `group` (or a call of `barrier`)."""
    for _ in range(min(100, calls)):
        once()
    if barrier:
        barrier()
    else:
        dist.barrier(group=group)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        once()
        times.append(time.perf_counter() - started)
    times.sort()
    return times[len(times) // 2], times[len(times) * 9 // 10]


def latency(group):
    """call_times of a synchronous 8-byte all_reduce, 2000 calls."""
    x = torch.ones(2)
    return call_times(lambda: dist.all_reduce(x, group=group), 2000, group)


def models():
    toy = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5))  # the DDP tutorial's
    mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    return {"toy": (toy, (20, 10), 5), "mlp": (mlp, (64, 256), 10),
            "cnn": (cnn, (32, 3, 32, 32), 10)}


def ddp_step_time(name, group, hook, steps=10):
    torch.manual_seed(0)
    model, shape, classes = models()[name]
    ddp = DDP(model, process_group=group)
    if hook:  # compressed from the third step on: the warm-up's end
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2, random_seed=0)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(*shape), torch.randint(0, classes, (shape[0],))

    def step():
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return timed(step, 3, steps, group), sum(p.numel() for p in model.parameters())


def check_cost(size):
    """Median seconds per all_reduce at 8 B and 1 MiB on a drun group without and with
    DRUN_COMM_CHECK (each timed call by call, 2000 and 200 calls)."""
    os.environ["DRUN_COMM_CHECK"] = "true"  # read when a communicator is made
    checked = dist.new_group(list(range(size)), backend="drun")
    os.environ["DRUN_COMM_CHECK"] = "false"  # not the default sampled check either
    plain = dist.new_group(list(range(size)), backend="drun")
    del os.environ["DRUN_COMM_CHECK"]
    rows = []
    for nbytes, calls in ((8, 2000), (1 << 20, 200)):
        x = torch.ones(max(1, nbytes // 4))
        medians = [call_times(lambda g=g: dist.all_reduce(x, group=g), calls, g)[0]
                   for g in (plain, checked)]
        rows.append((nbytes, *medians))
    return rows


def main():
    dist.init_process_group("drun", init_method="env://",
                            timeout=datetime.timedelta(seconds=300))
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(list(range(size)), backend="gloo")
    label = os.environ.get("BENCH_LABEL", f"{size} ranks")
    if rank == 0:
        print(f"## {label}: drun ({drun.torch.transport()}) vs gloo, torch {torch.__version__}")
    for op in OPS:
        rows = []
        for text in SIZES:
            nbytes = parse_bytes(text)
            t_drun = time_op(op, nbytes, None, size)
            t_gloo = time_op(op, nbytes, gloo, size)
            rows.append((nbytes, t_drun, t_gloo))
        if rank == 0:
            print(f"\n### {op} (float32), {label}")
            print("| bytes | drun us | gloo us | drun busbw GB/s | gloo busbw GB/s | "
                  "drun/gloo (busbw; = gloo/drun time) |")
            print("|---:|---:|---:|---:|---:|---:|")
            for nbytes, a, b in rows:
                print(f"| {nbytes} | {a * 1e6:.1f} | {b * 1e6:.1f} | "
                      f"{busbw(op, nbytes, a, size):.3f} | {busbw(op, nbytes, b, size):.3f} | "
                      f"{b / a:.2f} |")
    runs = [(latency(None), latency(gloo)) for _ in range(LATENCY_RUNS)]
    if rank == 0:
        print(f"\n### all_reduce of 8 bytes, synchronous, {label}: {LATENCY_RUNS} runs of 2000 "
              "calls, each timed")
        print("| run | drun median us | drun p90 us | gloo median us | gloo p90 us |")
        print("|---:|---:|---:|---:|---:|")
        for i, ((a50, a90), (b50, b90)) in enumerate(runs, 1):
            print(f"| {i} | {a50 * 1e6:.1f} | {a90 * 1e6:.1f} | {b50 * 1e6:.1f} | {b90 * 1e6:.1f} |")
    costs = check_cost(size)
    if rank == 0:
        print(f"\n### DRUN_COMM_CHECK=true: all_reduce (float32) with the check, {label}")
        print("| bytes | drun median us | drun + check median us | check us per collective |")
        print("|---:|---:|---:|---:|")
        for nbytes, a, b in costs:
            print(f"| {nbytes} | {a * 1e6:.1f} | {b * 1e6:.1f} | {(b - a) * 1e6:.1f} |")
    # powerSGD on gloo aborts the process on the MLP (two buckets: the hooks' callbacks issue
    # their all_reduces on gloo's two threads in another order on each rank; gloo::EnforceNotMet),
    # so the hook runs on the one-bucket models only.
    results = [(name, hook, ddp_step_time(name, None, hook), ddp_step_time(name, gloo, hook))
               for name in models() for hook in (False, True) if not (hook and name == "mlp")]
    if rank == 0:
        print(f"\n### DDP training step, {label}")
        print("| model | parameters | comm hook | drun ms/step | gloo ms/step | gloo/drun |")
        print("|---|---:|---|---:|---:|---:|")
        for name, hook, (a, params), (b, _) in results:
            print(f"| {name} | {params} | {'powerSGD' if hook else '-'} | {a * 1e3:.2f} | "
                  f"{b * 1e3:.2f} | {b / a:.2f} |")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
