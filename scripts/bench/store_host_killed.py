#!/usr/bin/python3
"""The "store host killed" row of scripts/bench/recovery.sh: 3 agents on loopback, --nnodes 2:3,
NPROC workers each, heartbeat_timeout 2 s; once the first round runs, the first agent (with c10d:
the one hosting the store) is SIGKILLed. c10d: the store goes with it, the job ends (reported:
how long until every survivor exited, and its status). etcd (a 3-member cluster from
scripts/etcd/up.sh): the survivors re-form; reported: from the kill to the first worker START of
the new round (world 2*NPROC) and to the last one. Every process is killed by PID at the end.

  store_host_killed.py --drun BIN --repo DIR [--trials 3] [--nproc 2]
Prints "RESULT <backend> <trial> <first_ms|-> <all_ms|-> <outcome>" lines.
"""
import argparse
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time

WORKER = r"""#!/bin/bash
echo "START ${TORCHELASTIC_RESTART_COUNT:-0} ${RANK} ${WORLD_SIZE} $$ $EPOCHREALTIME" >>"$RECOV_LOG"
exec sleep 300
"""


def starts(log):
    out = []
    if os.path.exists(log):
        for line in open(log):
            f = line.split()
            if len(f) == 6 and f[0] == "START":
                out.append((int(f[3]), float(f[5])))  # world size, wall time
    return out


def trial(args, backend, endpoint, work, index):
    log = os.path.join(work, f"{backend}-{index}.log")
    worker = os.path.join(work, "worker.sh")
    run_id = f"sk-{backend}-{index}-{random.randrange(1 << 30)}"
    cmd = [args.drun, "--nnodes", "2:3", "--nproc-per-node", str(args.nproc), "--rdzv-id", run_id,
           "--rdzv-endpoint", endpoint, "--max-restarts", "3",
           "--rdzv-conf", "heartbeat_timeout=2,last_call_timeout=1"]
    if backend == "etcd":
        cmd += ["--rdzv-backend", "etcd"]
    cmd += [worker]
    env = dict(os.environ, RECOV_LOG=log)
    agents = []
    try:
        for _ in range(3):
            agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))
            time.sleep(0.2)  # the first one hosts the c10d store
        deadline = time.time() + 30
        while len([s for s in starts(log) if s[0] == 3 * args.nproc]) < 3 * args.nproc:
            if time.time() > deadline:
                return None, None, "first round did not form"
            time.sleep(0.01)
        time.sleep(0.5 + random.random())
        killed = time.time()
        agents[0].send_signal(signal.SIGKILL)
        deadline = killed + 45  # c10d survivors look for the store for reconnect_timeout (30 s)
        while time.time() < deadline:
            new = [t for ws, t in starts(log) if ws == 2 * args.nproc and t > killed]
            if len(new) >= 2 * args.nproc:
                return (min(new) - killed) * 1000, (max(new) - killed) * 1000, "re-formed"
            if all(a.poll() is not None for a in agents[1:]):
                codes = sorted({a.returncode for a in agents[1:]})
                return None, (time.time() - killed) * 1000, "job ended, exit " + ",".join(map(str, codes))
            time.sleep(0.005)
        return None, None, "nothing within 45 s"
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
            a.wait()
        # Workers logged their pids: kill any left (they carry RECOV_LOG=log in their environment).
        if os.path.exists(log):
            for line in open(log):
                f = line.split()
                try:
                    pid = int(f[4])
                    if log in open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"):
                        os.kill(pid, signal.SIGKILL)
                except (OSError, ValueError, IndexError):
                    pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--drun", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="drun-storehost.")
    worker = os.path.join(work, "worker.sh")
    with open(worker, "w") as f:
        f.write(WORKER)
    os.chmod(worker, 0o755)
    port = random.randrange(30000, 40000)
    results = {"c10d": [], "etcd": []}

    def record(backend, i, r):
        results[backend].append(r)
        first, last, outcome = r
        print("RESULT %s %d %s %s %s" % (backend, i, "%.0f" % first if first else "-",
                                          "%.0f" % last if last else "-", outcome.replace(" ", "_")),
              flush=True)

    for i in range(args.trials):
        record("c10d", i, trial(args, "c10d", f"127.0.0.1:{port + i}", work, i))
    up = subprocess.run([os.path.join(args.repo, "scripts/etcd/up.sh")], capture_output=True,
                        text=True, env=dict(os.environ, BASE_PORT=str(port + 100)))
    if up.returncode == 0:
        etcd_dir, endpoints = up.stdout.split()[-2:]
        try:
            for i in range(args.trials):
                record("etcd", i, trial(args, "etcd", endpoints, work, i))
        finally:
            subprocess.run([os.path.join(args.repo, "scripts/etcd/down.sh"), etcd_dir])
    print()
    print("store host killed: 3 agents, --nnodes 2:3, %d workers each, heartbeat_timeout 2 s, "
          "loopback; the first agent (c10d: the store's host) SIGKILLed" % args.nproc)
    print("%-7s | %-34s | %22s | %22s" % ("backend", "outcome (trials)", "new round, first ms",
                                          "all ms / job ended ms"))
    print("-" * 95)
    for backend, rows in results.items():
        if not rows:
            print("%-7s | %-34s | %22s | %22s" % (backend, "not run (no etcd)", "-", "-"))
            continue
        outcomes = sorted({r[2] for r in rows})
        firsts = [r[0] for r in rows if r[0] is not None]
        lasts = [r[1] for r in rows if r[1] is not None]
        med = lambda v: "%.0f" % statistics.median(v) if v else "-"
        print("%-7s | %-34s | %22s | %22s" % (backend, "; ".join(
            "%s (%d/%d)" % (o, sum(r[2] == o for r in rows), len(rows)) for o in outcomes),
            med(firsts), med(lasts)))


if __name__ == "__main__":
    main()
