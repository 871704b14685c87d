#!/usr/bin/python3
"""DistributedDataParallel on the backend "drun" against "gloo": the same small MLP, seed and
per-rank data trained twice in one job, once with DDP over the drun world, once over a gloo group
of the same ranks. The loss curves must agree to float tolerance (the two backends may sum the
gradients in different orders), and after training every rank must hold the same parameters as
rank 0 (checked bit for bit with drun's own broadcast).

Run with TUTORIAL_BACKEND=drun. Prints `DDP rank=R steps=S loss_diff=D param_diff=P
ranks_equal=1 last_loss=L` or exits 1 naming what differed.
"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import dist_env

STEPS = 12


def train(rank, group, hook=None, steps=STEPS):
    """`steps` steps of DDP over `group` (None: the default group); `hook(ddp)` may register a
    comm hook. Returns the losses and the parameters."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    ddp = DDP(model, process_group=group)
    if hook:
        hook(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own partition
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=data)
        y = x.sum(1, keepdim=True)
        opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, torch.cat([p.detach().flatten() for p in model.parameters()])


def run(rank, size):
    gloo = dist.new_group(list(range(size)), backend="gloo")
    drun_losses, drun_params = train(rank, None)  # the default group: drun
    gloo_losses, gloo_params = train(rank, gloo)
    loss_diff = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(drun_losses, gloo_losses))
    param_diff = (drun_params - gloo_params).abs().max().item()
    if loss_diff > 1e-4 or param_diff > 1e-4:
        sys.exit(f"DDP rank={rank} drun and gloo differ: losses {drun_losses} vs {gloo_losses}, "
                 f"largest parameter difference {param_diff}")
    if drun_losses[-1] > drun_losses[0] / 2:
        sys.exit(f"DDP rank={rank} did not learn: {drun_losses}")
    rank0 = drun_params.clone()
    dist.broadcast(rank0, 0)
    equal = int(torch.equal(rank0, drun_params))
    if not equal:
        sys.exit(f"DDP rank={rank} parameters differ from rank 0's after training")
    print(f"DDP rank={rank} steps={STEPS} loss_diff={loss_diff:.3g} param_diff={param_diff:.3g} "
          f"ranks_equal={equal} last_loss={drun_losses[-1]:.6g}", flush=True)


if __name__ == "__main__":
    dist_env.main(run)
