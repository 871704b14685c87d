#include "communicator_impl.hpp"

namespace drun::comm {

using detail::OpKind;

// ---- Request ----

Request::Request(std::shared_ptr<State> state) : state_(std::move(state)) {}
void Request::wait(milliseconds timeout) {
  if (!state_) throw InvalidArgument("wait() on an empty Request");
  state_->wait(timeout);
}
bool Request::test() {
  if (!state_) throw InvalidArgument("test() on an empty Request");
  return state_->test();
}
int Request::source() const { return state_ ? state_->source() : -1; }
// ---- Communicator ----

Communicator::Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() { impl_->destroy(); }

int Communicator::rank() const { return impl_->rank(); }
int Communicator::size() const { return impl_->size(); }
bool Communicator::isMember() const { return impl_->isMember(); }
Backend Communicator::backend() const { return impl_->kind(); }
milliseconds Communicator::timeout() const { return impl_->timeout(); }
const std::vector<int>& Communicator::worldRanks() const { return impl_->worldRanks(); }
std::string Communicator::transport() const { return impl_->transport(); }
void Communicator::destroy() { impl_->destroy(); }
uint64_t Communicator::generation() const { return impl_->generation(); }
void Communicator::reform(milliseconds timeout) { impl_->reform(timeout); }

std::shared_ptr<Communicator> Communicator::newGroup(const std::vector<int>& ranks, milliseconds timeout) {
  return impl_->newGroup(ranks, timeout);
}

void Communicator::send(const void* buf, size_t count, DType dtype, int dst, int tag, milliseconds timeout) {
  isend(buf, count, dtype, dst, tag, timeout).wait();
}
int Communicator::recv(void* buf, size_t count, DType dtype, int src, int tag, milliseconds timeout) {
  Request r = irecv(buf, count, dtype, src, tag, timeout);
  r.wait();
  return r.source();
}
Request Communicator::isend(const void* buf, size_t count, DType dtype, int dst, int tag, milliseconds timeout) {
  return impl_->p2p(true, const_cast<void*>(buf), count, dtype, dst, tag, timeout);
}
Request Communicator::irecv(void* buf, size_t count, DType dtype, int src, int tag, milliseconds timeout) {
  return impl_->p2p(false, buf, count, dtype, src, tag, timeout);
}

Request Communicator::broadcastAsync(void* buf, size_t count, DType dtype, int root, milliseconds timeout) {
  return impl_->collective({OpKind::Broadcast, nullptr, buf, count, dtype, ReduceOp::Sum, root, timeout}, true);
}
Request Communicator::reduceAsync(void* buf, size_t count, DType dtype, ReduceOp op, int root, milliseconds timeout) {
  return impl_->collective({OpKind::Reduce, nullptr, buf, count, dtype, op, root, timeout}, true);
}
Request Communicator::allReduceAsync(void* buf, size_t count, DType dtype, ReduceOp op, milliseconds timeout) {
  return impl_->collective({OpKind::AllReduce, nullptr, buf, count, dtype, op, 0, timeout}, true);
}
Request Communicator::scatterAsync(const void* send, void* recv, size_t count, DType dtype, int root, milliseconds timeout) {
  return impl_->collective({OpKind::Scatter, send, recv, count, dtype, ReduceOp::Sum, root, timeout}, true);
}
Request Communicator::gatherAsync(const void* send, void* recv, size_t count, DType dtype, int root, milliseconds timeout) {
  return impl_->collective({OpKind::Gather, send, recv, count, dtype, ReduceOp::Sum, root, timeout}, true);
}
Request Communicator::allGatherAsync(const void* send, void* recv, size_t count, DType dtype, milliseconds timeout) {
  return impl_->collective({OpKind::AllGather, send, recv, count, dtype, ReduceOp::Sum, 0, timeout}, true);
}
Request Communicator::reduceScatterAsync(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, milliseconds timeout) {
  return impl_->collective({OpKind::ReduceScatter, send, recv, count, dtype, op, 0, timeout}, true);
}
Request Communicator::allToAllAsync(const void* send, void* recv, size_t count, DType dtype, milliseconds timeout) {
  return impl_->collective({OpKind::AllToAll, send, recv, count, dtype, ReduceOp::Sum, 0, timeout}, true);
}
Request Communicator::barrierAsync(milliseconds timeout) {
  return impl_->collective({OpKind::Barrier, nullptr, nullptr, 0, DType::UInt8, ReduceOp::Sum, 0, timeout}, true);
}

void Communicator::broadcast(void* buf, size_t count, DType dtype, int root, milliseconds timeout) {
  impl_->collective({OpKind::Broadcast, nullptr, buf, count, dtype, ReduceOp::Sum, root, timeout}, false);
}
void Communicator::reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root, milliseconds timeout) {
  impl_->collective({OpKind::Reduce, nullptr, buf, count, dtype, op, root, timeout}, false);
}
void Communicator::allReduce(void* buf, size_t count, DType dtype, ReduceOp op, milliseconds timeout) {
  impl_->collective({OpKind::AllReduce, nullptr, buf, count, dtype, op, 0, timeout}, false);
}
void Communicator::scatter(const void* send, void* recv, size_t count, DType dtype, int root, milliseconds timeout) {
  impl_->collective({OpKind::Scatter, send, recv, count, dtype, ReduceOp::Sum, root, timeout}, false);
}
void Communicator::gather(const void* send, void* recv, size_t count, DType dtype, int root, milliseconds timeout) {
  impl_->collective({OpKind::Gather, send, recv, count, dtype, ReduceOp::Sum, root, timeout}, false);
}
void Communicator::allGather(const void* send, void* recv, size_t count, DType dtype, milliseconds timeout) {
  impl_->collective({OpKind::AllGather, send, recv, count, dtype, ReduceOp::Sum, 0, timeout}, false);
}
void Communicator::reduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, milliseconds timeout) {
  impl_->collective({OpKind::ReduceScatter, send, recv, count, dtype, op, 0, timeout}, false);
}
void Communicator::allToAll(const void* send, void* recv, size_t count, DType dtype, milliseconds timeout) {
  impl_->collective({OpKind::AllToAll, send, recv, count, dtype, ReduceOp::Sum, 0, timeout}, false);
}
void Communicator::barrier(milliseconds timeout) {
  impl_->collective({OpKind::Barrier, nullptr, nullptr, 0, DType::UInt8, ReduceOp::Sum, 0, timeout}, false);
}

}  // namespace drun::comm
