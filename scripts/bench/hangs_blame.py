#!/usr/bin/python3
"""Hang blame benchmark: a torch job of 2 ranks (all_reduce per 50 ms step); at step 20 rank 1
sleeps while rank 0 waits for it in all_reduce. From the hang to the culprit named (the first
root-cause line on the launcher's stderr), and whether the rank named is the right one (rank 1):
drun with gloo and with its own backend (--hang-timeout 5, heartbeats per step; --hang-idle 5,
none), beside torchrun 1.13 with its FileTimer (expires(after=5) around each step).

    BLAME=1 scripts/bench/hangs.sh               # TRIALS=2
    DRUN_BIN_DIR=build/bin TRIALS=1 /usr/bin/python3 scripts/bench/hangs_blame.py
"""
import os
import re
import selectors
import signal
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("DRUN_BIN_DIR", os.path.join(HERE, "..", "..", "build", "bin"))
DRUN = os.path.join(BIN, "drun")
PY = "/usr/bin/python3"
TRIALS = int(os.environ.get("TRIALS", "2"))
LIMIT = 90.0

WORKER = r'''
import contextlib, os, sys, time
backend, mode, log = sys.argv[1], sys.argv[2], sys.argv[3]
import torch, torch.distributed as dist
if backend == "drun":
    import drun.torch
dist.init_process_group(backend)
rank = dist.get_rank()
beat = lambda: None
if mode == "heartbeat":
    import drun.worker
    beat = drun.worker.heartbeat
if mode == "timer":
    from torch.distributed.elastic import timer
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
t = torch.ones(1000)
for step in range(40):
    with timer.expires(after=5, scope="step") if mode == "timer" else contextlib.nullcontext():
        if rank == 1 and step == 20:
            with open(log, "a") as f:
                f.write("HANG %.6f\n" % time.time())
            time.sleep(10 ** 6)
        time.sleep(0.05)
        dist.all_reduce(t)
    beat()
'''

# drun: "drun: root cause: rank 1 (local_rank 1) on host hung: ..."; torchrun 1.13's
# ChildFailedError: "Root Cause (first observed failure):" then "  rank      : 1 (local_rank: 1)".
DRUN_NAMED = re.compile(r"root cause: rank (\d+) ")
TORCH_NAMED = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank")


def trial(argv, env, log):
    """(ms from the hang to the culprit named, the rank named), or (None, None)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, text=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    start = time.time()
    named_at = named = None
    in_root_cause = False
    try:
        while time.time() - start < LIMIT and named is None:
            if not sel.select(timeout=0.5):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stderr.readline()
            if not line:
                break
            m = DRUN_NAMED.search(line)
            in_root_cause = in_root_cause or "Root Cause" in line
            if not m and in_root_cause:
                m = TORCH_NAMED.search(line)
            if m:
                named_at, named = time.time(), int(m.group(1))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    hang = None
    if os.path.exists(log):
        with open(log) as f:
            hang = next((float(l.split()[1]) for l in f if l.startswith("HANG")), None)
    if hang is None or named_at is None:
        return None, named
    return (named_at - hang) * 1000, named


def main():
    work = tempfile.mkdtemp(prefix="drun-blame-bench-")
    worker = os.path.join(work, "train.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=PY)
    for k in list(base):
        if k.startswith(("PET_", "TORCHELASTIC_", "DRUN_")):
            del base[k]
    drun = [DRUN, "--standalone", "--nproc-per-node", "2"]
    torchrun = [PY, os.path.join(HERE, "torchrun_compat.py"), "--standalone", "--nproc_per_node", "2"]
    setups = [
        ("drun, gloo, --hang-timeout 5 (a heartbeat per step)", drun + ["--hang-timeout", "5"], "gloo", "heartbeat", {}),
        ("drun, drun backend, --hang-timeout 5 (a heartbeat per step)", drun + ["--hang-timeout", "5"], "drun", "heartbeat", {}),
        ("drun, gloo, --hang-idle 5 (no heartbeat)", drun + ["--hang-idle", "5"], "gloo", "none", {}),
        ("drun, drun backend, --hang-idle 5 (no heartbeat)", drun + ["--hang-idle", "5"], "drun", "none", {}),
        ("torchrun 1.13, gloo, FileTimer expires(after=5) per step", torchrun, "gloo", "timer",
         {"TORCHELASTIC_ENABLE_FILE_TIMER": "1"}),
    ]
    rows = []
    for name, prefix, backend, mode, extra in setups:
        times, named = [], []
        for t in range(TRIALS):
            log = os.path.join(work, "log-%d-%d" % (len(rows), t))
            ms, rank = trial(prefix + [worker, backend, mode, log], dict(base, **extra), log)
            times.append(ms)
            named.append(rank)
            print("  %s trial %d: named rank %s after %s ms" % (name, t, rank, ms), flush=True)
        got = [v for v in times if v is not None]
        med = "%.0f (%.0f..%.0f)" % (statistics.median(got), min(got), max(got)) if got else "none in %.0f s" % LIMIT
        right = sum(1 for r in named if r == 1)
        rows.append((name, med, "%d of %d" % (right, len(named)), " ".join(str(r) for r in named)))
    head = ("launcher, backend, detector", "hang -> culprit named, ms", "right rank (1)", "ranks named")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    fmt = " | ".join("%%-%ds" % w for w in widths)
    print(fmt % head)
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(fmt % r)
    print("\nmedian (min..max); the time a root-cause line reached the launcher's stderr.")


if __name__ == "__main__":
    main()
