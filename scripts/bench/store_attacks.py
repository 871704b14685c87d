#!/usr/bin/env python3
"""Hostile clients against drun-rendezvous (issues 9 and 15): each attack's outcome and the
daemon's resident memory before, at the peak (sampled every 10 ms) and after it, as a table.
Loopback only; every loop bounded in count and time; the daemon (default limits) is started here
and stopped by its PID.

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
import threading
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


def sstr(b):
    return struct.pack("<I", len(b)) + b


OP_SET, OP_GET, OP_TRYGET, OP_WAIT, OP_SETWILL, OP_WATCH, OP_DELPREFIX = 1, 2, 3, 6, 14, 13, 16


def frame(op, body, rid):
    return header(len(body), op=op, rid=rid) + body


def watch_body(key, known, timeout_ms=60000):
    return struct.pack("<I", timeout_ms) + sstr(key) + b"\x01" + sstr(known)


def wait_body(keys, timeout_ms=60000):
    return struct.pack("<II", timeout_ms, len(keys)) + b"".join(sstr(k) for k in keys)


def responses(s, quiet=0.5, limit=100000):
    """Reads response frames until none arrives for `quiet` s: [(status, id, message)]."""
    s.settimeout(quiet)
    data, out = b"", []
    while len(out) < limit:
        while len(data) >= 16:
            length, _op, status, _r, rid = struct.unpack("<IBBHQ", data[:16])
            if len(data) < 16 + length:
                break
            body = data[16:16 + length]
            message = body[4:4 + struct.unpack("<I", body[:4])[0]].decode(errors="replace") if status and len(body) >= 4 else ""
            out.append((status, rid, message))
            data = data[16 + length:]
        if len(out) >= limit:
            break
        try:
            chunk = s.recv(1 << 20)
        except (socket.timeout, ConnectionError):
            break
        if not chunk:
            break
        data += chunk
    return out


def admitted(port, lease_ms=60_000):
    s = connect(port)
    s.sendall(hello(lease_ms))
    st = reply_status(read_reply(s))
    assert st == 0, f"hello refused: {st}"
    return s


class Peak:
    """Samples a process's RSS every 10 ms while an attack runs."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, rss_kb(pid), False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, rss_kb(self.pid))
            time.sleep(0.01)

    def finish(self):
        self.stop = True
        self.thread.join()
        return self.peak


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
            print(f"... {name}", file=sys.stderr, flush=True)
            before = rss_kb(pid)
            peak = Peak(pid)
            outcome = fn()
            time.sleep(0.3)
            rows.append((name, outcome, before, peak.finish(), rss_kb(pid), fds(pid)))

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

        def big_known_watches():
            big = b"k" * (16 << 20)
            s = admitted(port)
            s.sendall(frame(OP_SET, sstr(b"atk/big") + sstr(big), 1))
            body = watch_body(b"atk/big", big)
            for i in range(64):
                s.sendall(frame(OP_WATCH, body, 100 + i))
            s.sendall(frame(OP_TRYGET, sstr(b"atk/none"), 999))
            got = responses(s, quiet=10, limit=2)
            pending = [r for r in got if r[1] >= 100 and r[1] < 999]
            s.close()
            return f"64 watches pending ({len(pending)} answered early); each keeps a 32-byte digest"

        def many_large_sets():
            big = b"v" * (16 << 20)
            s = admitted(port)
            stored, per_job, total, rid = 0, 0, 0, 1
            for job in range(6):
                for i in range(20):
                    rid += 1
                    s.sendall(frame(OP_SET, sstr(f"rdzv/atk{job}/{i}".encode()) + sstr(big), rid))
                    (status, _, msg), = responses(s, quiet=10, limit=1) or [(99, 0, "no reply")]
                    stored += status == 0
                    per_job += "maxStoredBytesPerJob" in msg
                    total += "maxStoredBytes " in msg
            held = rss_kb(pid)
            for job in range(6):
                rid += 1
                s.sendall(frame(OP_DELPREFIX, sstr(f"rdzv/atk{job}/".encode()), rid))
            responses(s, quiet=2, limit=6)
            s.close()
            return (f"{stored} x 16 MiB stored, then refused: {per_job} maxStoredBytesPerJob, "
                    f"{total} maxStoredBytes; RSS held {held // 1024} MB; deleted")

        def waiters_on_many_connections():
            keys = [b"atk/never/%04d/" % k + b"x" * 88 for k in range(500)]
            body = wait_body(keys)
            socks, per_conn, total, pending = [], 0, 0, 0
            for c in range(16):
                s = admitted(port)
                s.sendall(b"".join(frame(OP_WAIT, body, i) for i in range(1, 257)))
                socks.append(s)
            for s in socks:
                got = responses(s, quiet=1.0)
                per_conn += sum("maxCallBytesPerConnection" in m for _, _, m in got)
                total += sum("maxCallBytes " in m for _, _, m in got)
                pending += 256 - len(got)
            held = rss_kb(pid)
            for s in socks:
                s.close()
            return (f"{pending} of 4096 pending (500 keys each); refused: {total} maxCallBytes, "
                    f"{per_conn} maxCallBytesPerConnection; RSS held {held // 1024} MB")

        def large_wills():
            value = b"w" * ((16 << 20) - 1024)
            body = struct.pack("<I", 3) + b"".join(sstr(b"rdzv/atk/will/%d" % i) + sstr(value) for i in range(3))
            body += struct.pack("<I", 0) + struct.pack("<I", 0)
            socks, ok, refused = [], 0, 0
            for c in range(8):
                s = admitted(port)
                s.sendall(frame(OP_SETWILL, body, 1))
                (status, _, msg), = responses(s, quiet=10, limit=1) or [(99, 0, "")]
                ok += status == 0
                refused += "maxCallBytes" in msg
                socks.append(s)
            held = rss_kb(pid)
            for s in socks:
                s.close()
            return f"8 x 48 MiB wills: {ok} kept, {refused} refused (maxCallBytes); RSS held {held // 1024} MB"

        def crowd_then_client():
            crowd = []
            for _ in range(1400):
                crowd.append(connect(port))
            for _ in range(50):
                crowd.append(connect(port))
                crowd[-1].sendall(os.urandom(256))
            for _ in range(50):
                crowd.append(connect(port))
                crowd[-1].sendall(hello(60_000) + header(100) + b"x" * 10)
            t0 = time.monotonic()
            s = connect(port)
            s.sendall(hello())
            st = reply_status(read_reply(s))
            ms = (time.monotonic() - t0) * 1000
            s.close()
            for c in crowd:
                c.close()
            return f"1400 silent + 50 garbage + 50 mid-frame, then a client from 127.0.0.1: {'admitted' if st == 0 else f'status {st}'} in {ms:.1f} ms"

        def dripping_hello():
            s = connect(port)
            data = hello()
            t0 = time.monotonic()
            for i in range(len(data)):
                try:
                    s.sendall(data[i:i + 1])
                except OSError:
                    break
                if closed_by_server(s, 0.1):
                    break
            took = time.monotonic() - t0
            s.close()
            return f"dropped {took:.1f}s after connecting (handshake deadline 3s; all of it would take 4.8s)"

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
        attack("64 watches, known = the stored 16 MiB value", big_known_watches)
        attack("16 MiB sets into 6 jobs until refused", many_large_sets)
        attack("16 conns x 256 waits on 500 keys", waiters_on_many_connections)
        attack("8 conns x setWill of 48 MiB", large_wills)
        attack("crowd of 1500 from 127.0.0.1, then a client", crowd_then_client)
        attack("hello dripped 1 byte / 100 ms", dripping_hello)

        print(f"drun-rendezvous under hostile clients (pid {pid}); at start: RSS {start_rss} kB, {start_fds} fds")
        print(f"{'attack':52} | {'outcome':100} | {'RSS before kB':>13} | {'peak kB':>9} | {'after kB':>9} | fds")
        print("-" * 204)
        for name, outcome, before, peak, after, nfd in rows:
            print(f"{name:52} | {outcome:100} | {before:>13} | {peak:>9} | {after:>9} | {nfd}")
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


if __name__ == "__main__":
    sys.exit(main())
