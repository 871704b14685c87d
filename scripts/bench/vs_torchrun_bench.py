#!/usr/bin/python3
"""drun beside torchrun 1.13 for one PyTorch all_reduce program (vs_torchrun_allreduce.py), same
run, same machine: one node with 4 ranks, two network-namespace hosts with 2 ranks each. Called
by scripts/bench/vs-torchrun.sh (which checks the prerequisites; what is measured is described
there).

The trials run on recovery_bench.py's harness (fresh namespace hosts per trial, agents started
through scripts/netns.sh, the workers' START/END lines in a per-trial log, every process killed
by PID and the namespaces removed at the end of each trial, also on a signal).
"""
import argparse
import os
import statistics
import sys
import time

import recovery_bench as rb

CAP_S = 120.0  # one trial (launch to the last agent's exit), either launcher


class Setup:
    def __init__(self, name, title, hosts, nproc):
        self.name, self.title, self.hosts, self.nproc = name, title, hosts, nproc
        # recovery_bench's Scenario: every host starts at once, --nnodes = hosts.
        self.scenario = rb.Scenario(name, title, 0, hosts, list(range(hosts)), str(hosts), "", "")

    @property
    def world(self):
        return self.hosts * self.nproc


SETUPS = [Setup("one node", "1 node x 4 ranks", 1, 4),
          Setup("two hosts", "2 hosts x 2 ranks", 2, 2)]

METRICS = [("first", "first line from every rank", "launch -> last rank's first line"),
           ("total", "total job time", "launch -> last launcher exit"),
           ("restarted", "recovery: every rank restarted", "fault -> last rank's first line"),
           ("reduced", "recovery: all_reduce done again", "fault -> last rank's all_reduce")]


class NamedHostLauncher(rb.Launcher):
    """A launcher whose agent runs under a hostname of its own, the host's address (a UTS
    namespace: the machine's name is untouched). Namespace hosts share this machine's hostname,
    and torchrun 1.13 tells the workers MASTER_ADDR = socket.getfqdn() of node rank 0 (no
    --local-addr in 1.13): with one shared name that is this machine for every host, and ranks
    on other hosts cannot reach rank 0's store. Real hosts have names of their own; so have
    these, for both launchers alike."""

    def argv(self, sc, host, run_id, worker_argv, log_dir):
        name = host_address(self.args.netns, host)
        return (["unshare", "--uts", "/bin/sh", "-c", 'hostname "$0" && exec "$@"', name]
                + super().argv(sc, host, run_id, worker_argv, log_dir))


_addresses = {}


def host_address(netns, host):
    if host not in _addresses:
        _addresses[host] = rb.subprocess.run([netns, "addr", str(host)], check=True, text=True,
                                             capture_output=True, timeout=10).stdout.strip()
    return _addresses[host]


def run_trial(args, setup, launcher, index, mode):
    """One job; returns ({metric: ms}, None) or (None, why not)."""
    trial_args = argparse.Namespace(**{**vars(args), "nproc": setup.nproc})
    launcher = NamedHostLauncher(launcher.name, trial_args, launcher.torch_extra)
    trial = rb.Trial(trial_args, setup.scenario, launcher, index)
    try:
        trial.up()
        launched = time.time()
        for host in range(setup.hosts):
            trial.start_agent(host, worker_argv=[args.python, args.program, mode])
        trial.wait_exits(launched + CAP_S)
        if trial.pidfds:
            return None, f"not finished within {CAP_S:.0f} s"
        codes = {h: p.returncode for h, p in trial.agents.items()}
        if any(codes.values()):
            return None, f"launcher exit codes by host {codes}"
        lines = trial.read_log()
        return measure(lines, setup.world, launched, max(trial.exit_at.values()), mode,
                       fault_times(trial.log))
    except rb.Interrupted:
        raise
    except Exception as e:  # a broken trial is reported, not fatal
        return None, f"harness error: {e!r}"
    finally:
        trial.cleanup()


def last_by_rank(lines, kind, after):
    """rank -> wall time of its last `kind` line after `after`."""
    out = {}
    for k, _host, _restart, rank, _w, _pid, t in lines:
        if k == kind and t > after:
            out[rank] = max(out.get(rank, t), t)
    return out


def measure(lines, world, launched, last_exit, mode, fault_lines):
    if mode == "run":
        starts = last_by_rank(lines, "START", launched)
        if len(starts) != world:
            return None, f"{len(starts)}/{world} ranks started"
        return {"first": (max(starts.values()) - launched) * 1e3,
                "total": (last_exit - launched) * 1e3}, None
    if len(fault_lines) != 1:
        return None, f"{len(fault_lines)} faults (expected 1)"
    fault = fault_lines[0]
    # The new attempt: what started after the fault (restart counts would not do: torchrun's
    # are per agent).
    starts = last_by_rank(lines, "START", fault)
    ends = last_by_rank(lines, "END", fault)
    if len(starts) != world or len(ends) != world:
        return None, f"after the fault {len(starts)}/{world} ranks restarted, {len(ends)} reduced"
    return {"restarted": (max(starts.values()) - fault) * 1e3,
            "reduced": (max(ends.values()) - fault) * 1e3}, None


def fault_times(log):
    """Wall times of the FAULT lines (recovery_bench's reader keeps START and END only)."""
    with open(log) as f:
        return [float(line.split()[6]) for line in f if line.startswith("FAULT ")]


def fmt(value):
    return "n/a" if value is None else f"{value:.0f}"


def ratio(a, b):
    return "n/a" if a is None or b is None or b <= 0 else f"{a / b:.1f}x"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    rb.add_harness_arguments(p)
    p.add_argument("--program", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-restarts", type=int, default=1)
    p.add_argument("--launchers", default="drun,torchrun,torchrun mi0.1",
                   help="comma-separated subset (a quick check of one)")
    p.add_argument("--setups", default="one node,two hosts",
                   help="comma-separated subset of: " + ", ".join(s.name for s in SETUPS))
    p.add_argument("--modes", default="run,fail", help="run (first line, total), fail (recovery)")
    args = p.parse_args()
    setups = [s for s in SETUPS if s.name in args.setups.split(",")]
    modes = [m for m in ("run", "fail") if m in args.modes.split(",")]
    # What recovery_bench's Trial and Launcher read besides.
    args.exit_after, args.hold, args.worker = 0.0, 0.0, args.program
    rb.signal.signal(rb.signal.SIGTERM, rb.on_signal)
    rb.signal.signal(rb.signal.SIGHUP, rb.on_signal)
    args.endpoint_host = host_address(args.netns, 0)
    # The workers' environment: no launcher settings of the caller; gloo on the hosts' own
    # interface (every namespace host shares this machine's name, which may resolve to loopback);
    # one thread per worker on this small machine, for both launchers alike.
    for key in list(os.environ):
        if key.startswith(("PET_", "TORCHELASTIC_", "DRUN_")) or key == "PYTHON_EXEC":
            del os.environ[key]
    os.environ.update(GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")

    launchers = [rb.Launcher("drun", args), rb.Launcher("torchrun", args, []),
                 rb.Launcher("torchrun mi0.1", args, ["--monitor_interval", "0.1"])]
    wanted = args.launchers.split(",")
    unknown = set(wanted) - {l.name for l in launchers}
    if unknown:
        p.error(f"unknown launcher(s) {sorted(unknown)}")
    launchers = [l for l in launchers if l.name in wanted]
    samples = {}  # (setup, launcher, metric) -> [ms]
    failures = {}  # (setup, launcher) -> [why]
    counter = 0
    started = time.time()
    try:
        # Repetitions outermost and the launchers interleaved: load drifts hit all alike.
        for rep in range(args.reps):
            for setup in setups:
                for launcher in launchers:
                    for mode in modes:
                        counter += 1
                        got, why = run_trial(args, setup, launcher, counter, mode)
                        tag = f"rep {rep + 1} {setup.name:9} {launcher.name:14} {mode:4}"
                        if got is None:
                            failures.setdefault((setup.name, launcher.name), []).append(why)
                            print(f"  {tag}: {why}", file=sys.stderr, flush=True)
                            continue
                        for metric, ms in got.items():
                            samples.setdefault((setup.name, launcher.name, metric), []).append(ms)
                        print(f"  {tag}: " + ", ".join(f"{m} {v:.0f} ms" for m, v in got.items()),
                              file=sys.stderr, flush=True)
    except (rb.Interrupted, KeyboardInterrupt) as e:
        print(f"vs_torchrun_bench: interrupted ({e}); partial results", file=sys.stderr)
    elapsed = time.time() - started

    def median(setup, launcher, metric):
        v = samples.get((setup, launcher, metric))
        return statistics.median(v) if v else None

    print()
    print(f"drun vs torchrun 1.13, one PyTorch all_reduce program (gloo, env://), median ms of "
          f"{args.reps} repetitions; --max-restarts {args.max_restarts}; namespace hosts")
    head = ["scenario", "drun", "torchrun", "torchrun/drun", "torchrun mi0.1", "mi0.1/drun"]
    rows = []
    for setup in setups:
        for metric, title, _how in METRICS:
            d = median(setup.name, "drun", metric)
            t = median(setup.name, "torchrun", metric)
            m = median(setup.name, "torchrun mi0.1", metric)
            rows.append([f"{setup.title}: {title}", fmt(d), fmt(t), ratio(t, d), fmt(m), ratio(m, d)])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: " | ".join(c.ljust(widths[i]) for i, c in enumerate(r))
    print(line(head))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    print("Measured from the workers' own wall-clock timestamps (hosts share the clock): "
          + "; ".join(f"{title} = {how}" for _m, title, how in METRICS) + ". The fault: the last "
          "rank SIGKILLs itself after the first all_reduce. torchrun mi0.1: --monitor_interval "
          "0.1 (1.13's default is 5 s). First line: before `import torch`.")
    for (setup, launcher), whys in sorted(failures.items()):
        print(f"failed trials, {setup} / {launcher}: {len(whys)}: {whys[0]}")
    print(f"total run time {elapsed:.0f} s")


if __name__ == "__main__":
    main()
