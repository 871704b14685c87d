#!/usr/bin/env python3
"""MASTER_PORT: holding the reserved port while workers run, versus releasing it at spawn.

    python3 scripts/bench/master_port.py [TRIALS] [NEIGHBOUR_PORTS]   (results: docs/benchmarks/results/master-port.txt)

drun reserves MASTER_PORT with a socket that is bound (no SO_REUSEADDR) and never listens. Held while the workers
run, a program that binds the port without SO_REUSEADDR gets EADDRINUSE; released at spawn (like
torchrun), any program can bind it, but until the worker binds, another process on the host could
be handed the same port by the kernel, when the port is one the kernel hands out. drun now draws
the port from outside the ephemeral range and releases it at spawn. This measures the three:

  plain bind ok   a plain bind()+listen() (no SO_REUSEADDR) on the port succeeds
  stolen          the port is among NEIGHBOUR_PORTS ports the kernel hands out (bind to port 0,
                  as every outgoing connection and every port-0 server does) right after the
                  release and before the worker binds: the race the release opens. Expected about
                  NEIGHBOUR_PORTS / size of the ephemeral range.
Loopback only; every loop bounded by TRIALS.
"""
import random
import socket
import sys

TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
NEIGHBOURS = int(sys.argv[2]) if len(sys.argv) > 2 else 50


def ephemeral():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo, hi = map(int, f.read().split())
    return lo, hi


def outside_ephemeral():
    # As drun's masterPortRanges (without the reserved-ports list): from 28000 up, less the range.
    lo, hi = ephemeral()
    return [p for p in range(28000, 65536) if not lo <= p <= hi]


CANDIDATES = outside_ephemeral()


def reserve(draw):
    # As drun's PortReservation: no SO_REUSEADDR, never listening; a random port outside the
    # ephemeral range (draw) or one the kernel picks.
    for _ in range(32 if draw else 0):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", random.choice(CANDIDATES)))
            return s
        except OSError:
            s.close()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    return s


def plain_bind(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", port))
        s.listen(1)
        return True
    except OSError:
        return False
    finally:
        s.close()


def neighbour_ports(count):
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return {s.getsockname()[1] for s in socks}
    finally:
        for s in socks:
            s.close()


def trial(hold, draw):
    r = reserve(draw)
    port = r.getsockname()[1]
    if not hold:
        r.close()
    stolen = port in neighbour_ports(NEIGHBOURS)
    ok = plain_bind(port)
    if hold:
        r.close()
    return ok, stolen


def main():
    lo, hi = ephemeral()
    rows = []
    modes = (("hold while running", True, False, 0.0),
             ("release at spawn", False, False, 100.0 * NEIGHBOURS / (hi - lo + 1)),
             ("release, drawn outside", False, True, 0.0))
    for mode, hold, draw, expected in modes:
        ok = stolen = 0
        for _ in range(TRIALS):
            o, s = trial(hold, draw)
            ok += o
            stolen += s
        rows.append((mode, ok, stolen, expected))
    print(f"MASTER_PORT trade-off: {TRIALS} trials, {NEIGHBOURS} neighbour port(s) handed out in "
          f"each window, ephemeral range {lo}-{hi} ({hi - lo + 1} ports)")
    print(f"{'mode':<24} {'plain bind ok':>14} {'stolen':>8} {'expected stolen':>16}")
    for mode, ok, stolen, expected in rows:
        print(f"{mode:<24} {100.0 * ok / TRIALS:>13.1f}% {100.0 * stolen / TRIALS:>7.2f}% {expected:>15.2f}%")


if __name__ == "__main__":
    main()
