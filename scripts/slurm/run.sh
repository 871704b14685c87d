#!/bin/bash
# Seed 000's run.sh, done with drun. The original computed the torch.distributed environment by
# hand, one process per node:
#     export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
#     export MASTER_PORT=12345
#     export WORLD_SIZE=$SLURM_NTASKS
#     export RANK=$SLURM_PROCID
#     python main.py
# With drun, the same launch line (one task per node) runs NPROC_PER_NODE workers per node, with
# RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT set for each, restarts on
# failure if asked (--max-restarts), and one summary naming the failed rank:
#     srun -N 2 --ntasks-per-node=1 --time=1:00:00 bash scripts/slurm/run.sh scripts/slurm/main.py
# (main.py needs torch: DRUN_PYTHON=/usr/bin/python3 picks the interpreter that has it.)
set -e
exec "${DRUN:-drun}" --nproc-per-node "${NPROC_PER_NODE:-1}" "$@"
