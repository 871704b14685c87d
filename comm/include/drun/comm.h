/* drun/comm.h: libdrun_comm's C API, for C and for other languages' FFIs.
 *
 * The same runtime as drun/comm/communicator.hpp: init from the environment drun sets (or a
 * tcp:// / file:// method), point-to-point and collective operations, groups, requests.
 * Conventions: every int-returning call returns DRUN_OK (0) on success and a DRUN_E* status on
 * failure, with the message in drun_last_error() (per thread; valid until the thread's next
 * failing call). No C++ exception crosses this API. Counts are elements; timeout_ms <= 0 means
 * the communicator's timeout (DRUN_COMM_TIMEOUT, default 300 s). Ranks passed to a group's
 * operations are ranks within that group.
 * Threading: as the C++ API (collectives on one communicator run in call order).
 * Ownership: drun_comm_destroy() frees a communicator (groups too); drun_request_free() a request.
 */
#ifndef DRUN_COMM_H
#define DRUN_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct drun_comm drun_comm_t;
typedef struct drun_request drun_request_t;

/* In C++ the enums have int as their fixed type, the size they have in C: a C caller may pass
   any int, and the library refuses one out of range (DRUN_EINVAL) instead of reading an enum
   value that does not exist (undefined behaviour, which UBSan reports). */
#ifdef __cplusplus
#define DRUN_ENUM_OF_INT : int
#else
#define DRUN_ENUM_OF_INT
#endif

typedef enum DRUN_ENUM_OF_INT {
  DRUN_INT8 = 0, DRUN_UINT8 = 1, DRUN_INT32 = 2, DRUN_INT64 = 3,
  DRUN_FLOAT16 = 4, DRUN_BFLOAT16 = 5, DRUN_FLOAT32 = 6, DRUN_FLOAT64 = 7
} drun_dtype_t;

typedef enum DRUN_ENUM_OF_INT {
  DRUN_SUM = 0, DRUN_PRODUCT = 1, DRUN_MIN = 2, DRUN_MAX = 3,
  DRUN_AVG = 4, DRUN_BAND = 5, DRUN_BOR = 6, DRUN_BXOR = 7
} drun_op_t;

enum {
  DRUN_OK = 0,
  DRUN_EINVAL = 1,     /* invalid argument, misuse, unusable backend */
  DRUN_ETIMEOUT = 2,   /* the deadline passed */
  DRUN_ENETWORK = 3,   /* connection failed or lost */
  DRUN_ECOMM = 4,      /* a peer failed during an operation */
  DRUN_EPROTOCOL = 5,  /* the store speaks another protocol */
  DRUN_EINTERNAL = 6   /* anything else (out of memory, ...) */
};

#define DRUN_ANY_SOURCE (-1)

/* Init: backend "gloo" or "nccl". */
int drun_comm_init_env(const char* backend, drun_comm_t** comm);
/* init_method "env://", "tcp://host:port" or "file:///path"; rank/world_size -1 = from the
 * environment; timeout_ms <= 0 = DRUN_COMM_TIMEOUT. */
int drun_comm_init(const char* backend, const char* init_method, int rank, int world_size,
                   int timeout_ms, drun_comm_t** comm);
int drun_comm_rank(const drun_comm_t* comm);   /* -1 for a non-member of a group */
int drun_comm_size(const drun_comm_t* comm);
/* Every rank of comm calls it with the same ranks; a non-member gets a group it cannot use. */
int drun_comm_new_group(drun_comm_t* comm, const int* ranks, int nranks, drun_comm_t** group);
void drun_comm_destroy(drun_comm_t* comm);
/* In-process recovery (docs/recovery.md): the generation of comm (0 without recovery), and the
   move of the world communicator to the newest generation (DRUN_EINVAL on a group, without a
   workers' store, or with no recovery in progress). timeout_ms <= 0: the communicator's. */
int drun_comm_generation(const drun_comm_t* comm, uint64_t* generation);
int drun_comm_reform(drun_comm_t* comm, int64_t timeout_ms);

/* Point to point (tag >= 0). recv's *source (may be NULL) receives the sender's rank. */
int drun_send(drun_comm_t* comm, const void* buf, size_t count, drun_dtype_t dtype, int dst,
              int tag, int timeout_ms);
int drun_recv(drun_comm_t* comm, void* buf, size_t count, drun_dtype_t dtype, int src, int tag,
              int timeout_ms, int* source);
int drun_isend(drun_comm_t* comm, const void* buf, size_t count, drun_dtype_t dtype, int dst,
               int tag, int timeout_ms, drun_request_t** request);
int drun_irecv(drun_comm_t* comm, void* buf, size_t count, drun_dtype_t dtype, int src, int tag,
               int timeout_ms, drun_request_t** request);

/* Requests: wait (timeout_ms <= 0: the operation's own deadline), test (*done = 0 or 1). */
int drun_wait(drun_request_t* request, int timeout_ms);
int drun_test(drun_request_t* request, int* done);
int drun_request_source(const drun_request_t* request);
void drun_request_free(drun_request_t* request);

/* Collectives (buffers as in the C++ API). */
int drun_broadcast(drun_comm_t* comm, void* buf, size_t count, drun_dtype_t dtype, int root,
                   int timeout_ms);
int drun_reduce(drun_comm_t* comm, void* buf, size_t count, drun_dtype_t dtype, drun_op_t op,
                int root, int timeout_ms);                       /* in place, result on root */
int drun_all_reduce(drun_comm_t* comm, void* buf, size_t count, drun_dtype_t dtype,
                    drun_op_t op, int timeout_ms);                /* in place */
int drun_scatter(drun_comm_t* comm, const void* send, void* recv, size_t count,
                 drun_dtype_t dtype, int root, int timeout_ms);
int drun_gather(drun_comm_t* comm, const void* send, void* recv, size_t count,
                drun_dtype_t dtype, int root, int timeout_ms);
int drun_all_gather(drun_comm_t* comm, const void* send, void* recv, size_t count,
                    drun_dtype_t dtype, int timeout_ms);
int drun_reduce_scatter(drun_comm_t* comm, const void* send, void* recv, size_t count,
                        drun_dtype_t dtype, drun_op_t op, int timeout_ms);
int drun_all_to_all(drun_comm_t* comm, const void* send, void* recv, size_t count,
                    drun_dtype_t dtype, int timeout_ms);
int drun_barrier(drun_comm_t* comm, int timeout_ms);
/* The asynchronous all_reduce (the other collectives' async forms are in the C++ API). */
int drun_all_reduce_async(drun_comm_t* comm, void* buf, size_t count, drun_dtype_t dtype,
                          drun_op_t op, int timeout_ms, drun_request_t** request);

const char* drun_last_error(void); /* this thread's */

#ifdef __cplusplus
}
#endif

#endif /* DRUN_COMM_H */
