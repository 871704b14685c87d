/* The worker channel: one shared page per worker rank through which the worker tells its agent
 * that it makes progress (heartbeats) and where it is (named sections).
 *
 * The agent creates the file (kDrunChannelSize bytes, zeroed) in its job directory and names it
 * in the worker's environment (DRUN_WORKER_CHANNEL=/path). The worker maps it and writes with
 * plain atomic stores: no system call, so a heartbeat costs nanoseconds. The agent reads the file
 * with pread() on its own timer (a worker that truncates the file cannot fault the agent) and
 * treats every byte as untrusted input.
 *
 * Layout (native byte order: both sides run on the same host), all fields naturally aligned:
 *
 *   offset size  field
 *   0      4     magic            DRUN_CHANNEL_MAGIC, written by the agent
 *   4      4     version          DRUN_CHANNEL_VERSION, written by the agent
 *   8      8     beats            heartbeats so far (also bumped by section begin/end)
 *   16     8     last_beat_ns     CLOCK_MONOTONIC of the last beat
 *   24     8     seq              seqlock over the section fields: odd while being written
 *   32     8     section_seq      sections entered so far
 *   40     8     section_start_ns CLOCK_MONOTONIC when the current section began (0: none)
 *   48     64    section          the current section's name, NUL-terminated ("" = none)
 *   112    8     pid              the writer's pid (set when the worker maps the page)
 *   120    8     coll_start_ns    CLOCK_MONOTONIC when the current collective began (0: none)
 *   128    64    collective       "all_reduce #42 of world" while inside one (libdrun_comm),
 *                                 NUL-terminated; both under the seqlock
 *
 * Python's drun.worker writes the same layout with struct.pack_into (python/drun/worker.py).
 */
#ifndef DRUN_WORKER_CHANNEL_H
#define DRUN_WORKER_CHANNEL_H

#define DRUN_CHANNEL_ENV "DRUN_WORKER_CHANNEL"
#define DRUN_CHANNEL_MAGIC 0x43575244u /* "DRWC" little-endian */
#define DRUN_CHANNEL_VERSION 1u
#define DRUN_CHANNEL_SIZE 4096
#define DRUN_CHANNEL_SECTION_MAX 64 /* bytes, including the terminating NUL */

#define DRUN_CHANNEL_OFF_MAGIC 0
#define DRUN_CHANNEL_OFF_VERSION 4
#define DRUN_CHANNEL_OFF_BEATS 8
#define DRUN_CHANNEL_OFF_LAST_BEAT_NS 16
#define DRUN_CHANNEL_OFF_SEQ 24
#define DRUN_CHANNEL_OFF_SECTION_SEQ 32
#define DRUN_CHANNEL_OFF_SECTION_START_NS 40
#define DRUN_CHANNEL_OFF_SECTION 48
#define DRUN_CHANNEL_OFF_PID 112
#define DRUN_CHANNEL_OFF_COLL_START_NS 120
#define DRUN_CHANNEL_OFF_COLLECTIVE 128
#define DRUN_CHANNEL_USED 192 /* bytes the agent reads */

#endif
