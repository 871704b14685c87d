// copyBytes: memcpy for the shared-memory transport's bulk copies, through AVX2 loads and stores
// instead of glibc's `rep movsb` (where the CPU has no AVX2: memcpy).
//
// Why: glibc's memcpy copies blocks from 2 KiB up to its non-temporal threshold with `rep movsb`,
// which on AMD EPYC VMs is several times slower for some placements of source and destination
// (which placements hit it changes from run to run; figures: docs/benchmarks/comm.md). Same
// semantics as memcpy: no overlap.
#pragma once

#include <cstddef>

namespace drun::comm::detail {

void copyBytes(void* dst, const void* src, size_t n);
// copyBytes for a copy into the operation's result that this operation does not read again
// (the own block of an all_gather): from 4 MiB with non-temporal stores, which skip the cache
// and the read of each destination line before its write.
void copyToResult(void* dst, const void* src, size_t n);

}  // namespace drun::comm::detail
