#!/usr/bin/python3
"""torch.distributed on the backend "drun" beside "gloo", in one job (scripts/bench/torch_backend.sh
runs it under drun): the world is a drun process group and a gloo group spans the same ranks, so
both columns come from the same processes, machine and moment. For all_reduce, all_gather and
broadcast (float32) at each size, each backend runs its warm-up and timed iterations in turn;
then one DDP training step of a small MLP and of a small CNN on each backend.

Rank 0 prints one table per op (time per call, bus bandwidth as nccl-tests count it, and the
ratios drun/gloo) and the DDP table. Sizes: SIZES (bytes, K/M suffixes) or the default 8 B-64 MiB.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import drun.torch

SIZES = os.environ.get("SIZES", "8 64 1K 8K 64K 256K 1M 4M 16M 64M").split()
OPS = os.environ.get("OPS", "all_reduce all_gather broadcast").split()


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


def models():
    mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    return {"mlp": (mlp, (64, 256)), "cnn": (cnn, (32, 3, 32, 32))}


def ddp_step_time(name, group, steps=10):
    torch.manual_seed(0)
    model, shape = models()[name]
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))

    def step():
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return timed(step, 3, steps, group), sum(p.numel() for p in model.parameters())


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
    results = [(name, ddp_step_time(name, None), ddp_step_time(name, gloo)) for name in models()]
    if rank == 0:
        print(f"\n### DDP training step, {label}")
        print("| model | parameters | drun ms/step | gloo ms/step | gloo/drun |")
        print("|---|---:|---:|---:|---:|")
        for name, (a, params), (b, _) in results:
            print(f"| {name} | {params} | {a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.2f} |")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
