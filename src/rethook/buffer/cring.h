/* cring.h: the hot side of rethook's ring buffer, shared by the ring module (_cring.c) and the
 * native users that write into it (rethook/tracers/_native.c).
 *
 * One ring per thread, the kernel's per-CPU buffer. A ring is an array of fixed-size records
 * indexed by sequence number modulo its capacity:
 *
 *      seq:   clear_seq ... floor ............................ head
 *              |  lost or    |<------ readable records ------->|  next record goes here
 *              |  consumed   |  (at most `capacity` of them)   |
 *
 *   head      the sequence number the next record gets; records written since the last clear:
 *             head - clear_seq (refused ones are not in it: they get no sequence number)
 *   floor     the oldest sequence number still readable; raised by a consuming read (to head),
 *             by overwriting (to head - capacity) and by clear (to head)
 *   read_pos  where the last consuming read (trace_pipe) ended: floor - read_pos records were
 *             lost (overwritten) since then, reported as a gap by the next consuming read
 *   refused   records a full non-overwriting ring turned away since the last clear
 *
 * Writers (the owning thread, or any thread holding the GIL: the GIL is never released while
 * a record is written) call rh_ring_reserve(), fill the record it returns, then rh_ring_done(). Readers are
 * Python methods of the ring type (_cring.c); they run under the GIL too, so no lock exists.
 *
 * Between rh_ring_reserve() and the last store into the record, run no Python code: no call,
 * no allocation of a Python object (it may start the GC, whose finalizers run Python code),
 * no Py_DECREF that may free. Python code run there could read the ring and see the reserved
 * record still empty, or clear or resize it, which frees the array the record lives in.
 * Compute every field first (frame, parent, line, time), then reserve and store.
 *
 * A record holds strong references to its code objects (never to the traced program's data,
 * which must not be kept alive by the tracer); they are released when the record is
 * overwritten, consumed or cleared.
 */
#ifndef RETHOOK_CRING_H
#define RETHOOK_CRING_H

#include <Python.h>
#include <stdint.h>

/* Record types: the event format ids of rethook/tracers/formats.py. */
#define RH_FUNCTION 1
#define RH_FUNCGRAPH_ENTRY 2
#define RH_FUNCGRAPH_EXIT 3
#define RH_FUNCGRAPH_SUSPEND 4
#define RH_FUNCGRAPH_RESUME 5

typedef struct {
    int64_t ts;         /* the event's time (the exit's time for an exit) */
    PyObject *code;     /* owned: the function */
    PyObject *parent;   /* owned or NULL: the caller's code (function events) */
    int64_t calltime;   /* exit: the entry's time */
    int64_t sleep;      /* exit: time suspended */
    int32_t type;       /* RH_* */
    int32_t depth;      /* graph events: depth; function events: the caller's line */
    int32_t flags;      /* exit: the engine's FLAG_* plus EXIT_RAISED */
    int32_t overrun;    /* exit: the thread's overrun count (funcgraph-overrun) */
} rh_rec;

typedef struct {
    PyObject_HEAD
    rh_rec *recs;        /* capacity records */
    uint64_t capacity;   /* >= 1 */
    uint64_t head;       /* next sequence number */
    uint64_t wpos;       /* head % capacity, kept up to date so writers never divide */
    uint64_t floor;      /* oldest readable sequence number */
    uint64_t clear_seq;  /* head at the last clear */
    uint64_t read_pos;   /* where the last consuming read ended (the pipe's position) */
    uint64_t consumed;   /* records taken by consuming reads since the last clear */
    uint64_t refused;    /* records refused (full, not overwriting) since the last clear */
    uint64_t refused_unreported; /* refused since the last consuming read */
    uint64_t tid;        /* native thread id of the owning thread */
    int on;              /* tracing_on: when 0 nothing is written nor counted */
    int overwrite;       /* 1: drop the oldest; 0: refuse the newest */
    PyObject *weakreflist;
} rh_ring;

/* Release a record's references (it stays in place, empty). */
static inline void
rh_rec_clear(rh_rec *r)
{
    PyObject *c = r->code, *p = r->parent;
    r->code = NULL;
    r->parent = NULL;
    Py_XDECREF(c);
    Py_XDECREF(p);
}

/* What an overwritten record held: released by rh_ring_done() once the new record is filled
 * (releasing it earlier could free a code object, whose weakref callbacks run Python code). */
typedef struct {
    PyObject *code;
    PyObject *parent;
} rh_stale;

/* The record to fill for the next event, or NULL when none is written (tracing off, or a full
 * ring that does not overwrite: then the event is counted as refused). The caller fills every
 * field (code and parent receive new references), then calls rh_ring_done(&stale). */
static inline rh_rec *
rh_ring_reserve(rh_ring *r, rh_stale *stale)
{
    stale->code = stale->parent = NULL;
    if (!r->on)
        return NULL;
    if (r->head - r->floor >= r->capacity) {
        if (!r->overwrite) {
            r->refused++;
            r->refused_unreported++;
            return NULL;
        }
        r->floor = r->head - r->capacity + 1; /* the oldest is overwritten (lost) */
    }
    rh_rec *rec = &r->recs[r->wpos];
    stale->code = rec->code;
    stale->parent = rec->parent;
    rec->code = rec->parent = NULL;
    r->head++;
    r->wpos = r->wpos + 1 == r->capacity ? 0 : r->wpos + 1;
    return rec;
}

/* After the reserved record is filled: release what it held before. */
static inline void
rh_ring_done(rh_stale *stale)
{
    Py_XDECREF(stale->code);
    Py_XDECREF(stale->parent);
}

/* What _cring exports to other extensions (capsule "rethook.buffer._cring._C_API"). */
typedef struct {
    PyTypeObject *ring_type;
} rh_cring_api;

#define RH_CRING_CAPSULE "rethook.buffer._cring._C_API"

#endif
