// ShmCollectives' single-copy all_gather: the ranks publish their buffers' addresses with a step
// and read each other's memory with process_vm_readv (one copy instead of two through the
// segment); the second step keeps every send buffer in place until its readers are done.
#include <cstring>

#include "shm/shm_collectives.hpp"
#include "shm/shm_copy.hpp"

namespace drun::comm::detail {

void ShmCollectives::singleCopyAllGather(const Collective& c, const OpDeadline& d) {
  const int n = seg_.size(), me = seg_.rank();
  const size_t block = c.count * dtypeSize(c.dtype);
  char* recv = static_cast<char*>(c.recv);
  seg_.publishBuffer(c.send);
  if (c.send != recv + me * block)  // before the step: while the peers arrive
    copyToResult(recv + me * block, c.send, block);
  step(d, "all_gather", 0);
  for (int r = 0; r < n; ++r)
    if (r != me) seg_.readPeer(r, seg_.sendAddr(r), recv + r * block, block);
  step(d, "all_gather", 0);
}

}  // namespace drun::comm::detail
