#!/usr/bin/python3
"""In-process recoveries in a row, and what a survivor holds before and after: one node x 4,
time_lost_train.py on the drun backend under drun --recovery in-process. Called by
scripts/bench/time_lost.sh (which documents the run).

Recovery i SIGKILLs rank 1 + i % 3 (rank 0's process is the survivor watched) once every rank
has committed two steps since the last recovery; it ends at the job's next committed step
(time_lost_job.Job.first_commit_after). Rank 0's open fds, threads, RSS and shared-memory
mappings (memfd or /dev/shm), and the /dev/shm entries made since the job began (by anything on
the machine), are taken before the first recovery, after it and after the last.
A survivor that lost its process (a fallback to a restart) or a recovery past --cap ends the loop
early, saying so. Every wait is bounded; the job is one time_lost_job.Job, cleaned up whatever
happens.
"""
import argparse
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from time_lost_job import MODES, Interrupted, Job, harness_arguments  # noqa: E402

WORLD = 4
FORM_CAP_S = 120.0
SETTLE_STEPS = 2


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def sample(pid, shm_before):
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    with open(f"/proc/{pid}/maps") as f:
        # Shared-memory segments (drun's are memfds; others may be /dev/shm files), by inode.
        maps = {line.split()[4] for line in f if "/dev/shm/" in line or "memfd:" in line}
    return {"open fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(status["Threads"]),
            "RSS (MiB)": round(int(status["VmRSS"].split()[0]) / 1024, 1),
            "shared-memory segments it maps": len(maps),
            "/dev/shm entries new since the start": len(shm_entries() - shm_before)}


def latest_pid(job, rank):
    pids = [ln.pid for ln in job.lines if ln.kind == "START" and ln.rank == rank]
    return pids[-1] if pids else None


def recover_in_a_row(args, job, shm_before):
    """Returns (samples by label, recovery times, note)."""
    samples, times = {}, []
    if not job.wait_for(job.world_stepping(WORLD), time.time() + FORM_CAP_S):
        return samples, times, f"the job never formed (agent exit codes {job.codes})"
    survivor = latest_pid(job, 0)
    samples["before the first"] = sample(survivor, shm_before)
    deadline = time.time() + args.time_budget
    since = 0
    for i in range(args.recoveries):
        if time.time() > deadline:
            return samples, times, f"time budget ({args.time_budget:.0f} s) spent"
        settled = job.wait_for(job.world_stepping(WORLD, since + SETTLE_STEPS),
                               time.time() + args.cap)
        if not settled:
            return samples, times, f"recovery {i}: the ranks did not step on"
        victim = latest_pid(job, 1 + i % 3)
        if victim is None or not job.is_ours(victim):
            return samples, times, f"recovery {i + 1}: rank {1 + i % 3} has no live process"
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        first = job.wait_for(job.first_commit_after(killed_at), killed_at + args.cap)
        if first is None:
            return samples, times, (f"recovery {i + 1}: no step committed within "
                                    f"{args.cap:.0f} s (agent exit codes {job.codes})")
        times.append(first.t - killed_at)
        since = first.step
        if latest_pid(job, 0) != survivor:
            return samples, times, f"recovery {i + 1}: rank 0 lost its process (a restart)"
        if i == 0:
            samples["after the first"] = sample(survivor, shm_before)
    samples[f"after the last ({len(times)})"] = sample(survivor, shm_before)
    return samples, times, ""


def print_report(samples, times, note, recoveries):
    print(f"\nIn-process recoveries in a row (one node x 4, drun backend): {len(times)} of "
          f"{recoveries}" + (f"; stopped early: {note}" if note else ""))
    if times:
        ms = sorted(t * 1e3 for t in times)
        print(f"time lost per recovery: median {statistics.median(ms):.0f} ms, "
              f"min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms\n")
    if not samples:
        return
    labels = list(samples)
    print("| rank 0 (a survivor) | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for key in samples[labels[0]]:
        print(f"| {key} | " + " | ".join(str(samples[lb][key]) for lb in labels) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness_arguments(p)
    p.add_argument("--recoveries", type=int, default=100)
    p.add_argument("--cap", type=float, default=60.0, help="bound of one recovery (s)")
    p.add_argument("--time-budget", type=float, default=900.0, help="bound of the loop (s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not 1 <= args.recoveries <= 10000:
        p.error("--recoveries must be in 1..10000")
    mode = next(m for m in MODES if m.key == "inprocess-drun")
    job = Job(args, mode, args.work_dir, 1, WORLD, steps=10 ** 7,
              max_restarts=args.recoveries + 5)
    samples, times, note = {}, [], ""
    try:
        shm_before = shm_entries()
        job.up()
        job.start_agent(0, 1)
        samples, times, note = recover_in_a_row(args, job, shm_before)
    except (Interrupted, KeyboardInterrupt) as e:
        note = f"interrupted ({e})"
    finally:
        job.cleanup()
    print_report(samples, times, note, args.recoveries)
    return 1 if note else 0


if __name__ == "__main__":
    sys.exit(main())
