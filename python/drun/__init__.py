"""drun's Python package: what drun gives the Python programs it runs.

Standard library only at import time; each submodule loads what it needs when imported:
  drun.worker  heartbeats and named sections for drun's hang detector
  drun.comm    libdrun_comm's collectives on Python buffers, through ctypes
  drun.torch   the "drun" backend of torch.distributed
"""
