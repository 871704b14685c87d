#!/usr/bin/python3
"""The latency of a synchronous 8-byte torch all_reduce on the backend "drun" beside "gloo", in
one job (scripts/bench/torch_latency.sh runs it under drun): RUNS runs back to back, each the
median and 90th percentile of CALLS calls timed one by one, drun's and gloo's in turn in the same
processes, with how often the drun group's helper threads were woken per call (a figure load
does not blur: each wake-up takes a core from a rank). Then the cost of the default mismatch
check (DRUN_COMM_CHECK unset, sampled) against none (off) and the full check (true), at 8 B and
1 MiB: medians of calls timed one by one.

With COMM_ONLY=1: the same runs of an 8-byte all_reduce through drun.comm (ctypes, libdrun_comm
alone, no torch), the floor the backend stands on at that moment.

Rank 0 prints markdown tables, with the load average (1 min) before each run.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

import drun.torch
from torch_backend_bench import call_times  # this script's folder is on sys.path

RUNS = int(os.environ.get("RUNS", "10"))
CALLS = int(os.environ.get("CALLS", "2000"))
CHECK = os.environ.get("CHECK", "1") == "1"
COMM_ONLY = os.environ.get("COMM_ONLY", "0") == "1"


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def latency(group):
    x = torch.ones(2)
    return call_times(lambda: dist.all_reduce(x, group=group), CALLS, group)


def helper_switches():
    """Voluntary context switches of this process's threads other than the main one: how often
    its helper threads (the drun group's queue thread above all) were woken."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == os.getpid():
            continue
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))
        except OSError:  # the thread ended
            pass
    return total


def latency_and_wakes(group):
    """latency(group) and the helper threads' wake-ups per call during it (warm-up included)."""
    before = helper_switches()
    times = latency(group)
    return times, (helper_switches() - before) / (CALLS + min(100, CALLS))


def check_cost(size):
    """Median seconds per all_reduce at 8 B and 1 MiB on drun groups made with DRUN_COMM_CHECK
    off, unset (the default) and true."""
    groups = []
    for value in ("false", None, "true"):  # read when a communicator is made
        if value is None:
            os.environ.pop("DRUN_COMM_CHECK", None)
        else:
            os.environ["DRUN_COMM_CHECK"] = value
        groups.append(dist.new_group(list(range(size)), backend="drun"))
    os.environ.pop("DRUN_COMM_CHECK", None)
    rows = []
    for nbytes, calls in ((8, 4000), (1 << 20, 300)):
        x = torch.ones(max(1, nbytes // 4))
        medians = [call_times(lambda g=g: dist.all_reduce(x, group=g), calls, g)[0] for g in groups]
        rows.append((nbytes, *medians))
    return rows


def comm_only():
    import numpy as np
    import drun.comm
    with drun.comm.init() as world:
        x = np.ones(2, np.float32)
        rows = []
        for _ in range(RUNS):
            before = load()
            rows.append((before, call_times(lambda: world.all_reduce(x), CALLS, None, world.barrier)))
        if world.rank == 0:
            label = os.environ.get("BENCH_LABEL", f"{world.size} ranks")
            print(f"### drun.comm alone (ctypes): all_reduce of 8 bytes, {label}: {RUNS} runs of "
                  f"{CALLS} calls, each timed")
            print("| run | load (1 min) | median us | p90 us |")
            print("|---:|---:|---:|---:|")
            for i, (avg, (a50, a90)) in enumerate(rows, 1):
                print(f"| {i} | {avg} | {a50 * 1e6:.1f} | {a90 * 1e6:.1f} |")


def main():
    if COMM_ONLY:
        return comm_only()
    dist.init_process_group("drun", init_method="env://", timeout=datetime.timedelta(seconds=120))
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(list(range(size)), backend="gloo")
    label = os.environ.get("BENCH_LABEL", f"{size} ranks")
    rows = []
    for _ in range(RUNS):
        before = load()
        drun_times, wakes = latency_and_wakes(None)
        rows.append((before, drun_times, latency(gloo), wakes))
    if rank == 0:
        print(f"### all_reduce of 8 bytes, synchronous, {label}, torch {torch.__version__}: "
              f"{RUNS} runs of {CALLS} calls, each timed")
        print("| run | load (1 min) | drun median us | drun p90 us | drun helper wake-ups per call "
              "| gloo median us | gloo p90 us |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for i, (avg, (a50, a90), (b50, b90), wakes) in enumerate(rows, 1):
            print(f"| {i} | {avg} | {a50 * 1e6:.1f} | {a90 * 1e6:.1f} | {wakes:.3f} | "
                  f"{b50 * 1e6:.1f} | {b90 * 1e6:.1f} |")
        medians = sorted(a50 for _, (a50, _), _, _ in rows)
        print(f"\ndrun medians {medians[0] * 1e6:.1f}-{medians[-1] * 1e6:.1f} us over {RUNS} runs")
    if CHECK:
        costs = check_cost(size)
        if rank == 0:
            print(f"\n### the mismatch check: all_reduce (float32) medians, {label}")
            print("| bytes | check off us | default (sampled) us | DRUN_COMM_CHECK=true us |")
            print("|---:|---:|---:|---:|")
            for nbytes, off, sampled, full in costs:
                print(f"| {nbytes} | {off * 1e6:.2f} | {sampled * 1e6:.2f} | {full * 1e6:.2f} |")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
