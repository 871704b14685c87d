#!/usr/bin/python3
"""Elastic recovery timings on network-namespace hosts: drun beside torchrun 1.13, same run.
Called by scripts/bench/recovery.sh (which checks the prerequisites); the scenarios, what is
timed and how are described there.

Every trial gets fresh namespace hosts (scripts/netns.sh up/down) and its own log file, to which
each worker appends, as its first action, one line

    START <host> <restart count> <rank> <world size> <pid> <wall time>

(and, in the exit scenario, `END ...` right before it exits 0). Hosts share the file system and
the wall clock, so the harness reads the workers' own timestamps and its polling interval does
not enter the result. Every wait has a deadline; every process the harness started (agents, and
workers by the PID they logged, checked through their environment) is killed by PID at the end
of its trial; the namespaces are removed even on an error or a signal.
"""
import argparse
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import time

PORT = 29400
SETTLE_S = 0.5        # the first round must stay unchanged this long before the fault
POLL_S = 0.005        # log polling while waiting (the workers' timestamps are what counts)
STOP_GRACE_S = 3.0    # SIGTERM -> SIGKILL for agents at the end of a trial
JITTER_S = 1.0       # random pause before the fault: no fixed phase of any periodic timer
REPLACE_AFTER_S = 2.0  # replace: from the kill to the replacement's start (torchrun's keep-alive
                       # notices a dead node within its 5 s heartbeat timeout;
                       # docs/multinode.md)
FORM_CAP_S = 60.0     # the first round must form within this (torchrun: python start, 1 s polls)
ETCD_TTL_S = 2        # drun etcd: heartbeat_timeout (the lease TTL) where a scenario sets none
ETCD_HOSTS = 3        # drun etcd: the members run on 3 more namespace hosts

WORKER = r"""#!/bin/bash
# recovery benchmark worker: logs its start first thing (bash's $EPOCHREALTIME: no fork).
echo "START ${RECOV_HOST} ${TORCHELASTIC_RESTART_COUNT:-0} ${RANK} ${WORLD_SIZE} $$ $EPOCHREALTIME" >>"$RECOV_LOG"
if [[ "$1" == exit ]]; then
  sleep "$2"
  echo "END ${RECOV_HOST} ${TORCHELASTIC_RESTART_COUNT:-0} ${RANK} ${WORLD_SIZE} $$ $EPOCHREALTIME" >>"$RECOV_LOG"
  exit 0
fi
exec sleep "$2"
"""


class Scenario:
    def __init__(self, name, title, target_ms, hosts, first, nnodes, drun_conf, torch_conf,
                 survivors=None, drun_only=False, c10d_only=False, verdict_on="drun"):
        self.name = name
        self.title = title
        self.target_ms = target_ms
        self.hosts = hosts          # namespace hosts to create
        self.first = first          # hosts whose agents start before the fault
        self.nnodes = nnodes
        self.drun_conf = drun_conf
        self.torch_conf = torch_conf
        self.survivors = survivors  # hosts of the new round (None: not a recovery scenario)
        self.drun_only = drun_only  # torchrun has no counterpart (a drun-rendezvous daemon)
        self.c10d_only = c10d_only  # no counterpart on etcd (the daemon is c10d's store)
        self.verdict_on = verdict_on  # the launcher whose median the target is about


def scenarios(args):
    loss_conf = args.loss_last_call
    return {
        "failure": Scenario(
            "failure", "worker SIGKILLed on host 1 (not the store's)", 200, 2, [0, 1], "2",
            "", "", survivors=[0, 1]),
        "sigkill": Scenario(
            "sigkill", "agent of host 2 of 3 SIGKILLed", 1000, 3, [0, 1, 2], "2:3",
            f"last_call_timeout={loss_conf}", "last_call_timeout=1", survivors=[0, 1]),
        "linkcut": Scenario(
            "linkcut", "host 2 of 3 cut off, heartbeat_timeout 2 s", 2500, 3, [0, 1, 2], "2:3",
            f"heartbeat_timeout=2,last_call_timeout={loss_conf}",
            "heartbeat_timeout=2,last_call_timeout=1", survivors=[0, 1]),
        "scaleup": Scenario(
            "scaleup", "host 2 joins 2 of 2:4, last_call 1 s", 1500, 3, [0, 1], "2:4",
            "last_call_timeout=1", "last_call_timeout=1", survivors=[0, 1, 2]),
        "replace": Scenario(
            "replace", "host 1 of 2:2 SIGKILLed; a replacement agent starts on host 2", 1000, 3,
            [0, 1], "2", "", "", survivors=[0, 2]),
        "daemon": Scenario(
            "daemon", "store daemon restarted (drun-rendezvous on host 0, SIGKILL + start)",
            2000, 2, [0, 1], "2", "is_host=0", "", survivors=[0, 1], drun_only=True,
            c10d_only=True),
        # c10d: host 0's agent hosts the store, which dies with it: the job ends (the survivors
        # exit 1 once reconnect_timeout, 3 s here, has passed). etcd: the survivors re-form.
        "storehost": Scenario(
            "storehost", "store host killed: host 0's agent of 3 SIGKILLed", 2500, 3, [0, 1, 2],
            "2:3", f"heartbeat_timeout=2,last_call_timeout={loss_conf},reconnect_timeout=3",
            "heartbeat_timeout=2,last_call_timeout=1", survivors=[1, 2], verdict_on="drun etcd"),
        "exit": Scenario(
            "exit", "last worker exits 0 -> last agent exits", 100, 2, [0, 1], "2",
            "", ""),
    }


class Launcher:
    def __init__(self, name, args, torch_extra=None, etcd=False):
        self.name = name
        self.args = args
        self.torch_extra = torch_extra  # None: drun
        self.etcd = etcd                # drun with --rdzv-backend etcd

    @property
    def is_drun(self):
        return self.torch_extra is None

    def argv(self, sc, host, run_id, worker_argv, log_dir, etcd_endpoints=None):
        a = self.args
        endpoint = f"{a.endpoint_host}:{PORT}"
        if self.is_drun:
            conf = sc.drun_conf
            if self.etcd:
                endpoint = etcd_endpoints
                # The lease TTL is the heartbeat timeout: a killed agent is noticed after it.
                if "heartbeat_timeout=" not in conf:
                    conf = ",".join(c for c in (conf, f"heartbeat_timeout={ETCD_TTL_S}") if c)
            cmd = [os.path.join(a.drun_bin, "drun"), "--nnodes", sc.nnodes, "--nproc-per-node",
                   str(a.nproc), "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
                   "--max-restarts", str(a.max_restarts)]
            if self.etcd:
                cmd += ["--rdzv-backend", "etcd"]
            if conf:
                cmd += ["--rdzv-conf", conf]
            return cmd + ["--no-python"] + worker_argv
        # torch 1.13 decides "am I the store host" from the machine's hostname, which every
        # namespace shares: say it explicitly.
        conf = ",".join(c for c in (sc.torch_conf, f"is_host={1 if host == 0 else 0}") if c)
        return [a.python, a.torchrun_compat, "--nnodes", sc.nnodes, "--nproc_per_node",
                str(a.nproc), "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                "--rdzv_id", run_id, "--max_restarts", str(a.max_restarts), "--rdzv_conf", conf,
                *self.torch_extra, "--log_dir", log_dir, "--no_python"] + worker_argv


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


class Trial:
    """One job on fresh namespace hosts; owns every process it starts."""

    def __init__(self, args, sc, launcher, index):
        self.args = args
        self.sc = sc
        self.launcher = launcher
        self.prefix = f"drecov-{os.getpid()}"
        tag = f"{sc.name}-{launcher.name.replace(' ', '_')}-{index}"
        self.dir = os.path.join(args.work_dir, tag)
        os.makedirs(self.dir)
        self.log = os.path.join(self.dir, "workers.log")
        open(self.log, "w").close()
        self.run_id = f"recov-{os.getpid()}-{index}"
        self.agents = {}     # host -> Popen
        self.daemons = []    # drun-rendezvous processes (daemon scenario), newest last
        self.exit_at = {}    # host -> wall time the agent's exit was seen
        self.pidfds = {}
        self.lines = []
        self.offset = 0
        self.partial = ""
        # exit scenario: the workers' run time, the same for all, at a random phase
        self.exit_hold = round(args.exit_after + random.uniform(0.0, JITTER_S), 3)
        self.restart_counts = ""  # TORCHELASTIC_RESTART_COUNT by host in the new round
        self.events = []          # (wall time, text): the harness's side of timeline.txt
        self.etcd_dir = None      # drun etcd: the cluster's directory (scripts/etcd/down.sh)
        self.etcd_endpoints = None

    # --- namespaces and processes -------------------------------------------------------------
    def netns(self, *words, check=True):
        return subprocess.run([self.args.netns, "-p", self.prefix, *words], check=check,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=30)

    def up(self):
        self.netns("down")
        extra = ETCD_HOSTS if self.launcher.etcd else 0
        self.netns("up", str(self.sc.hosts + extra))
        if self.launcher.etcd:
            self.etcd_up(range(self.sc.hosts, self.sc.hosts + ETCD_HOSTS))

    def etcd_up(self, hosts):
        """A 3-member etcd cluster, one member on each of `hosts` (scripts/etcd/up.sh)."""
        addrs = [self.netns("addr", str(h)).stdout.strip() for h in hosts]
        env = dict(os.environ, MEMBER_NETNS=" ".join(f"{self.prefix}-{h}" for h in hosts),
                   MEMBER_ADDRS=" ".join(addrs))
        out = subprocess.run([os.path.join(self.args.etcd_scripts, "up.sh")], env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/etcd/up.sh failed ({out.returncode}): {out.stderr[-500:]}")
        self.etcd_dir, self.etcd_endpoints = out.stdout.strip().splitlines()[-1].split()
        self.events.append((time.time(), f"etcd up: {self.etcd_endpoints}"))

    def start_agent(self, host, mode="run", worker_argv=None):
        """Starts the launcher on `host` with this benchmark's worker, or `worker_argv` (another
        benchmark's program that logs the same START/END lines, e.g. vs_torchrun_bench.py)."""
        if worker_argv is None:
            hold = self.exit_hold if mode == "exit" else self.args.hold
            worker_argv = [self.args.worker, mode, str(hold)]
        argv = self.launcher.argv(self.sc, host, self.run_id, worker_argv, self.dir,
                                  self.etcd_endpoints)
        env = dict(os.environ, RECOV_HOST=str(host), RECOV_LOG=self.log)
        out = open(os.path.join(self.dir, f"agent{host}.log"), "w")
        # netns.sh execs `ip netns exec`, which execs the agent: the PID is the agent's.
        proc = subprocess.Popen([self.args.netns, "-p", self.prefix, "exec", str(host), *argv],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env)
        out.close()
        self.agents[host] = proc
        self.pidfds[host] = os.pidfd_open(proc.pid)
        self.events.append((time.time(), f"agent {host} started (pid {proc.pid})"))
        return proc

    def start_daemon(self, deadline_s=10.0):
        """drun-rendezvous on host 0 at the endpoint; returns once it listens."""
        out_path = os.path.join(self.dir, f"daemon{len(self.daemons)}.log")
        out = open(out_path, "w")
        proc = subprocess.Popen(
            [self.args.netns, "-p", self.prefix, "exec", "0",
             os.path.join(self.args.drun_bin, "drun-rendezvous"), "--host",
             self.args.endpoint_host, "--port", str(PORT)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.daemons.append(proc)
        self.events.append((time.time(), f"daemon started (pid {proc.pid})"))
        deadline = time.time() + deadline_s
        while time.time() < deadline:
            with open(out_path) as f:
                if "listening on" in f.read():
                    return proc
            if proc.poll() is not None:
                break
            time.sleep(POLL_S)
        raise RuntimeError(f"drun-rendezvous did not start (see {out_path})")

    def reap(self):
        """Records the wall time of every agent exit that is ready now."""
        for host, fd in list(self.pidfds.items()):
            if select.select([fd], [], [], 0)[0]:
                now = time.time()
                self.exited(host, now)

    def exited(self, host, now):
        code = self.agents[host].wait()
        self.exit_at[host] = now
        self.events.append((now, f"agent {host} exited {code}"))
        os.close(self.pidfds.pop(host))

    def wait_exits(self, deadline):
        """Waits for every agent to exit (until deadline), timing each exit as it happens."""
        while self.pidfds and time.time() < deadline:
            ready = select.select(list(self.pidfds.values()), [], [],
                                  max(0.0, deadline - time.time()))[0]
            now = time.time()
            for host, fd in list(self.pidfds.items()):
                if fd in ready:
                    self.exited(host, now)

    def is_our_worker(self, pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return f"RECOV_LOG={self.log}".encode() in f.read().split(b"\0")
        except OSError:
            return False

    def cleanup(self):
        # Not interruptible: a second Ctrl-C must not leave agents, workers or namespaces.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK,
                                         {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            self.stop_everything()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def stop_everything(self):
        self.reap()
        self.events.append((time.time(), "end of trial: SIGTERM to the agents left"))
        for host, proc in self.agents.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        self.wait_exits(time.time() + STOP_GRACE_S)
        for proc in list(self.agents.values()) + self.daemons:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for fd in self.pidfds.values():
            os.close(fd)
        self.pidfds.clear()
        if self.etcd_dir:  # its members are killed by the PIDs up.sh recorded
            subprocess.run([os.path.join(self.args.etcd_scripts, "down.sh"), self.etcd_dir],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        self.read_log()
        for pid in {line[5] for line in self.lines}:
            if self.is_our_worker(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.netns("down", check=False)
        self.write_timeline()

    def write_timeline(self):
        """timeline.txt: the workers' lines and the harness's events, by time, for KEEP_LOGS."""
        rows = self.events + [(t, f"{kind} host {host} restart {restart} rank {rank} world {w} "
                                  f"pid {pid}")
                              for kind, host, restart, rank, w, pid, t in self.lines]
        rows.sort()
        with open(os.path.join(self.dir, "timeline.txt"), "w") as f:
            for t, text in rows:
                f.write(f"{t:.6f} {(t - rows[0][0]) * 1e3:10.1f} ms  {text}\n")

    # --- the workers' log ---------------------------------------------------------------------
    def read_log(self):
        with open(self.log) as f:
            f.seek(self.offset)
            data = f.read()
            self.offset = f.tell()
        data = self.partial + data
        *complete, self.partial = data.split("\n")
        for text in complete:
            w = text.split()
            if len(w) == 7 and w[0] in ("START", "END"):
                # kind, host, restart count, rank, world size, pid, wall time
                self.lines.append((w[0], int(w[1]), int(w[2]), int(w[3]), int(w[4]), int(w[5]),
                                   float(w[6])))
        return self.lines

    def starts(self, after, hosts, world):
        """(host, rank) -> (start time, restart count) of the latest START line after `after`
        with this world size on one of `hosts`."""
        seen = {}
        for kind, host, restart, rank, w, _pid, t in self.lines:
            if kind == "START" and t > after and host in hosts and w == world:
                if t > seen.get((host, rank), (0.0, 0))[0]:
                    seen[(host, rank)] = (t, restart)
        return seen

    def wait_round(self, after, hosts, world, deadline):
        """Waits until world workers of `hosts` have started after `after` with this world size
        and none started during the last SETTLE_S (the round is stable); returns their starts."""
        while time.time() < deadline:
            self.read_log()
            seen = self.starts(after, hosts, world)
            if len(seen) >= world:
                newest = max(t for kind, *_, t in self.lines if kind == "START")
                if time.time() - newest >= SETTLE_S:
                    return seen
            self.reap()
            if not self.pidfds:
                return None
            time.sleep(POLL_S * 4)
        return None

    # --- one measurement ----------------------------------------------------------------------
    def run(self):
        """Returns (value ms, detail ms or None, None) or (None, None, reason)."""
        sc, a = self.sc, self.args
        self.up()
        mode = "exit" if sc.name == "exit" else "run"
        if sc.name == "daemon":
            self.start_daemon()
        for host in sc.first:
            self.start_agent(host, mode)
        world0 = len(sc.first) * a.nproc
        if sc.name == "exit":
            return self.measure_exit(world0)
        first = self.wait_round(0.0, sc.first, world0, time.time() + FORM_CAP_S)
        if first is None:
            return None, None, f"first round never formed (within {FORM_CAP_S:.0f} s)"
        world1 = len(sc.survivors) * a.nproc
        time.sleep(random.uniform(0.0, JITTER_S))
        fault_at = self.inject()
        self.events.append((fault_at, f"FAULT {sc.name}"))
        cap = a.drun_cap if self.launcher.is_drun else a.torch_cap
        deadline = fault_at + cap
        while time.time() < deadline:
            self.read_log()
            seen = self.starts(fault_at, sc.survivors, world1)
            if len(seen) >= world1:
                times = [t for t, _ in seen.values()]
                self.restart_counts = " ".join(
                    f"h{h}:{r}" for h, r in sorted({(h, r) for (h, _), (_, r) in seen.items()}))
                return (min(times) - fault_at) * 1e3, (max(times) - fault_at) * 1e3, None
            self.reap()
            gone = {h: self.agents[h].returncode for h in sc.survivors if h not in self.pidfds}
            if gone:  # a host of the new round has no agent any more: no new round will come
                self.read_log()
                if len(self.starts(fault_at, sc.survivors, world1)) < world1:
                    return None, None, f"no recovery: agent exit codes by host {gone}"
            time.sleep(POLL_S)
        self.read_log()
        return None, None, self.no_recovery_reason(fault_at, cap)

    def inject(self):
        sc = self.sc
        if sc.name == "failure":
            alive = [pid for kind, host, _r, _k, _w, pid, _t in self.lines
                     if kind == "START" and host == 1 and self.is_our_worker(pid)]
            if not alive:
                raise RuntimeError("no live worker on host 1 to kill")
            victim = min(alive)
            fault_at = time.time()
            os.kill(victim, signal.SIGKILL)
        elif sc.name == "sigkill":
            fault_at = time.time()
            self.agents[2].kill()
        elif sc.name == "storehost":
            fault_at = time.time()
            self.agents[0].kill()
        elif sc.name == "linkcut":
            # The switch port of host 2 goes down (hub side): host 2's eth0 stays configured,
            # its packets go nowhere, nobody gets a reset.
            fault_at = time.time()
            subprocess.run(["ip", "-n", f"{self.prefix}-hub", "link", "set", "v2", "down"],
                           check=True, timeout=10)
        elif sc.name == "scaleup":
            fault_at = time.time()
            self.start_agent(2)
        elif sc.name == "daemon":
            # SIGKILL (no goodbye to its clients), then the same daemon on the same port, empty:
            # the fault time is the new daemon's start; the survivors refill it.
            self.daemons[-1].kill()
            self.daemons[-1].wait()
            fault_at = time.time()
            self.start_daemon()
        elif sc.name == "replace":
            # The survivor learns the loss (drun: the will, at once; torchrun: its keep-alive)
            # and waits for a replacement; the fault time is the replacement's start.
            self.agents[1].kill()
            time.sleep(REPLACE_AFTER_S)
            fault_at = time.time()
            self.start_agent(2)
        else:
            raise ValueError(sc.name)
        return fault_at

    def no_recovery_reason(self, fault_at, cap):
        later = [(host, w) for kind, host, _r, _k, w, _p, t in self.lines
                 if kind == "START" and t > fault_at]
        text = f"no recovery within {cap:.0f} s"
        if later:
            hosts = sorted({h for h, _ in later})
            worlds = sorted({w for _, w in later})
            text += f" (only {len(later)} start(s) on host(s) {hosts}, world {worlds})"
        return text

    def measure_exit(self, world):
        a = self.args
        cap = a.drun_cap if self.launcher.is_drun else a.torch_cap
        deadline = time.time() + FORM_CAP_S + self.exit_hold
        ends = []
        while len(ends) < world and self.pidfds and time.time() < deadline:
            self.wait_exits(time.time() + POLL_S * 4)  # times an early exit at once
            self.read_log()
            ends = [t for kind, *_, t in self.lines if kind == "END"]
        if len(ends) < world:
            codes = {h: p.poll() for h, p in self.agents.items()}
            return None, None, f"only {len(ends)}/{world} workers ended, agent exit codes {codes}"
        self.wait_exits(max(ends) + cap)
        if self.pidfds:
            return None, None, f"agents still running {cap:.0f} s after the last worker's exit"
        codes = {h: p.returncode for h, p in self.agents.items()}
        if any(codes.values()):
            return None, None, f"agent exit codes {codes}"
        last_end = max(ends)
        return ((max(self.exit_at.values()) - last_end) * 1e3,
                (min(self.exit_at.values()) - last_end) * 1e3, None)


def run_cell(args, sc, launcher, trials, counter):
    """Trials of one (scenario, launcher); gives up after a first trial without recovery."""
    values, details, reasons, counts = [], [], [], set()
    for i in range(trials):
        counter[0] += 1
        trial = Trial(args, sc, launcher, counter[0])
        try:
            value, detail, reason = trial.run()
        except Interrupted:
            raise
        except Exception as e:  # one broken trial (a netns or spawn error) is reported, not fatal
            value, detail, reason = None, None, f"harness error: {e!r}"
        finally:
            trial.cleanup()
        if value is None:
            reasons.append(reason)
            print(f"  {sc.name:8} {launcher.name:15} trial {i + 1}: {reason}", file=sys.stderr,
                  flush=True)
            if not values:
                break
        else:
            values.append(value)
            details.append(detail)
            if trial.restart_counts:
                counts.add(trial.restart_counts)
            print(f"  {sc.name:8} {launcher.name:15} trial {i + 1}: {value:.1f} ms "
                  f"(all: {detail:.1f} ms)", file=sys.stderr, flush=True)
    return {"values": values, "details": details, "reasons": reasons, "trials": trials,
            "restart_counts": sorted(counts)}


def fmt_cell(cell, unit_digits=0):
    if cell is None:
        return "skipped"
    v = cell["values"]
    if not v:
        if not cell["reasons"]:
            return "n/a"
        n = len(cell["reasons"])
        return f"{cell['reasons'][0]} ({n} trial{'s' if n > 1 else ''})"
    text = f"{statistics.median(v):.{unit_digits}f}"
    if len(v) < cell["trials"] or cell["reasons"]:
        text += f" ({len(v)}/{len(v) + len(cell['reasons'])} recovered)"
    return text


def add_harness_arguments(p):
    """What a Trial and a Launcher read: the launchers, the namespace script, the work dir."""
    p.add_argument("--drun-bin", required=True)
    p.add_argument("--netns", required=True)
    p.add_argument("--torchrun-compat", required=True)
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--etcd-scripts", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                          "..", "etcd"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_harness_arguments(p)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--torch-trials", type=int, default=5)
    p.add_argument("--torch", type=int, default=1, help="0: drun only")
    p.add_argument("--drun", type=int, default=1, help="0: torchrun only")
    p.add_argument("--etcd", type=int, default=1,
                   help="1: a column of drun with --rdzv-backend etcd (needs etcd installed)")
    p.add_argument("--keep-logs", type=int, default=0)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--drun-cap", type=float, default=10.0)
    p.add_argument("--torch-cap", type=float, default=30.0)
    p.add_argument("--loss-last-call", default="1")
    p.add_argument("--hold", type=float, default=300.0, help="worker lifetime (s) when not failed")
    p.add_argument("--exit-after", type=float, default=1.0, help="exit scenario: worker run time")
    p.add_argument("scenarios", nargs="*",
                   default=["failure", "sigkill", "linkcut", "scaleup", "replace", "daemon",
                            "storehost", "exit"])
    args = p.parse_args()
    all_scenarios = scenarios(args)
    for name in args.scenarios:
        if name not in all_scenarios:
            p.error(f"unknown scenario '{name}' (known: {', '.join(all_scenarios)})")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    args.endpoint_host = subprocess.run([args.netns, "addr", "0"], check=True, text=True,
                                        capture_output=True, timeout=10).stdout.strip()
    args.worker = os.path.join(args.work_dir, "worker.sh")
    with open(args.worker, "w") as f:
        f.write(WORKER)
    os.chmod(args.worker, 0o755)

    launchers = [Launcher("drun", args)] if args.drun else []
    if args.drun and args.etcd:
        launchers.append(Launcher("drun etcd", args, etcd=True))
    if args.torch:
        launchers += [Launcher("torchrun", args, []),
                      Launcher("torchrun mi0.1", args, ["--monitor_interval", "0.1"])]
    started = time.time()
    results = {}
    counter = [0]
    try:
        for name in args.scenarios:
            sc = all_scenarios[name]
            for launcher in launchers:
                if (sc.drun_only and not launcher.is_drun) or (sc.c10d_only and launcher.etcd):
                    continue
                trials = args.trials if launcher.is_drun else args.torch_trials
                results[(name, launcher.name)] = run_cell(args, sc, launcher, trials, counter)
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"recovery_bench: interrupted ({e}); partial results", file=sys.stderr)
    elapsed = time.time() - started

    print()
    print(f"Recovery on network-namespace hosts, {args.nproc} workers per host, median ms over "
          f"{args.trials} trials (torchrun {args.torch_trials}); fault -> first worker of the new "
          "round started")
    print(f"(exit: last worker's exit 0 -> last agent's exit). drun from {args.drun_bin}; "
          "torchrun 1.13 c10d, monitor_interval 5 s (default) and 0.1 s")
    head = ["scenario", "target", "drun", "drun min..max", "drun all", "verdict",
            "drun etcd", "etcd min..max", "torchrun (mi 5)", "torchrun mi0.1"]
    rows = []
    for name in args.scenarios:
        sc = all_scenarios[name]
        if not any(key[0] == name for key in results):
            continue
        d = results.get((name, "drun"))
        v = d["values"] if d else []
        span, all_col = "-", "-"
        if v:
            span = f"{min(v):.1f}..{max(v):.1f}"
            all_col = f"{statistics.median(d['details']):.1f}"
        judged = results.get((name, sc.verdict_on))
        if judged and judged["values"]:
            met = statistics.median(judged["values"]) <= sc.target_ms and not judged["reasons"]
            verdict = "MET" if met else "MISSED"
        else:
            verdict = "MISSED" if judged else "-"
        if sc.verdict_on != "drun" and verdict != "-":
            verdict += " (etcd)"
        e = results.get((name, "drun etcd"))
        e_span = (f"{min(e['values']):.1f}..{max(e['values']):.1f}" if e and e["values"] else "-")
        rows.append([f"{name}: {sc.title}", f"<= {sc.target_ms}", fmt_cell(d, 1), span, all_col,
                     verdict, fmt_cell(e, 1), e_span, fmt_cell(results.get((name, "torchrun"))),
                     fmt_cell(results.get((name, "torchrun mi0.1")))])
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: " | ".join(str(c).ljust(widths[i]) for i, c in enumerate(r))
    print(line(head))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    print(f"drun all: median time until every worker of the new round had started (exit: until "
          f"the first agent's exit; negative: an agent left before the job's last worker ended, "
          f"i.e. it did not wait in an exit barrier). The lost-node scenarios use last_call_timeout="
          f"{args.loss_last_call} s for drun (torchrun: 1, its minimum); torch 1.13 ignores heartbeat_timeout "
          "(keep-alive fixed at 5 s x 3). drun etcd: --rdzv-backend etcd, a 3-member etcd cluster "
          f"on 3 more namespace hosts, heartbeat_timeout={ETCD_TTL_S} s (the lease TTL) where the "
          "scenario sets none; the verdict is the c10d column's but for storehost (etcd's: with "
          "c10d the store dies with its host and the job ends).")
    notes = [(name, launcher, cell["restart_counts"]) for (name, launcher), cell in results.items()
             if cell["restart_counts"]]
    if notes:
        print("TORCHELASTIC_RESTART_COUNT in the new round, by host (hN:count; one entry per "
              "distinct outcome over the trials):")
        for name, launcher, counts in notes:
            print(f"  {name:8} {launcher:15} {' / '.join(counts)}")
    print(f"total run time {elapsed:.0f} s" +
          (f"; logs in {args.work_dir}" if args.keep_logs else " (KEEP_LOGS=1 keeps the logs)"))


if __name__ == "__main__":
    main()
