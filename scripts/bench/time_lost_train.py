#!/usr/bin/python3
"""The training program of scripts/bench/time_lost.sh: the pytorch/examples DDP tutorial's shape
(ToyModel: Linear(10, 10), ReLU, Linear(10, 5); SGD lr 0.001; MSE loss on a batch of 20 random
inputs), written once with drun.torch's recovery API and run unchanged under torchrun, drun
`--recovery restart` and drun `--recovery in-process`:

    time_lost_train.py --backend gloo|drun --steps N --log FILE --snapshot FILE
                       [--step-ms 50] [--snapshot-every 20] [--seed 0]

- Step s (1-based) of rank r trains on data drawn from a generator seeded with (seed, s, r), so
  every mode sees the same data at the same step, whatever it redoes.
- Each step is padded with a sleep to --step-ms from its start (the tutorial's model alone takes
  well under a millisecond).
- Every --snapshot-every committed steps rank 0 writes the model, the optimizer and the step to
  --snapshot (a temporary file renamed over it). A process whose state.track() brought no
  committed state (a fresh start: outside drun, under --recovery restart, or after a fallback to
  a restart) loads that snapshot itself.
- Each rank appends one line per event to --log (O_APPEND; one short write per line, so lines of
  concurrent ranks do not interleave):

      START <rank> <pid> <wall time> <TORCHELASTIC_RESTART_COUNT> <DRUN_GENERATION>
      BOOT <rank> <pid> <wall time>   when the interpreter began this file (before its imports;
                                      a standby worker's long before its rank was assigned)
      INIT <rank> <pid> <wall time>   dist.init_process_group returned
      TRACK <rank> <pid> <wall time>  each entry into train(), before state.track()
      ENTER <rank> <pid> <wall time> <step> <generation>   each entry into train(), its state
                                                          loaded (generation: state.generation
                                                          where the API has it, else "-")
      STEP <rank> <step> <wall time> <pid> <sha1>     after state.commit() of that step
      END <rank> <step> <wall time> <pid> <sha1>      train() returned

  (sha1: of the parameters, 16 hex digits; equal on every rank at one step.)

With drun.torch (python/drun/torch) the API is drun.torch.resilient and drun.torch.State; where
drun.torch cannot be imported or has no `resilient` (a drun built without torch, or a tree
without the API), the same code runs through a stand-in that calls the function once with a
plain State: the behaviour the API has outside drun.
"""
import time as _time

_BOOT = _time.time()  # before the imports: what they cost is START - BOOT

import argparse
import datetime
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import drun.torch as drun_torch
except ImportError:
    drun_torch = None

BATCH = 20


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class _PlainState:
    """What drun.torch.State does outside drun: a step counter; track() loads nothing."""

    def __init__(self):
        self.step = 0

    def track(self, **objects):
        for name, obj in objects.items():
            if not hasattr(obj, "state_dict"):
                raise TypeError(f"state.track: {name} has no state_dict()")

    def commit(self):
        self.step += 1


def _run_once(fn):
    def call(*args, **kwargs):
        return fn(_PlainState(), *args, **kwargs)
    return call


resilient = getattr(drun_torch, "resilient", None) or _run_once


class EventLog:
    def __init__(self, path, rank):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.rank = rank

    def write(self, kind, *words):
        line = " ".join([kind, str(self.rank), *map(str, words)]) + "\n"
        os.write(self.fd, line.encode())


def batch_for(seed, step, rank):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(BATCH, 10, generator=g), torch.randn(BATCH, 5, generator=g)


def parameters_sha1(model):
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def save_snapshot(path, step, model, optimizer):
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
               tmp)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("gloo", "drun"), required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--snapshot", required=True)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--snapshot-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.backend == "drun" and drun_torch is None:
        sys.exit("time_lost_train.py: --backend drun needs drun.torch (PYTHONPATH)")
    rank = int(os.environ["RANK"])
    log = EventLog(a.log, rank)
    log.write("START", os.getpid(), f"{time.time():.6f}",
              os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
              os.environ.get("DRUN_GENERATION", "-"))
    log.write("BOOT", os.getpid(), f"{_BOOT:.6f}")
    dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=60))
    log.write("INIT", os.getpid(), f"{time.time():.6f}")

    @resilient
    def train(state):
        torch.manual_seed(0)  # the same initial parameters in every mode
        log.write("TRACK", os.getpid(), f"{time.time():.6f}")
        model = DDP(ToyModel())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
        state.track(model=model, optimizer=optimizer)
        if state.step == 0 and os.path.exists(a.snapshot):
            snap = torch.load(a.snapshot)
            model.load_state_dict(snap["model"])
            optimizer.load_state_dict(snap["optimizer"])
            state.step = snap["step"]
        log.write("ENTER", os.getpid(), f"{time.time():.6f}", state.step,
                  getattr(state, "generation", "-"))
        loss_fn = nn.MSELoss()
        while state.step < a.steps:
            begun = time.time()
            inputs, labels = batch_for(a.seed, state.step + 1, rank)
            optimizer.zero_grad()
            loss_fn(model(inputs), labels).backward()
            optimizer.step()
            rest = a.step_ms / 1e3 - (time.time() - begun)
            if rest > 0:
                time.sleep(rest)
            state.commit()
            log.write("STEP", state.step, f"{time.time():.6f}", os.getpid(),
                      parameters_sha1(model))
            if rank == 0 and state.step % a.snapshot_every == 0:
                save_snapshot(a.snapshot, state.step, model, optimizer)
        log.write("END", state.step, f"{time.time():.6f}", os.getpid(), parameters_sha1(model))
        return model

    train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
