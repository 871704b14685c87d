// NUMA binding (--numa-binding, torchrun 2.9's flag): the CPUs and the memory nodes each local
// rank is bound to, computed once from the machine's topology as hwloc reads it.
//
// A local rank's domain is a NUMA node: rank r of N over the D NUMA nodes that have CPUs takes
// node r*D/N (consecutive ranks share a node, as GPUs numbered in NUMA order do). Then:
//   node          every CPU of that NUMA node
//   socket        every CPU of the package (socket) holding that node
//   exclusive     the node's cores split evenly among the ranks on that node (lower ranks get the
//                 extra core), each core with all of its hardware threads
//   core-complex  one group of cores sharing the last-level cache (L3) inside that node, a
//                 different one per rank on the node while there are enough (largest first)
// Memory: bound (MPOL_BIND) to the rank's node (socket: the package's nodes) where hwloc says
// this system supports binding a process's memory; the plan says whether it does.
// On this machine, only the CPUs drun may run on count (its own affinity and cpuset).
//
// Threading: pure functions of their arguments and the topology; any thread.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace drun::agent {

enum class NumaMode { Off, Node, Socket, Exclusive, CoreComplex };

// "node" | "socket" | "exclusive" | "core-complex"; nullopt for anything else.
std::optional<NumaMode> parseNumaMode(std::string_view text);
const char* toString(NumaMode mode);

// What one local rank is bound to. Empty cpus: not bound.
struct RankBinding {
  std::vector<int> cpus;      // logical CPU numbers (the kernel's), ascending
  std::vector<int> memNodes;  // NUMA node numbers its memory is bound to; empty: memory not bound
};

struct NumaPlan {
  std::vector<RankBinding> ranks;  // by local rank
  bool thisSystem = false;         // the topology is this machine's (its CPUs can be bound here)
  bool bindsMemory = false;        // hwloc can bind a thread's memory here (memNodes are applied)
  std::string source;              // "this machine", or the XML file it was read from
};

struct TopologySource {
  // An hwloc XML topology to plan on instead of this machine's (tests); empty: HWLOC_XMLFILE when
  // set, as hwloc reads it, else this machine. A topology read from XML is not this system's
  // (unless HWLOC_THISSYSTEM=1 says so): nothing is bound by memory.
  std::filesystem::path xml;
};

// The plan for `localWorkers` ranks. Throws drun::Error naming what failed: the topology that
// could not be read (a missing or malformed XML file), a node with fewer cores than ranks
// (exclusive), a rank left without CPUs.
NumaPlan planNumaBinding(NumaMode mode, int localWorkers, const TopologySource& source = {});

// "0-3,8,10-11": a CPU or node list as taskset and /sys write them.
std::string describeList(const std::vector<int>& values);

}  // namespace drun::agent
