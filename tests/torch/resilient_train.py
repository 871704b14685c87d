#!/usr/bin/python3
"""The DDP tutorial's model (pytorch/examples: ToyModel, Linear(10,10) ReLU Linear(10,5), SGD)
trained under @drun.torch.resilient, the data of each step a function of (step, rank) only, so
that a run through recoveries must end with the parameters of a run without a failure.

    TRAIN_BACKEND   drun (default) | gloo
    TRAIN_STEPS     steps to train (default 40)
    TRAIN_KILL_READY  1: before it SIGKILLs itself, a rank waits (60 s at most) until a standby
                    worker of its node is ready (a process holds a standby_* FIFO of the attempt
                    open: docs/recovery.md, "Standby workers")
    TRAIN_KILL      "R:S[,R:S...]": rank R SIGKILLs itself as step S begins; only a process of
                    the job's first attempt (TORCHELASTIC_RESTART_COUNT=0, DRUN_GENERATION=0)
    TRAIN_KILL_IN_RECOVERY  "R[,R...]": rank R SIGKILLs itself as soon as it sees generation 1
                    begin (a second death during the first recovery); first attempt only
    TRAIN_STEP_MS   a step takes at least this long (default 0): room for a node to be killed
                    while the job trains

After a shrink (state.on_resize) each rank prints `RESIZED rank=R from=N to=M pid=P`.

Prints, on every (re-)entry of the training function once the state is tracked,
`ENTER rank=R generation=G step=S sum=H equal=E pid=P` (H: a hash of the parameters, E: 1 when every
rank's hash is the same), and at the end `FINAL rank=R step=S sum=H`.
"""
import datetime
import hashlib
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import drun.torch

BACKEND = os.environ.get("TRAIN_BACKEND", "drun")
STEPS = int(os.environ.get("TRAIN_STEPS", "40"))
FIRST_ATTEMPT = (os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
                 and os.environ.get("DRUN_GENERATION", "0") == "0")
KILL_READY = os.environ.get("TRAIN_KILL_READY") == "1"
KILLS = {tuple(int(n) for n in kill.split(":")) for kill in os.environ.get("TRAIN_KILL", "").split(",") if kill}
KILLS_IN_RECOVERY = {int(r) for r in os.environ.get("TRAIN_KILL_IN_RECOVERY", "").split(",") if r}
STEP_SECONDS = int(os.environ.get("TRAIN_STEP_MS", "0")) / 1000
_killer = []


def kill_when_recovery_begins():
    """SIGKILLs this process within 5 ms of generation 1 beginning (once per process)."""
    from drun.torch import recovery

    def watch():
        while recovery.coordinator().newest() < 1:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)

    _killer.append(threading.Thread(target=watch, daemon=True))
    _killer[0].start()


def wait_for_standby():
    attempt = os.path.dirname(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fifos = {os.path.join(attempt, n) for n in os.listdir(attempt) if n.startswith("standby_")}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if any(os.readlink(f"/proc/{pid}/fd/{fd}") in fifos for fd in os.listdir(f"/proc/{pid}/fd")):
                    return
            except OSError:
                continue
        time.sleep(0.05)


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def digest(model):
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()
    return hashlib.sha256(flat).hexdigest()[:16]


def same_everywhere(text):
    mine = torch.tensor([int(text, 16) & ((1 << 62) - 1)], dtype=torch.int64)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return int(all(torch.equal(g, mine) for g in gathered))


@drun.torch.resilient
def train(state):
    torch.manual_seed(0)
    model = DDP(ToyModel())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state.track(model=model, optimizer=opt)
    state.on_resize(lambda s, old, new: print(f"RESIZED rank={s.rank} from={old} to={new} pid={os.getpid()}",
                                              flush=True))
    rank = state.rank
    if FIRST_ATTEMPT and rank in KILLS_IN_RECOVERY and not _killer:
        kill_when_recovery_begins()
    generation = os.environ.get("DRUN_GENERATION", "0")
    if dist.is_initialized():
        from drun.torch import recovery
        generation = recovery.coordinator().generation() if os.environ.get("DRUN_RECOVERY") == "in-process" else 0
    print(f"ENTER rank={rank} generation={generation} step={state.step} sum={digest(model.module)} "
          f"equal={same_everywhere(digest(model.module))} pid={os.getpid()}", flush=True)
    while state.step < STEPS:
        if FIRST_ATTEMPT and (rank, state.step) in KILLS:
            if KILL_READY:
                wait_for_standby()
            os.kill(os.getpid(), signal.SIGKILL)
        data = torch.Generator().manual_seed(1000 * state.step + rank)
        x, y = torch.randn(20, 10, generator=data), torch.randn(20, 5, generator=data)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if STEP_SECONDS:
            time.sleep(STEP_SECONDS)
        state.commit()
    return model.module, state.step


if __name__ == "__main__":
    dist.init_process_group(BACKEND, init_method="env://", timeout=datetime.timedelta(seconds=60))
    model, steps = train()
    print(f"FINAL rank={dist.get_rank()} step={steps} sum={digest(model)}", flush=True)
    dist.destroy_process_group()
