"""The cost of the job's events and drun-rendezvous --http (scripts/bench/observe.sh)."""
import argparse
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Daemon:
    """drun-rendezvous on a free loopback port, with --http when asked; stopped by stop()."""

    def __init__(self, build, http):
        args = [f"{build}/bin/drun-rendezvous", "--host", "127.0.0.1", "--port", "0",
                "--max-connections-per-peer", "16384", "--log-level", "warn"]
        if http:
            args += ["--http", "0"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.port = self.http = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (self.port is None or (http and self.http is None)):
            line = self.proc.stdout.readline()
            if m := re.search(r"listening on \S+:(\d+)", line):
                self.port = int(m.group(1))
            if m := re.search(r"http on \S+:(\d+)", line):
                self.http = int(m.group(1))
        assert self.port, "drun-rendezvous did not start"
        self.polling = False

    def poll_page(self):
        """Fetch /api/jobs and /metrics every 100 ms (a page left open, a Prometheus scraper)."""
        self.polling = True

        def loop():
            while self.polling:
                for path in ("/api/jobs", "/metrics"):
                    try:
                        NO_PROXY.open(f"http://127.0.0.1:{self.http}{path}", timeout=5).read()
                    except OSError:
                        pass
                time.sleep(0.1)

        self.poller = threading.Thread(target=loop, daemon=True)
        self.poller.start()

    def stop(self):
        self.polling = False
        self.proc.terminate()
        self.proc.wait(timeout=10)


def launch_ms(build, env_extra, args, events_dir):
    env = dict(os.environ, **env_extra)
    t0 = time.perf_counter()
    r = subprocess.run([f"{build}/bin/drun", *args, "--nproc-per-node", "16", "hostname"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    ms = (time.perf_counter() - t0) * 1000
    if r.returncode != 0:
        raise SystemExit("drun failed: " + r.stderr.decode())
    return ms


def rendezvous_ms(build, port, agents):
    out = subprocess.run([f"{build}/bin/rendezvous_bench", "--port", str(port), "--sizes", str(agents)],
                         capture_output=True, text=True, timeout=300).stdout
    for line in out.splitlines():
        f = line.split()
        if f[:3] == ["RESULT", "drun", "generator"]:
            return float(f[6])  # every agent's next() would return
    raise SystemExit("rendezvous_bench gave no result:\n" + out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--runs", type=int, default=21)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--agents", type=int, default=4096)
    a = p.parse_args()
    tmp = tempfile.mkdtemp()
    off_daemon, on_daemon = Daemon(a.build, False), Daemon(a.build, True)
    on_daemon.poll_page()
    rows = {k: ([], []) for k in ("standalone", "daemon", "round")}
    try:
        for i in range(a.runs):  # interleaved: off, on, off, on ...
            ev = f"{tmp}/events{i}.jsonl"
            rows["standalone"][0].append(launch_ms(a.build, {"DRUN_JOB_HISTORY": "0"}, [], tmp))
            rows["standalone"][1].append(launch_ms(a.build, {}, ["--events", ev], tmp))
            common = ["--nnodes", "1", "--rdzv-id", f"bench{i}"]
            rows["daemon"][0].append(launch_ms(
                a.build, {"DRUN_JOB_HISTORY": "0"},
                common + ["--rdzv-endpoint", f"127.0.0.1:{off_daemon.port}"], tmp))
            rows["daemon"][1].append(launch_ms(
                a.build, {}, common + ["--rdzv-endpoint", f"127.0.0.1:{on_daemon.port}", "--events", ev + ".d"],
                tmp))
        for _ in range(a.rounds):
            rows["round"][0].append(rendezvous_ms(a.build, off_daemon.port, a.agents))
            rows["round"][1].append(rendezvous_ms(a.build, on_daemon.port, a.agents))
    finally:
        off_daemon.stop()
        on_daemon.stop()
    names = {"standalone": "launch 16 x hostname (single node, --events)",
             "daemon": "launch 16 x hostname via daemon (history, --http)",
             "round": f"{a.agents}-agent rendezvous round (--http)"}
    print("watching a job: events + HTTP off vs on (same run, interleaved); median and min of the runs")
    print("%-52s %5s | %9s %9s %7s | %9s %9s %7s" % ("what", "runs", "off med", "on med", "on/off",
                                                   "off min", "on min", "on/off"))
    print("-" * 118)
    for key, (off, on) in rows.items():
        mo, mn = statistics.median(off), statistics.median(on)
        lo, ln = min(off), min(on)
        print("%-52s %5d | %9.1f %9.1f %6.3fx | %9.1f %9.1f %6.3fx" % (
            names[key], len(off), mo, mn, mn / mo, lo, ln, ln / lo))
    print("(ms; load average at the end: %.1f on %d cores)" % (os.getloadavg()[0], os.cpu_count()))

if __name__ == "__main__":
    main()
