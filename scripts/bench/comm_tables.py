"""Joins scripts/bench/comm.sh's raw tables (nccl-tests' rows, one file per implementation, op
and world: <impl>.<op>.<world>) by size, keeps the best time of every repeat, and prints one table
per op and world plus the verdicts on drun's targets.

    comm_tables.py DIR "all_reduce all_gather" "2 4" REPEAT
"""
import math
import os
import platform
import sys

ONE_HOST = [("shm", "drun shm"), ("tcp", "drun tcp"), ("gloo", "raw Gloo"), ("mpi", "OpenMPI"), ("torch", "torch+gloo")]
TWO_HOSTS = [("hier", "drun hier"), ("gloo", "raw Gloo")]


def table(path):
    """size -> (best time us, busbw at that time) over every repeat in the file."""
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        f = line.split()
        if len(f) == 9 and f[0].isdigit():
            size, us, busbw = int(f[0]), float(f[5]), float(f[7])
            if size not in rows or us < rows[size][0]:
                rows[size] = (us, busbw)
    return rows


def human(b):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale}{unit}"
    return str(b)


def gmean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def print_table(title, data, impls, ref, target):
    """Prints one table; returns the busbw ratios target/ref from 64 KiB and the smallest size's time ratio."""
    present = [(k, name) for k, name in impls if data[k]]
    print(f"\n## {title}")
    print(f"{'size':>6}" + "".join(f" {name + ' us':>14} {'busbw':>7}" for _, name in present) +
          f" {target + '/' + ref + ' busbw':>18}")
    ratios, first_time = [], None
    sizes = sorted(set().union(*[set(data[k]) for k, _ in present])) if present else []
    for size in sizes:
        line = f"{human(size):>6}"
        for k, _ in present:
            us, bw = data[k].get(size, (float("nan"), float("nan")))
            line += f" {us:>14.1f} {bw:>7.3f}"
        t, r = data[target].get(size), data[ref].get(size)
        if t and r:
            ratio = t[1] / r[1] if r[1] > 0 else float("nan")
            line += f" {ratio:>18.2f}"
            if size >= 64 << 10 and r[1] > 0:
                ratios.append(ratio)
            if first_time is None:
                first_time = (size, t[0] / r[0])
        print(line)
    return ratios, first_time


def main():
    tmp, ops, worlds, repeat = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
    print(f"# float32, sum; time(us) and busbw(GB/s) per implementation; best of {repeat} run(s) per size")
    print(f"# {platform.node()}: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    verdicts = []
    # (title, files' suffix, implementations, reference, drun's column, verdict's target text)
    scenarios = [(f"{op}, one host, world {n}", f"{op}.{n}", ONE_HOST, "mpi", "shm", f"{op} world {n}: shm/OpenMPI", 1.0)
                 for op in ops for n in worlds]
    scenarios += [(f"{op}, two hosts x 2", f"{op}.2x2", TWO_HOSTS, "gloo", "hier", f"{op} 2 hosts x 2: hier/raw Gloo", 1.5)
                  for op in ops]
    for title, suffix, impls, ref, drun, what, target in scenarios:
        data = {k: table(os.path.join(tmp, f"{k}.{suffix}")) for k, _ in impls}
        if not data[drun]:
            continue
        ratios, first = print_table(title, data, impls, ref, drun)
        if not ratios:
            continue
        verdict = f"# {what} busbw from 64K: geomean {gmean(ratios):.2f}, worst {min(ratios):.2f} (target >= {target})"
        if ref == "mpi" and first:
            verdict += f"; {human(first[0])} time {first[1]:.2f}x OpenMPI's (target <= 2.0)"
        verdicts.append(verdict)
    print()
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()
