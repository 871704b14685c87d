#!/usr/bin/env python3
"""Hostile clients against drun-rendezvous (issue 9): each attack's outcome and the daemon's
resident memory before and after it, as a table. Loopback only; every loop bounded in count and
time; the daemon is started here and stopped by its PID.

  python3 scripts/bench/store_attacks.py [--build-dir build]
"""
import argparse
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import time

MAGIC = b"drun"


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def connect(port, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def hello(lease_ms=0, scope=b""):
    return MAGIC + struct.pack("<HHI", 2, 0, lease_ms) + os.urandom(32) + struct.pack("<I", len(scope)) + scope


def header(length, op=1, rid=1):
    return struct.pack("<IBBHQ", length, op, 0, 0, rid)


def read_reply(s, n=45, timeout=5.0):
    s.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while len(data) < n and time.monotonic() < deadline:
        try:
            chunk = s.recv(n - len(data))
        except (socket.timeout, ConnectionError):
            break
        if not chunk:
            break
        data += chunk
    return data


def closed_by_server(s, timeout):
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not s.recv(65536):
                return True
    except socket.timeout:
        return False
    except ConnectionError:
        return True
    return False


def reply_status(data):
    return struct.unpack("<H", data[6:8])[0] if len(data) >= 12 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.environ.get("DRUN_BUILD_DIR", "build"))
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1100 sockets at once
    daemon = subprocess.Popen(
        [os.path.join(args.build_dir, "bin", "drun-rendezvous"), "--host", "127.0.0.1", "--port", "0",
         "--stalled-frame-timeout", "2s", "--log-level", "error"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = daemon.stdout.readline()
        port = int(re.search(r":(\d+)\s*$", line).group(1))
        pid = daemon.pid
        rows = []

        def attack(name, fn):
            before = rss_kb(pid)
            outcome = fn()
            time.sleep(0.3)
            rows.append((name, outcome, before, rss_kb(pid), fds(pid)))

        def claim_64mib():
            socks = [connect(port) for _ in range(3)]
            for s in socks:
                s.sendall(hello(3_600_000) + header(64 << 20))
            leases = [struct.unpack("<I", read_reply(s)[8:12])[0] for s in socks]
            time.sleep(0.5)
            held = rss_kb(pid)
            for s in socks:
                s.close()
            return f"lease granted {leases[0] // 1000}s (asked 3600s); RSS while held {held // 1024} MB"

        def garbage():
            s = connect(port)
            s.sendall(os.urandom(4096))
            return "closed at once" if closed_by_server(s, 3) else "NOT closed"

        def wrong_magic():
            s = connect(port)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            return "closed without a reply" if closed_by_server(s, 3) else "NOT closed"

        def old_version():
            s = connect(port)
            s.sendall(MAGIC + struct.pack("<HHI", 1, 0, 0))
            st = reply_status(read_reply(s, 12))
            return "VersionMismatch" if st == 1 else f"status {st}"

        def oversized():
            s = connect(port)
            s.sendall(hello() + header(0xFFFFFFFF))
            read_reply(s)
            return "protocol error, closed" if closed_by_server(s, 3) else "NOT closed"

        def stalled():
            s = connect(port)
            s.sendall(hello(60_000) + header(100) + b"x" * 10)
            read_reply(s)
            t0 = time.monotonic()
            ok = closed_by_server(s, 10)
            return f"dropped after {time.monotonic() - t0:.1f}s (stalled-frame timeout 2s)" if ok else "NOT dropped"

        def idle_many():
            socks = []
            for _ in range(1000):
                socks.append(connect(port))
                socks[-1].sendall(hello(60_000))
            ok = sum(reply_status(read_reply(s)) == 0 for s in socks)
            held = rss_kb(pid)
            for s in socks:
                s.close()
            return f"{ok}/1000 served while idle; RSS while held {held // 1024} MB"

        def over_cap():
            socks = []
            busy = 0
            for _ in range(1100):
                s = connect(port)
                s.sendall(hello(60_000))
                socks.append(s)
            served = 0
            for s in socks:
                st = reply_status(read_reply(s, 12))
                served += st == 0
                busy += st == 2
            for s in socks:
                s.close()
            # Past 64 refusals lingering at once, the others are closed without the Busy reply.
            return f"{served} served, {1100 - served} refused ({busy} told Busy), cap 1024 per peer"

        def many_waiters():
            s = connect(port)
            s.sendall(hello(60_000))
            read_reply(s)
            body = struct.pack("<I", 30000) + struct.pack("<I", 5) + b"never"
            s.sendall(b"".join(header(len(body), op=2, rid=i) + body for i in range(1, 301)))
            data = read_reply(s, 16, 5)
            refused = len(data) == 16 and data[5] == 2
            s.close()
            return "the 257th blocking call refused (InvalidArgument)" if refused else "no refusal"

        def slow_reader():
            s = connect(port)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(hello(60_000))
            read_reply(s)
            key = b"big"
            value = b"v" * (8 << 20)
            set_body = struct.pack("<I", len(key)) + key + struct.pack("<I", len(value)) + value
            s.sendall(header(len(set_body), op=1, rid=1) + set_body)
            get_body = struct.pack("<I", 1000) + struct.pack("<I", len(key)) + key
            for i in range(2, 20):
                s.sendall(header(len(get_body), op=2, rid=i) + get_body)
            time.sleep(1.0)
            return "dropped at the 64 MiB output bound" if closed_by_server(s, 5) else "NOT dropped"

        def disconnect_mid_wait():
            s = connect(port)
            s.sendall(hello(60_000))
            read_reply(s)
            body = struct.pack("<I", 30000) + struct.pack("<I", 4) + b"none"
            s.sendall(header(len(body), op=2, rid=1) + body)
            time.sleep(0.2)
            s.close()
            return "closed; its waiter dropped"

        start_rss, start_fds = rss_kb(pid), fds(pid)
        attack("3 x (hello asking 1h lease + header claiming 64 MiB)", claim_64mib)
        attack("4 KiB of random bytes", garbage)
        attack("wrong magic (an HTTP request)", wrong_magic)
        attack("protocol version 1 hello", old_version)
        attack("frame header claiming 4 GiB", oversized)
        attack("half a frame, then silence", stalled)
        attack("1000 idle connections", idle_many)
        attack("1100 connections from one address", over_cap)
        attack("300 pending gets on one connection", many_waiters)
        attack("8 MiB value read back 18 times, client never reads", slow_reader)
        attack("disconnect in the middle of a wait", disconnect_mid_wait)

        print(f"drun-rendezvous under hostile clients (pid {pid}); at start: RSS {start_rss} kB, {start_fds} fds")
        print(f"{'attack':56} | {'outcome':64} | {'RSS before kB':>13} | {'RSS after kB':>12} | fds")
        print("-" * 164)
        for name, outcome, before, after, nfd in rows:
            print(f"{name:56} | {outcome:64} | {before:>13} | {after:>12} | {nfd}")
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


if __name__ == "__main__":
    sys.exit(main())
