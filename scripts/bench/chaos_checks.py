"""The invariants of scripts/bench/chaos.sh, checked over one iteration's records: the workers'
lines (scripts/bench/chaos_worker.sh), each agent's exit and output, the faults as injected.
Pure functions of what they are given: no processes, no clocks (the driver owns those).

A *round* as the workers saw it is the set of worker lines with one (MASTER_ADDR:PORT,
TORCHELASTIC_RESTART_COUNT, WORLD_SIZE): drun draws a fresh MASTER_PORT for every round, so two
groups running at once under one job have different keys. A worker's interval runs from its
`start` line to its last line (`alive` every ~100 ms, `term`, `end`); it writes its last line
before it exits, and an agent rejoins only after its workers exited, so a round that starts while
a worker of an older round still writes is two rounds at once. No tolerance is needed: a line's
time is taken before it is written, so measured overlaps are never longer than real ones (runs on
the landed code show at least 2.8 ms between rounds where nothing went wrong).

A straggler of an older round is *excused* when its agent could not have stopped it yet: the agent
was frozen (SIGSTOP) or cut off and fences within heartbeat_timeout of the cut or of its SIGCONT
(+ FENCE_GRACE_S), or was SIGKILLed and its watchdog kills the workers (within KILL_GRACE_S).
Excused overlaps are counted (the table's notes), never reported as violations.
"""
import json
import os
import re
from dataclasses import dataclass, field

from chaos_plan import HEARTBEAT_INTERVAL_S

OVERLAP_TOLERANCE_S = 0.0
FENCE_GRACE_S = 1.0
KILL_GRACE_S = 0.5
ARRIVAL_RACE_S = 0.5   # an agent started this close to the job's end may come after it

AGENT_FAULTS = ("agent_stop", "link_cut", "store_slow", "agent_kill")


@dataclass
class Worker:
    pid: int
    host: int
    agent_pid: int
    restart: int
    group_rank: int
    rank: int
    world: int
    master: str
    start: float = None
    last: float = 0.0
    ended: bool = False     # wrote `end`: exited 0 of its own accord
    termed: bool = False

    @property
    def key(self):
        return (self.master, self.restart, self.world)


@dataclass
class Fault:
    kind: str
    start: float
    end: float                # == start for instantaneous faults
    agent_pids: tuple = ()    # the agents (or the daemon) it hit
    host: int = None
    detail: str = ""
    hits_store: bool = False  # it froze, cut off or killed the store's process


@dataclass
class Agent:
    name: str                 # "h2", "h2-dup", "new4"
    host: int
    pid: int
    role: str                 # initial | newcomer | duplicate
    started: float
    exited: float = None
    code: int = None          # exit status (negative: killed by that signal)
    killed_by_driver: bool = False
    hung: bool = False
    output: str = ""


@dataclass
class Violation:
    kind: str
    text: str


@dataclass
class Summary:
    violations: list = field(default_factory=list)
    excused_overlap_s: float = 0.0   # the longest straggler overlap excused by a fault
    min_gap_s: float = None          # the closest a round started after an older one's last line
    succeeded: bool = False          # the last round ended on every rank
    members_exited_0: bool = False   # ... and every judged agent that ran it exited 0
    rounds: int = 0


def parse_worker_lines(text):
    """pid -> Worker from the lines of one or more host files; malformed lines are skipped."""
    workers = {}
    for line in text.splitlines():
        w = line.split()
        if len(w) != 10 or not w[0].isdigit():
            continue
        try:
            t = int(w[0]) / 1e9
            pid, host, agent_pid = int(w[2]), int(w[1]), int(w[3])
            restart, group_rank, rank, world = int(w[4]), int(w[5]), int(w[6]), int(w[7])
        except ValueError:
            continue
        rec = workers.get(pid)
        if rec is None:
            rec = workers[pid] = Worker(pid, host, agent_pid, restart, group_rank, rank, world,
                                        w[8])
        if w[9] == "start":
            rec.start = t
        rec.last = max(rec.last, t)
        rec.ended |= w[9] == "end"
        rec.termed |= w[9] == "term"
    return {pid: w for pid, w in workers.items() if w.start is not None}


def rounds_of(workers):
    """[(key, [workers])] ordered by the round's first start."""
    groups = {}
    for w in workers.values():
        groups.setdefault(w.key, []).append(w)
    return sorted(groups.items(), key=lambda kv: min(w.start for w in kv[1]))


def excused(worker, faults, hb_timeout):
    """Whether an agent-level fault explains why this straggler still ran."""
    for f in faults:
        if f.kind not in AGENT_FAULTS or worker.agent_pid not in f.agent_pids:
            continue
        if f.kind == "agent_kill":
            if f.start <= worker.last <= f.start + KILL_GRACE_S:
                return True
        elif f.start <= worker.last <= f.end + hb_timeout + FENCE_GRACE_S:
            return True
    return False


def check_rounds(workers, faults, hb_timeout, max_restarts, summary):
    rounds = rounds_of(workers)
    summary.rounds = len(rounds)
    for i, (key_a, a) in enumerate(rounds):
        ranks = [w.rank for w in a]
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        if twice:
            summary.violations.append(Violation(
                "rank twice in a round", f"round {fmt_key(key_a)}: ranks {twice} started twice "
                f"(pids {[w.pid for w in a if w.rank in twice]})"))
        if key_a[1] > max_restarts:
            summary.violations.append(Violation(
                "restart count over budget", f"round {fmt_key(key_a)} runs with "
                f"TORCHELASTIC_RESTART_COUNT {key_a[1]} > --max-restarts {max_restarts}"))
        for key_b, b in rounds[i + 1:]:
            b_start = min(w.start for w in b)
            if key_b[1] < key_a[1]:
                summary.violations.append(Violation(
                    "restart count went back", f"round {fmt_key(key_b)} started at "
                    f"{b_start:.3f} after round {fmt_key(key_a)}"))
            stragglers = [w for w in a if w.last > b_start + OVERLAP_TOLERANCE_S]
            real = [w for w in stragglers if not excused(w, faults, hb_timeout)]
            for w in stragglers:
                if w not in real:
                    summary.excused_overlap_s = max(summary.excused_overlap_s, w.last - b_start)
            if not real:
                last = max((w.last for w in a if w not in stragglers), default=None)
                if last is not None and (summary.min_gap_s is None
                                         or b_start - last < summary.min_gap_s):
                    summary.min_gap_s = b_start - last
                continue
            b_rank0 = [w for w in b if w.rank == 0]
            a_rank0 = [w for w in real if w.rank == 0]
            kind = "split brain (two rank 0s)" if a_rank0 and b_rank0 else "rounds overlap"
            who = ", ".join(f"rank {w.rank} pid {w.pid} on h{w.host} until {w.last:.3f} "
                            f"(+{w.last - b_start:.3f} s)" for w in real)
            summary.violations.append(Violation(
                kind, f"round {fmt_key(key_b)} started at {b_start:.3f} on "
                f"h{sorted({w.host for w in b})} while round {fmt_key(key_a)} still ran: {who}"))
    return rounds


def fmt_key(key):
    master, restart, world = key
    return f"[master {master} restart {restart} world {world}]"


ROOT_CAUSE = re.compile(r"^drun: root cause: rank (\d+) \(local_rank \d+\) on (\S+) "
                        r"(?:exited with code (\d+)|was killed by signal \S+ \((\d+)\))$", re.M)
CAUSE_DETAIL = re.compile(r"^drun:   (pid|time): (.*)$", re.M)
# A node that waited (a spare) when the job failed says it in one line.
WAITER_CAUSE = re.compile(r"the job failed while this node waited to join it: rank (\d+) on (\S+) "
                          r"ended with status (\d+)")
BUDGET_SPENT = re.compile(r"^drun: restart budget exhausted \((\d+) restarts\)$", re.M)


def root_cause(output):
    """(rank, node, status, pid and time or None) of the root cause an agent printed, or None.
    The summary and a waiter's one line name the same cause in two shapes: the status compared
    is the exit code, or 128 + the signal (drun's exit code for it)."""
    m = ROOT_CAUSE.search(output)
    if m:
        details = dict(CAUSE_DETAIL.findall(output[m.end():m.end() + 400]))
        status = int(m.group(3)) if m.group(3) else 128 + int(m.group(4))
        return (int(m.group(1)), m.group(2), status,
                f"pid {details.get('pid', '?')}, time {details.get('time', '?')}")
    m = WAITER_CAUSE.search(output)
    return (int(m.group(1)), m.group(2), int(m.group(3)), None) if m else None


def check_causes(agents, judged, workers, summary):
    """(4) one root cause everywhere, a failed job's agents exit with its code (spares too), and
    a spent budget means that many restarts were made."""
    causes = {a.name: root_cause(a.output) for a in agents}
    causes = {n: c for n, c in causes.items() if c}
    shapes = {c[:3] for c in causes.values()}
    details = {c[3] for c in causes.values() if c[3]}
    if len(shapes) > 1 or len(details) > 1:
        summary.violations.append(Violation(
            "root causes differ", "; ".join(f"{n}: rank {c[0]} on {c[1]} status {c[2]}"
                                            + (f" ({c[3]})" if c[3] else "")
                                            for n, c in sorted(causes.items()))))
    if len(shapes) == 1 and not summary.succeeded:
        status = next(iter(shapes))[2]
        wrong = {a.name: a.code for a in judged if a.code != status}
        if wrong:
            summary.violations.append(Violation(
                "failed job, agent exit differs", f"the root cause's status is {status}; "
                f"exit codes {wrong}\n" + "\n".join(f"    {n}:\n" + tail(a.output, 4)
                                                   for n, a in ((a.name, a) for a in judged)
                                                   if n in wrong)))
    reached = max((w.restart for w in workers.values()), default=0)
    for a in agents:
        m = BUDGET_SPENT.search(a.output)
        if m and int(m.group(1)) != reached:
            summary.violations.append(Violation(
                "restart count differs", f"{a.name} says the budget of {m.group(1)} restarts is "
                f"spent, but the job's workers reached TORCHELASTIC_RESTART_COUNT {reached}"))


def check_exits(agents, workers, rounds, faults, hb_timeout, summary):
    """(3) exit codes of a succeeded job, and no success claimed without a completed round."""
    complete = {key for key, ws in rounds
                if {w.rank for w in ws if w.ended} == set(range(ws[0].world))}
    summary.succeeded = bool(rounds) and rounds[-1][0] in complete
    job_end = max((w.last for w in rounds[-1][1]), default=0.0) if rounds else 0.0
    members = {w.agent_pid for w in rounds[-1][1]} if rounds else set()
    # A node frozen or cut off for heartbeat_timeout is lost by definition; so is the whole job
    # when that node is the store's (docs/multinode.md: the store's host is the job's single
    # point of failure). Their exits are not judged. The lease counts from the node's last frame,
    # which can precede the fault by a heartbeat interval: a fault that long short of the timeout
    # can already expire it (seed 20003: a spare cut off 1.85 s of a 2 s lease was declared lost).
    at_risk = hb_timeout - HEARTBEAT_INTERVAL_S
    lost = {pid for f in faults if f.kind == "agent_kill" or
            (f.kind in ("agent_stop", "link_cut", "store_slow") and f.end - f.start >= at_risk)
            for pid in f.agent_pids}
    store_lost = any(f.hits_store and (f.kind == "agent_kill" or f.end - f.start >= at_risk)
                     for f in faults)
    judged = []   # agents whose exit code says what the job's was
    for a in agents:
        if a.hung or a.killed_by_driver or a.code is None:
            continue
        if not store_lost and a.pid not in lost and a.started < job_end - ARRIVAL_RACE_S:
            judged.append(a)
        own = [w for w in workers.values() if w.agent_pid == a.pid]
        last_own = max(own, key=lambda w: w.start).key if own else None
        # Exit 0 says "the job succeeded": the job's last round, or the one this agent ran last
        # (a member replaced by a spare at a restart exits with the job's code, as a spare).
        if a.code == 0 and not summary.succeeded and last_own not in complete:
            summary.violations.append(Violation(
                "exit 0 without a completed round", f"{a.name} (pid {a.pid}) exited 0 but "
                "neither the job's last round nor "
                + (f"its own last round {fmt_key(last_own)}" if own else "any round")
                + " ended on every rank"))
        if summary.succeeded and a.code != 0 and a in judged:
            summary.violations.append(Violation(
                "succeeded job, agent failed", f"{a.name} (pid {a.pid}, {a.role}) exited "
                f"{a.code} after every rank of the last round succeeded; its last lines:\n"
                + tail(a.output, 6)))
    # Only judged exits count: a member killed after its workers ended (seed 3825369) exits -9
    # and says nothing of the job. With none judged (the store's host lost) nothing says it.
    judged_members = [a for a in judged if a.pid in members]
    summary.members_exited_0 = (summary.succeeded and bool(judged_members)
                                and all(a.code == 0 for a in judged_members))
    return judged


def tail(text, n):
    return "\n".join("      " + line for line in text.rstrip().splitlines()[-n:])


def check_iteration(agents, worker_text, faults, hb_timeout, max_restarts):
    """Every invariant that reads only records (hangs and leftovers are the driver's: it sees
    the processes). Returns a Summary."""
    summary = Summary()
    workers = parse_worker_lines(worker_text)
    rounds = check_rounds(workers, faults, hb_timeout, max_restarts, summary)
    judged = check_exits(agents, workers, rounds, faults, hb_timeout, summary)
    check_causes(agents, judged, workers, summary)
    return summary


def recheck(directory, hb_timeout, max_restarts):
    """The invariants again over an iteration's kept logs (its record.json, host*.log,
    agent-*.log): to judge a change of these rules against runs already seen."""
    with open(os.path.join(directory, "record.json")) as f:
        record = json.load(f)
    agents = [Agent(**a) for a in record["agents"]]
    for a in agents:
        with open(os.path.join(directory, f"agent-{a.name}.log"), errors="replace") as f:
            a.output = f.read()
    faults = [Fault(**dict(f, agent_pids=tuple(f["agent_pids"]))) for f in record["faults"]]
    text = ""
    for name in sorted(os.listdir(directory)):
        if name.startswith("host"):
            with open(os.path.join(directory, name), errors="replace") as f:
                text += f.read()
    summary = check_iteration(agents, text, faults, hb_timeout, max_restarts)
    summary.violations[:0] = [Violation(**v) for v in record["driver_violations"]]
    return record["seed"], summary
