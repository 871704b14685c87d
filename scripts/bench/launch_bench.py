#!/usr/bin/python3
"""Launch and failover timings: drun beside mpirun (OpenMPI) and torchrun (PyTorch 1.13), same
machine, same run. Called by scripts/bench/launch.sh, which builds what it needs; see there.

Launch: median wall time of `<launcher> N x hostname` (the launcher's whole life: start, run N
`hostname` workers, collect, exit), measured around the process from this script. drun and mpirun
runs are interleaved round by round so that background load hits both alike; one untimed warm-up
run each first.

Failover: the failover_probe worker (N=4) fails on attempt 0 after printing CLOCK_REALTIME ns, and
on the restart prints CLOCK_REALTIME ns first thing in main. Failover = the first failure to the
last restarted worker's start ("group running"); the first restarted worker's start is shown too.

Every run has a timeout; every loop is bounded by its run count.
"""
import argparse
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time


def timed(argv, timeout, env):
    """Runs argv with stdin/stdout/stderr on /dev/null; returns (wall seconds, exit status).

    posix_spawn + a pidfd wait: subprocess.run costs several ms more per run, which would blur a
    launcher that takes a few ms. On timeout the child is SIGKILLed by PID."""
    null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    path = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    start = time.perf_counter_ns()
    pid = os.posix_spawn(path, argv, env, file_actions=null)
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], timeout)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return (time.perf_counter_ns() - start) / 1e9, "timeout"
        _, status = os.waitpid(pid, 0)
        wall = (time.perf_counter_ns() - start) / 1e9
    finally:
        os.close(pidfd)
    return wall, os.waitstatus_to_exitcode(status)


def median_ms(samples):
    return statistics.median(samples) * 1e3 if samples else None


def fmt_ms(value, digits=1):
    return "n/a" if value is None else f"{value:.{digits}f}"


def fmt_ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.3f}"


class Launchers:
    def __init__(self, args):
        self.args = args

    def drun(self, n, extra=()):
        return [self.args.drun, "--standalone", "--nproc-per-node", str(n), *extra]

    def mpirun(self, n):
        return [self.args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n)]

    def torchrun(self, n, extra=()):
        return [self.args.torch_python, self.args.torchrun_compat, "--standalone",
                "--nproc_per_node", str(n), *extra, "--no_python"]


def launch_table(args, launchers, env):
    columns = [("drun", lambda n: launchers.drun(n) + ["hostname"], args.runs, 30),
               ("mpirun", lambda n: launchers.mpirun(n) + ["hostname"], args.runs, 60),
               ("torchrun", lambda n: launchers.torchrun(n) + ["hostname"], args.torch_runs, 120),
               ("torchrun mi0.1",
                lambda n: launchers.torchrun(n, ["--monitor_interval", "0.1"]) + ["hostname"],
                args.torch_runs, 120)]
    results = {}
    failures = []
    for n in args.nprocs:
        samples = {name: [] for name, *_ in columns}
        for name, make, runs, timeout in columns:  # warm-up, untimed (torchrun: its median
            if not name.startswith("torchrun"):     # of 3 already drops a cold first run)
                timed(make(n), timeout, env)
        rounds = max(runs for _, _, runs, _ in columns)
        for i in range(rounds):
            for name, make, runs, timeout in columns:
                if i >= runs:
                    continue
                wall, code = timed(make(n), timeout, env)
                if code == 0:
                    samples[name].append(wall)
                else:
                    failures.append(f"{name} N={n}: exit {code}")
        results[n] = {name: median_ms(s) for name, s in samples.items()}
        results[n]["drun min"] = min(samples["drun"]) * 1e3 if samples["drun"] else None
        print(f"  N={n} done", file=sys.stderr, flush=True)

    print()
    print(f"Launch: median wall time (ms) of `<launcher> N x hostname`; drun/mpirun {args.runs} runs, "
          f"torchrun {args.torch_runs} runs")
    print("(min: drun's fastest run; torchrun: --standalone --no_python; mi0.1 = --monitor_interval"
          " 0.1, default is 5 s)")
    header = f"{'N':>3} | {'drun':>8} | {'(min)':>6} | {'mpirun':>8} | {'torchrun':>9} | {'torchrun mi0.1':>14} |" \
             f" {'drun/mpirun':>11} | {'drun/torchrun':>13} | {'drun/torchrun mi0.1':>19}"
    print(header)
    print("-" * len(header))
    for n in args.nprocs:
        r = results[n]
        print(f"{n:>3} | {fmt_ms(r['drun']):>8} | {fmt_ms(r['drun min']):>6} | {fmt_ms(r['mpirun']):>8} | "
              f"{fmt_ms(r['torchrun'], 0):>9} | {fmt_ms(r['torchrun mi0.1'], 0):>14} | "
              f"{fmt_ratio(r['drun'], r['mpirun']):>11} | {fmt_ratio(r['drun'], r['torchrun']):>13} |"
              f" {fmt_ratio(r['drun'], r['torchrun mi0.1']):>19}")
    for f in failures:
        print(f"  failed run: {f}")
    return results


PROBE_LINE = re.compile(r"(FAIL|START) (\d+) (\d+)")


def failover_once(argv, n, timeout, env):
    """One job; returns (first failure -> first restart start, -> last restart start) in ms."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    fails, starts = [], []
    for match in PROBE_LINE.finditer(proc.stdout + proc.stderr):
        (fails if match.group(1) == "FAIL" else starts).append(int(match.group(3)))
    if proc.returncode != 0 or not fails or len(starts) != n:
        return None, f"exit {proc.returncode}, {len(fails)} FAIL / {len(starts)} START lines"
    first_fail = min(fails)
    return ((min(starts) - first_fail) / 1e6, (max(starts) - first_fail) / 1e6), None


def failover_table(args, launchers, env):
    n = 4
    rows = [("drun --max-restarts 1", launchers.drun(n, ["--max-restarts", "1"]),
             args.failover_runs, 30),
            ("torchrun --max_restarts 1 (monitor_interval 5)",
             launchers.torchrun(n, ["--max_restarts", "1"]), args.torch_failover_runs, 120),
            ("torchrun --max_restarts 1 --monitor_interval 0.1",
             launchers.torchrun(n, ["--max_restarts", "1", "--monitor_interval", "0.1"]),
             args.torch_failover_runs, 120)]
    print()
    print(f"Failover (N={n}): from the first worker failure to the restarted group running (ms), "
          "median")
    header = f"{'launcher':<50} | {'runs':>4} | {'first restarted':>15} | {'all restarted':>13}"
    print(header)
    print("-" * len(header))
    drun_all = None
    for name, argv, runs, timeout in rows:
        firsts, alls, errors = [], [], []
        for _ in range(runs):
            result, error = failover_once(argv + [args.probe], n, timeout, env)
            if result:
                firsts.append(result[0])
                alls.append(result[1])
            else:
                errors.append(error)
        first, all_ = (statistics.median(firsts) if firsts else None,
                       statistics.median(alls) if alls else None)
        if name.startswith("drun"):
            drun_all = all_
        print(f"{name:<50} | {len(alls):>4} | {fmt_ms(first):>15} | {fmt_ms(all_):>13}")
        for e in errors:
            print(f"  failed run: {name}: {e}")
    return drun_all


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drun", required=True)
    parser.add_argument("--probe", required=True, help="path of the failover_probe helper")
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--torch-python", default="/usr/bin/python3")
    parser.add_argument("--torchrun-compat",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "torchrun_compat.py"))
    parser.add_argument("--nprocs", default="1,4,16")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--torch-runs", type=int, default=3)
    parser.add_argument("--failover-runs", type=int, default=7)
    parser.add_argument("--torch-failover-runs", type=int, default=3)
    args = parser.parse_args()
    args.nprocs = [int(x) for x in args.nprocs.split(",")]

    # Same environment for everyone: no launcher settings inherited, OMP_NUM_THREADS set so that
    # neither drun nor torchrun prints its note.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "DRUN_", "OMPI_", "PMIX_"))}
    env["OMP_NUM_THREADS"] = "1"
    launchers = Launchers(args)

    baseline = [timed(["/bin/true"], 10, env)[0] for _ in range(args.runs)]
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; harness overhead (median wall of /bin/true): "
          f"{median_ms(baseline):.2f} ms (included in every number below)")
    launch = launch_table(args, launchers, env)
    drun_failover = failover_table(args, launchers, env)

    print()
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    drun4 = launch.get(4, {}).get("drun")
    if drun4 is not None:
        print(f"target: drun launch N=4 <= 20 ms: {drun4:.1f} ms "
              f"{'MET' if drun4 <= 20 else 'MISSED'}")
    if drun_failover is not None:
        print(f"target: drun failover N=4 <= 50 ms: {drun_failover:.1f} ms "
              f"{'MET' if drun_failover <= 50 else 'MISSED'}")


if __name__ == "__main__":
    main()
