#!/usr/bin/python3
"""Distributed synchronous SGD (the "DDP under the hood" tutorial): every rank trains the same
model on its own partition of the data and averages the gradients with all_reduce before each
step, so the replicas stay identical. The data set is synthetic (a noisy linear function), made
from a fixed seed, so that the program needs no download.

Prints `SGD rank=R epoch=E loss=L` per epoch and `SGD rank=R params=<sha256 of the parameters>`:
equal digests on every rank prove the gradients were averaged (the partitions differ).
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.optim as optim

import dist_env

SAMPLES = 512
FEATURES = 8
EPOCHS = 4
BATCH = 64  # the global batch; each rank takes BATCH / world_size of it


def partition_dataset(rank, size):
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    w = torch.randn(FEATURES, 1, generator=generator)
    y = x @ w + 0.01 * torch.randn(SAMPLES, 1, generator=generator)
    mine = slice(rank * SAMPLES // size, (rank + 1) * SAMPLES // size)
    bsz = max(1, BATCH // size)
    data = torch.utils.data.TensorDataset(x[mine], y[mine])
    return torch.utils.data.DataLoader(data, batch_size=bsz, shuffle=False), bsz


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run(rank, size):
    torch.manual_seed(1234)
    train_set, _ = partition_dataset(rank, size)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    for epoch in range(EPOCHS):
        epoch_loss = 0.0
        for data, target in train_set:
            optimizer.zero_grad()
            loss = F.mse_loss(model(data), target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            optimizer.step()
        print(f"SGD rank={rank} epoch={epoch} loss={epoch_loss / len(train_set):.6f}", flush=True)
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().numpy().tobytes())
    print(f"SGD rank={rank} params={digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    dist_env.main(run)
