#!/usr/bin/python3
"""Point-to-point communication (the tutorials' send/recv, then isend/irecv).

Blocking: rank 0 sends a tensor holding 1 to every other rank (the 4-rank tutorial's loop).
Non-blocking: a ring; rank r sends (r + 1) * 10 to rank r + 1 and receives from rank r - 1.
Prints `P2P rank=R recv=V ring=W`.
"""
import torch
import torch.distributed as dist

import dist_env


def run(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        for other_rank in range(1, size):  # blocking: returns when the peer has the data
            dist.send(tensor=tensor, dst=other_rank)
    else:
        dist.recv(tensor=tensor, src=0)

    outgoing = torch.tensor([float((rank + 1) * 10)])
    incoming = torch.zeros(1)
    requests = [dist.isend(tensor=outgoing, dst=(rank + 1) % size),
                dist.irecv(tensor=incoming, src=(rank - 1) % size)]
    for req in requests:  # after wait() the communication took place
        req.wait()
    print(f"P2P rank={rank} recv={tensor[0].item():g} ring={incoming[0].item():g}", flush=True)


if __name__ == "__main__":
    dist_env.main(run)
