// Reconnector: after this node lost the store (fencing already stopped its workers), connects
// again within the join deadline. A store that refuses connections is gone for good (its host
// died: NetworkError at once); one that does not answer may come back (a cut link), so that is
// retried until the deadline (TimeoutError naming how long it tried).
//
// Threading: called on the rendezvous' agent thread; each connect has its own deadline.
#pragma once

#include <functional>
#include <memory>

#include "c10d_node.hpp"

namespace drun::rdzv {

std::unique_ptr<LivenessStore> reconnect(const std::function<std::unique_ptr<LivenessStore>()>& connect,
                                 const C10dNode& node, const Deadline& deadline);

}  // namespace drun::rdzv
