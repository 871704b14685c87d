// The Backend interface's shared parts: operation names and kinds, and the default of the
// receive from a set of ranks.
#include <string>

#include "backend.hpp"

namespace drun::comm::detail {

const char* toString(OpKind kind) {
  switch (kind) {
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Reduce: return "reduce";
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::Scatter: return "scatter";
    case OpKind::Gather: return "gather";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::Barrier: return "barrier";
  }
  return "?";
}

bool isRooted(OpKind k) {
  return k == OpKind::Broadcast || k == OpKind::Reduce || k == OpKind::Scatter || k == OpKind::Gather;
}
bool isReduction(OpKind k) {
  return k == OpKind::Reduce || k == OpKind::AllReduce || k == OpKind::ReduceScatter;
}

std::shared_ptr<Request::State> Backend::irecvFromAnyOf(void*, size_t, const std::vector<int>&, int, milliseconds) {
  throw InvalidArgument(std::string("receive from a set of ranks: not supported by the ") + transport() + " transport");
}

}  // namespace drun::comm::detail
