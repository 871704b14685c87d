// The hierarchical backend: ranks on several hosts. Within a host the ranks share memory (a shm
// backend per host); among hosts, one leader per host (its lowest rank) talks over Gloo; every
// rank is also in a full Gloo mesh for what is not hierarchical.
//   all_reduce  shm reduce to the leader, all_reduce among leaders, shm broadcast; from 1 MiB
//               on hosts of equal size L: shm reduce_scatter, L all_reduces of 1/L each (ranks
//               of the same local index across hosts), shm all_gather. The all_reduce among
//               hosts is two exchanges of Gloo point to point (each host sums its chunk, then
//               sends it to all), every receive posted before the shm step
//   broadcast   shm broadcast on the root's host (root -> its leader), Gloo broadcast among
//               leaders, shm broadcast on the other hosts; from 1 MiB on two hosts of equal
//               size: the root sends pieces to its peer on the other host, which passes each
//               round its host over shm while the next is on the wire
//   (point to point among hosts travels on two meshes, one a direction: see "Lanes" in
//   docs/comm.md)
//   all_gather  shm gather to the leader, Gloo all_gather among leaders (blocks padded to the
//               largest host), shm broadcast of the result; from 4 MiB in all on hosts of
//               equal size: each rank sends its block to and receives the blocks of the ranks
//               of its local index on the other hosts (Gloo point to point, straight into
//               place) while its host all_gathers its own blocks over shm, then shm all_gathers
//               of the other hosts' blocks
//   reduce_scatter  on hosts of equal size: shm reduce_scatters of each host's blocks, the
//               other hosts' sums sent to their ranks of my local index (Gloo point to point)
//               while my host's is summed, and what arrives added; else the full Gloo mesh
//   barrier     shm barrier, Gloo barrier among leaders, shm barrier
//   the rest: the full Gloo mesh
//   send/recv   a peer on this host over the segment, one elsewhere over the full mesh (HierP2P)
// hostOfRank: each rank's host identity (TransportPlan). Threading and ownership: a Backend's.
#pragma once

#include <string>
#include <vector>

#include "backend.hpp"
#include "shm/shm_segment.hpp"

namespace drun::comm::detail {

std::unique_ptr<Backend> makeHierarchicalBackend(std::shared_ptr<rdzv::Store> store, int rank,
                                                 const std::vector<std::string>& hostOfRank,
                                                 milliseconds timeout, const ShmOptions& shm,
                                                 std::shared_ptr<GlooDevice> device);

}  // namespace drun::comm::detail
