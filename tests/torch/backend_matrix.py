#!/usr/bin/python3
"""Every collective x dtype x reduce op on the backend "drun" against the backend "gloo", in one
job: the world is a drun process group, and a gloo group over the same ranks runs the same calls
on the same inputs. Each result must equal gloo's (integers exactly, floats to rounding), and the
reference computed here from every rank's input (inputs are a function of the rank), which also
covers what gloo 1.13 does not do (AVG, some dtypes). Point to point, async work objects,
non-contiguous tensors, new_group and the clear errors of unsupported calls too.

Run with TUTORIAL_BACKEND=drun (dist_env). Prints `MATRIX rank=R checks=N gloo=G gloo_refused=R` (G: results
compared with gloo's; R: calls gloo refused) or exits 1 naming the first mismatch.
"""
import sys

import torch
import torch.distributed as dist

import dist_env

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
FLOATING = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
N = 23
R = dist.ReduceOp


def ops_for(dtype):
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    if dtype in FLOATING:
        return ops + [R.AVG]
    return ops + [R.BAND, R.BOR, R.BXOR]


def values(rank, dtype, n=N):
    """Rank r's input: small integers (booleans: a pattern), exact in every dtype."""
    v = (torch.arange(n) * 3 + rank * 7) % 5 + 1
    return (v % 2 == rank % 2) if dtype == torch.bool else v.to(dtype)


def reference(inputs, op):
    """The reduction of every rank's input, in rank order, in the dtype (bool: logical)."""
    acc = inputs[0].clone()
    for t in inputs[1:]:
        if op == R.SUM or op == R.AVG:
            acc = (acc | t) if acc.dtype == torch.bool else acc + t
        elif op == R.PRODUCT:
            acc = (acc & t) if acc.dtype == torch.bool else acc * t
        elif op == R.MIN:
            acc = torch.minimum(acc, t)
        elif op == R.MAX:
            acc = torch.maximum(acc, t)
        elif op == R.BAND:
            acc = acc & t
        elif op == R.BOR:
            acc = acc | t
        elif op == R.BXOR:
            acc = acc ^ t
    return acc / len(inputs) if op == R.AVG else acc


class Check:
    def __init__(self, rank):
        self.rank, self.count, self.gloo, self.gloo_refused = rank, 0, 0, 0

    def same(self, got, want, what):
        self.count += 1
        if got.dtype != want.dtype and want.dtype != torch.bool:
            want = want.to(got.dtype)
        loose = got.dtype in (torch.float16, torch.bfloat16)
        ok = (torch.allclose(got.double(), want.double(), rtol=1e-2 if loose else 1e-6)
              if got.dtype in FLOATING else torch.equal(got, want))
        if not ok:
            sys.exit(f"MATRIX rank={self.rank} MISMATCH {what}: got {got.tolist()} "
                     f"expected {want.tolist()}")

    def against_gloo(self, run, what):
        """run(group) -> result tensor; the drun result vs gloo's, where gloo can do it."""
        mine = run(None)
        try:
            theirs = run(GLOO)
        except RuntimeError:
            # gloo 1.13 refuses it before sending anything (AVG, some dtypes and ops): the check
            # against the reference stands alone.
            self.gloo_refused += 1
            return mine
        self.gloo += 1
        self.same(mine, theirs, what + " vs gloo")
        return mine

    def raises(self, fn, needle, what):
        self.count += 1
        try:
            fn()
        except RuntimeError as e:
            if needle not in str(e):
                sys.exit(f"MATRIX rank={self.rank} {what}: message lacks '{needle}': {e}")
            return
        sys.exit(f"MATRIX rank={self.rank} {what}: no RuntimeError")


GLOO = None


def reductions(rank, size, check):
    for dtype in DTYPES:
        inputs = [values(r, dtype) for r in range(size)]
        for op in ops_for(dtype):
            what = f"{dtype} {op}"

            def all_reduce(group):
                t = inputs[rank].clone()
                dist.all_reduce(t, op=op, group=group)
                return t
            check.same(check.against_gloo(all_reduce, "all_reduce " + what),
                       reference(inputs, op), "all_reduce " + what)

            root = size - 1

            def reduce(group):
                t = inputs[rank].clone()
                dist.reduce(t, root, op=op, group=group)
                return t if rank == root else inputs[rank]
            got = check.against_gloo(reduce, "reduce " + what)
            check.same(got, reference(inputs, op) if rank == root else inputs[rank],
                       "reduce " + what)

            if op in (R.SUM, R.MAX):
                blocks = [values(r, dtype, N * size) for r in range(size)]

                def reduce_scatter(group):
                    out = torch.empty(N, dtype=dtype)
                    dist.reduce_scatter(out, list(blocks[rank].chunk(size)), op=op, group=group)
                    return out
                got = check.against_gloo(reduce_scatter, "reduce_scatter " + what)
                check.same(got, reference(blocks, op).chunk(size)[rank], "reduce_scatter " + what)


def data_movement(rank, size, check):
    for dtype in DTYPES:
        mine = values(rank, dtype)
        everyone = [values(r, dtype) for r in range(size)]
        root = 1 % size

        def all_gather(group):
            out = [torch.empty(N, dtype=dtype) for _ in range(size)]
            dist.all_gather(out, mine, group=group)
            return torch.cat(out)
        check.same(check.against_gloo(all_gather, f"all_gather {dtype}"), torch.cat(everyone),
                   f"all_gather {dtype}")

        for source in range(size):  # every root: a host's leader or not (hierarchical)
            def broadcast(group):
                t = mine.clone()
                dist.broadcast(t, source, group=group)
                return t
            check.same(check.against_gloo(broadcast, f"broadcast {dtype} from {source}"),
                       everyone[source], f"broadcast {dtype} from {source}")

        def gather(group):
            out = [torch.empty(N, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(mine, out, dst=root, group=group)
            return torch.cat(out) if rank == root else mine
        check.same(check.against_gloo(gather, f"gather {dtype}"),
                   torch.cat(everyone) if rank == root else mine, f"gather {dtype}")

        def scatter(group):
            out = torch.empty(N, dtype=dtype)
            parts = list(values(root, dtype, N * size).chunk(size)) if rank == root else None
            dist.scatter(out, parts, src=root, group=group)
            return out
        check.same(check.against_gloo(scatter, f"scatter {dtype}"),
                   values(root, dtype, N * size).chunk(size)[rank], f"scatter {dtype}")

        def all_to_all_single(group):
            out = torch.empty(N * size, dtype=dtype)
            dist.all_to_all_single(out, values(rank, dtype, N * size), group=group)
            return out
        want = torch.cat([values(r, dtype, N * size).chunk(size)[rank] for r in range(size)])
        check.same(check.against_gloo(all_to_all_single, f"all_to_all_single {dtype}"), want,
                   f"all_to_all_single {dtype}")


def shapes_and_work(rank, size, check):
    # Non-contiguous tensors: a transposed matrix and a strided column, results in place.
    grid = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (rank + 1)
    assert not grid.is_contiguous()
    dist.all_reduce(grid)
    check.same(grid, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * sum(range(1, size + 1)),
               "all_reduce of a transposed tensor")
    column = torch.zeros(4, 3, dtype=torch.int64)
    target = column[:, 1]
    if rank == 0:
        target.copy_(torch.tensor([5, 6, 7, 8]))
    dist.broadcast(target, 0)
    check.same(column[:, 1], torch.tensor([5, 6, 7, 8]), "broadcast into a strided column")
    check.same(column[:, 0], torch.zeros(4, dtype=torch.int64), "the column's neighbours")
    # Complex tensors: torch hands the backend their float view (SUM).
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (rank + 1)
    dist.all_reduce(z)
    check.same(torch.view_as_real(z), torch.view_as_real(
        torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * sum(range(1, size + 1))),
        "all_reduce complex64")
    # Async work objects.
    t = torch.ones(8)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    check.same(torch.tensor([work.is_completed()]), torch.tensor([True]), "is_completed")
    check.same(t, torch.full((8,), float(size)), "async all_reduce")
    fut = dist.all_reduce(torch.ones(2), async_op=True).get_future()
    check.same(fut.wait()[0], torch.full((2,), float(size)), "work.get_future()")
    # Point to point: a ring with isend/irecv of a non-contiguous receive, then recv from any.
    if size > 1:
        recv = torch.zeros(6, 2)[:, 0]
        reqs = [dist.isend(torch.full((6,), float(rank)), (rank + 1) % size),
                dist.irecv(recv, (rank - 1) % size)]
        for r in reqs:
            r.wait()
        check.same(recv, torch.full((6,), float((rank - 1) % size)), "isend/irecv ring")
        if rank == 0:
            got = sorted(dist.recv(torch.zeros(1), tag=9) for _ in range(size - 1))
            check.same(torch.tensor(got), torch.arange(1, size), "recv from any source")
        else:
            dist.send(torch.ones(1), 0, tag=9)
    # The object collectives (pickles in uint8 tensors, sizes in int64 ones).
    objs = [{"from": 0, "list": [1, 2]}, "text"] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    check.same(torch.tensor([objs[0]["list"] == [1, 2] and objs[1] == "text"]),
               torch.tensor([True]), "broadcast_object_list")
    gathered = [None] * size if rank == 0 else None
    dist.gather_object(("rank", rank), gathered, dst=0)
    if rank == 0:
        check.same(torch.tensor([g[1] for g in gathered]), torch.arange(size), "gather_object")
    got = [None]
    dist.scatter_object_list(got, [f"to {r}" for r in range(size)] if rank == 0 else None, src=0)
    check.same(torch.tensor([got[0] == f"to {rank}"]), torch.tensor([True]), "scatter_object_list")
    # new_group over the even ranks (every rank calls it).
    members = list(range(0, size, 2))
    group = dist.new_group(members)
    t = torch.tensor([float(rank)])
    if rank in members:
        dist.all_reduce(t, group=group)
        check.same(t, torch.tensor([float(sum(members))]), "new_group all_reduce")
    dist.barrier()
    # Unsupported calls fail clearly, and the group stays usable.
    check.raises(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), "not supported",
                 "int16")
    # all_to_all_single with uneven splits: rank r sends peer j (r + j) % 3 + 1 rows of 2.
    splits = [(rank + j) % 3 + 1 for j in range(size)]

    def uneven(group):
        mine = torch.arange(sum(splits) * 2, dtype=torch.float64).reshape(-1, 2) + 100 * rank
        out = torch.empty(sum(splits), 2, dtype=torch.float64)
        dist.all_to_all_single(out, mine, splits, splits, group=group)
        return out
    want = []
    for peer in range(size):
        theirs = [(peer + j) % 3 + 1 for j in range(size)]
        rows = torch.arange(sum(theirs) * 2, dtype=torch.float64).reshape(-1, 2) + 100 * peer
        want.append(rows[sum(theirs[:rank]):sum(theirs[:rank + 1])])
    check.same(check.against_gloo(uneven, "all_to_all_single uneven"), torch.cat(want),
               "all_to_all_single uneven")
    check.raises(lambda: dist.all_reduce(torch.ones(2), op=R.BAND), "bitwise", "BAND on floats")
    t = torch.ones(1)
    dist.all_reduce(t)
    check.same(t, torch.tensor([float(size)]), "usable after the errors")


def run(rank, size):
    global GLOO
    assert dist.get_backend() == "drun", dist.get_backend()
    GLOO = dist.new_group(list(range(size)), backend="gloo")
    check = Check(rank)
    reductions(rank, size, check)
    data_movement(rank, size, check)
    shapes_and_work(rank, size, check)
    print(f"MATRIX rank={rank} checks={check.count} gloo={check.gloo} "
          f"gloo_refused={check.gloo_refused}", flush=True)


if __name__ == "__main__":
    dist_env.main(run)
