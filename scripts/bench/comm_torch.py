#!/usr/bin/env python3
"""torch.distributed (gloo) in drun-comm-bench's table, for scripts/bench/comm.sh. Run under drun:
   drun --standalone --nproc-per-node 2 /usr/bin/python3 scripts/bench/comm_torch.py --op all_reduce ..."""
import argparse
import math
import datetime
import time

import torch
import torch.distributed as dist


def parse_bytes(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--op", default="all_reduce", choices=["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"])
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--factor", type=float, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-time-ms", type=float, default=0)  # as bench_table.hpp's timeIt
    a = p.parse_args()
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=300))
    r, n = dist.get_rank(), dist.get_world_size()
    factor = 2 * (n - 1) / n if a.op == "all_reduce" else 1.0 if a.op in ("broadcast", "reduce") else (n - 1) / n
    if r == 0:
        print(f"# torch.distributed {torch.__version__}: {a.op}, {n} ranks, gloo backend, iters {a.iters}, warmup {a.warmup}")
        print("# %12s %12s %8s %6s %5s %10s %11s %11s %6s" % ("size(B)", "count", "type", "redop", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"))
    size, top, total_busbw, rows = parse_bytes(a.min_bytes), parse_bytes(a.max_bytes), 0.0, 0
    # A discarded start (as bench_table.hpp's sweep): the first moments of a job are not its speed.
    for _ in range(a.warmup + a.iters):
        dist.all_reduce(torch.zeros(1))
    dist.barrier()
    while size <= top:
        whole = a.op in ("all_reduce", "reduce", "broadcast")
        count = max(1, size // 4) if whole else max(1, size // 4 // n)
        total = count if whole else count * n
        x = torch.zeros(total if a.op != "all_gather" else count)
        outs = [torch.zeros(count) for _ in range(n)]
        out = torch.zeros(count)
        ins = list(torch.zeros(total).chunk(n))

        def once():
            if a.op == "all_reduce":
                dist.all_reduce(x)
            elif a.op == "broadcast":
                dist.broadcast(x, 0)
            elif a.op == "reduce":
                dist.reduce(x, 0)
            elif a.op == "all_gather":
                dist.all_gather(outs, x)
            elif a.op == "reduce_scatter":  # gloo has no reduce_scatter: all_to_all + sum, as drun
                dist.all_to_all(outs, ins)
                torch.stack(outs).sum(0, out=out)
            else:
                dist.all_to_all(outs, ins)

        for _ in range(a.warmup):
            once()

        def loop(iters):  # the slowest rank's time of `iters` runs, in us
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                once()
            t = torch.tensor([(time.perf_counter() - t0) * 1e6], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.item()

        iters = a.iters
        took = loop(iters)
        if took < a.min_time_ms * 1e3:  # too short to time: again, as long as --min-time-ms (timeIt)
            iters = min(100000, max(iters, math.ceil(iters * a.min_time_ms * 1e3 / max(took, 1e-3))))
            took = loop(iters)
        us = took / iters
        reported = total * 4
        algbw = reported / (us * 1e3)
        if r == 0:
            print("  %12d %12d %8s %6s %5d %10.2f %11.3f %11.3f %6s" % (
                reported, reported // 4, "float", "sum" if a.op in ("all_reduce", "reduce", "reduce_scatter") else "none",
                -1, us, algbw, algbw * factor, "N/A"), flush=True)
        total_busbw += algbw * factor
        rows += 1
        size = max(size + 1, int(size * a.factor))
    if r == 0:
        print("# Avg bus bandwidth : %.3f" % (total_busbw / rows if rows else 0))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
