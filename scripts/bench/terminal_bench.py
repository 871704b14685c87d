#!/usr/bin/python3
"""drun beside torchrun in the user's terminal, same run, same machine (scripts/bench/terminal.sh).

Each launcher runs 2 /bin/sh workers with its stdout/stderr on a pseudo-terminal this script
opens (as an interactive shell would), and the table shows:
  - whether a worker's stdout is a terminal (isatty);
  - partial-line latency: from the worker's "start" line to its progress bar "\\r50%" (no newline,
    the worker then sleeps 1 s) appearing on the terminal, median and range over RUNS trials;
  - whether a line typed on the terminal reaches rank 0's stdin;
  - `| head -2` on a job whose workers write a line every 10 ms for 3 s: wall time until the
    launcher exits, and its exit status.
Every run has a timeout.
"""
import os
import pty
import select
import signal
import statistics
import subprocess
import sys
import atexit
import tempfile
import time

RUNS = int(os.environ.get("RUNS", "5"))
BUILD_DIR = os.environ.get("BUILD_DIR", "build")
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")
TIMEOUT = 30.0


def launchers():
    drun = [os.path.join(BUILD_DIR, "bin", "drun"), "--nproc-per-node", "2"]
    torchrun = [PYTHON, "scripts/bench/torchrun_compat.py", "--nproc_per_node", "2",
                "--no_python"]
    return [("drun", drun), ("torchrun", torchrun)]


def on_terminal(argv, stdin_text=None, until=None):
    """Runs argv with stdin/stdout/stderr on a fresh pty; returns [(time, bytes)] and the status."""
    master, slave = pty.openpty()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                            start_new_session=True)
    os.close(slave)
    chunks, deadline, typed = [], time.monotonic() + TIMEOUT, False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer is gone
                break
            if not data:
                break
            chunks.append((time.monotonic(), data))
            text = b"".join(c for _, c in chunks)
            if stdin_text and not typed and b"READY" in text:
                os.write(master, stdin_text)
                typed = True
            if until and until(text):
                break
        elif proc.poll() is not None and not ready:
            break
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    os.close(master)
    return chunks, proc.returncode


def shell(script):
    """The worker: /bin/sh running `script` from a file (torchrun's CLI would take `-c` as its own)."""
    f = tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False, dir=os.environ.get("TMPDIR"))
    f.write(script + "\n")
    f.close()
    atexit.register(os.unlink, f.name)
    return ["/bin/sh", f.name]


def first_time(chunks, needle):
    text = b""
    for when, data in chunks:
        text += data
        if needle in text:
            return when
    return None


def isatty_row(argv):
    chunks, _ = on_terminal(argv + shell("test -t 1 && echo IS-TTY || echo NOT-TTY"))
    text = b"".join(c for _, c in chunks)
    return "yes" if b"IS-TTY" in text else "no" if b"NOT-TTY" in text else "?"


def latency_row(argv):
    script = "echo start; printf '\\r50%%'; sleep 1; printf '\\r100%%\\n'"
    samples = []
    for _ in range(RUNS):
        chunks, _ = on_terminal(argv + shell(script))
        start, bar = first_time(chunks, b"start"), first_time(chunks, b"50%")
        if start is not None and bar is not None:
            samples.append((bar - start) * 1000)
    if not samples:
        return "not seen"
    return "%.1f (%.1f..%.1f)" % (statistics.median(samples), min(samples), max(samples))


def stdin_row(argv):
    script = ("echo READY; read -r line; echo \"rank=${RANK:-?} got:$line\"")
    chunks, _ = on_terminal(argv + shell(script), stdin_text=b"typed-line\n",
                            until=lambda t: b"got:typed-line" in t)
    text = b"".join(c for _, c in chunks).decode(errors="replace")
    for line in text.splitlines():
        if "got:typed-line" in line:
            return "yes (%s)" % line.split("rank=")[1].split()[0]
    return "no"


def head_row(argv):
    script = "i=0; while [ $i -lt 300 ]; do echo line $i; i=$((i+1)); sleep 0.01; done"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.monotonic()
    pipeline = subprocess.Popen(
        ["bash", "-c", 'exec 2>/dev/null; "$@" | head -2 >/dev/null; echo ${PIPESTATUS[0]}', "x"]
        + argv + shell(script),
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        out, _ = pipeline.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(pipeline.pid, signal.SIGKILL)
        return "timed out"
    wall = (time.monotonic() - start) * 1000
    return "%.0f ms, exit %s" % (wall, out.decode().strip())


def main():
    rows = [("worker stdout is a terminal", isatty_row),
            ("partial line latency, ms: median (min..max)", latency_row),
            ("a typed line reaches a worker's stdin (rank)", stdin_row),
            ("`| head -2`, workers writing 3 s: until exit", head_row)]
    tools = launchers()
    results = [[name] + [fn(argv) for _, argv in tools] for name, fn in rows]
    headers = ["what (2 workers, /bin/sh, on a pty)"] + [name for name, _ in tools]
    widths = [max(len(str(r[i])) for r in results + [headers]) for i in range(len(headers))]
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in results:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    sys.exit(main())
