"""The invariants of `chaos.sh --recovery in-process` (chaos_inprocess.py), judged from the
workers' log of time_lost_train.py (time_lost_job.Line: START / ENTER / STEP / END) and the
agents' exits. Standard library only; chaos_inprocess_checks_test.py tests each rule.

  generations  one generation at a time: once a process that entered train() after a kill has
               committed a step, no process whose last entry is older than that kill commits
               again (a survivor on stale state, a rank of a superseded generation).
  parameters   the last commit of each step carries the same parameter checksum on every rank,
               and so do the END lines: no rank runs on stale parameters after a recovery.
  recovery     within `bound` of each kill, every rank commits a step from a process that
               entered after it (the generation formed, or the job restarted), or the job ends;
               a restart after a worker's death is explained on some node (FALLBACK_PHRASES).
  restarts     TORCHELASTIC_RESTART_COUNT never goes back nor beyond --max-restarts (a
               replacement of an older generation may start after one of a newer).
  exits        when every rank ended, every agent not killed exits 0; an agent exits 0 only then.
"""
import bisect
from dataclasses import dataclass, field

from chaos_checks import Violation

# What drun prints when an in-process recovery ends in a restart ("generation 2 did not form:
# rank 3 never joined; restarting the job", "no in-process recovery: ...", or a node or the store
# lost: "...; stopping the workers and re-forming the job"); any one will do.
FALLBACK_PHRASES = ("did not form", "no in-process recovery", "re-forming the job", "fallback",
                    "fall back")


@dataclass
class Kill:
    t: float            # wall time of the SIGKILL
    kind: str           # worker_kill | agent_kill ...
    detail: str = ""
    ranks: tuple = ()   # ranks whose process it killed


@dataclass
class AgentExit:
    name: str
    code: int = None    # None: still running at the end (hung)
    killed: bool = False
    output: str = ""


@dataclass
class Summary:
    violations: list = field(default_factory=list)
    recoveries: list = field(default_factory=list)   # "formed" | "restart" | "ended" per kill
    ended: bool = False                              # every rank wrote END

    def add(self, kind, text):
        self.violations.append(Violation(kind, text))


class Entries:
    """Each process's entries into train(), by time."""

    def __init__(self, lines):
        self.by_pid = {}
        for ln in sorted((ln for ln in lines if ln.kind == "ENTER"), key=lambda ln: ln.t):
            self.by_pid.setdefault(ln.pid, []).append(ln.t)

    def last_before(self, pid, t):
        times = self.by_pid.get(pid, [])
        i = bisect.bisect_left(times, t)
        return times[i - 1] if i else None


def rel(t, t0):
    return f"+{t - t0:.3f} s"


def check_generations(steps, kills, entries, t0, summary):
    for kill in kills:
        new = [s for s in steps if s.t > kill.t and (entries.last_before(s.pid, s.t) or 0) > kill.t]
        if not new:
            continue
        first = new[0]
        for s in steps:
            if s.t <= first.t:
                continue
            entered = entries.last_before(s.pid, s.t)
            if entered is None or entered <= kill.t:
                summary.add("two generations at once",
                            f"rank {s.rank} (pid {s.pid}) committed step {s.step} at "
                            f"{rel(s.t, t0)} on state from before the kill at {rel(kill.t, t0)} "
                            f"({kill.detail}), after rank {first.rank} (pid {first.pid}) had "
                            f"committed step {first.step} in the new generation at "
                            f"{rel(first.t, t0)}")
                break


def check_parameters(steps, ends, summary):
    last = {}
    for s in steps:
        last[(s.step, s.rank)] = s
    by_step = {}
    for (step, _rank), s in last.items():
        by_step.setdefault(step, []).append(s)
    for step in sorted(by_step):
        if len({s.sha1 for s in by_step[step]}) > 1:
            summary.add("parameters differ across ranks",
                        f"step {step}: " + ", ".join(f"rank {s.rank} (pid {s.pid}) {s.sha1}"
                                                     for s in sorted(by_step[step],
                                                                     key=lambda s: s.rank)))
            return
    if len({e.sha1 for e in ends}) > 1:
        summary.add("parameters differ across ranks",
                    "at the end: " + ", ".join(f"rank {e.rank} {e.sha1}" for e in ends))


def check_recoveries(steps, kills, entries, world, bound, job_end, agents, t0, summary, frozen=()):
    """job_end: the wall time the last agent exited (None: some agent never did). frozen: ranks
    whose process was SIGSTOPped for a while: one frozen past the store's liveness is fenced and
    replaced (its own death), so it may come back as a new process without a restart."""
    explained = any(phrase in a.output.lower() for a in agents for phrase in FALLBACK_PHRASES)
    for i, kill in enumerate(kills):
        resolved = {}
        for s in steps:
            if s.t > kill.t and s.rank not in resolved and \
                    (entries.last_before(s.pid, s.t) or 0) > kill.t:
                resolved[s.rank] = s
        done_at = max(s.t for s in resolved.values()) if len(resolved) >= world else None
        later = kills[i + 1].t if i + 1 < len(kills) else None
        if done_at is not None and done_at <= kill.t + bound:
            before = {s.rank: s for s in steps if s.t < kill.t}
            # A rank whose process then was killed (by this kill, or by another one before the
            # recovery resolved: a second death during it) is replaced, not kept.
            lost = {r for k in kills if k.t <= done_at for r in k.ranks
                    if r in before and before[r].t <= k.t}
            kept = all(resolved[r].pid == s.pid for r, s in before.items()
                       if r not in lost and r not in frozen and r in resolved)
            summary.recoveries.append("formed" if kept else "restart")
            if not kept and kill.kind == "worker_kill" and not explained:
                summary.add("restart without a reason",
                            f"the kill at {rel(kill.t, t0)} ({kill.detail}) ended in a restart "
                            "and no node printed why the recovery fell back")
        elif later is not None and later <= kill.t + bound:
            summary.recoveries.append("superseded")
        elif job_end is not None and job_end <= kill.t + bound:
            summary.recoveries.append("ended")
        else:
            summary.add("recovery stuck",
                        f"{bound:.0f} s after the kill at {rel(kill.t, t0)} ({kill.detail}) "
                        f"only ranks {sorted(resolved)} of {world} stepped on from a new entry "
                        "and the job had not ended")


def check_restart_counts(starts, max_restarts, t0, summary):
    """A process of the job's (re)start must not start below any count seen before it; a
    replacement of generation g only below none of a process of generation g or lower (the
    replacements of two generations start together, and the older one may log its START later)."""
    seen = {}  # generation -> the highest count started in it
    for s in sorted(starts, key=lambda s: s.t):
        count = int(s.restart) if s.restart.isdigit() else 0
        g = int(s.generation) if s.generation.isdigit() else 0
        floor = max((c for gen, c in seen.items() if g == 0 or gen <= g), default=0)
        if count < floor or count > max_restarts:
            summary.add("restart count", f"rank {s.rank} (pid {s.pid}, generation {g}) started "
                        f"at {rel(s.t, t0)} with TORCHELASTIC_RESTART_COUNT {s.restart} after "
                        f"{floor} was seen (--max-restarts {max_restarts})")
            return
        seen[g] = max(seen.get(g, 0), count)


def check_exits(agents, ended, summary):
    for a in agents:
        if a.killed or a.code is None:
            continue
        if ended and a.code != 0:
            summary.add("exit codes", f"every rank ended, yet agent {a.name} exited {a.code}")
        elif not ended and a.code == 0:
            summary.add("exit codes", f"agent {a.name} exited 0 though not every rank ended")


def check(lines, kills, agents, world, max_restarts, bound, job_end, t0, frozen=()):
    """lines: time_lost_job.Line; kills: Kill by time; agents: AgentExit; frozen: ranks that were
    SIGSTOPped (check_recoveries). Returns a Summary."""
    summary = Summary()
    steps = sorted((ln for ln in lines if ln.kind == "STEP"), key=lambda ln: ln.t)
    ends = {ln.rank: ln for ln in lines if ln.kind == "END"}
    summary.ended = len(ends) >= world
    entries = Entries(lines)
    kills = sorted(kills, key=lambda k: k.t)
    check_generations(steps, kills, entries, t0, summary)
    check_parameters(steps, list(ends.values()), summary)
    check_recoveries(steps, kills, entries, world, bound, job_end, agents, t0, summary, frozen)
    check_restart_counts([ln for ln in lines if ln.kind == "START"], max_restarts, t0, summary)
    check_exits(agents, summary.ended, summary)
    return summary
