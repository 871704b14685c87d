"""drun's Python package: what drun gives the Python programs it runs.

Standard library only at import time; each submodule loads what it needs when imported:
  drun.worker  heartbeats and named sections for drun's hang detector
  drun.comm    libdrun_comm's collectives on Python buffers, through ctypes
  drun.torch   the "drun" backend of torch.distributed

In a standby worker of `drun --recovery in-process` (DRUN_STANDBY set), importing drun waits
until the agent assigns the process a rank (drun._standby): the program then goes on as that
rank, with what it imported before already loaded.
"""
import os as _os

if _os.environ.get("DRUN_STANDBY"):
    from . import _standby

    _standby.wait()
