/* drun's worker API (C): tell the drun agent that this worker makes progress (heartbeats) and
 * where it is (named sections), so that drun can detect a hung worker, name it, show its stack and
 * restart the job (docs/hangs.md).
 *
 * Outside drun (DRUN_WORKER_CHANNEL unset or unusable) every call is a no-op costing one load.
 * The first call maps the channel (drun/worker_channel.h); later calls make no system call.
 *
 * Threading: every function may be called from any thread. Sections form one stack per process
 * (meant for the main loop's thread); a heartbeat from any thread counts for the process.
 * Ownership: the mapping lives until the process exits.
 */
#ifndef DRUN_WORKER_H
#define DRUN_WORKER_H

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when a drun agent listens (the channel is mapped), else 0. */
int drun_worker_enabled(void);

/* One heartbeat: "this rank makes progress". */
void drun_worker_heartbeat(void);

/* Enters the section `name` (cut to 63 bytes; bytes outside printable ASCII become '?');
 * sections nest up to 8 deep (deeper ones count as heartbeats only). */
void drun_worker_section_begin(const char* name);

/* Leaves the innermost section: the enclosing one (with its start time) is current again. */
void drun_worker_section_end(void);

/* libdrun_comm: this rank entered (begin) or left (end) a collective, described as
 * "all_reduce #42 of world" (cut to 63 bytes). A rank silent inside a collective is taken for a
 * waiter: drun gives it twice the timeout, so a peer that never came is named first. */
void drun_worker_collective_begin(const char* what);
void drun_worker_collective_end(void);

#ifdef __cplusplus
}
#endif

#endif
