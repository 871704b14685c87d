// AbortableGlooContext: a Gloo full-mesh context whose waits another thread can end at once.
//
// Gloo ends an operation waiting in one of its unbound buffers only when data arrives, when its
// deadline passes, when abortWaitRecv/abortWaitSend is called on that very buffer, or when the
// buffer's pair fails while the operation is still queued on it. Closing or resetting the
// connections does not reach an operation whose transfer is under way (its buffer is being read
// or written, no longer queued): it waits for its deadline. So every unbound buffer made through
// this context (those of Gloo's collectives and of drun's point-to-point) is wrapped, and
// abortWaits() ends the wait of each live one; a wrapped wait that was ended so, or starts after,
// throws gloo::IoException("... aborted"), which unwinds the collective.
// Threading: abortWaits() from any thread, any number of times.
// Ownership: the context owns its transport context, which the wrappers share with the registry.
#pragma once

#include <gloo/rendezvous/context.h>

#include <memory>

namespace drun::comm::detail {

class AbortableTransportContext;

class AbortableGlooContext final : public gloo::rendezvous::Context {
 public:
  AbortableGlooContext(int rank, int size);
  // After connectFullMesh: from now on its unbound buffers can be aborted.
  void makeAbortable();
  // Every wait in this context's unbound buffers, now and later, fails at once.
  void abortWaits();

 private:
  std::shared_ptr<AbortableTransportContext> abortable_;
};

}  // namespace drun::comm::detail
