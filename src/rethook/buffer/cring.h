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
 * Python methods of the ring type (_cring.c), and the consuming read the capsule exports in
 * pieces (rh_cring_api below: the trace file writer's fused drain, _tfenc.c); they run under
 * the GIL too, so no lock exists.
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

#include "../engine/drainround.h"

/* How many records ahead of the writer rh_ring_reserve() asks the CPU to fetch. */
#define RH_PREFETCH_AHEAD 16

/* Record types: the event format ids of rethook/buffer/schema.py (checked at import). */
#define RH_FUNCTION 1
#define RH_FUNCGRAPH_ENTRY 2
#define RH_FUNCGRAPH_EXIT 3
#define RH_FUNCGRAPH_SUSPEND 4
#define RH_FUNCGRAPH_RESUME 5

/* Function records: with RH_CALLER_OFFSET in flags, depth is the caller's instruction offset
 * (bytes), which readers turn into its line (rh_caller_line). Computing a line walks the
 * caller's line table, which grows with the caller's size: the writer leaves it to the
 * reader. Without the flag, depth is the line itself. */
#define RH_CALLER_OFFSET (1 << 30) /* schema.py's CALLER_OFFSET (checked at import) */

typedef struct {
    int64_t ts;         /* the event's time (the exit's time for an exit) */
    PyObject *code;     /* owned: the function */
    PyObject *parent;   /* owned or NULL: the caller's code (function events) */
    int64_t calltime;   /* exit: the entry's time */
    int64_t sleep;      /* exit: time suspended */
    int32_t type;       /* RH_* */
    int32_t depth;      /* graph events: depth; function events: the caller's line (or offset) */
    int32_t flags;      /* exit: the engine's FLAG_* plus EXIT_RAISED; function: RH_CALLER_* */
    int32_t overrun;    /* exit: the thread's overrun count (funcgraph-overrun) */
} rh_rec;

/* A ring's array of records (_cring.c's recs_alloc, the only maker of rings' arrays) starts
 * after a header of its own: what the drain has done to it so far (_tfenc.c, ahead_of()). */
typedef struct {
    uint64_t paged; /* bytes the drain has paged in ahead of the writers, all calls summed */
    uint64_t pad[7]; /* (the records stay aligned as the allocator aligns) */
} rh_array_head;

static inline rh_array_head *
rh_array_head_of(rh_rec *recs)
{
    return (rh_array_head *)recs - 1;
}

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
    /* What the writer tells the drain (engine/drainround.h), one compare per record:
     * unconsumed records reaching `mark` call rh_ring_passed(). */
    uint64_t mark;         /* the next level to report: wake_water, then high_water */
    uint64_t wake_water;   /* RH_RING_WAKE_WATER(capacity) */
    uint64_t high_water;   /* RH_RING_HIGH_WATER(capacity) */
    const rh_round_api *round; /* _ccore's round API, or NULL (then mark is the capacity) */
} rh_ring;

/* A record written into a ring this full wakes the drain (round->wake), once until the
 * ring's next consuming read: the kernel's buffer_percent, at a quarter. The drain sleeps
 * until then rather than poll, so it takes the GIL from the program once per quarter ring
 * instead of once per millisecond; a quarter leaves the drain room to get the GIL (a
 * CPU-bound thread keeps it up to a switch interval) and to encode the round without it
 * (_tfenc.c: at most half a ring). */
#define RH_RING_WAKE_WATER(capacity) ((capacity) / 4)
/* A ring this full reports it at every record (round->full): three quarters of its capacity,
 * the rest the headroom its writer fills before it next waits for the drain ("blocking"). */
#define RH_RING_HIGH_WATER(capacity) ((capacity) - (capacity) / 4)

/* The first level a ring with nothing unconsumed reports: after a consuming read, a clear, a
 * resize. Without a round API only a full ring is noticed (for overwriting or refusing). */
static inline void
rh_ring_rearm(rh_ring *r)
{
    r->mark = r->round != NULL ? r->wake_water : r->capacity;
}

/* Unconsumed records reached r->mark: wake the drain at the wake level, then report the
 * high level at every record until a consuming read (the program's threads may wait). */
static inline void
rh_ring_passed(rh_ring *r, uint64_t used)
{
    if (r->round == NULL)
        return;
    if (used >= r->high_water) {
        r->round->full();
        return;
    }
    r->round->wake();
    r->mark = r->high_water;
}

/* The caller's line of a function record (its depth holds the line, or with RH_CALLER_OFFSET
 * the caller's instruction offset). Runs no Python code. */
static inline int32_t
rh_caller_line(const rh_rec *r)
{
    if (!(r->flags & RH_CALLER_OFFSET))
        return r->depth;
    if (r->parent == NULL || !PyCode_Check(r->parent))
        return 0;
    int line = PyCode_Addr2Line((PyCodeObject *)r->parent, r->depth);
    return line < 0 ? 0 : line;
}

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

/* The writer moves past the record at wpos, rec (the next event's number taken). */
static inline void
rh_ring_advance(rh_ring *r, const rh_rec *rec)
{
    r->head++;
    r->wpos = r->wpos + 1 == r->capacity ? 0 : r->wpos + 1;
#if defined(__GNUC__)
    /* the records a few events ahead: their lines are read (what they held) and written.
     * Past the array's end near a wrap: a prefetch never faults, it only fetches nothing of
     * use there (cheaper than the compare that would skip it) */
    __builtin_prefetch((const void *)((uintptr_t)rec + RH_PREFETCH_AHEAD * sizeof(rh_rec)), 1, 3);
#endif
}

/* The record to fill for the next event, or NULL when none is written (tracing off, or a full
 * ring that does not overwrite: then the event is counted as refused). The caller fills every
 * field (code and parent receive new references), then calls rh_ring_done(&stale). */
static inline rh_rec *
rh_ring_reserve(rh_ring *r, rh_stale *stale)
{
    stale->code = stale->parent = NULL;
    if (!r->on)
        return NULL;
    uint64_t used = r->head - r->floor;
    if (used >= r->mark) { /* (one compare per record below it; mark <= capacity) */
        rh_ring_passed(r, used);
        if (used >= r->capacity) {
            if (!r->overwrite) {
                r->refused++;
                r->refused_unreported++;
                return NULL;
            }
            r->floor = r->head - r->capacity + 1; /* the oldest is overwritten (lost) */
        }
    }
    rh_rec *rec = &r->recs[r->wpos];
    if (used >= r->capacity) { /* (otherwise the slot is empty: the invariant, _cring.c) */
        stale->code = rec->code;
        stale->parent = rec->parent;
        rec->code = rec->parent = NULL;
    }
    rh_ring_advance(r, rec);
    return rec;
}

/* rh_ring_reserve() for a writer's fast lane: the record to fill when writing it needs nothing
 * else -- the ring is on and below its mark (so no report to make and nothing overwritten:
 * the slot is empty, by _cring.c's invariant, as head - floor < capacity) -- else NULL,
 * nothing changed, and the caller takes rh_ring_reserve(). It makes no call, so a writer
 * that uses it keeps its fast lane to a few registers; and it does not read the slot, which
 * on a page nobody has touched yet would map the zero page for the read, then fault again
 * for the write (two faults a fresh 4 KB page instead of one). Fill every field; no
 * rh_ring_done() is needed. */
static inline rh_rec *
rh_ring_reserve_quiet(rh_ring *r)
{
    if (!r->on || r->head - r->floor >= r->mark)
        return NULL;
    rh_rec *rec = &r->recs[r->wpos];
    rh_ring_advance(r, rec);
    return rec;
}

/* Fill a reserved record of the function_graph types (no parent): every field, a new
 * reference to code. */
static inline void
rh_rec_set_graph(rh_rec *rec, int type, int64_t ts, PyObject *code, int64_t calltime,
                 int64_t sleep, long depth, long flags, long overrun)
{
    rec->ts = ts;
    rec->code = Py_NewRef(code);
    rec->parent = NULL;
    rec->calltime = calltime;
    rec->sleep = sleep;
    rec->type = type;
    rec->depth = (int32_t)depth;
    rec->flags = (int32_t)flags;
    rec->overrun = (int32_t)overrun;
}

/* After the reserved record is filled: release what it held before. */
static inline void
rh_ring_done(rh_stale *stale)
{
    Py_XDECREF(stale->code);
    Py_XDECREF(stale->parent);
}

/* Records taken out of a ring by a consuming read (rh_cring_api.take). */
typedef struct {
    rh_rec *recs;          /* n records, oldest first, each holding its references */
    uint64_t n;
    uint64_t lost_before;  /* records overwritten since the last consuming read: before recs */
    uint64_t lost_after;   /* records refused since then: after recs (where is not known) */
    uint64_t clear_seq;    /* the ring's clear_seq when taken (untake checks it) */
    uint64_t first;        /* the sequence number of the first record */
    int owned;             /* recs is a PyMem array of the ring module's (release frees it) */
} rh_taken;

/* What _cring exports to other extensions (capsule "rethook.buffer._cring._C_API").
 *
 * ring_type is all the native users need. The rest is the consuming read of Ring.consume()
 * in pieces, for a reader that does not want event tuples (the trace file writer's fused
 * drain, rethook.buffer._tfenc): take() is Ring.consume()'s read and accounting,
 * take_in_place() its accounting alone, detach() its accounting with the ring's array taken
 * out, untake() its accounting when the records then reach no reader, release() drops what
 * take() gave, events() its decoding into event tuples. The module's _C_API_VERSION says
 * which fields exist (1: ring_type only; 2: up to events; 3: all of them);
 * fields are only ever added at the end. */
typedef struct {
    PyTypeObject *ring_type;
    /* Move every readable record of r (head - floor of them: at most `room`, else -1 with
     * ValueError) into the caller's array buf, oldest first, with Ring.consume()'s
     * accounting: t gets them, and lost_before/lost_after as it reports them; the ring's
     * read position goes to its head. Runs no Python code (read r->head - r->floor, make
     * room, take: nothing can write the ring in between). 0, or -1 (the ring unchanged). */
    int (*take)(rh_ring *r, rh_taken *t, rh_rec *buf, uint64_t room);
    /* take()'s accounting, the records left where they are: t->first and t->n say which
     * (t->recs is NULL). They are no longer readable, but their slots still hold their
     * references, which the caller now owns: it must take every one of them out of the ring
     * (read the slot, set its code and parent to NULL) before running any Python code, or
     * anything else that may write the ring (a writer would release them). Runs no Python
     * code. */
    void (*take_in_place)(rh_ring *r, rh_taken *t);
    /* The records t holds reach no reader (an error after take()): count them lost as
     * Ring.consume() does (the next consuming read reports them after its records), unless
     * the ring was cleared since. Runs no Python code. */
    void (*untake)(rh_ring *r, const rh_taken *t);
    /* Release the references the records of t hold (t is left empty; the caller's array
     * stays its). May run Python code (code objects freed: weakref callbacks). */
    void (*release)(rh_taken *t);
    /* Ring.consume(tid, name_of)'s decoding: a new list of the event tuples of n records
     * (references borrowed from recs, which must stay alive), or NULL with an error. Calls
     * name_of once per distinct code object. */
    PyObject *(*events)(const rh_rec *recs, uint64_t n, PyObject *tid, PyObject *name_of);
    /* --- version 3 --- */
    /* take_in_place()'s accounting, and the ring's array taken out with the records: the
     * ring gets an empty array of the same capacity (the spare, or a new one) and writers go
     * on in it, so the records of t, in *array at (t->first + i) % capacity for i < t->n,
     * are the caller's alone, references included: it reads them without the GIL and runs
     * Python code as it likes. It must empty every one of those slots (the array's others
     * are empty) and hand the array to give_back(). 0, or -1 with MemoryError (nothing
     * taken). Runs no Python code. */
    int (*detach)(rh_ring *r, rh_taken *t, rh_rec **array);
    /* An array detach() gave, every slot empty, with its ring's capacity then: kept as the
     * spare the next detach() puts in a ring, or freed. Runs no Python code. */
    void (*give_back)(rh_rec *array, uint64_t capacity);
    /* Free the spare (the recording is over). Runs no Python code. */
    void (*free_spare)(void);
    /* Make the spare an array of this capacity now (a recording starts), rather than at the
     * first detach(): the spare, which stays the next detach()'s (the caller may page it in
     * with MADV_POPULATE_WRITE, which keeps what it holds), or NULL with MemoryError. */
    rh_rec *(*reserve_spare)(uint64_t capacity);
} rh_cring_api;

#define RH_CRING_CAPSULE "rethook.buffer._cring._C_API"
#define RH_CRING_API_VERSION 3

#endif
