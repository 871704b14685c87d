#include "drun/agent/numa_binding.hpp"

#include <hwloc.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <system_error>

#include "drun/common/error.hpp"

namespace drun::agent {
namespace {

struct HwlocBitmapFree {
  void operator()(hwloc_bitmap_t b) const { hwloc_bitmap_free(b); }
};
using HwlocBitmap = std::unique_ptr<hwloc_bitmap_s, HwlocBitmapFree>;

HwlocBitmap bitmapAnd(hwloc_const_bitmap_t a, hwloc_const_bitmap_t b) {
  HwlocBitmap out(hwloc_bitmap_alloc());
  if (!out) throw Error("--numa-binding: out of memory");
  hwloc_bitmap_and(out.get(), a, b);
  return out;
}

std::vector<int> bitsOf(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

// The loaded topology and the CPUs a worker may be bound to (on this machine: drun's own).
class HwlocTopology {
 public:
  explicit HwlocTopology(const TopologySource& source) {
    if (hwloc_topology_init(&topo_) != 0)
      throw Error("--numa-binding: hwloc could not start: " + std::string(std::strerror(errno)));
    try {
      load(source);
    } catch (...) {
      hwloc_topology_destroy(topo_);
      throw;
    }
  }
  ~HwlocTopology() { hwloc_topology_destroy(topo_); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;

  hwloc_topology_t get() const { return topo_; }
  hwloc_const_bitmap_t allowed() const { return allowed_.get(); }
  const std::string& name() const { return name_; }
  bool thisSystem() const { return hwloc_topology_is_thissystem(topo_) == 1; }

  // Each object of `type` (cores, caches) with CPUs inside `within`: those CPUs, by first CPU.
  std::vector<HwlocBitmap> groupsIn(hwloc_obj_type_t type, hwloc_const_bitmap_t within) const {
    std::vector<HwlocBitmap> groups;
    for (int i = 0, n = hwloc_get_nbobjs_by_type(topo_, type); i < n; ++i) {
      HwlocBitmap part = bitmapAnd(hwloc_get_obj_by_type(topo_, type, i)->cpuset, within);
      if (!hwloc_bitmap_iszero(part.get())) groups.push_back(std::move(part));
    }
    std::sort(groups.begin(), groups.end(), [](const HwlocBitmap& a, const HwlocBitmap& b) {
      return hwloc_bitmap_first(a.get()) < hwloc_bitmap_first(b.get());
    });
    return groups;
  }

 private:
  void load(const TopologySource& source) {
    // HWLOC_XMLFILE is loaded here as hwloc would, except that a file hwloc cannot read is an
    // error, not a silent fallback to this machine.
    std::filesystem::path xml = source.xml;
    name_ = xml.string();
    const char* fromEnv = std::getenv("HWLOC_XMLFILE");
    if (xml.empty() && fromEnv && *fromEnv) {
      xml = fromEnv;
      name_ = xml.string() + " (HWLOC_XMLFILE)";
    }
    if (xml.empty()) name_ = "this machine";
    if (!xml.empty()) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(xml, ec))
        throw Error("--numa-binding: the topology file " + name_ + " is not a readable file");
      if (hwloc_topology_set_xml(topo_, xml.c_str()) != 0)
        throw Error("--numa-binding: hwloc cannot read the topology file " + name_ + ": " + std::strerror(errno));
    }
    if (hwloc_topology_load(topo_) != 0)
      throw Error("--numa-binding: hwloc could not load the topology of " + name_ + ": " + std::strerror(errno));
    allowed_.reset(hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(topo_)));
    if (!allowed_) throw Error("--numa-binding: out of memory");
    if (thisSystem()) {  // the CPUs drun itself may run on (taskset, a cpuset cgroup)
      HwlocBitmap mine(hwloc_bitmap_alloc());
      if (mine && hwloc_get_cpubind(topo_, mine.get(), HWLOC_CPUBIND_THREAD) == 0)
        hwloc_bitmap_and(allowed_.get(), allowed_.get(), mine.get());
    }
    if (hwloc_bitmap_iszero(allowed_.get()))
      throw Error("--numa-binding: the topology of " + name_ + " has no CPU drun may use");
  }

  hwloc_topology_t topo_ = nullptr;
  HwlocBitmap allowed_;
  std::string name_;
};

struct NumaDomain {
  hwloc_obj_t node;
  HwlocBitmap cpus;  // the node's CPUs a worker may use
};

// The NUMA nodes that have usable CPUs, in hwloc's (logical) order.
std::vector<NumaDomain> numaDomains(const HwlocTopology& topo) {
  std::vector<NumaDomain> domains;
  for (int i = 0, n = hwloc_get_nbobjs_by_type(topo.get(), HWLOC_OBJ_NUMANODE); i < n; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo.get(), HWLOC_OBJ_NUMANODE, i);
    HwlocBitmap cpus = bitmapAnd(node->cpuset, topo.allowed());
    if (!hwloc_bitmap_iszero(cpus.get())) domains.push_back({node, std::move(cpus)});
  }
  if (domains.empty())
    throw Error("--numa-binding: hwloc found no NUMA node with usable CPUs on " + topo.name());
  return domains;
}

// The deepest cache hwloc knows (L3 on most machines), or none.
std::optional<hwloc_obj_type_t> lastLevelCache(const HwlocTopology& topo) {
  for (hwloc_obj_type_t type : {HWLOC_OBJ_L5CACHE, HWLOC_OBJ_L4CACHE, HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L2CACHE,
                                HWLOC_OBJ_L1CACHE})
    if (hwloc_get_nbobjs_by_type(topo.get(), type) > 0) return type;
  return std::nullopt;
}

// exclusive: the `index`-th of `count` even shares of the node's cores (a core: all its threads).
HwlocBitmap exclusiveShare(const HwlocTopology& topo, const NumaDomain& domain, int index, int count) {
  const hwloc_obj_type_t unit = hwloc_get_nbobjs_by_type(topo.get(), HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  std::vector<HwlocBitmap> cores = topo.groupsIn(unit, domain.cpus.get());
  const int per = static_cast<int>(cores.size()) / count, extra = static_cast<int>(cores.size()) % count;
  if (per < 1)
    throw Error("--numa-binding exclusive: NUMA node " + std::to_string(domain.node->os_index) + " of " +
                topo.name() + " has " + std::to_string(cores.size()) + " cores for " + std::to_string(count) +
                " local ranks");
  const int start = index * per + std::min(index, extra);
  const int end = start + per + (index < extra ? 1 : 0);
  HwlocBitmap share(hwloc_bitmap_alloc());
  for (int i = start; i < end; ++i) hwloc_bitmap_or(share.get(), share.get(), cores[i].get());
  return share;
}

// core-complex: one group of cores sharing the last-level cache, the largest groups first.
HwlocBitmap coreComplex(const HwlocTopology& topo, const NumaDomain& domain, int index) {
  std::optional<hwloc_obj_type_t> cache = lastLevelCache(topo);
  if (!cache) return HwlocBitmap(hwloc_bitmap_dup(domain.cpus.get()));  // no cache known: the node
  std::vector<HwlocBitmap> groups = topo.groupsIn(*cache, domain.cpus.get());
  if (groups.empty()) return HwlocBitmap(hwloc_bitmap_dup(domain.cpus.get()));
  std::stable_sort(groups.begin(), groups.end(), [](const HwlocBitmap& a, const HwlocBitmap& b) {
    return hwloc_bitmap_weight(a.get()) > hwloc_bitmap_weight(b.get());
  });
  return std::move(groups[index % groups.size()]);
}

}  // namespace

NumaPlan planNumaBinding(NumaMode mode, int localWorkers, const TopologySource& source) {
  NumaPlan plan;
  if (mode == NumaMode::Off || localWorkers <= 0) return plan;
  HwlocTopology topo(source);
  plan.source = topo.name();
  const hwloc_topology_support* support = hwloc_topology_get_support(topo.get());
  // The policy is set by the worker's only thread before execve: a thread's policy (Linux has no
  // other), which the process keeps.
  plan.thisSystem = topo.thisSystem();
  plan.bindsMemory = plan.thisSystem && support && support->membind->set_thisthread_membind &&
                     support->membind->bind_membind;
  const std::vector<NumaDomain> domains = numaDomains(topo);
  const int count = static_cast<int>(domains.size());
  auto domainOf = [&](int rank) { return static_cast<int>(static_cast<long long>(rank) * count / localWorkers); };

  for (int rank = 0; rank < localWorkers; ++rank) {
    const NumaDomain& domain = domains[domainOf(rank)];
    int first = rank, onNode = 0;  // the ranks that share this node: [first, first + onNode)
    while (first > 0 && domainOf(first - 1) == domainOf(rank)) --first;
    while (first + onNode < localWorkers && domainOf(first + onNode) == domainOf(rank)) ++onNode;

    HwlocBitmap cpus, memNodes(hwloc_bitmap_dup(domain.node->nodeset));
    switch (mode) {
      case NumaMode::Node: cpus.reset(hwloc_bitmap_dup(domain.cpus.get())); break;
      case NumaMode::Socket: {
        hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(topo.get(), HWLOC_OBJ_PACKAGE, domain.node);
        if (!package) package = hwloc_get_root_obj(topo.get());
        cpus = bitmapAnd(package->cpuset, topo.allowed());
        memNodes.reset(hwloc_bitmap_dup(package->nodeset));
        break;
      }
      case NumaMode::Exclusive: cpus = exclusiveShare(topo, domain, rank - first, onNode); break;
      case NumaMode::CoreComplex: cpus = coreComplex(topo, domain, rank - first); break;
      case NumaMode::Off: break;
    }
    if (!cpus || hwloc_bitmap_iszero(cpus.get()))
      throw Error("--numa-binding " + std::string(toString(mode)) + ": local rank " + std::to_string(rank) +
                  " gets no CPU on " + topo.name());
    plan.ranks.push_back({bitsOf(cpus.get()), bitsOf(memNodes.get())});
  }
  return plan;
}

std::string describeList(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(values[i]);
    if (j > i) out += '-' + std::to_string(values[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace drun::agent
