"""One job of scripts/bench/time_lost_train.py on network-namespace hosts, for the time-lost
benchmark (time_lost_bench.py, time_lost_leaks.py): torchrun 1.13 or drun agents, one per host,
the workers' event log (time_lost_train.py's START / STEP / END lines) read as it grows, and
clean-up that leaves nothing: agents by their PID, workers by the PIDs they logged (each checked
to carry this job's TL_TAG in its environment), the namespaces removed.

Hosts are scripts/netns.sh namespaces 10.231.0.1, .2, ...; host 0's agent is the rendezvous
endpoint (10.231.0.1:29400) and hosts the store. Every namespace shares this machine's file
system and wall clock, so one log file serves every host and the workers' own timestamps are
what is measured.
"""
import os
import select
import signal
import subprocess
import time

PORT = 29400
POLL_S = 0.005
STOP_GRACE_S = 5.0


class Mode:
    def __init__(self, key, name, launcher, recovery, backend):
        self.key = key              # its name on the command line
        self.name = name
        self.launcher = launcher    # "torchrun" | "drun"
        self.recovery = recovery    # None (torchrun) | "restart" | "in-process"
        self.backend = backend      # "gloo" | "drun"


MODES = [
    Mode("torchrun", "torchrun 1.13 (gloo)", "torchrun", None, "gloo"),
    Mode("restart", "drun --recovery restart (gloo)", "drun", "restart", "gloo"),
    Mode("inprocess-drun", "drun --recovery in-process, drun backend", "drun", "in-process",
         "drun"),
    Mode("inprocess-gloo", "drun --recovery in-process, gloo", "drun", "in-process", "gloo"),
]


class Line:
    """One line of the workers' log."""

    def __init__(self, words):
        self.kind = words[0]
        self.rank = int(words[1])
        self.sha1 = None
        if self.kind == "START":     # START rank pid time restart generation
            self.pid, self.t, self.step = int(words[2]), float(words[3]), 0
            self.restart = words[4]
            self.generation = words[5] if len(words) > 5 else "0"
        elif self.kind == "ENTER":   # ENTER rank pid time step generation
            self.pid, self.t, self.step = int(words[2]), float(words[3]), int(words[4])
            self.generation = words[5]
        else:                        # STEP/END rank step time pid sha1
            self.step, self.t, self.pid = int(words[2]), float(words[3]), int(words[4])
            self.sha1 = words[5]


class Job:
    """A job on fresh namespace hosts; owns every process it starts."""

    def __init__(self, args, mode, directory, hosts, nproc, steps, max_restarts=3, drun_extra=()):
        self.args = args
        self.mode = mode
        self.dir = directory
        os.makedirs(directory)
        self.hosts = hosts                   # namespaces made (agents may use fewer)
        self.nproc = nproc
        self.steps = steps
        self.max_restarts = max_restarts
        self.drun_extra = list(drun_extra)  # more drun options (--rdzv-conf ...)
        self.prefix = f"dtl{os.getpid() % 100000}"
        self.tag = f"time-lost-{os.getpid()}-{os.path.basename(directory)}"
        self.log = os.path.join(directory, "workers.log")
        self.snapshot = os.path.join(directory, "snapshot.pt")
        open(self.log, "w").close()
        self.agents = {}    # host -> Popen
        self.codes = {}     # host -> exit code
        self.lines = []
        self.offset = 0
        self.partial = ""
        self.netns_up = False

    # --- namespaces and processes -------------------------------------------------------------
    def netns(self, *words, check=True):
        return subprocess.run([self.args.netns, "-p", self.prefix, *words], check=check,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)

    def up(self):
        self.netns("down", check=False)
        self.netns_up = True
        self.netns("up", str(self.hosts))

    def program(self):
        a = self.args
        return [a.python, a.train, "--backend", self.mode.backend, "--steps", str(self.steps),
                "--log", self.log, "--snapshot", self.snapshot, "--step-ms", str(a.step_ms),
                "--seed", str(a.seed)]

    def agent_argv(self, nnodes, host):
        a, m = self.args, self.mode
        endpoint = f"10.231.0.1:{PORT}"
        run_id = self.tag
        if m.launcher == "torchrun":
            # torch 1.13 decides "am I the store host" from the hostname, which every namespace
            # shares: say it. Default flags otherwise (monitor_interval 5 s).
            return [a.python, a.torchrun_compat, "--nnodes", str(nnodes), "--nproc_per_node",
                    str(self.nproc), "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                    "--rdzv_id", run_id, "--max_restarts", str(self.max_restarts),
                    "--rdzv_conf", f"is_host={1 if host == 0 else 0}",
                    "--log_dir", os.path.join(self.dir, f"torchrun{host}"), "--no_python",
                    *self.program()]
        # restart is the default: left unsaid, so a drun without --recovery runs that row too.
        recovery = ["--recovery", m.recovery] if m.recovery != "restart" else []
        return [os.path.join(a.drun_bin, "drun"), "--nnodes", str(nnodes), "--nproc-per-node",
                str(self.nproc), "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
                "--max-restarts", str(self.max_restarts), *recovery, *self.drun_extra,
                "--events", os.path.join(self.dir, f"events{host}.jsonl"),
                "--no-python", *self.program()]

    def start_agent(self, host, nnodes):
        env = dict(os.environ, TL_TAG=self.tag, TL_HOST=str(host), OMP_NUM_THREADS="1",
                   GLOO_SOCKET_IFNAME="eth0", PYTHONPATH=self.args.pythonpath)
        # Each host gets a hostname of its own, its address (a UTS namespace; the machine's
        # name is untouched): torchrun 1.13 tells the workers MASTER_ADDR = getfqdn() of node
        # rank 0, which for namespaces sharing one name is this machine on every host.
        name = f"10.231.0.{host + 1}"
        named = ["unshare", "--uts", "/bin/sh", "-c", 'hostname "$0" && exec "$@"', name]
        with open(os.path.join(self.dir, f"agent{host}.log"), "w") as out:
            # netns.sh execs `ip netns exec`, which execs unshare, sh and the agent: the PID is
            # the agent's.
            self.agents[host] = subprocess.Popen(
                [self.args.netns, "-p", self.prefix, "exec", str(host), *named,
                 *self.agent_argv(nnodes, host)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)

    def reap(self):
        for host, proc in self.agents.items():
            if host not in self.codes and proc.poll() is not None:
                self.codes[host] = proc.returncode

    def running_agents(self):
        self.reap()
        return [h for h in self.agents if h not in self.codes]

    def wait_agents(self, deadline):
        while self.running_agents() and time.time() < deadline:
            time.sleep(POLL_S * 10)
        return not self.running_agents()

    def environ(self, pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            return {}

    def is_ours(self, pid):
        return self.environ(pid).get(b"TL_TAG") == self.tag.encode()

    def host_of(self, pid):
        h = self.environ(pid).get(b"TL_HOST")
        return int(h) if h is not None else None

    def tagged_pids(self):
        """Every live process carrying this job's TL_TAG (agents pass it to their workers)."""
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit() and self.is_ours(int(name)):
                try:
                    with open(f"/proc/{name}/stat") as f:
                        stat = f.read()
                    if stat[stat.rindex(")") + 2] not in "ZX":
                        found.append(int(name))
                except (OSError, ValueError, IndexError):
                    pass
        return found

    def worker_pids(self):
        """Live workers of this job, by the PIDs their START lines logged."""
        self.read_log()
        return sorted({ln.pid for ln in self.lines if ln.kind == "START" and self.is_ours(ln.pid)})

    def kill_agent(self, host):
        """SIGKILL to the agent of `host` and to its workers at once: the node is lost."""
        victims = [p for p in self.worker_pids() if self.host_of(p) == host]
        t = time.time()
        self.agents[host].kill()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        return t

    def cleanup(self):
        """Idempotent and not interruptible: nothing of the job stays."""
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK,
                                         {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            for proc in self.agents.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            self.wait_agents(time.time() + STOP_GRACE_S)
            for proc in self.agents.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
            for pid in self.worker_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.netns_up:
                self.netns("down", check=False)
                self.netns_up = False
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    # --- the workers' log ---------------------------------------------------------------------
    def read_log(self):
        with open(self.log) as f:
            f.seek(self.offset)
            data = f.read()
            self.offset = f.tell()
        *complete, self.partial = (self.partial + data).split("\n")
        for text in complete:
            words = text.split()
            if words and words[0] in ("START", "ENTER", "STEP", "END"):
                try:
                    self.lines.append(Line(words))
                except (ValueError, IndexError):
                    pass
        return self.lines

    def wait_for(self, condition, deadline):
        """Polls the log until condition(lines) returns something true, or the deadline, or no
        agent runs any more; returns that value or None."""
        while time.time() < deadline:
            self.read_log()
            found = condition(self.lines)
            if found:
                return found
            if not self.running_agents():
                self.read_log()
                return condition(self.lines) or None
            time.sleep(POLL_S)
        return None

    def world_stepping(self, world, min_step=1):
        """Every rank has committed a step >= min_step."""
        def cond(lines):
            ranks = {ln.rank for ln in lines if ln.kind == "STEP" and ln.step >= min_step}
            return len(ranks) >= world
        return cond

    def first_commit_after(self, t):
        """A condition for wait_for: the first step committed after `t` by a process that
        entered train() after `t` (a replacement, a restarted rank, or a survivor back from a
        recovery): the job's next committed step."""
        def cond(lines):
            entered = {}
            for ln in sorted(lines, key=lambda ln: ln.t):
                if ln.kind == "ENTER":
                    entered[ln.pid] = ln.t
                elif ln.kind == "STEP" and ln.t > t and entered.get(ln.pid, 0.0) > t:
                    return ln
            return None
        return cond

    def old_generation_steps(self, t):
        """Steps committed by processes whose last entry into train() was before `t`."""
        entered, steps = {}, []
        for ln in sorted(self.lines, key=lambda ln: ln.t):
            if ln.kind == "ENTER":
                entered[ln.pid] = ln.t
            elif ln.kind == "STEP" and entered.get(ln.pid, 0.0) <= t:
                steps.append(ln.step)
        return steps

    def agent_output(self, host):
        try:
            with open(os.path.join(self.dir, f"agent{host}.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def harness_arguments(parser):
    """The options every time-lost harness takes (time_lost.sh passes them); SIGINT, SIGTERM
    and SIGHUP raise Interrupted from here on, so that a job's clean-up runs."""
    for name in ("--drun-bin", "--netns", "--torchrun-compat", "--train", "--pythonpath",
                 "--work-dir"):
        parser.add_argument(name, required=True)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--step-ms", type=float, default=50.0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
