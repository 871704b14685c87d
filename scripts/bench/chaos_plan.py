"""What one iteration of scripts/bench/chaos.sh does, drawn from its seed alone (so that
`chaos.sh --seed S --iterations 1` replays the plan of the iteration that printed seed S; the
timing of the processes themselves is not replayable).

The fault kind is KINDS[seed % len(KINDS)], so consecutive seeds cover every kind; the rest
(shape of the job, store, times, durations, targets) comes from random.Random(seed).
"""
import random
from dataclasses import dataclass, field

KINDS = ("worker_kill", "agent_kill", "agent_stop", "link_cut", "store_slow", "newcomer",
         "newcomers_min", "duplicate")

FIRST_NEWCOMER_HOST = 4   # initial agents use hosts 0..3, newcomers 4..6
DAEMON_HOST = 7
HOSTS = 8
# --store etcd: a 3-member etcd cluster (scripts/etcd/up.sh) on hosts 8..10, made once per run.
ETCD_HOSTS = (8, 9, 10)
HOSTS_WITH_ETCD = 11

# The job's rendezvous settings: short, so that an iteration ends in seconds.
HEARTBEAT_TIMEOUT_S = 2.0
HEARTBEAT_INTERVAL_S = 0.5
RDZV_CONF = ("join_timeout=6,last_call_timeout=500ms,close_timeout=3,"
             f"heartbeat_interval={HEARTBEAT_INTERVAL_S * 1000:g}ms,"
             f"heartbeat_timeout={HEARTBEAT_TIMEOUT_S:g},read_timeout=5,"
             # The store's host killed ends the job (an embedded store): its agents give up
             # after 3 s, as before the 30 s default, so an iteration stays short.
             "reconnect_timeout=3")
MAX_RESTARTS = 3
SHUTDOWN_TIMEOUT_S = 2


@dataclass
class Action:
    at: float                 # seconds after the iteration's start
    kind: str
    target: str = ""          # an agent's name, "store", "host:N" (link cut), "" (worker: drawn then)
    duration: float = 0.0
    new_agents: list = field(default_factory=list)   # [(name, host, role)] for arrivals
    pick: float = 0.0         # worker_kill: which live worker, as a fraction of the sorted list


@dataclass
class Plan:
    seed: int
    kind: str
    min_nodes: int
    max_nodes: int
    store: str                # embedded (agent h0 hosts it) | daemon (drun-rendezvous on host 7)
                              # | etcd (--rdzv-backend etcd on the run's 3-member cluster)
    nproc: int
    life_ms: int
    initial: list             # [(name, host, role)]
    actions: list

    @property
    def nnodes(self):
        return f"{self.min_nodes}:{self.max_nodes}"

    @property
    def store_host(self):
        """The host whose loss takes the store with it (none on etcd: one member of three)."""
        return {"embedded": 0, "daemon": DAEMON_HOST}.get(self.store)

    def describe(self):
        acts = "; ".join(
            f"{a.kind}@{a.at:.2f}s" + (f" {a.target}" if a.target else "")
            + (f" for {a.duration:.2f}s" if a.duration else "")
            + (f" [{', '.join(n for n, _, _ in a.new_agents)}]" if a.new_agents else "")
            for a in self.actions)
        return (f"--nnodes {self.nnodes}, {len(self.initial)} agents, store {self.store}, "
                f"{self.nproc} worker(s)/node for {self.life_ms} ms; {acts}")


def make_plan(seed, store_mode=None):
    """store_mode "etcd": every job on the run's etcd cluster; store_slow freezes one member and
    link_cut may cut a member's host (a replay needs the same --store)."""
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    min_nodes, max_nodes = rng.choice([(2, 3), (3, 3)])
    store = rng.choice(["embedded", "embedded", "daemon"])
    if store_mode == "etcd":
        store = "etcd"
    nproc = rng.choice([1, 2])
    life_ms = rng.randint(1500, 2500)
    arrivals = kind in ("newcomer", "newcomers_min", "duplicate")
    count = max_nodes + 1
    if arrivals and min_nodes < max_nodes and rng.random() < 0.4:
        count = min_nodes     # below MAX: an arrival scales the job up instead of waiting
    initial = [(f"h{h}", h, "initial") for h in range(count)]
    window = life_ms / 1000 + 1.5   # faults fall anywhere from forming to the exit barrier
    actions = []
    repeats = 1 if kind in ("newcomers_min",) else rng.choice([1, 1, 2])
    if kind == "worker_kill":   # sometimes more kills than the budget: one root cause everywhere
        repeats = rng.choice([1, 2, MAX_RESTARTS + 1])
    for i in range(repeats):
        at = round(rng.uniform(0.2, window), 3)
        target = rng.choice(initial)[0]
        if kind == "worker_kill":
            actions.append(Action(at, kind, pick=rng.random()))
        elif kind == "agent_kill":
            actions.append(Action(at, kind, target))
        elif kind == "agent_stop":
            actions.append(Action(at, kind, target, round(rng.uniform(0.1, 3.0), 3)))
        elif kind == "link_cut":
            hosts = [h for _, h, _ in initial] + ([DAEMON_HOST] if store == "daemon" else [])
            hosts += [rng.choice(ETCD_HOSTS)] if store == "etcd" else []
            actions.append(Action(at, kind, f"host:{rng.choice(hosts)}",
                                  round(rng.uniform(0.5, 5.0), 3)))
        elif kind == "store_slow":
            target = f"member:{rng.randrange(len(ETCD_HOSTS))}" if store == "etcd" else "store"
            actions.append(Action(at, kind, target, round(rng.uniform(0.1, 1.5), 3)))
        elif kind == "newcomer":
            host = FIRST_NEWCOMER_HOST + i
            actions.append(Action(at, kind, new_agents=[(f"n{host}", host, "newcomer")]))
        elif kind == "newcomers_min":
            actions.append(Action(at, kind, new_agents=[
                (f"n{FIRST_NEWCOMER_HOST + j}", FIRST_NEWCOMER_HOST + j, "newcomer")
                for j in range(min_nodes)]))
        elif kind == "duplicate":
            name, host, _ = rng.choice(initial)
            actions.append(Action(at, kind, new_agents=[(f"{name}-dup{i}", host, "duplicate")]))
    actions.sort(key=lambda a: a.at)
    # Two stops (or cuts) of one target never overlap: the first SIGCONT would end the second.
    for first, second in zip(actions, actions[1:]):
        if first.duration and first.target == second.target:
            second.at = max(second.at, round(first.at + first.duration + 0.1, 3))
    return Plan(seed, kind, min_nodes, max_nodes, store, nproc, life_ms, initial, actions)


def may_fail(plan):
    """Whether the plan's faults can legitimately fail the job: more worker kills than the
    budget, the store's host killed or cut off (or frozen) for a heartbeat timeout or more, or
    fewer than MIN initial agents unharmed."""
    hit = set()
    for a in plan.actions:
        # The lease counts from the last frame, up to a heartbeat interval before the fault.
        long_fault = a.duration >= HEARTBEAT_TIMEOUT_S - HEARTBEAT_INTERVAL_S
        if a.kind == "agent_kill" or (a.kind == "agent_stop" and long_fault):
            if a.target == "h0" and plan.store == "embedded":
                return True
            hit.add(a.target)
        elif a.kind == "link_cut" and long_fault:
            host = int(a.target.split(":")[1])
            if host == plan.store_host:
                return True
            hit.add(f"h{host}")
    kills = sum(1 for a in plan.actions if a.kind == "worker_kill")
    return kills > MAX_RESTARTS or len(plan.initial) - len(hit) < plan.min_nodes
