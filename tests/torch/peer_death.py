#!/usr/bin/python3
"""A rank SIGKILLed in the middle of collectives on the backend "drun": every rank loops on
all_reduce of 1 MiB; rank VICTIM kills itself from a timer while in that loop. Each survivor must
raise RuntimeError naming the dead rank within the timeout. Started directly (no launcher, whose
agent would stop the survivors first): RANK and WORLD_SIZE in the environment, a file:// store
(or STORE = tcp://host:port: a TCPStore, as on two namespace hosts).
With `stall`, VICTIM stays alive but stops calling collectives: the others' all_reduce must raise
once init_process_group's timeout passed (named = the message says it timed out, or that a
rank that did aborted the communicator); VICTIM waits
(bounded) in the store until they did, then exits.

    peer_death.py STORE_FILE|tcp://HOST:PORT VICTIM TIMEOUT_S [kill|stall]

Prints `DEATH rank=R raised=1 seconds=S named=0|1 heard=0|1` (heard: the heartbeats named the
victim as not heard from) and the message on stderr.
"""
import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import drun.torch  # noqa: F401 (registers "drun")


def main():
    path, victim, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    stall = len(sys.argv) > 4 and sys.argv[4] == "stall"
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init = path if path.startswith("tcp://") else "file://" + path
    dist.init_process_group("drun", init_method=init, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))
    t = torch.ones(1 << 18)
    dist.all_reduce(t)  # everyone is in
    print(f"DEATH rank={rank} ready=1", flush=True)
    store = dist.distributed_c10d._get_default_store()
    if rank == victim and stall:  # alive, silent, until every other rank gave up
        store.wait([f"gave_up/{r}" for r in range(size) if r != victim],
                   datetime.timedelta(seconds=3 * timeout))
        os._exit(0)
    if rank == victim:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < 2 * timeout:
            dist.all_reduce(t)
    except RuntimeError as e:
        seconds = time.monotonic() - started
        # stall: a rank's own deadline, or the first rank's timeout seen through the segment.
        explained = "timed out" in str(e) or "aborted the communicator" in str(e)
        named = int(explained if stall else f"rank {victim}" in str(e))
        heard = int(f"rank {victim} (host " in str(e) and "has not been heard" in str(e))
        print(f"DEATH rank={rank} raised=1 seconds={seconds:.2f} named={named} heard={heard}",
              flush=True)
        print(f"DEATH rank={rank} message: {e}", file=sys.stderr, flush=True)
        try:
            store.set(f"gave_up/{rank}", "1")
        except RuntimeError:  # a TCPStore's host (rank 0) may have left already
            if stall:
                raise
        os._exit(0)  # the group is broken: no orderly goodbye
    print(f"DEATH rank={rank} raised=0", flush=True)
    os._exit(1)


if __name__ == "__main__":
    main()
