#!/usr/bin/python3
"""Hang benchmark: a small training loop, rank 1 hangs at step N of the first attempt;
from the hang to (a) the hung worker's end (detected, stack taken, ended) and (b) the first worker
of the restarted round. drun (--hang-timeout 5, auto, torch's FileTimer served by drun) beside
torchrun 1.13 with its FileTimer on (expires(after=5) around each step) and off. One table.

    scripts/bench/hangs.sh                      # TRIALS=3 TORCH_TRIALS=2 WAIT_OFF=30
    DRUN_BIN_DIR=build/bin TRIALS=1 scripts/bench/hangs.sh
    JITTER_SECONDS=120 scripts/bench/hangs.sh   # learned timeouts: 2 minutes of jitter, then a hang
    COST_ONLY=1 scripts/bench/hangs.sh           # the worker API's cost per call only

Single node, 2 workers (/usr/bin/python3), --max-restarts 1, steps of 50 ms, the hang at step 20.
Every worker appends `START <restart> <rank> <pid> <time>` to a log first; the hanging one appends
`HANG <time>` and then either spins (`loop`: a pure-Python busy loop) or sleeps (`sleep`:
time.sleep, stuck inside a C call). The harness watches the hung pid with a pidfd.
"""
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("DRUN_BIN_DIR", os.path.join(HERE, "..", "..", "build", "bin"))
DRUN = os.path.join(BIN, "drun")
PY = "/usr/bin/python3"
TRIALS = int(os.environ.get("TRIALS", "3"))
TORCH_TRIALS = int(os.environ.get("TORCH_TRIALS", "2"))
WAIT_OFF = float(os.environ.get("WAIT_OFF", "30"))
TRIAL_LIMIT = 60.0

WORKER = r'''
import os, sys, time, contextlib
mode, kind, hang_step, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rank = int(os.environ["RANK"]); restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
note("START %d %d %d %.6f" % (restart, rank, os.getpid(), time.time()))
beat = lambda: None
if mode == "heartbeat":
    import drun.worker
    beat = drun.worker.heartbeat
if mode == "timer":
    from torch.distributed.elastic import timer
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
for step in range(40):
    ctx = timer.expires(after=5, scope="step") if mode == "timer" else contextlib.nullcontext()
    with ctx:
        if restart == 0 and rank == 1 and step == hang_step:
            note("HANG %.6f" % time.time())
            if kind == "loop":
                while True:
                    pass
            time.sleep(10 ** 6)
        time.sleep(0.05)
    beat()
'''


def read_log(path):
    try:
        with open(path) as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def trial(argv, env, log, limit):
    """Runs one job; returns (hung worker ended - hang, first restarted start - hang) in ms or None."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    start = time.time()
    hang_at = ended = restarted = None
    pidfd = None
    try:
        while time.time() - start < limit:
            lines = read_log(log)
            if hang_at is None:
                hang = [l for l in lines if l[0] == "HANG"]
                if hang:
                    hang_at = float(hang[0][1])
                    pid = [int(l[3]) for l in lines if l[0] == "START" and l[1] == "0" and l[2] == "1"][0]
                    try:
                        pidfd = os.pidfd_open(pid)
                    except ProcessLookupError:
                        ended = time.time()
            if pidfd is not None and ended is None and select.select([pidfd], [], [], 0)[0]:
                ended = time.time()
            starts = [float(l[4]) for l in lines if l[0] == "START" and l[1] == "1"]
            if starts and restarted is None:
                restarted = min(starts)
            if restarted is not None and ended is not None:
                break
            if proc.poll() is not None and hang_at is not None:
                if ended is None:
                    ended = time.time()
                if restarted is None and not starts:
                    break
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if pidfd is not None:
            os.close(pidfd)
    if hang_at is None:
        return None, None
    ms = lambda t: None if t is None else (t - hang_at) * 1000
    return ms(ended), ms(restarted)


def summary(values, limit_s):
    got = [v for v in values if v is not None]
    if not got:
        return "none within %.0f s" % limit_s
    med = statistics.median(got)
    text = "%.0f (%.0f..%.0f)" % (med, min(got), max(got)) if len(got) > 1 else "%.0f" % med
    if len(got) < len(values):
        text += " [%d/%d]" % (len(got), len(values))
    return text


PY_COST = r'''
import time, drun.worker as w
n = 200000
t = time.perf_counter()
for _ in range(n): w.heartbeat()
t1 = time.perf_counter()
for _ in range(n):
    with w.section("step"): pass
t2 = time.perf_counter()
print("%.0f %.0f" % ((t1 - t) / n * 1e9, (t2 - t1) / n * 1e9))
'''


def api_costs(work):
    """The worker API's cost per call, ns: C and Python, under drun (channel on) and without."""
    script = os.path.join(work, "cost.py")
    with open(script, "w") as f:
        f.write(PY_COST)
    native = os.path.join(BIN, "..", "tests", "helpers", "worker_call_bench")
    pypath = os.path.join(BIN, "..", "lib", "drun", "python")
    env = dict(os.environ, PYTHON_EXEC=PY)
    env.pop("DRUN_WORKER_CHANNEL", None)
    rows = []
    for name, argv, extra in (
            ("C, no drun (no-op)", [native], {}),
            ("C, under drun", [DRUN, "--standalone", native], {}),
            ("Python, no drun (no-op)", [PY, script], {"PYTHONPATH": pypath}),
            ("Python, under drun", [DRUN, "--standalone", script], {})):
        out = subprocess.run(argv, env=dict(env, **extra), capture_output=True, text=True, timeout=120).stdout
        nums = [w for w in out.replace(",", " ").split() if w.replace(".", "").isdigit()]
        rows.append((name, nums[0] if nums else "?", nums[1] if len(nums) > 1 else "?"))
    print("%-24s | %-13s | %s" % ("worker API", "heartbeat, ns", "section begin+end, ns"))
    print("-" * 24 + "-+-" + "-" * 13 + "-+-" + "-" * 21)
    for r in rows:
        print("%-24s | %-13s | %s" % r)
    print()


JITTER = r'''
import os, random, sys, time
import drun.worker
seconds, log = float(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
random.seed(rank * 7919 + int(time.time()))
end = time.time() + seconds
steps = 0
while time.time() < end:
    with drun.worker.section("step"):
        # 10..90 ms, and one step in 20 a slow one (up to 400 ms): a jittery loader
        time.sleep(random.uniform(0.01, 0.09) if random.random() > 0.05 else random.uniform(0.1, 0.4))
    steps += 1
with open(log, "a") as f:
    f.write("STEPS %d %d\n" % (rank, steps))
    if rank == 1:
        f.write("HANG %.6f\n" % time.time())
if rank == 1:
    with drun.worker.section("step"):
        time.sleep(10 ** 6)
'''


def jitter_run(work, seconds):
    """--hang-timeout auto over `seconds` of jittery steps: false positives, then a real hang."""
    script = os.path.join(work, "jitter.py")
    log = os.path.join(work, "jitter.log")
    with open(script, "w") as f:
        f.write(JITTER)
    env = dict(os.environ, PYTHON_EXEC=PY, OMP_NUM_THREADS="1")
    proc = subprocess.run([DRUN, "--standalone", "--nproc-per-node", "2", "--hang-timeout", "auto,floor=1,warmup=0", script,
                           str(seconds), log], env=env, capture_output=True, text=True, timeout=seconds + 120)
    ended = time.time()
    lines = read_log(log)
    hung = [l for l in proc.stderr.splitlines() if " hung: " in l and "root cause" not in l]
    hang = [float(l[1]) for l in lines if l[0] == "HANG"]
    steps = {l[1]: l[2] for l in lines if l[0] == "STEPS"}
    print("auto, %.0f s of jittery steps (10-90 ms, 1 in 20 up to 400 ms), 2 ranks:" % seconds)
    print("  steps per rank: %s; hang reports: %d (expected 1, rank 1 after its loop)" % (steps, len(hung)))
    for l in hung:
        print("  " + l)
    if hang:
        print("  the real hang to drun's exit: %.0f ms; exit status %d" % ((ended - hang[0]) * 1000, proc.returncode))
    print()


def main():
    work = tempfile.mkdtemp(prefix="drun-hangs-bench-")
    worker = os.path.join(work, "train.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    api_costs(work)
    if os.environ.get("COST_ONLY"):
        return
    if os.environ.get("JITTER_SECONDS"):
        jitter_run(work, float(os.environ["JITTER_SECONDS"]))
        return
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=PY)
    for k in list(base):
        if k.startswith(("PET_", "TORCHELASTIC_", "DRUN_")):
            del base[k]
    torchrun = [PY, os.path.join(HERE, "torchrun_compat.py"), "--standalone", "--nproc_per_node", "2",
                "--max_restarts", "1"]
    drun = [DRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    setups = [
        ("drun --hang-timeout 5 (drun.worker.heartbeat per step)", drun + ["--hang-timeout", "5"], "heartbeat", {}, TRIALS, TRIAL_LIMIT),
        ("drun --hang-timeout auto,floor=1,warmup=0 (learned: 5x, floor 1 s)",
         drun + ["--hang-timeout", "auto,floor=1,warmup=0"], "heartbeat", {}, TRIALS, TRIAL_LIMIT),
        ("drun, torch FileTimer expires(after=5) per step", drun, "timer", {}, TRIALS, TRIAL_LIMIT),
        ("torchrun 1.13, FileTimer on, expires(after=5), monitor 5 s", torchrun, "timer",
         {"TORCHELASTIC_ENABLE_FILE_TIMER": "1"}, TORCH_TRIALS, TRIAL_LIMIT),
        ("torchrun 1.13, FileTimer off", torchrun, "none", {}, 1, WAIT_OFF),
    ]
    rows = []
    for kind in ("loop", "sleep"):
        for name, prefix, mode, extra, trials, limit in setups:
            detected, restarted = [], []
            for t in range(trials):
                log = os.path.join(work, "log-%s-%d-%d" % (kind, len(rows), t))
                d, r = trial(prefix + [worker, mode, kind, "20", log], dict(base, **extra), log, limit)
                detected.append(d)
                restarted.append(r)
                print("  %s %s trial %d: ended %s ms, restarted %s ms" % (kind, name, t, d, r),
                      file=sys.stderr, flush=True)
            rows.append((kind, name, summary(detected, limit), summary(restarted, limit), trials))
    head = ("hang", "launcher / detector", "hang -> hung worker ended, ms", "hang -> restarted round's first worker, ms", "trials")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(5)]
    fmt = " | ".join("%%-%ds" % w for w in widths)
    print(fmt % head)
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(fmt % r)
    print("\nmedian (min..max) ms; loop: a pure-Python busy loop; sleep: time.sleep (inside a C call).")
    print("drun's 'ended' includes taking the stack (faulthandler via SIGABRT).")


if __name__ == "__main__":
    main()
