#!/usr/bin/python3
"""Chaos driver for drun's elastic core: random faults on namespace hosts, invariants
checked after every iteration. Called by scripts/bench/chaos.sh (which checks the
prerequisites and documents the run); standard library only.

Iteration i runs seed S+i: its plan (chaos_plan.py) is a job of 3-4 agents (--nnodes 2:3 or 3:3,
one agent beyond MAX as a spare, or MIN agents when arrivals are the fault) with 1-2 faults of
one kind at random times; chaos_iteration.py runs it and chaos_checks.py checks it. Prints one
line per iteration, the violations with their seed, timeline and logs, then a table of fault
kind x outcome. Exit status: 0 with no violation, 1 otherwise (also when the time budget ended
the run early), 2 on a usage error. `--recovery in-process` runs chaos_inprocess.py instead:
jobs whose workers use drun.torch.resilient, under drun --recovery in-process.
"""
import argparse
import os
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_checks as checks  # noqa: E402
from chaos_cluster import Cluster, EtcdMembers  # noqa: E402
from chaos_iteration import Iteration  # noqa: E402
from chaos_plan import (ETCD_HOSTS, HEARTBEAT_TIMEOUT_S, HOSTS, HOSTS_WITH_ETCD, KINDS,  # noqa: E402
                        MAX_RESTARTS, make_plan)
import chaos_inprocess  # noqa: E402

OUTCOMES = ("succeeded", "failed, expected", "failed, unexpected", "violation")


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def report_violations(it):
    print(f"  VIOLATION in iteration {it.index} (replay: chaos.sh --seed {it.plan.seed} "
          f"--iterations 1); logs and timeline.txt in {it.dir}", flush=True)
    for v in it.summary.violations:
        print(f"    [{v.kind}] {v.text}", flush=True)


def print_table(results, elapsed):
    kinds_seen = [k for k in KINDS if any(r[0] == k for r in results)]
    violation_kinds = sorted({v for r in results for v in r[2]})
    head = ["fault kind", "runs"] + list(OUTCOMES[:3]) + violation_kinds
    rows = []
    for kind in kinds_seen + ["all"]:
        mine = [r for r in results if kind in ("all", r[0])]
        row = [kind, len(mine)] + [sum(1 for r in mine if r[1] == o) for o in OUTCOMES[:3]]
        row += [sum(1 for r in mine if v in r[2]) for v in violation_kinds]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: " | ".join(str(c).rjust(widths[i]) if i else str(c).ljust(widths[i])
                                for i, c in enumerate(r))
    print()
    print("Chaos: iterations by fault kind and outcome; violation columns count the iterations "
          "with at least one violation of that kind")
    print(line(head))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    print(f"total run time {elapsed:.0f} s")


def recheck(directories):
    status = 0
    for d in directories:
        seed, summary = checks.recheck(d, HEARTBEAT_TIMEOUT_S, MAX_RESTARTS)
        print(f"{d}: seed {seed}, {len(summary.violations)} violation(s)")
        for v in summary.violations:
            print(f"    [{v.kind}] {v.text}")
        status |= bool(summary.violations)
    return status


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--drun-bin")
    p.add_argument("--netns")
    p.add_argument("--work-dir")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--recovery", choices=("restart", "in-process"), default="restart",
                   help="in-process: jobs under drun --recovery in-process (chaos_inprocess.py)")
    p.add_argument("--store", choices=("any", "etcd"), default="any",
                   help="etcd: every job on a 3-member etcd cluster on hosts 8-10 (--rdzv-backend "
                        "etcd); any: each plan's own (an agent's embedded store or drun-rendezvous)")
    p.add_argument("--etcd-scripts", help="scripts/etcd (up.sh, down.sh), for --store etcd")
    p.add_argument("--kind", choices=KINDS + chaos_inprocess.KINDS,
                   help="only this fault kind (seeds of other kinds are skipped)")
    p.add_argument("--hang-bound", type=float, default=30.0,
                   help="every agent must have exited this long after the last fault (s)")
    p.add_argument("--time-budget", type=float, default=0,
                   help="start no iteration after this many seconds (0: no limit)")
    p.add_argument("--keep-logs", type=int, default=0, help="1: keep every iteration's logs")
    p.add_argument("--recheck", nargs="+", metavar="DIR",
                   help="check kept iteration directories again (no run)")
    args = p.parse_args()
    if args.recheck:
        return recheck(args.recheck)
    if not (args.drun_bin and args.netns and args.work_dir):
        p.error("--drun-bin, --netns and --work-dir are needed (unless --recheck)")
    if args.iterations < 1 or args.iterations > 100000:
        p.error("--iterations must be in 1..100000")
    if args.recovery == "in-process":
        if args.kind and args.kind not in chaos_inprocess.KINDS:
            p.error(f"--kind {args.kind} is not a kind of --recovery in-process "
                    f"({', '.join(chaos_inprocess.KINDS)})")
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, on_signal)
        try:
            return chaos_inprocess.run(args)
        except (Interrupted, KeyboardInterrupt) as e:
            print(f"chaos: interrupted ({e})")
            return 1
    if args.kind and args.kind not in KINDS:
        p.error(f"--kind {args.kind} is a kind of --recovery in-process only")
    if args.store == "etcd" and not args.etcd_scripts:
        p.error("--store etcd needs --etcd-scripts")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    args.worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaos_worker.sh")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    store_words = " --store etcd" if args.store == "etcd" else ""
    print(f"chaos: {args.iterations} iteration(s) from seed {seed} (replay one: chaos.sh{store_words} "
          f"--seed <its seed> --iterations 1); drun from {args.drun_bin}", flush=True)

    cluster = Cluster(args.netns, f"dchaos{os.getpid() % 100000}",
                      HOSTS_WITH_ETCD if args.store == "etcd" else HOSTS)
    args.etcd = None
    results, margins, started, it, stopped_early = [], [], time.time(), None, ""
    try:
        cluster.up()
        if args.store == "etcd":
            args.etcd = EtcdMembers(args.etcd_scripts, cluster, ETCD_HOSTS,
                                    os.path.join(args.work_dir, "etcd"))
            print(f"chaos: etcd members at {args.etcd.endpoints}", flush=True)
        s = seed
        while len(results) < args.iterations:
            if args.time_budget and time.time() - started > args.time_budget:
                stopped_early = (f"time budget of {args.time_budget:.0f} s spent after "
                                 f"{len(results)} of {args.iterations} iterations")
                break
            plan = make_plan(s, args.store)
            s += 1
            if args.kind and plan.kind != args.kind:
                continue
            it = Iteration(args, cluster, plan, len(results))
            begun = time.time()
            try:
                it.run()
            finally:
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
                try:
                    it.cleanup()
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            outcome = it.outcome()
            kinds = sorted({v.kind for v in it.summary.violations})
            results.append((plan.kind, outcome, kinds, plan.seed,
                            [f"[{v.kind}] {v.text}" for v in it.summary.violations]))
            margins.append(it.summary)
            print(f"iter {it.index:3d} seed {plan.seed} {plan.kind:13} {outcome:18} "
                  f"{time.time() - begun:5.1f} s  rounds {it.summary.rounds}  {it.codes()}  "
                  f"| {plan.describe()}", flush=True)
            if kinds:
                report_violations(it)
            elif not args.keep_logs:
                shutil.rmtree(it.dir, ignore_errors=True)
            it = None
    except (Interrupted, KeyboardInterrupt) as e:
        stopped_early = f"interrupted ({e}) after {len(results)} iteration(s)"
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        if it is not None:
            it.cleanup()
        cluster.restore_links()
        if args.etcd:
            args.etcd.down()
        cluster.down()
    print_table(results, time.time() - started)
    gaps = [m.min_gap_s for m in margins if m.min_gap_s is not None]
    excused = max((m.excused_overlap_s for m in margins), default=0.0)
    if gaps:
        print(f"closest start of a round after the last line of an older one: {min(gaps) * 1e3:.1f} "
              f"ms (overlap tolerance {checks.OVERLAP_TOLERANCE_S * 1e3:.0f} ms); longest "
              f"overlap excused by a frozen, cut off or killed agent: {excused * 1e3:.0f} ms")
    bad = [r for r in results if r[1] == "violation"]
    if bad:
        print(f"{len(bad)} iteration(s) with violations; seeds: "
              + ", ".join(str(r[3]) for r in bad))
        # Again at the end, short: a caller that shows only the tail of this output (CI) still
        # sees what was violated, not just that something was.
        for r in bad:
            for text in r[4]:
                print(f"  seed {r[3]} ({r[0]}): " + "\n      ".join(text.splitlines()[:8]))
    if stopped_early:
        print(f"chaos: {stopped_early}")
    return 1 if bad or stopped_early else 0


if __name__ == "__main__":
    sys.exit(main())
