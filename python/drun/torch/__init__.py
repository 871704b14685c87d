"""drun.torch: torch.distributed's backend "drun", on libdrun_comm (shared memory within a host,
Gloo across hosts). Importing this module registers it; then one word changes:

    import torch.distributed as dist
    import drun.torch
    dist.init_process_group("drun", init_method="env://")   # or tcp://, file://, store=...
    dist.all_reduce(tensor)

CPU tensors of float32/64, float16, bfloat16, int8, uint8, int32, int64 and bool (contiguous or
not); reduce ops SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR; new_group; timeouts from
init_process_group's `timeout`; drun's errors as RuntimeError (a dead peer named). CUDA tensors
raise a clear error (use "nccl" for them).
"""
import torch.distributed as _dist  # registers the Store / ProcessGroup types _backend uses

try:
    from . import _backend
except ImportError as e:  # the build found no libtorch-dev / pybind11-dev / python3-dev
    raise ImportError(f"drun.torch: the compiled backend is missing or unloadable ({e}); build "
                      "drun with libtorch-dev, pybind11-dev and python3-dev installed") from e

BACKEND = "drun"


def _create(store, rank, size, timeout):
    return _backend.create_process_group(store, rank, size, timeout)


def transport(group=None):
    """How the ranks of a drun process group talk: 'shm', 'tcp' or 'hierarchical'."""
    return _backend.transport(group if group is not None else _dist.distributed_c10d._get_default_group())


if not hasattr(_dist.Backend, BACKEND.upper()):  # importing twice (reload) registers once
    _dist.Backend.register_backend(BACKEND, _create)
