#!/usr/bin/python3
"""drun.comm (ctypes over libdrun_comm) on numpy arrays, bytearray and memoryview, run under
drun with any number of ranks: every collective x dtype x op against the result numpy computes
here from every rank's input (the inputs are a function of the rank, so each rank knows them all),
point to point (blocking, any source, a ring of isend/irecv), new_group, and the argument checks.

Prints `PYCOMM rank=R size=S checks=N` when everything matched; exits 1 with the
first mismatch otherwise (tests/python_comm_test.cpp).
"""
import sys

import numpy as np

import drun.comm as dc

DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
FLOATING = {"float16", "bfloat16", "float32", "float64"}
N = 37  # elements per rank: not a multiple of anything the transports chunk by


def values(rank, n=N):
    """Rank r's input: small positive integers, exact in every dtype (bfloat16 included)."""
    return (np.arange(n) * 3 + rank * 7) % 5 + 1


def as_dtype(v, name):
    """numpy array of `name` (bfloat16: its bits in uint16; exact for these small integers)."""
    if name == "bfloat16":
        return (np.asarray(v, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(v).astype(name)


def from_dtype(a, name):
    if name == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def expected_reduce(inputs, op, name):
    """The reduction in rank order, in the dtype (integer products wrap as in C++)."""
    stack = np.stack([from_dtype(as_dtype(v, name), name) for v in inputs])
    kind = np.float32 if name == "bfloat16" else stack.dtype
    fns = {"sum": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum,
           "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
    if op == "avg":
        return np.add.reduce(stack.astype(np.float64), axis=0) / len(inputs)
    return fns[op].reduce(stack, axis=0, dtype=kind)


class Checker:
    def __init__(self, rank):
        self.rank, self.count = rank, 0

    def same(self, got, want, what, tolerance=0.0):
        self.count += 1
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape or not np.allclose(got, want, rtol=tolerance, atol=tolerance):
            sys.exit(f"PYCOMM rank={self.rank} MISMATCH {what}: got {got.tolist()} "
                     f"expected {want.tolist()}")

    def raises(self, kind, fn, what, needle=""):
        self.count += 1
        try:
            fn()
        except kind as e:
            if needle.lower() not in str(e).lower():
                sys.exit(f"PYCOMM rank={self.rank} {what}: message lacks '{needle}': {e}")
            return
        sys.exit(f"PYCOMM rank={self.rank} {what}: no {kind.__name__} raised")


def ops_for(name):
    ops = ["sum", "product", "min", "max"]
    return ops + (["avg"] if name in FLOATING else ["band", "bor", "bxor"])


def collectives(world, check):
    rank, size = world.rank, world.size
    inputs = [values(r) for r in range(size)]
    for name in DTYPES:
        tol = 1e-2 if name in ("float16", "bfloat16") else 1e-6
        for op in ops_for(name):
            buf = as_dtype(inputs[rank], name)
            world.all_reduce(buf, op=op, dtype=name)
            want = expected_reduce(inputs, op, name)
            exact = 0.0 if op != "avg" and name not in ("float16", "bfloat16") else tol
            check.same(from_dtype(buf, name), want, f"all_reduce {name} {op}", exact)
            buf = as_dtype(inputs[rank], name)
            root = size - 1
            world.reduce(buf, op=op, root=root, dtype=name)
            if rank == root:
                check.same(from_dtype(buf, name), want, f"reduce {name} {op}", exact)
            if op in ("sum", "max"):
                blocks = [values(r, N * size) for r in range(size)]
                out = np.empty(N, buf.dtype)
                world.reduce_scatter(as_dtype(blocks[rank], name), out, op=op, dtype=name)
                full = expected_reduce(blocks, op, name)
                check.same(from_dtype(out, name), full[rank * N:(rank + 1) * N],
                           f"reduce_scatter {name} {op}", exact)

        mine = as_dtype(inputs[rank], name)
        gathered = np.empty(N * size, mine.dtype)
        world.all_gather(mine, gathered, dtype=name)
        check.same(gathered, np.concatenate([as_dtype(v, name) for v in inputs]),
                   f"all_gather {name}")

        root = 1 % size
        buf = as_dtype(inputs[rank], name)
        world.broadcast(buf, root=root, dtype=name)
        check.same(buf, as_dtype(inputs[root], name), f"broadcast {name}")

        out = np.empty(N * size, mine.dtype) if rank == root else None
        world.gather(mine, out, root=root, dtype=name)
        if rank == root:
            check.same(out, np.concatenate([as_dtype(v, name) for v in inputs]), f"gather {name}")

        send = as_dtype(values(root, N * size), name) if rank == root else None
        part = np.empty(N, mine.dtype)
        world.scatter(send, part, root=root, dtype=name)
        check.same(part, as_dtype(values(root, N * size), name)[rank * N:(rank + 1) * N],
                   f"scatter {name}")

        send = as_dtype(values(rank, N * size), name)
        recv = np.empty(N * size, mine.dtype)
        world.all_to_all(send, recv, dtype=name)
        want = np.concatenate([as_dtype(values(r, N * size), name)[rank * N:(rank + 1) * N]
                               for r in range(size)])
        check.same(recv, want, f"all_to_all {name}")

    # bool arrays travel as uint8; other buffer kinds: bytearray, memoryview, 2-D arrays.
    flags = np.array([rank % 2 == 0, True, False])
    world.all_reduce(flags, op="bor")
    check.same(flags, [True, True, False], "all_reduce bool bor")
    raw = bytearray([rank + 1] * 5)
    world.all_reduce(raw, op="max")
    check.same(list(raw), [size] * 5, "all_reduce bytearray max")
    grid = np.full((3, 4), rank, np.float64)
    world.all_reduce(memoryview(grid), op="sum")
    check.same(grid, np.full((3, 4), size * (size - 1) / 2), "all_reduce 2-D memoryview")
    req = world.all_reduce_async(grid, op="max")
    req.wait()
    check.same(grid, np.full((3, 4), size * (size - 1) / 2), "all_reduce_async")
    world.barrier()


def point_to_point(world, check):
    rank, size = world.rank, world.size
    if size < 2:
        return
    # Blocking: rank 0 sends every other rank its number; receive from any source.
    if rank == 0:
        for dst in range(1, size):
            world.send(np.array([dst * 100], np.int64), dst, tag=3)
        got = sorted(world.recv(np.zeros(1, np.int32), tag=4) for _ in range(1, size))
        check.same(got, list(range(1, size)), "recv from any source: the sources")
    else:
        buf = np.zeros(1, np.int64)
        check.same([world.recv(buf, 0, tag=3)], [0], "recv's source")
        check.same(buf, [rank * 100], "send/recv")
        world.send(np.array([rank], np.int32), 0, tag=4)
    # A ring of isend/irecv (bytes: a read-only send buffer).
    incoming = bytearray(8)
    reqs = [world.isend(bytes([rank]) * 8, (rank + 1) % size, tag=5),
            world.irecv(incoming, (rank - 1) % size, tag=5)]
    for r in reqs:
        r.wait()
    check.same(list(incoming), [(rank - 1) % size] * 8, "isend/irecv ring")
    check.same([reqs[1].source], [(rank - 1) % size], "irecv's source")


def groups(world, check):
    rank, size = world.rank, world.size
    members = list(range(0, size, 2))  # the even ranks
    group = world.new_group(members)
    if rank in members:
        check.same([group.rank, group.size], [members.index(rank), len(members)], "group rank")
        buf = np.array([rank], np.float32)
        group.all_reduce(buf)
        check.same(buf, [sum(members)], "group all_reduce")
    else:
        check.same([group.rank], [-1], "non-member's group rank")
        check.raises(dc.InvalidArgument, lambda: group.barrier(), "non-member barrier")


def misuse(world, check):
    """Checks made before anything is sent: the communicator stays usable after each."""
    check.raises(dc.InvalidArgument, lambda: world.all_reduce(np.ones(4, np.float32), op="band"),
                 "bitwise op on floats", "BAND")
    check.raises(dc.InvalidArgument, lambda: world.all_reduce(np.ones(4, np.int32), op="avg"),
                 "avg on integers", "AVG")
    check.raises(dc.InvalidArgument, lambda: world.all_reduce(np.ones((4, 4))[:, 1]),
                 "non-contiguous", "contiguous")
    check.raises(ValueError, lambda: world.all_gather(np.ones(3), np.ones(3 * world.size - 1)),
                 "too small a receive buffer", "expected")
    check.raises(dc.InvalidArgument, lambda: world.all_reduce(np.ones(2, np.complex64)),
                 "complex", "not supported")
    check.raises(dc.InvalidArgument, lambda: world.all_reduce(b"abc"), "read-only", "read-only")
    check.raises(dc.InvalidArgument, lambda: world.all_reduce(np.ones(2), op="mean"), "op", "mean")
    check.raises(dc.InvalidArgument, lambda: world.broadcast(np.ones(2), root=world.size),
                 "root out of range", "root")
    check.same([world.generation], [0], "generation without in-process recovery")
    check.raises(dc.InvalidArgument, lambda: world.reform(), "reform without a workers' store",
                 "workers' store")
    buf = np.ones(2)
    world.all_reduce(buf)
    check.same(buf, [world.size] * 2, "usable after misuse")


def main():
    with dc.init(timeout=60) as world:
        check = Checker(world.rank)
        collectives(world, check)
        point_to_point(world, check)
        groups(world, check)
        misuse(world, check)
        world.barrier()
        print(f"PYCOMM rank={world.rank} size={world.size} checks={check.count}", flush=True)


if __name__ == "__main__":
    main()
