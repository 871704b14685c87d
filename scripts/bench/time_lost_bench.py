#!/usr/bin/python3
"""Time lost to a failure in a real PyTorch program: torchrun 1.13, drun --recovery restart and
drun --recovery in-process (drun and gloo backends), same program, same faults, one run. Called
by scripts/bench/time_lost.sh (which checks the prerequisites and documents the run).

For each scenario and mode: a fresh job of time_lost_train.py on namespace hosts
(time_lost_job.py); once every rank commits, the fault falls at the scenario's step (drawn from
--seed, the same for every mode) plus a drawn fraction of a step; then the harness waits for the
first step committed after the fault by a process that entered the training function after it (a
replacement, a restarted rank, or a survivor back from the recovery: a step commits after its
DDP all-reduce, so the job as a whole got past a collective again), and for the job's end.
Reported: that wall time, the steps redone (the last step committed by a process that had not
entered again since the fault, minus the step before that first commit), the outcome (in place:
every survivor kept its process; restarted; or the fallback's reason) and the parameters' sha1
at the end (the same on every rank, and the same in every row of one backend when the recovery
is exact).
"""
import argparse
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos_inprocess_checks import FALLBACK_PHRASES  # noqa: E402
from time_lost_job import MODES, Interrupted, Job, harness_arguments  # noqa: E402

FORM_CAP_S = 120.0      # the first round: python and torch start on a loaded 2-core machine
SPARE_SETTLE_S = 3.0    # the spare agent starts and waits before the fault
END_CAP_S = 60.0        # from the recovery to the job's end
TAIL_STEPS = 25         # steps after the fault's step


class Scenario:
    def __init__(self, key, title, hosts, nproc, fault, spare=False):
        self.key = key
        self.title = title
        self.hosts = hosts      # agents of the job (a spare comes on one more host)
        self.nproc = nproc
        self.fault = fault      # "rank": one worker SIGKILLed; "agent": host 1's agent + workers
        self.spare = spare

    @property
    def world(self):
        return self.hosts * self.nproc


SCENARIOS = [
    Scenario("node", "one node x 4, a rank SIGKILLed", 1, 4, "rank"),
    Scenario("hosts", "two hosts x 2, a rank SIGKILLed", 2, 2, "rank"),
    Scenario("agent", "two hosts x 2 and a spare, host 1 lost (agent + workers SIGKILLed)",
             2, 2, "agent", spare=True),
]


class Fault:
    """Where the fault of a scenario falls, drawn once per run (every mode gets the same)."""

    def __init__(self, rng, sc, snapshot_every, step_ms):
        # After the snapshot at 20 (80 with a spare, which starts and settles for 3 s first).
        base = snapshot_every * (4 if sc.spare else 1)
        self.step = base + rng.randint(5, snapshot_every - 1)
        self.victim = rng.randrange(sc.world) if sc.fault == "rank" else 1
        self.offset_s = rng.uniform(0.0, step_ms / 1e3)

    def describe(self, sc):
        who = f"rank {self.victim}" if sc.fault == "rank" else f"host {self.victim}"
        return f"{who} after step {self.step} + {self.offset_s * 1e3:.0f} ms"


class Result:
    def __init__(self, outcome, lost_s=None, redone=None, params="-"):
        self.outcome = outcome
        self.lost_s = lost_s
        self.redone = redone
        self.params = params


def measure(args, sc, mode, fault, directory):
    extra = os.environ.get("DRUN_EXTRA", "").split() if mode.launcher == "drun" else []
    job = Job(args, mode, directory, sc.hosts + (1 if sc.spare else 0), sc.nproc,
              fault.step + TAIL_STEPS, drun_extra=extra)
    try:
        return run_job(args, job, sc, mode, fault)
    finally:
        job.cleanup()


def run_job(args, job, sc, mode, fault):
    job.up()
    for host in range(sc.hosts):
        job.start_agent(host, sc.hosts)
    if not job.wait_for(job.world_stepping(sc.world), time.time() + FORM_CAP_S):
        return Result(f"never formed (agent exit codes {job.codes})")
    if sc.spare:
        job.start_agent(sc.hosts, sc.hosts)
        time.sleep(SPARE_SETTLE_S)
    if not job.wait_for(lambda ls: any(ln.kind == "STEP" and ln.step >= fault.step for ln in ls),
                        time.time() + FORM_CAP_S):
        return Result(f"step {fault.step} never reached (agent exit codes {job.codes})")
    time.sleep(fault.offset_s)
    job.read_log()
    before = {ln.pid for ln in job.lines if ln.kind == "START"}
    if sc.fault == "rank":
        pids = [ln.pid for ln in job.lines if ln.kind == "START" and ln.rank == fault.victim]
        if not pids or not job.is_ours(pids[-1]):
            return Result(f"rank {fault.victim} has no live process to kill")
        killed_at = time.time()
        os.kill(pids[-1], signal.SIGKILL)
        lost_ranks = {fault.victim}
    else:
        lost_ranks = {ln.rank for ln in job.lines
                      if ln.kind == "START" and job.host_of(ln.pid) == fault.victim}
        killed_at = job.kill_agent(fault.victim)
    with open(os.path.join(job.dir, "killed_at"), "w") as f:  # the phases are read against it
        f.write(f"{killed_at:.6f}\n")
    cap = args.torch_cap if mode.launcher == "torchrun" else args.drun_cap

    first = job.wait_for(job.first_commit_after(killed_at), killed_at + cap)
    if first is None:
        job.reap()
        return Result(f"no step committed within {cap:.0f} s of the fault "
                      f"(agent exit codes {job.codes}){fallback_reason(job)}")
    redone = max(0, max(job.old_generation_steps(killed_at), default=0) - first.step + 1)
    job.wait_agents(time.time() + END_CAP_S)
    job.read_log()
    survivors = {ln.rank: ln.pid in before for ln in job.lines
                 if ln.kind == "STEP" and ln.t >= first.t and ln.rank not in lost_ranks}
    in_place = bool(survivors) and all(survivors.values())
    how = "in place" if in_place else "restarted" + fallback_reason(job)
    codes = " ".join(str(c) for h, c in sorted(job.codes.items())
                     if not (sc.fault == "agent" and h == fault.victim))
    return Result(f"{how}; exit {codes or '-'}", first.t - killed_at, redone, params_of(job, sc))


def fallback_reason(job):
    for host in sorted(job.agents):
        for line in job.agent_output(host).splitlines():
            if any(phrase in line.lower() for phrase in FALLBACK_PHRASES):
                text = line.strip()
                return f" ({text if len(text) <= 140 else text[:137] + '...'})"
    return ""


def params_of(job, sc):
    last = {}
    for ln in job.lines:
        if ln.kind == "END":
            last[ln.rank] = ln.sha1
    if len(last) < sc.world:
        return f"{len(last)}/{sc.world} ranks ended"
    hashes = set(last.values())
    return next(iter(hashes))[:10] if len(hashes) == 1 else "ranks differ"


def print_table(rows, seed):
    head = ["scenario", "fault", "mode", "time lost", "vs torchrun", "steps redone", "outcome",
            "params sha1"]
    body = []
    torch_s = {}
    for sc, fault, mode, r in rows:
        if mode.launcher == "torchrun" and r.lost_s is not None:
            torch_s[sc.key] = r.lost_s
    for sc, fault, mode, r in rows:
        lost = f"{r.lost_s:.3f} s" if r.lost_s is not None else "-"
        ratio = (f"{torch_s[sc.key] / r.lost_s:.1f}x less" if r.lost_s and sc.key in torch_s
                 and mode.launcher != "torchrun" else "")
        body.append([sc.title, fault.describe(sc), mode.name, lost, ratio,
                     "-" if r.redone is None else str(r.redone), r.outcome, r.params])
    print(f"\nTime lost to a failure (seed {seed}; time lost: from the SIGKILL to the first step "
          "committed by a new process)\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in body:
        print("| " + " | ".join(c.replace("|", "/") for c in row) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness_arguments(p)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--snapshot-every", type=int, default=20)
    p.add_argument("--drun-cap", type=float, default=60.0)
    p.add_argument("--torch-cap", type=float, default=90.0)
    p.add_argument("--in-process", default="",
                   help="empty: the in-process rows run; else why they cannot (shown)")
    p.add_argument("--scenarios", default=",".join(s.key for s in SCENARIOS))
    p.add_argument("--modes", default=",".join(m.key for m in MODES))
    args = p.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    rng = random.Random(seed)
    scenarios = [s for s in SCENARIOS if s.key in args.scenarios.split(",")]
    modes = [m for m in MODES if m.key in args.modes.split(",")]
    if not scenarios or not modes:
        p.error(f"no scenario or mode selected (scenarios: {', '.join(s.key for s in SCENARIOS)}; "
                f"modes: {', '.join(m.key for m in MODES)})")
    faults = {s.key: Fault(rng, s, args.snapshot_every, args.step_ms) for s in SCENARIOS}
    args.seed = seed
    print(f"time_lost: seed {seed}; drun from {args.drun_bin}; logs in {args.work_dir}",
          flush=True)
    rows = []
    try:
        for sc in scenarios:
            for mode in modes:
                fault = faults[sc.key]
                if mode.recovery == "in-process" and args.in_process:
                    r = Result(f"not measured: {args.in_process}")
                else:
                    begun = time.time()
                    r = measure(args, sc, mode, fault, os.path.join(args.work_dir,
                                                                    f"{sc.key}-{mode.key}"))
                    print(f"  {sc.key:6} {mode.name:42} {time.time() - begun:5.1f} s: "
                          + (f"{r.lost_s:.3f} s lost, " if r.lost_s is not None else "")
                          + f"redone {r.redone}, {r.outcome}", flush=True)
                rows.append((sc, fault, mode, r))
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"time_lost: interrupted ({e})", flush=True)
    print_table(rows, seed)
    return 0 if len(rows) == len(scenarios) * len(modes) else 1


if __name__ == "__main__":
    sys.exit(main())
