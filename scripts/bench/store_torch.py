#!/usr/bin/python3
"""The store_bench op mix against torch's TCPStore (PyTorch's c10d store), for scripts/bench/store.sh.

    store_torch.py --clients N --ops K

A server process hosts TCPStore(is_master=True); N client processes each do K calls of set, get,
add and compare_set on their own key, all starting together (barrier). Prints, per op:
    RESULT torch <op> <clients> <ops_per_s> <p50_us> <p99_us>
"""
import argparse
import datetime
import multiprocessing as mp
import time

import torch.distributed as dist  # imported once; client processes are forked from here


def serve(port_queue, stop):
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    port_queue.put(store.port)
    stop.wait()


OPS = ("set", "get", "add", "compare_set")


def client(port, ops, index, barrier, results):
    store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    value = "v" * 64
    for op in OPS:
        key = "bench/%s/%d" % (op, index)
        latencies = []
        barrier.wait()  # every client starts each op together
        start = time.monotonic()
        for i in range(ops):
            t0 = time.perf_counter()
            if op == "set":
                store.set(key, value)
            elif op == "get":
                if i == 0:
                    store.set(key, value)
                store.get(key)
            elif op == "add":
                store.add(key, 1)
            else:  # compare_set: succeeds every time
                store.compare_set(key, "" if i == 0 else str(i - 1), str(i))
            latencies.append((time.perf_counter() - t0) * 1e6)
        results.put((op, start, time.monotonic(), latencies))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--ops", type=int, default=2000)
    args = parser.parse_args()
    ctx = mp.get_context("fork")  # no store exists in this process: forking is safe
    port_queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=serve, args=(port_queue, stop))
    server.start()
    port = port_queue.get(timeout=60)
    try:
        # The client processes are forked once, then run every op in turn.
        barrier, results = ctx.Barrier(args.clients), ctx.Queue()
        procs = [ctx.Process(target=client, args=(port, args.ops, i, barrier, results))
                 for i in range(args.clients)]
        for p in procs:
            p.start()
        outcomes = {op: [] for op in OPS}
        for _ in range(len(OPS) * args.clients):
            op, start, end, lat = results.get(timeout=300)
            outcomes[op].append((start, end, lat))
        for p in procs:
            p.join(timeout=60)
        for op in OPS:
            start = min(o[0] for o in outcomes[op])
            end = max(o[1] for o in outcomes[op])
            lat = sorted(x for o in outcomes[op] for x in o[2])
            rate = len(lat) / (end - start)
            p50 = lat[len(lat) // 2]
            p99 = lat[min(len(lat) - 1, len(lat) * 99 // 100)]
            print("RESULT torch %s %d %.0f %.1f %.1f" % (op, args.clients, rate, p50, p99),
                  flush=True)
    finally:
        stop.set()
        server.join(timeout=10)


if __name__ == "__main__":
    main()
