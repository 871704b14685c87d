// The C API (drun/comm.h) over the C++ one: handles own shared_ptrs, every call catches every
// exception and turns it into a status plus this thread's drun_last_error().
#include "drun/comm.h"

#include <new>
#include <string>

#include "drun/comm/communicator.hpp"

using namespace drun::comm;

struct drun_comm {
  std::shared_ptr<Communicator> comm;
};
struct drun_request {
  Request request;
};

namespace {

thread_local std::string lastError;

milliseconds ms(int timeoutMs) { return timeoutMs <= 0 ? kDefaultTimeout : milliseconds(timeoutMs); }
DType dt(drun_dtype_t d) { return static_cast<DType>(d); }
ReduceOp rop(drun_op_t o) { return static_cast<ReduceOp>(o); }

template <class F>
int guarded(F&& f) {
  try {
    f();
    return DRUN_OK;
  } catch (const drun::InvalidArgument& e) {
    lastError = e.what();
    return DRUN_EINVAL;
  } catch (const drun::TimeoutError& e) {
    lastError = e.what();
    return DRUN_ETIMEOUT;
  } catch (const drun::NetworkError& e) {
    lastError = e.what();
    return DRUN_ENETWORK;
  } catch (const drun::CommError& e) {
    lastError = e.what();
    return DRUN_ECOMM;
  } catch (const drun::ProtocolError& e) {
    lastError = e.what();
    return DRUN_EPROTOCOL;
  } catch (const std::exception& e) {
    lastError = e.what();
    return DRUN_EINTERNAL;
  } catch (...) {
    lastError = "unknown error";
    return DRUN_EINTERNAL;
  }
}

Communicator& need(drun_comm_t* c) {
  if (!c || !c->comm) throw drun::InvalidArgument("the communicator is NULL");
  return *c->comm;
}

template <class T>
T* needOut(T* p, const char* what) {
  if (!p) throw drun::InvalidArgument(std::string(what) + " is NULL");
  return p;
}

}  // namespace

extern "C" {

int drun_comm_init(const char* backend, const char* initMethod, int rank, int worldSize,
                   int timeoutMs, drun_comm_t** comm) {
  return guarded([&] {
    needOut(comm, "the comm out-parameter");
    *comm = nullptr;
    InitOptions o;
    o.backend = parseBackend(backend);
    if (initMethod) o.initMethod = initMethod;
    o.rank = rank;
    o.worldSize = worldSize;
    o.timeout = timeoutMs > 0 ? milliseconds(timeoutMs) : milliseconds(0);
    *comm = new drun_comm{init(o)};
  });
}

int drun_comm_init_env(const char* backend, drun_comm_t** comm) {
  return drun_comm_init(backend, "env://", -1, -1, 0, comm);
}

int drun_comm_rank(const drun_comm_t* comm) { return comm && comm->comm ? comm->comm->rank() : -1; }
int drun_comm_size(const drun_comm_t* comm) { return comm && comm->comm ? comm->comm->size() : -1; }

int drun_comm_new_group(drun_comm_t* comm, const int* ranks, int nranks, drun_comm_t** group) {
  return guarded([&] {
    needOut(group, "the group out-parameter");
    *group = nullptr;
    if (nranks < 0 || (nranks > 0 && !ranks)) throw drun::InvalidArgument("new_group: bad rank list");
    *group = new drun_comm{need(comm).newGroup(std::vector<int>(ranks, ranks + nranks))};
  });
}

void drun_comm_destroy(drun_comm_t* comm) {
  if (!comm) return;
  guarded([&] { comm->comm->destroy(); });
  delete comm;
}

int drun_comm_generation(const drun_comm_t* comm, uint64_t* generation) {
  return guarded([&] {
    if (!comm || !comm->comm) throw drun::InvalidArgument("the communicator is NULL");
    *needOut(generation, "the generation out-parameter") = comm->comm->generation();
  });
}

int drun_comm_reform(drun_comm_t* comm, int64_t timeoutMs) {
  return guarded([&] { need(comm).reform(timeoutMs <= 0 ? kDefaultTimeout : milliseconds(timeoutMs)); });
}

int drun_send(drun_comm_t* c, const void* buf, size_t count, drun_dtype_t d, int dst, int tag, int t) {
  return guarded([&] { need(c).send(buf, count, dt(d), dst, tag, ms(t)); });
}
int drun_recv(drun_comm_t* c, void* buf, size_t count, drun_dtype_t d, int src, int tag, int t, int* source) {
  return guarded([&] {
    int from = need(c).recv(buf, count, dt(d), src, tag, ms(t));
    if (source) *source = from;
  });
}
int drun_isend(drun_comm_t* c, const void* buf, size_t count, drun_dtype_t d, int dst, int tag, int t,
               drun_request_t** req) {
  return guarded([&] {
    needOut(req, "the request out-parameter");
    *req = new drun_request{need(c).isend(buf, count, dt(d), dst, tag, ms(t))};
  });
}
int drun_irecv(drun_comm_t* c, void* buf, size_t count, drun_dtype_t d, int src, int tag, int t,
               drun_request_t** req) {
  return guarded([&] {
    needOut(req, "the request out-parameter");
    *req = new drun_request{need(c).irecv(buf, count, dt(d), src, tag, ms(t))};
  });
}

int drun_wait(drun_request_t* req, int t) {
  return guarded([&] { needOut(req, "the request")->request.wait(ms(t)); });
}
int drun_test(drun_request_t* req, int* done) {
  return guarded([&] { *needOut(done, "done") = needOut(req, "the request")->request.test() ? 1 : 0; });
}
int drun_request_source(const drun_request_t* req) { return req ? req->request.source() : -1; }
void drun_request_free(drun_request_t* req) { delete req; }

int drun_broadcast(drun_comm_t* c, void* buf, size_t count, drun_dtype_t d, int root, int t) {
  return guarded([&] { need(c).broadcast(buf, count, dt(d), root, ms(t)); });
}
int drun_reduce(drun_comm_t* c, void* buf, size_t count, drun_dtype_t d, drun_op_t op, int root, int t) {
  return guarded([&] { need(c).reduce(buf, count, dt(d), rop(op), root, ms(t)); });
}
int drun_all_reduce(drun_comm_t* c, void* buf, size_t count, drun_dtype_t d, drun_op_t op, int t) {
  return guarded([&] { need(c).allReduce(buf, count, dt(d), rop(op), ms(t)); });
}
int drun_scatter(drun_comm_t* c, const void* s, void* r, size_t count, drun_dtype_t d, int root, int t) {
  return guarded([&] { need(c).scatter(s, r, count, dt(d), root, ms(t)); });
}
int drun_gather(drun_comm_t* c, const void* s, void* r, size_t count, drun_dtype_t d, int root, int t) {
  return guarded([&] { need(c).gather(s, r, count, dt(d), root, ms(t)); });
}
int drun_all_gather(drun_comm_t* c, const void* s, void* r, size_t count, drun_dtype_t d, int t) {
  return guarded([&] { need(c).allGather(s, r, count, dt(d), ms(t)); });
}
int drun_reduce_scatter(drun_comm_t* c, const void* s, void* r, size_t count, drun_dtype_t d, drun_op_t op, int t) {
  return guarded([&] { need(c).reduceScatter(s, r, count, dt(d), rop(op), ms(t)); });
}
int drun_all_to_all(drun_comm_t* c, const void* s, void* r, size_t count, drun_dtype_t d, int t) {
  return guarded([&] { need(c).allToAll(s, r, count, dt(d), ms(t)); });
}
int drun_barrier(drun_comm_t* c, int t) {
  return guarded([&] { need(c).barrier(ms(t)); });
}
int drun_all_reduce_async(drun_comm_t* c, void* buf, size_t count, drun_dtype_t d, drun_op_t op, int t,
                          drun_request_t** req) {
  return guarded([&] {
    needOut(req, "the request out-parameter");
    *req = new drun_request{need(c).allReduceAsync(buf, count, dt(d), rop(op), ms(t))};
  });
}

const char* drun_last_error(void) { return lastError.c_str(); }

}  // extern "C"
