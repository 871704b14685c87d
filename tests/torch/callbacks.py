#!/usr/bin/python3
"""Collectives issued from a Work's Future callback on the backend "drun": they run, a callback
that raises hands its error to the waiter, a callback that blocks the group cannot make another
wait hang past the group's timeout, and DDP with powerSGD_hook (whose callbacks issue and wait
for all_reduces) trains as it does on gloo.

    callbacks.py STORE_FILE [CHECK ...]     (RANK, WORLD_SIZE in the environment)
    CHECK: nested raises blocked powersgd   (default: all)

Prints `CALLBACKS rank=R check=NAME ok=1 seconds=S` per check (ok=0 and `error=...` when it did
not hold), or `CALLBACKS rank=R check=NAME hung=1` and exits 3 when a check did not end within
HANG_S: a deadlock shows up as a failure, never as a hang.
"""
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

import ddp_compare
import drun.torch  # noqa: F401 (registers "drun")

HANG_S = 60.0
BLOCKED_TIMEOUT_S = 2.0  # the group timeout of the "blocked" check


def nested(rank, size):
    """The minimal form: a callback issues a second all_reduce and waits for its Future; also
    two levels deep, and with the caller waiting on the Work (which may run the first collective
    on the caller's thread) instead of the Future."""
    n = 1024
    a, b, c = (torch.full((n,), float(rank + 1)) for _ in range(3))
    expected = n * size * (size + 1) / 2
    fut = dist.all_reduce(a, async_op=True).get_future().then(
        lambda f: dist.all_reduce(b, async_op=True).get_future().wait()[0].sum().item())
    one = fut.wait() == expected

    def deeper(_):
        inner = dist.all_reduce(c, async_op=True).get_future().then(
            lambda f: dist.all_reduce(f.value()[0], async_op=True).get_future().wait()[0])
        return inner.wait().sum().item()

    d = torch.full((n,), float(rank + 1))
    work = dist.all_reduce(d, async_op=True)
    fut2 = work.get_future().then(deeper)
    work.wait()
    two = fut2.wait() == expected * size  # c reduced twice
    return one and two and bool((d == expected / n).all())


def raises(rank, size):
    """A callback that raises: the waiter gets its error, and the group goes on working."""
    def boom(_):
        raise ValueError("callback failed on purpose")

    fut = dist.all_reduce(torch.ones(8), async_op=True).get_future().then(boom)
    try:
        fut.wait()
        return False
    except Exception as e:  # torch 1.13 raises the callback's error as RuntimeError
        if "callback failed on purpose" not in str(e):
            raise
    t = torch.ones(8)
    dist.all_reduce(t)
    return bool((t == size).all())


def blocked(rank, size):
    """A callback that blocks the group's queue (it waits for something that never comes in
    time): an all_reduce issued meanwhile fails within the group's timeout, naming itself,
    instead of waiting behind the callback."""
    group = dist.new_group(list(range(size)), backend="drun",
                           timeout=datetime.timedelta(seconds=BLOCKED_TIMEOUT_S))
    release = threading.Event()
    entered = threading.Event()

    def hold(_):
        entered.set()
        release.wait(4 * BLOCKED_TIMEOUT_S)
        return 0

    held = dist.all_reduce(torch.ones(4), group=group, async_op=True).get_future().then(hold)
    entered.wait(HANG_S)
    start = time.monotonic()
    later = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    try:
        later.get_future().wait()
        message = ""
    except RuntimeError as e:
        message = str(e)
    elapsed = time.monotonic() - start
    release.set()
    held.wait()
    ok = "all_reduce" in message and elapsed < 2 * BLOCKED_TIMEOUT_S + 1
    if not ok:
        print(f"CALLBACKS rank={rank} check=blocked message={message!r} elapsed={elapsed:.2f}",
              flush=True)
    return ok


def powersgd_hook(group):
    """Registers powerSGD_hook on a DDP model: rank 1, from the second step on."""
    def register(ddp):
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2, min_compression_rate=0.5,
                                       random_seed=0)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    return register


def train(rank, group, hook):
    """ddp_compare's model and data, 8 steps. With powerSGD on 4 ranks, shared memory's sums
    (in another order than gloo's ring) stay within 1e-7 of gloo's up to step 11, then one bias
    jumps 5e-4 apart at step 12; with drun's Gloo transport, which sums in gloo's order, the two
    agree bit for bit at every step: rounding amplified, not a wrong result."""
    return ddp_compare.train(rank, group, hook=powersgd_hook(group) if hook else None, steps=8)


def powersgd(rank, size):
    """DDP with powerSGD_hook on drun and on gloo: the same losses and parameters, which differ
    from plain DDP's (the hook compressed the gradients)."""
    gloo = dist.new_group(list(range(size)), backend="gloo")
    drun_losses, drun_params = train(rank, None, True)
    gloo_losses, gloo_params = train(rank, gloo, True)
    _, plain_params = train(rank, None, False)
    loss_diff = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(drun_losses, gloo_losses))
    param_diff = (drun_params - gloo_params).abs().max().item()
    compressed = (drun_params - plain_params).abs().max().item()
    ok = loss_diff <= 1e-4 and param_diff <= 1e-4 and compressed > 1e-4
    print(f"CALLBACKS rank={rank} check=powersgd_detail loss_diff={loss_diff:.3g} "
          f"param_diff={param_diff:.3g} vs_plain={compressed:.3g}", flush=True)
    return ok


CHECKS = {"nested": nested, "raises": raises, "blocked": blocked, "powersgd": powersgd}


def main():
    path, names = sys.argv[1], sys.argv[2:] or list(CHECKS)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("drun", init_method="file://" + path, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=30))
    for name in names:
        def hung(name=name):
            print(f"CALLBACKS rank={rank} check={name} hung=1", flush=True)
            os._exit(3)

        timer = threading.Timer(HANG_S, hung)
        timer.daemon = True
        timer.start()
        start = time.monotonic()
        try:
            ok, error = CHECKS[name](rank, size), ""
        except Exception as e:
            ok, error = False, f" error={type(e).__name__}:{str(e)[:200]!r}"
        timer.cancel()
        print(f"CALLBACKS rank={rank} check={name} ok={int(ok)} "
              f"seconds={time.monotonic() - start:.2f}{error}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
