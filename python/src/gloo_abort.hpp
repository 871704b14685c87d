// abortGloo: fails the pending and later work of a torch ProcessGroupGloo at once, as a peer's
// death would, so that a new generation does not wait out the group's timeout. torch 1.13's
// ProcessGroupGloo has no abort(): this shuts down (shutdown(2), not close) the TCP socket of
// every Gloo pair of every context the group holds. Gloo's event loop then sees each socket end
// and fails the pair's pending and later operations with an IoException, which torch raises as a
// RuntimeError from the Work. The group's store connection is not one of them. The group is
// unusable afterwards: destroy it and create another.
//
// Threading: any thread (the generation watcher's); each pair's socket is read under the pair's
// own lock. Returns how many sockets were shut down.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace drun::torch_backend {

int abortGloo(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

}  // namespace drun::torch_backend
