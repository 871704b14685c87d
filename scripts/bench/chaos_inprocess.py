"""`chaos.sh --recovery in-process`: random faults during in-process recoveries, and the
invariants of chaos_inprocess_checks.py after every iteration. Called from chaos_driver.py.

Each iteration is a fresh job on 3 fresh namespace hosts (time_lost_job.Job): drun agents on
hosts 0 and 1 (--nnodes 2, 2 workers each, --recovery in-process, --max-restarts 3,
recovery_timeout 10 s), a spare agent on host 2 started once the job runs, and the workers
running scripts/bench/time_lost_train.py (the DDP tutorial model through drun.torch.resilient,
80 steps of 30 ms, the drun or the gloo backend as drawn). The fault kind is KINDS[seed %
len(KINDS)]; times, victims and durations come from random.Random(seed), counted from the moment
every rank committed its first step:

  worker_kill       SIGKILL to a worker
  double_kill       SIGKILL to a worker, and to another 0-400 ms later (during the recovery)
  replacement_kill  SIGKILL to a worker, then to its replacement 0-1.5 s after it started
  survivor_stop     SIGKILL to a worker; a survivor SIGSTOPped 0.2-15 s (past recovery_timeout
                    sometimes), then SIGCONT
  agent_kill        host 1 lost: its agent and its workers SIGKILLed (the spare takes over)
  store_slow        SIGKILL to a worker; host 0's agent (it serves the store) SIGSTOPped
                    0.1-1.5 s during the recovery

The iteration waits (bounded) for every agent's exit, then kills whatever of the job is left,
by PID, and counts it and any /dev/shm entry naming the job as violations.
"""
import argparse
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass, field

import chaos_inprocess_checks as checks
from time_lost_job import Job, Mode

KINDS = ("worker_kill", "double_kill", "replacement_kill", "survivor_stop", "agent_kill",
         "store_slow")
MAX_RESTARTS = 3
RECOVERY_TIMEOUT_S = 10
RECOVERY_BOUND_S = RECOVERY_TIMEOUT_S + 40   # a fallback restarts the job: torch imports again
RDZV_CONF = (f"recovery_timeout={RECOVERY_TIMEOUT_S},heartbeat_interval=500ms,"
             "heartbeat_timeout=2,last_call_timeout=500ms,join_timeout=30")
STEPS, STEP_MS = 80, 30
FORM_CAP_S = 120.0
HANG_BOUND_S = 90.0          # every agent exits this long after the last fault
LEFTOVER_GRACE_S = 2.0
POLL_S = 0.01


@dataclass
class Action:
    at: float                # seconds after every rank's first step
    kind: str                # kill | kill_replacement | stop | agent_kill | store_stop
    pick: float = 0.0        # which worker, as a fraction of the live ones by rank
    duration: float = 0.0


@dataclass
class Plan:
    seed: int
    kind: str
    backend: str
    actions: list = field(default_factory=list)

    def describe(self):
        return f"{self.backend} backend; " + "; ".join(
            f"{a.kind}@{a.at:.2f}s" + (f" for {a.duration:.2f}s" if a.duration else "")
            for a in self.actions)


def make_plan(seed):
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    plan = Plan(seed, kind, rng.choice(["drun", "gloo"]))
    at = round(rng.uniform(0.2, 1.5), 3)
    if kind == "agent_kill":
        plan.actions.append(Action(at, "agent_kill"))
        return plan
    plan.actions.append(Action(at, "kill", pick=rng.random()))
    if kind == "double_kill":
        plan.actions.append(Action(round(at + rng.uniform(0.0, 0.4), 3), "kill", pick=rng.random()))
    elif kind == "replacement_kill":
        plan.actions.append(Action(round(rng.uniform(0.0, 1.5), 3), "kill_replacement"))
    elif kind == "survivor_stop":
        plan.actions.append(Action(round(at + rng.uniform(0.0, 0.3), 3), "stop", rng.random(),
                                   round(rng.uniform(0.2, 1.5 * RECOVERY_TIMEOUT_S), 3)))
    elif kind == "store_slow":
        plan.actions.append(Action(round(at + rng.uniform(0.0, 0.5), 3), "store_stop",
                                   duration=round(rng.uniform(0.1, 1.5), 3)))
    return plan


class Iteration:
    def __init__(self, args, plan, index):
        self.args = args
        self.plan = plan
        self.index = index
        self.dir = os.path.join(args.work_dir, f"iter{index:03d}-seed{plan.seed}")
        job_args = argparse.Namespace(
            python="/usr/bin/python3", train=args.train, step_ms=STEP_MS, seed=plan.seed,
            drun_bin=args.drun_bin, netns=args.netns, torchrun_compat="",
            pythonpath=os.path.join(os.path.dirname(args.drun_bin), "lib", "drun", "python"))
        mode = Mode(f"inprocess-{plan.backend}", "", "drun", "in-process", plan.backend)
        self.job = Job(job_args, mode, self.dir, 3, 2, STEPS, MAX_RESTARTS,
                       ["--rdzv-conf", RDZV_CONF, "--shutdown-timeout", "2"])
        self.kills = []          # checks.Kill
        self.killed_agents = set()
        self.stopped = []        # (due, pids)
        self.frozen = set()      # ranks of the survivors SIGSTOPped
        self.violations = []
        self.t0 = 0.0
        self.summary = checks.Summary()

    def live_workers(self):
        """(rank, pid) of the live workers, by rank."""
        job = self.job
        job.read_log()
        latest = {}
        for ln in job.lines:
            if ln.kind == "START" and job.is_ours(ln.pid):
                latest[ln.rank] = ln.pid
        return sorted(latest.items())

    def kill(self, victims, kind, detail):
        now = time.time()
        for _rank, pid in victims:
            os.kill(pid, signal.SIGKILL)
        self.kills.append(checks.Kill(now, kind, detail, tuple(r for r, _ in victims)))

    def inject(self, action):
        live = self.live_workers()
        if action.kind == "agent_kill":
            ranks = [r for r, pid in live if self.job.host_of(pid) == 1]
            t = self.job.kill_agent(1)
            self.killed_agents.add(1)
            self.kills.append(checks.Kill(t, "agent_kill", "host 1 lost", tuple(ranks)))
        elif action.kind == "kill" and live:
            rank, pid = live[min(int(action.pick * len(live)), len(live) - 1)]
            self.kill([(rank, pid)], "worker_kill", f"rank {rank} pid {pid}")
        elif action.kind == "kill_replacement" and self.kills:
            first = self.kills[0]
            rank = first.ranks[0]
            new = self.job.wait_for(lambda ls: [ln for ln in ls if ln.kind == "START" and
                                                ln.rank == rank and ln.t > first.t],
                                    time.time() + RECOVERY_TIMEOUT_S)
            if new:
                time.sleep(max(0.0, new[0].t + action.at - time.time()))
                if self.job.is_ours(new[0].pid):
                    self.kill([(rank, new[0].pid)], "worker_kill",
                              f"rank {rank}'s replacement pid {new[0].pid}")
        elif action.kind in ("stop", "store_stop"):
            if action.kind == "stop":
                survivors = [(r, p) for r, p in live if all(r not in k.ranks for k in self.kills)]
                chosen = [survivors[min(int(action.pick * len(survivors)), len(survivors) - 1)]] \
                    if survivors else []
                self.frozen.update(r for r, _ in chosen)
                pids = [p for _, p in chosen]
            else:
                pids = [self.job.agents[0].pid]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            self.stopped.append((time.time() + action.duration, pids))

    def resume_due(self, force=False):
        for item in list(self.stopped):
            if force or time.time() >= item[0]:
                for pid in item[1]:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                self.stopped.remove(item)

    def run(self):
        job, shm_before = self.job, set(os.listdir("/dev/shm"))
        job.up()
        for host in (0, 1):
            job.start_agent(host, 2)
        if not job.wait_for(job.world_stepping(4), time.time() + FORM_CAP_S):
            self.violations.append(checks.Violation(
                "never formed", f"the job did not commit a first step within {FORM_CAP_S:.0f} s"
                f" (agent exit codes {job.codes})"))
            self.finish(shm_before)
            return
        self.t0 = time.time()
        job.start_agent(2, 2)
        todo = sorted(self.plan.actions, key=lambda a: a.at if a.kind != "kill_replacement"
                      else float("inf"))
        deadline = self.t0 + max(a.at + a.duration for a in todo) + HANG_BOUND_S
        while time.time() < deadline:
            while todo and time.time() >= self.t0 + (todo[0].at if todo[0].kind !=
                                                     "kill_replacement" else 0):
                self.inject(todo.pop(0))
            self.resume_due()
            if not todo and not self.stopped and not job.running_agents():
                break
            time.sleep(POLL_S)
        self.finish(shm_before)

    def finish(self, shm_before):
        job = self.job
        self.resume_due(force=True)
        hung = job.running_agents()
        job_end = time.time() if not hung else None
        for host in hung:
            self.violations.append(checks.Violation(
                "agent hangs", f"agent {host} still running {HANG_BOUND_S:.0f} s after the "
                "last fault"))
        job.cleanup()
        deadline = time.time() + LEFTOVER_GRACE_S
        while job.tagged_pids() and time.time() < deadline:
            time.sleep(POLL_S)
        left = job.tagged_pids()
        if left:
            self.violations.append(checks.Violation("processes left", f"pids {left}"))
            for pid in left:
                os.kill(pid, signal.SIGKILL)
        shm_new = [n for n in set(os.listdir("/dev/shm")) - shm_before if job.tag in n]
        if shm_new:
            self.violations.append(checks.Violation("files left in /dev/shm", ", ".join(shm_new)))
        agents = [checks.AgentExit(str(h), job.codes.get(h), h in self.killed_agents,
                                   job.agent_output(h)) for h in sorted(job.agents)]
        self.summary = checks.check(job.read_log(), self.kills, agents, 4, MAX_RESTARTS,
                                    RECOVERY_BOUND_S, job_end, self.t0, self.frozen)
        self.summary.violations[:0] = self.violations

    def outcome(self):
        if self.summary.violations:
            return "violation"
        if self.summary.ended:
            return "succeeded"
        spent = len(self.kills) + self.summary.recoveries.count("restart")
        expected = spent > MAX_RESTARTS or self.plan.kind in ("store_slow", "agent_kill")
        return "failed, expected" if expected else "failed, unexpected"

    def codes(self):
        return " ".join(f"h{h}={c}" for h, c in sorted(self.job.codes.items()))


def run(args):
    """The in-process chaos loop; returns the exit status."""
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    args.train = os.path.join(os.path.dirname(os.path.abspath(__file__)), "time_lost_train.py")
    print(f"chaos --recovery in-process: {args.iterations} iteration(s) from seed {seed} "
          f"(replay one: chaos.sh --recovery in-process --seed <its seed> --iterations 1)",
          flush=True)
    results, started, s = [], time.time(), seed
    stopped_early = ""
    while len(results) < args.iterations:
        if args.time_budget and time.time() - started > args.time_budget:
            stopped_early = f"time budget of {args.time_budget:.0f} s spent"
            break
        plan = make_plan(s)
        s += 1
        if args.kind and plan.kind != args.kind:
            continue
        it = Iteration(args, plan, len(results))
        begun = time.time()
        try:
            it.run()
        finally:
            it.resume_due(force=True)
            it.job.cleanup()
        outcome = it.outcome()
        results.append((plan, outcome, it.summary))
        print(f"iter {it.index:3d} seed {plan.seed} {plan.kind:16} {outcome:18} "
              f"{time.time() - begun:5.1f} s  recoveries {' '.join(it.summary.recoveries) or '-'}"
              f"  {it.codes()}  | {plan.describe()}", flush=True)
        for v in it.summary.violations:
            print(f"    [{v.kind}] {v.text}", flush=True)
        if outcome in ("violation", "failed, unexpected"):
            print(f"  logs in {it.dir}", flush=True)
        elif not args.keep_logs:
            shutil.rmtree(it.dir, ignore_errors=True)
    print_table(results, time.time() - started)
    bad = [p.seed for p, o, _ in results if o == "violation"]
    if bad:
        print(f"{len(bad)} iteration(s) with violations; seeds: {', '.join(map(str, bad))}")
    if stopped_early:
        print(f"chaos: {stopped_early} after {len(results)} iteration(s)")
    return 1 if bad or stopped_early else 0


def print_table(results, elapsed):
    outcomes = ("succeeded", "failed, expected", "failed, unexpected", "violation")
    recoveries = ("formed", "restart", "superseded", "ended")
    head = ["fault kind", "runs", *outcomes, *(f"recovery {r}" for r in recoveries)]
    rows = []
    for kind in [k for k in KINDS if any(p.kind == k for p, _, _ in results)] + ["all"]:
        mine = [r for r in results if kind in ("all", r[0].kind)]
        rows.append([kind, len(mine)] + [sum(1 for r in mine if r[1] == o) for o in outcomes]
                    + [sum(r[2].recoveries.count(x) for r in mine) for x in recoveries])
    print(f"\nChaos, in-process recovery: iterations by fault kind and outcome ({elapsed:.0f} s)")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")
