#!/usr/bin/python3
"""torch's c10d rendezvous at N nodes, for scripts/bench/rendezvous.sh (beside rendezvous_bench).

    rendezvous_torch.py --sizes 8,16,32,64 --cap 60

For each N, in a fresh process (killed at --cap seconds): a TCPStore server (is_master) and N
threads, each one node with its own TCPStore client, C10dRendezvousBackend and
DynamicRendezvousHandler (min = max = N), all calling next_rendezvous() together (barrier).
This is torchrun's rendezvous path (torch 1.13: whole-state compare-and-set, 1 s polling,
0-0.3 s random delay in round 0). Threads, not processes: N torch imports would not fit in
memory; the GIL is released in the store calls and the handlers mostly sleep.
Prints per size:  RESULT torch <N> <seconds or 'timeout'> <connect seconds>
"""
import argparse
import datetime
import os
import resource
import subprocess
import sys
import threading
import time


def one(n, cap):
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler, RendezvousTimeout)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    timeout = datetime.timedelta(seconds=cap)
    server = TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
    run_id = "bench%d" % n

    t_connect = time.monotonic()
    handlers = []
    for _ in range(n):
        store = TCPStore("127.0.0.1", server.port, None, False, timeout, wait_for_workers=False)
        backend = C10dRendezvousBackend(store, run_id)
        handlers.append(DynamicRendezvousHandler.from_backend(
            run_id, store, backend, n, n, RendezvousTimeout(join=timeout)))
    connect = time.monotonic() - t_connect

    barrier = threading.Barrier(n + 1)
    ranks, done, errors = [None] * n, [0.0] * n, []

    def node(i):
        barrier.wait()
        try:
            _, rank, world = handlers[i].next_rendezvous()
        except Exception as e:  # RendezvousTimeoutError at the cap
            errors.append(type(e).__name__)
            return
        ranks[i] = rank
        done[i] = time.monotonic()

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    if errors:
        timeouts = all(e == "RendezvousTimeoutError" for e in errors)
        print("RESULT torch %d %s -" % (n, "timeout" if timeouts else "error"), flush=True)
        sys.stderr.write("%d node(s) failed: %s\n" % (len(errors), sorted(set(errors))))
        os._exit(0)
    assert sorted(ranks) == list(range(n)), ranks
    print("RESULT torch %d %.3f %.3f" % (n, max(done) - t0, connect), flush=True)
    os._exit(0)  # the handlers' keep-alive threads would linger


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds per size")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.cap)
        return
    for n in (int(s) for s in args.sizes.split(",")):
        try:
            out = subprocess.run([sys.executable, __file__, "--one", str(n), "--cap", str(args.cap)],
                                 capture_output=True, text=True, timeout=args.cap + 30)
            line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
            print(line[0] if line else "RESULT torch %d error -" % n, flush=True)
            if not line:
                sys.stderr.write(out.stderr[-2000:])
        except subprocess.TimeoutExpired:
            print("RESULT torch %d timeout -" % n, flush=True)


if __name__ == "__main__":
    main()
