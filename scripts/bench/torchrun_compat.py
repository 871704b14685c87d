#!/usr/bin/python3
"""torchrun (PyTorch 1.13, Debian's python3-torch) made runnable on Python 3.11, for the benchmarks.

    /usr/bin/python3 scripts/bench/torchrun_compat.py [torchrun options] PROGRAM [ARGS...]

1.13's Std.from_str maps "0" to None on Python 3.11 (iterating an IntFlag no longer yields the
zero member), and torchrun then crashes while parsing the default --redirects/--tee. This wrapper
maps None to Std.NONE and calls torch.distributed.run.main with the arguments unchanged.
"""
import sys

from torch.distributed.elastic.multiprocessing import api

_original_from_str = api.Std.from_str.__func__


def _from_str(cls, vm):
    value = _original_from_str(cls, vm)
    if value is None:
        return api.Std.NONE
    if isinstance(value, dict):
        return {rank: api.Std.NONE if std is None else std for rank, std in value.items()}
    return value


api.Std.from_str = classmethod(_from_str)

from torch.distributed import run  # noqa: E402  (after the patch, which run imports)

if __name__ == "__main__":
    run.main(sys.argv[1:])
