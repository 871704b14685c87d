// The static rendezvous (--rdzv-backend static): a fixed set of nodes that never changes, like
// torchrun's static backend, but without a store: every node knows its place from its options.
//
// --node-rank is required and --nnodes must be a single number N (no MIN:MAX); MASTER_ADDR and
// MASTER_PORT come from --master-addr (default 127.0.0.1) and --master-port (default 29500).
// Ranks assume every node runs the same number of workers: WORLD_SIZE = N * nproc-per-node and
// RANK offset = node rank * nproc-per-node (nodes with different counts need the c10d backend).
// Nothing to watch: the only job events are this node's own (LocalJob).
//
// Threading: next()/leave() from one thread. Ownership: holds nothing but its options.
#pragma once

#include <memory>

#include "drun/rendezvous/rendezvous.hpp"

namespace drun::rdzv {

inline constexpr uint16_t kDefaultStaticMasterPort = 29500;

// Throws InvalidArgument for a missing or out-of-range node rank, or an elastic node count.
std::unique_ptr<Rendezvous> makeStaticRendezvous(const RendezvousOptions& options);

}  // namespace drun::rdzv
