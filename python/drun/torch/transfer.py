"""The exchange after a recovery: every rank says which step it committed last (one all_gather),
and when they differ the lowest rank with the highest step broadcasts its snapshot, serialized to
bytes in memory, to the others (its length, then the bytes as a uint8 tensor). Ranks already at
that step keep their own. Runs on the default process group, on the device its backend needs
(CUDA for nccl).
"""
import torch
import torch.distributed as dist

from .snapshot import Snapshot


def _device():
    if dist.get_backend() == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def exchange(snapshot):
    """Returns the snapshot this rank must adopt, or None when its own is the newest (or when no
    rank has one). Every rank of the default group calls it at the same point."""
    device = _device()
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([snapshot.step if snapshot is not None else -1], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(gathered, mine)
    steps = [int(t.item()) for t in gathered]
    newest = max(steps)
    if newest < 0 or all(s == newest for s in steps):
        return None
    source = steps.index(newest)  # the lowest rank that has it
    data = snapshot.encode() if rank == source else b""
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(length, source)
    if rank == source:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, source)
    if steps[rank] == newest:
        return None
    return Snapshot.decode(payload.cpu().numpy().tobytes())
