"""One iteration of scripts/bench/chaos.sh: a job of drun agents on the namespace hosts, the
plan's faults injected at their times, every agent's exit awaited (bounded), then the invariants.
The iteration owns every process it starts and leaves none: agents and the daemon by PID, workers
and anything else by their CHAOS_TAG (chaos_cluster.kill_tagged); frozen processes get SIGCONT
and cut links come back up whatever happens (also on an exception or a signal).
"""
import dataclasses
import json
import os
import signal
import subprocess
import time

import chaos_checks as checks
import chaos_cluster as cl
from chaos_plan import (HEARTBEAT_TIMEOUT_S, MAX_RESTARTS, RDZV_CONF, SHUTDOWN_TIMEOUT_S,
                        may_fail)

POLL_S = 0.02
LEFTOVER_GRACE_S = 2.0    # a dead agent's watchdog kills its workers within this
DAEMON_START_S = 5.0


class Iteration:
    def __init__(self, args, cluster, plan, index):
        self.args = args
        self.cluster = cluster
        self.plan = plan
        self.index = index
        self.tag = f"chaos-{os.getpid()}-{index}"
        self.run_id = f"chaos-{plan.seed}-{os.getpid()}"
        self.dir = os.path.join(args.work_dir, f"iter{index:03d}-seed{plan.seed}")
        os.makedirs(self.dir)
        self.agents = {}       # name -> checks.Agent
        self.procs = {}        # name -> Popen
        self.faults = []       # checks.Fault, as injected
        self.pending_undo = [] # (time, callable) restoring a stop or a cut
        self.daemon = None
        self.violations = []
        self.events = []       # (wall time, text) for timeline.txt
        self.t0 = 0.0

    # --- processes --------------------------------------------------------------------------
    def env(self, host):
        return dict(os.environ, CHAOS_TAG=self.tag, CHAOS_HOST=str(host),
                    CHAOS_LOG=os.path.join(self.dir, f"host{host}.log"), DRUN_LOG_LEVEL="debug")

    def start_agent(self, name, host, role):
        p = self.plan
        if p.store == "etcd":
            rendezvous = ["--rdzv-backend", "etcd", "--rdzv-endpoint", self.args.etcd.endpoints]
        else:
            rendezvous = ["--rdzv-endpoint", f"{self.cluster.addr(p.store_host)}:{cl.PORT}"]
        argv = [os.path.join(self.args.drun_bin, "drun"), "--nnodes", p.nnodes,
                "--nproc-per-node", str(p.nproc), *rendezvous,
                "--rdzv-id", self.run_id, "--max-restarts", str(MAX_RESTARTS),
                "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), "--rdzv-conf", RDZV_CONF,
                "--no-python", self.args.worker, str(p.life_ms)]
        with open(os.path.join(self.dir, f"agent-{name}.log"), "w") as out:
            proc = subprocess.Popen(self.cluster.exec_argv(host, argv), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, env=self.env(host),
                                    start_new_session=True)
        now = time.time()
        self.procs[name] = proc
        self.agents[name] = checks.Agent(name, host, proc.pid, role, now)
        self.events.append((now, f"agent {name} started on h{host} (pid {proc.pid}, {role})"))

    def start_daemon(self):
        argv = [os.path.join(self.args.drun_bin, "drun-rendezvous"), "--port", str(cl.PORT),
                "--lease-timeout", f"{HEARTBEAT_TIMEOUT_S:g}s", "--log-level", "debug"]
        env = dict(os.environ, CHAOS_TAG=self.tag + "-daemon")
        with open(os.path.join(self.dir, "daemon.log"), "w") as out:
            self.daemon = subprocess.Popen(self.cluster.exec_argv(self.plan.store_host, argv),
                                           stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True)
        deadline = time.time() + DAEMON_START_S
        while not cl.listening(self.daemon.pid, cl.PORT):
            if time.time() > deadline or self.daemon.poll() is not None:
                raise RuntimeError(f"drun-rendezvous did not listen within {DAEMON_START_S} s")
            time.sleep(POLL_S)

    def live(self, name):
        return self.procs[name].poll() is None

    def store_pids(self, target="store"):
        """The process(es) a store_slow freezes: the daemon, the store's agent, or on etcd the
        member the target names ("member:I")."""
        if target.startswith("member:"):
            pid = self.args.etcd.member_pid(int(target.split(":")[1]))
            return [pid] if pid else []
        if self.daemon:
            return [self.daemon.pid]
        return [self.agents["h0"].pid] if "h0" in self.agents and self.live("h0") else []

    # --- faults -----------------------------------------------------------------------------
    def inject(self, action):
        now = time.time()
        kind, fault = action.kind, None
        if kind == "worker_kill":
            pids = sorted(p for p in cl.tagged_pids(self.tag) if self.is_worker(p))
            if pids:
                victim = pids[min(int(action.pick * len(pids)), len(pids) - 1)]
                cl.signal_pid(victim, signal.SIGKILL)
                fault = checks.Fault(kind, now, now, detail=f"worker pid {victim}")
        elif kind == "agent_kill":
            if self.live(action.target):
                self.procs[action.target].kill()
                self.agents[action.target].killed_by_driver = True
                fault = checks.Fault(kind, now, now, (self.agents[action.target].pid,),
                                     detail=action.target,
                                     hits_store=self.is_store_agent(action.target))
        elif kind in ("agent_stop", "store_slow"):
            pids = (self.store_pids(action.target) if kind == "store_slow" else
                    [self.agents[action.target].pid] if self.live(action.target) else [])
            if pids:
                for pid in pids:
                    cl.signal_pid(pid, signal.SIGSTOP)
                fault = checks.Fault(kind, now, now + action.duration, tuple(pids),
                                     detail=f"{action.target} pids {pids}",
                                     hits_store=(kind == "store_slow" and self.plan.store != "etcd")
                                     or self.is_store_agent(action.target))
                self.pending_undo.append((now + action.duration, fault,
                                          lambda: [cl.signal_pid(p, signal.SIGCONT) for p in pids]))
        elif kind == "link_cut":
            host = int(action.target.split(":")[1])
            self.cluster.set_link(host, False)
            pids = tuple(a.pid for a in self.agents.values() if a.host == host)
            pids += (self.daemon.pid,) if self.daemon and host == self.plan.store_host else ()
            fault = checks.Fault(kind, now, now + action.duration, pids, host, f"h{host}",
                                 hits_store=host == self.plan.store_host)
            self.pending_undo.append((now + action.duration, fault,
                                      lambda: self.cluster.set_link(host, True)))
        else:  # arrivals
            for name, host, role in action.new_agents:
                self.start_agent(name, host, role)
            fault = checks.Fault(kind, now, now, detail=" ".join(n for n, _, _ in action.new_agents))
        if fault:
            self.faults.append(fault)
            self.events.append((now, f"FAULT {kind} {fault.detail}"
                                + (f" for {fault.end - fault.start:.2f} s" if fault.end > now else "")))
        else:
            self.events.append((now, f"fault {kind} {action.target}: no target (already gone)"))

    def is_store_agent(self, name):
        return self.plan.store == "embedded" and name == "h0"

    def is_worker(self, pid):
        """The worker script itself (bash, the script), not its agent nor the agent's watchdog,
        whose command lines name the script too."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return False
        return len(argv) > 1 and argv[0].endswith(b"bash") and argv[1] == self.args.worker.encode()

    def undo_due(self, now, force=False):
        for item in list(self.pending_undo):
            due, fault, undo = item
            if force or now >= due:
                undo()
                fault.end = time.time()
                self.events.append((fault.end, f"fault {fault.kind} {fault.detail} undone"))
                self.pending_undo.remove(item)

    # --- the run ----------------------------------------------------------------------------
    def run(self):
        p = self.plan
        shm_before = cl.shm_entries()
        self.t0 = time.time()
        if p.store == "daemon":
            self.start_daemon()
        for name, host, role in p.initial:
            self.start_agent(name, host, role)
        todo = list(p.actions)
        last_event = self.t0 + max([a.at + a.duration for a in todo] + [0.0])
        deadline = last_event + self.args.hang_bound
        while time.time() < deadline:
            now = time.time()
            while todo and now >= self.t0 + todo[0].at:
                self.inject(todo.pop(0))
            self.undo_due(now)
            self.reap()
            if not todo and not self.pending_undo and all(a.code is not None
                                                          for a in self.agents.values()):
                break
            time.sleep(POLL_S)
        self.finish(shm_before)

    def reap(self):
        for name, proc in self.procs.items():
            a = self.agents[name]
            if a.code is None and proc.poll() is not None:
                a.code, a.exited = proc.returncode, time.time()
                self.events.append((a.exited, f"agent {name} exited {a.code}"))

    def finish(self, shm_before):
        self.undo_due(time.time(), force=True)
        for name, proc in self.procs.items():
            a = self.agents[name]
            if a.code is None:
                a.hung = True
                self.violations.append(checks.Violation(
                    "agent hangs", f"{name} (pid {a.pid}, {a.role}) still running "
                    f"{self.args.hang_bound:g} s after the last fault; its last lines:\n"
                    + checks.tail(self.output(name), 6)))
                cl.signal_pid(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=10)
        self.reap()
        self.check_leftovers(shm_before)
        self.stop_daemon()
        worker_text = "".join(self.read(f) for f in sorted(os.listdir(self.dir))
                              if f.startswith("host"))
        for name, a in self.agents.items():
            a.output = self.output(name)
        self.summary = checks.check_iteration(list(self.agents.values()), worker_text,
                                              self.faults, HEARTBEAT_TIMEOUT_S, MAX_RESTARTS)
        self.summary.violations[:0] = self.violations
        self.save_record()
        self.write_timeline(worker_text)

    def check_leftovers(self, shm_before):
        deadline = time.time() + LEFTOVER_GRACE_S
        left = cl.tagged_pids(self.tag)
        while left and time.time() < deadline:
            time.sleep(POLL_S)
            left = cl.tagged_pids(self.tag)
        if left:
            self.violations.append(checks.Violation(
                "processes left", f"{LEFTOVER_GRACE_S:.0f} s after the last agent's exit: "
                + "; ".join(cl.describe(pid) for pid in left)))
            cl.kill_tagged(self.tag)
        shm_new = [n for n in cl.shm_entries() - shm_before if self.run_id in n or self.tag in n]
        if shm_new:
            self.violations.append(checks.Violation("files left in /dev/shm", ", ".join(shm_new)))

    def stop_daemon(self):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGCONT)
            self.daemon.terminate()
            try:
                self.daemon.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(timeout=10)
        cl.kill_tagged(self.tag + "-daemon")

    def cleanup(self):
        """Idempotent: after an exception or a signal, nothing of this iteration stays."""
        self.undo_due(time.time(), force=True)
        for proc in self.procs.values():
            if proc.poll() is None:
                cl.signal_pid(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=10)
        cl.kill_tagged(self.tag)
        self.stop_daemon()

    # --- results ----------------------------------------------------------------------------
    def read(self, name):
        with open(os.path.join(self.dir, name), errors="replace") as f:
            return f.read()

    def output(self, name):
        return self.read(f"agent-{name}.log")

    def outcome(self):
        if self.summary.violations:
            return "violation"
        if self.summary.members_exited_0:
            return "succeeded"
        return "failed, expected" if may_fail(self.plan) else "failed, unexpected"

    def codes(self):
        return " ".join(f"{n}={'hung' if a.hung else a.code}" for n, a in self.agents.items())

    def save_record(self):
        """record.json: what `chaos_driver.py --recheck DIR` needs to check the logs again."""
        record = {"seed": self.plan.seed, "driver_violations": [dataclasses.asdict(v) for v in
                                                                 self.violations],
                  "agents": [dict(dataclasses.asdict(a), output="") for a in self.agents.values()],
                  "faults": [dataclasses.asdict(f) for f in self.faults]}
        with open(os.path.join(self.dir, "record.json"), "w") as f:
            json.dump(record, f, indent=1)

    def write_timeline(self, worker_text):
        rows = list(self.events)
        for line in worker_text.splitlines():
            w = line.split()
            if len(w) == 10 and w[0].isdigit() and w[9] != "alive":
                rows.append((int(w[0]) / 1e9, f"h{w[1]} pid {w[2]} agent {w[3]} restart {w[4]} "
                             f"group {w[5]} rank {w[6]} world {w[7]} master {w[8]} {w[9]}"))
        rows.sort()
        with open(os.path.join(self.dir, "timeline.txt"), "w") as f:
            f.write(f"seed {self.plan.seed}: {self.plan.describe()}\n")
            for t, text in rows:
                f.write(f"{t - self.t0:9.3f} s  {text}\n")
