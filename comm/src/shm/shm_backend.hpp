// The shared-memory backend's factory (shm_backend.cpp): a Backend for `size` ranks that all run
// on this host, connected through `store` (a prefix reserved for the communicator). Throws
// CommError on every rank when the segment cannot be shared.
#pragma once

#include "backend.hpp"
#include "shm/shm_segment.hpp"

namespace drun::comm::detail {

std::unique_ptr<Backend> makeShmBackend(rdzv::Store& store, int rank, int size, milliseconds timeout,
                                        const ShmOptions& options);

}  // namespace drun::comm::detail
