#!/usr/bin/python3
"""The phases of one recovery in a job directory that scripts/bench/time_lost.sh kept
(KEEP_LOGS=1): ms from the SIGKILL (killed_at) to each thing the agents' events
(events<host>.jsonl) and the workers' log (workers.log) record, in time order.

    time_lost_phases.py DIR [DIR...]

The workers' lines are those of the processes that started after the kill, or were assigned a
rank after it (a standby: its BOOT is before the kill, its START after), and the survivors'
first ENTER and STEP after it. Standard library only.
"""
import glob
import json
import os
import sys

EVENTS = ("node_lost", "node_place_offered", "recovery_started", "standby_started", "round_formed",
          "worker_started", "recovery_formed", "recovery_fallback")


def phases(directory):
    with open(os.path.join(directory, "killed_at")) as f:
        killed = float(f.read().split()[0])
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "events*.jsonl"))):
        host = os.path.basename(path)[len("events"):-len(".jsonl")]
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                t = e.get("ts_ms", 0) / 1e3
                if e.get("event") in EVENTS and t >= killed - 0.001:
                    what = {k: e[k] for k in ("rank", "pid", "generation", "standby", "spare") if k in e}
                    rows.append((t, f"host {host}", e["event"], json.dumps(what) if what else ""))
    started = {}  # pid -> rank, of the processes whose START is after the kill
    seen = set()
    with open(os.path.join(directory, "workers.log"), errors="replace") as f:
        lines = [ln.split() for ln in f if ln.strip()]
    for w in lines:
        if w[0] == "START" and float(w[3]) >= killed:
            started[int(w[2])] = int(w[1])
    for w in lines:
        kind = w[0]
        if kind in ("BOOT", "START", "INIT", "TRACK", "ENTER"):
            pid, t = int(w[2]), float(w[3])
            if pid in started or (kind in ("TRACK", "ENTER") and t >= killed):
                rows.append((t, f"rank {w[1]} pid {pid}", kind, "new process" if pid in started else ""))
        elif kind == "STEP":
            t, pid = float(w[3]), int(w[4])
            if t >= killed and (w[1], pid) not in seen:
                seen.add((w[1], pid))
                rows.append((t, f"rank {w[1]} pid {pid}", f"STEP {w[2]}", "first after the kill"))
    rows.sort()
    print(f"== {directory}: ms from the SIGKILL")
    for t, who, what, detail in rows:
        print(f"{(t - killed) * 1e3:9.1f}  {who:<22} {what:<20} {detail}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for directory in sys.argv[1:]:
        phases(directory)


if __name__ == "__main__":
    main()
