#!/usr/bin/python3
"""torchrun (PyTorch 1.13, Debian's python3-torch) made runnable on Python 3.11, for the benchmarks.

    /usr/bin/python3 scripts/bench/torchrun_compat.py [torchrun options] PROGRAM [ARGS...]

1.13's Std.from_str maps "0" and "3" to None on Python 3.11 (iterating an IntFlag no longer
yields the zero member nor composite ones): torchrun then crashes while parsing the default
--redirects/--tee, and -r 3 / -t 3 would do nothing. This wrapper computes Std(value) and calls
torch.distributed.run.main with the arguments unchanged.
"""
import sys

from torch.distributed.elastic.multiprocessing import api

_original_from_str = api.Std.from_str.__func__


def _from_str(cls, vm):
    value = _original_from_str(cls, vm)  # checks the syntax (ValueError), as in 1.13
    # Iterating Std on 3.11 yields neither NONE (0) nor ALL (3, a composite): 1.13 maps both to
    # None. Std(int) gives every value.
    if isinstance(value, dict):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    return api.Std(int(vm))


api.Std.from_str = classmethod(_from_str)

from torch.distributed import run  # noqa: E402  (after the patch, which run imports)

if __name__ == "__main__":
    run.main(sys.argv[1:])
