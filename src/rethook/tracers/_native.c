/* rethook.tracers._native: the built-in users that run on every call, written in C.
 *
 * The engine calls a user's handlers with fixed arguments (engine.py: FtraceOps.func,
 * FgraphOps.entryfunc/retfunc/suspendfunc/resumefunc). The handlers here are those same
 * callables, written in C, so the C core calls them exactly as it calls Python handlers, and
 * nothing in the engine knows they are native. They do per call what the pure-Python users
 * in function.py, function_graph.py and profiler.py do, and write fixed-size records into the
 * calling thread's C ring (rethook/buffer/cring.h) instead of appending tuples.
 *
 * One type, NativeUser, with a kind:
 *
 *   KIND_FUNCTION  func(code, frame): an RH_FUNCTION record (function and caller)
 *   KIND_GRAPH     function_graph: entry/exit/suspend/resume records, set_graph_function,
 *                  set_graph_notrace, max_graph_depth, tracing_thresh, sleep-time
 *   KIND_PROFILE   the function profiler: per thread, per code: hits, time, time^2 (the
 *                  kernel's columns; with graph-time off a call's children's time is
 *                  subtracted), and the columns cProfile has: calls not inside another call
 *                  of the same function (prim), their inclusive time (total), self time; and
 *                  the same per caller -> callee edge. A call's parent is found on the user's
 *                  own per-thread stack of open calls, which mirrors this user's claims on the
 *                  engine's shadow stack.
 *
 * Per-thread state (TState) is found through a small cache indexed by the PyThreadState's
 * address and checked against its unique id; it lives as long as the user. A call's entry data
 * is an NCall object (from a freelist): the thread state it belongs to, its depth and kind, or
 * its profiler row and children's time. NCall holds a reference to its user, so a user (and
 * its thread states) outlives every record that still carries its data.
 *
 * The function_graph user also offers direct hooks (engine/fgraph_direct.h), which the C core
 * calls with C values where it is a function's only user: plain functions' calls keep their
 * data on the thread's DCall stack (no NCall); generators' and coroutines' calls get the same
 * NCall as through entryfunc, as their direct record's claim data, and the gen_* hooks share
 * the handlers' code (graph_claim, graph_call_exit/suspend/resume). Claims delivered from
 * Python (teardown, collect_parked) still come through retfunc.
 *
 * Everything runs under the GIL; nothing here releases it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "clock.h"

#include "cring.h"
#include "fgraph_direct.h"
#include "pyframe.h"
#include "ptrhash.h"

#ifdef Py_GIL_DISABLED
#error "rethook's native users rely on the GIL"
#endif

#if PY_VERSION_HEX >= 0x030D0000
#define current_tstate() PyThreadState_GetUnchecked()
#else
#define current_tstate() _PyThreadState_UncheckedGet()
#endif

enum { KIND_FUNCTION = 0, KIND_GRAPH = 1, KIND_PROFILE = 2 };

/* What a graph call's entry data says its exit has to do (function_graph.py's _RECORD...). */
enum { CALL_RECORD = 0, CALL_NOTRACE = 1, CALL_ROOT = 2 };

#define TS_CACHE 64            /* per-user thread cache entries (a power of two) */
#define NCALL_FREELIST 256     /* NCall objects kept for reuse */

static PyTypeObject *Ring_t; /* rethook.buffer._cring.Ring, from its capsule */

static const rh_clock *trace_clock; /* _clock's calibration, or NULL: CLOCK_MONOTONIC */

static inline long long
now_ns(void)
{
    return rh_clock_ns(trace_clock); /* the trace clock (clock.h), shared with Python */
}

/* ---------------------------------------------------------------------------------------- */
/* Profiler rows: per thread, open-addressing tables of Row pointers keyed by code address: one
 * row per function (caller NULL), and one per caller -> callee edge. */

typedef struct {
    PyObject *code;   /* owned */
    PyObject *caller; /* owned: the calling function of an edge; NULL for a function's row */
    long long hit;    /* calls and resumptions (cProfile's ncalls) */
    long long prim;   /* of those, made with no other call of code (of this edge) on the stack */
    long long time;   /* the kernel's Time: inclusive with graph-time on, self time with it off */
    unsigned __int128 sq; /* sum of squared times: a 3 s call squared overflows 64 bits */
    long long total;  /* inclusive time of the calls that were prim at entry (cProfile's ct) */
    long long self;   /* time minus the children's (cProfile's tt) */
    long active;      /* calls of code (of this edge) on the thread's stack now */
} Row;

typedef struct {
    Row **slots;
    size_t size; /* a power of two, or 0 */
    size_t used;
} RowTable;

static inline size_t
hash_row(const void *code, const void *caller)
{
    return rh_hash_ptr(code) ^ (rh_hash_ptr(caller) * 31);
}

static int
rows_grow(RowTable *t)
{
    size_t size = t->size ? t->size * 2 : 64;
    Row **slots = PyMem_Calloc(size, sizeof(Row *));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < t->size; i++) {
        Row *r = t->slots[i];
        if (r == NULL)
            continue;
        size_t j = hash_row(r->code, r->caller) & (size - 1);
        while (slots[j] != NULL)
            j = (j + 1) & (size - 1);
        slots[j] = r;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->size = size;
    return 0;
}

/* The row of code (of the edge caller -> code), created on first use (NULL with an error set
 * on failure). */
static inline Row *
row_of(RowTable *t, PyObject *code, PyObject *caller)
{
    if (t->size) {
        size_t j = hash_row(code, caller) & (t->size - 1);
        Row *r;
        while ((r = t->slots[j]) != NULL) {
            if (r->code == code && r->caller == caller)
                return r;
            j = (j + 1) & (t->size - 1);
        }
    }
    if ((t->used + 1) * 2 > t->size && rows_grow(t) < 0)
        return NULL;
    Row *r = PyMem_Calloc(1, sizeof(Row));
    if (r == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    r->code = Py_NewRef(code);
    r->caller = Py_XNewRef(caller);
    size_t j = hash_row(code, caller) & (t->size - 1);
    while (t->slots[j] != NULL)
        j = (j + 1) & (t->size - 1);
    t->slots[j] = r;
    t->used++;
    return r;
}

static void
rows_free(RowTable *t)
{
    for (size_t i = 0; i < t->size; i++) {
        if (t->slots[i] != NULL) {
            Py_DECREF(t->slots[i]->code);
            Py_XDECREF(t->slots[i]->caller);
            PyMem_Free(t->slots[i]);
        }
    }
    PyMem_Free(t->slots);
    t->slots = NULL;
    t->size = t->used = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Thread states and the call objects (entry data).                                        */

typedef struct NCall NCall;

/* A function_graph call claimed through the direct entry: the entry data NCall holds
 * otherwise, kept on the thread's own stack (returns come newest first on a thread). */
typedef struct {
    int64_t t0;
    long d;
    int kind;
} DCall;

typedef struct TState {
    struct TState *next;   /* every state of the user, for teardown and reading */
    PyThreadState *tstate; /* the thread's PyThreadState (only compared, never used) */
    uint64_t tstate_id;
    unsigned long tid;     /* native thread id */
    rh_ring *ring;         /* owned; NULL for the profiler */
    long depth;            /* graph: calls this user is recording, open on this thread */
    long graph;            /* graph: open set_graph_function roots */
    long notrace;          /* graph: open set_graph_notrace functions */
    unsigned long ident;   /* threading.get_ident() of the thread (ThreadState.tid) */
    DCall *dstack;         /* graph: calls claimed through direct entry (fgraph_direct.h) */
    Py_ssize_t ndstack, capdstack;
    RowTable rows;         /* profiler: per function */
    RowTable edges;        /* profiler: per caller -> callee */
    NCall **stack;         /* profiler: this user's open calls on this thread (borrowed) */
    Py_ssize_t nstack, capstack;
} TState;

typedef struct {
    PyThreadState *tstate;
    uint64_t id;
    TState *st;
} TCache;

typedef struct {
    PyObject_HEAD
    int kind;
    PyObject *buffer;     /* the TraceBuffer (function, graph) or None */
    PyObject *name_of;    /* registry.name, handed to the buffer for reading records */
    PyObject *roots;      /* dict id(code) -> code: set_graph_function, or NULL */
    PyObject *skip;       /* dict id(code) -> code: set_graph_notrace, or NULL */
    PyObject *overrun_of; /* callable () -> int when funcgraph-overrun is on, or NULL */
    long max_depth;       /* 0: no limit */
    long long thresh;     /* tracing_thresh in ns, 0: off */
    int sleep_time;       /* durations include time suspended */
    int graph_time;       /* profiler: time includes children */
    int exit_raised;      /* flag bit an exit record gets when the call raised */
    int plain;            /* graph: none of roots, skip, overrun_of, max_depth, thresh (the
                           * direct hooks' fast lane records every call as it comes) */
    TState *states;
    unsigned long made;   /* thread states made so far (fresh_time()) */
    rh_direct direct;      /* the hooks ops.direct's capsule points at (fgraph_direct.h) */
    rh_fdirect fdirect;    /* the same for the function user (an entry user) */
    TCache cache[TS_CACHE];
    PyObject *weakreflist;
} NUser;

struct NCall {
    PyObject_HEAD
    NUser *user;   /* owned: keeps the thread states alive */
    TState *st;    /* the thread the call runs in (updated on resume) */
    long d;        /* graph: depth */
    int kind;      /* graph: CALL_* */
    int in_stack;  /* profiler: on st->stack */
    int prim;      /* profiler: PRIM_* of the entry (what its time counts in) */
    int64_t t0;    /* graph: entry time, if not the engine's (0): see fresh_time() */
    long long child; /* profiler: children's time */
    Row *row;      /* profiler: the row of the thread that made the call */
    Row *edge;     /* profiler: the edge it was called through (NULL: no caller) */
    Row *arow;     /* profiler: the rows whose active count holds the call while on a stack */
    Row *aedge;
};

/* NCall.prim: the entry was not inside another call of the function, of the edge. */
enum { PRIM_ROW = 1, PRIM_EDGE = 2 };

static PyTypeObject NCall_Type;
static PyTypeObject NUser_Type;

static NCall *ncall_free[NCALL_FREELIST];
static int ncall_nfree;

static void prof_leave(NCall *c, NCall **parent);

static NCall *
ncall_new(NUser *u, TState *st)
{
    NCall *c;
    if (ncall_nfree) {
        c = ncall_free[--ncall_nfree];
        (void)PyObject_Init((PyObject *)c, &NCall_Type);
    }
    else {
        c = PyObject_New(NCall, &NCall_Type);
        if (c == NULL)
            return NULL;
    }
    c->user = (NUser *)Py_NewRef(u);
    c->st = st;
    c->d = 0;
    c->kind = CALL_RECORD;
    c->in_stack = 0;
    c->prim = 0;
    c->t0 = 0;
    c->child = 0;
    c->row = c->edge = c->arow = c->aedge = NULL;
    return c;
}

static void
NCall_dealloc(NCall *c)
{
    if (c->in_stack) /* dropped without a return (the engine lost it): never dangle */
        prof_leave(c, NULL);
    NUser *u = c->user;
    if (ncall_nfree < NCALL_FREELIST)
        ncall_free[ncall_nfree++] = c;
    else
        PyObject_Free(c);
    Py_DECREF(u);
}

static PyObject *
NCall_repr(NCall *c)
{
    return PyUnicode_FromFormat("<NCall depth=%ld kind=%d child=%lld>", c->d, c->kind,
                                c->child);
}

static PyTypeObject NCall_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rethook.tracers._native.NCall",
    .tp_basicsize = sizeof(NCall),
    .tp_dealloc = (destructor)NCall_dealloc,
    .tp_repr = (reprfunc)NCall_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A native user's entry data for one call.",
};

static int
stack_push(TState *st, NCall *c)
{
    if (st->nstack == st->capstack) {
        Py_ssize_t cap = st->capstack ? st->capstack * 2 : 64;
        NCall **s = PyMem_Realloc(st->stack, (size_t)cap * sizeof(NCall *));
        if (s == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        st->stack = s;
        st->capstack = cap;
    }
    st->stack[st->nstack++] = c;
    c->in_stack = 1;
    return 0;
}

/* Take c off its thread's stack; *parent gets the open call below it (or NULL). */
static void
stack_remove(TState *st, NCall *c, NCall **parent)
{
    Py_ssize_t i = st->nstack - 1;
    while (i >= 0 && st->stack[i] != c)
        i--;
    if (parent != NULL)
        *parent = NULL;
    if (i < 0)
        return;
    if (parent != NULL && i > 0)
        *parent = st->stack[i - 1];
    memmove(&st->stack[i], &st->stack[i + 1], (size_t)(st->nstack - i - 1) * sizeof(NCall *));
    st->nstack--;
    c->in_stack = 0;
}

/* The state of the thread ts (put in the cache entry e), or NULL when it has none and `make`
 * is 0; with `make`, one is created for it (with its ring, from the buffer: Python code runs),
 * or NULL with an error. */
static __attribute__((noinline, cold)) TState *
tstate_slow(NUser *u, PyThreadState *ts, TCache *e, int make)
{
    TState *st;
    for (st = u->states; st != NULL; st = st->next)
        if (st->tstate == ts && st->tstate_id == ts->id)
            break;
    if (st == NULL && !make)
        return NULL;
    if (st == NULL) {
        rh_ring *ring = NULL;
        if (u->buffer != Py_None) {
            PyObject *r = PyObject_CallMethod(u->buffer, "native_local", "O", u->name_of);
            if (r == NULL)
                return NULL;
            if (!PyObject_TypeCheck(r, Ring_t)) {
                PyErr_Format(PyExc_TypeError, "native_local() returned a %.100s, not a Ring",
                             Py_TYPE(r)->tp_name);
                Py_DECREF(r);
                return NULL;
            }
            ring = (rh_ring *)r;
        }
        st = PyMem_Calloc(1, sizeof(TState));
        if (st == NULL) {
            Py_XDECREF(ring);
            PyErr_NoMemory();
            return NULL;
        }
        st->tstate = ts;
        st->tstate_id = ts->id;
        st->tid = PyThread_get_thread_native_id();
        st->ident = PyThread_get_thread_ident();
        st->ring = ring;
        st->next = u->states;
        u->states = st;
        u->made++;
    }
    e->tstate = ts;
    e->id = ts->id;
    e->st = st;
    return st;
}

/* The cache entry for thread ts. */
static inline TCache *
tcache_entry(NUser *u, PyThreadState *ts)
{
    return &u->cache[rh_hash_ptr(ts) & (TS_CACHE - 1)];
}

/* The state entry e holds for thread ts, or NULL (another thread's, or empty). */
static inline TState *
tcache_hit(const TCache *e, PyThreadState *ts)
{
    return e->tstate == ts && e->id == ts->id ? e->st : NULL;
}

/* The thread's state if the cache has it (no call), else NULL. */
static inline TState *
tstate_cached(NUser *u, PyThreadState *ts)
{
    return tcache_hit(tcache_entry(u, ts), ts);
}

static inline TState *
tstate_lookup(NUser *u, PyThreadState *ts, int make)
{
    TCache *e = tcache_entry(u, ts);
    TState *st = tcache_hit(e, ts);
    return st != NULL ? st : tstate_slow(u, ts, e, make);
}

/* The thread's state, made on its first call (through Python), or NULL with an error. */
static inline TState *
tstate_in(NUser *u, PyThreadState *ts)
{
    return tstate_lookup(u, ts, 1);
}

/* The thread's state, or NULL when it has none yet (no error set; no Python code runs). */
static inline TState *
tstate_known(NUser *u, PyThreadState *ts)
{
    return tstate_lookup(u, ts, 0);
}

static inline TState *
tstate_of(NUser *u)
{
    return tstate_in(u, current_tstate());
}

/* A call's entry time, given the user's count of thread states from before its state was
 * looked up: a thread met for the first time had its ring allocated just now (≈1 ms for a
 * large buffer), which is no part of the call, so its time is taken again, after. */
static inline int64_t
fresh_time(NUser *u, unsigned long made_before, int64_t t)
{
    return u->made == made_before ? t : now_ns();
}

/* ---------------------------------------------------------------------------------------- */
/* Writing records.                                                                          */

static inline void
put(rh_ring *r, int type, int64_t ts, PyObject *code, long depth)
{
    rh_stale stale;
    rh_rec *rec = rh_ring_reserve(r, &stale);
    if (rec == NULL)
        return;
    rh_rec_set_graph(rec, type, ts, code, 0, 0, depth, 0, 0);
    rh_ring_done(&stale);
}

static int
bad_args(const char *what, Py_ssize_t nargs, Py_ssize_t want)
{
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", what, want, nargs);
    return -1;
}

/* PyLong_AsLong, not AsLongLong: on 3.13 the latter goes through _PyLong_AsByteArray, which
 * costs a timestamp ~10 ns; long is 64 bits on the LP64 platforms this builds for. */
_Static_assert(sizeof(long) == sizeof(int64_t), "rethook's native users need a 64-bit long");

static inline int
as_i64(PyObject *o, int64_t *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static inline NCall *
as_call(NUser *u, PyObject *data)
{
    if (!Py_IS_TYPE(data, &NCall_Type) || ((NCall *)data)->user != u) {
        PyErr_Format(PyExc_TypeError, "entry data of a native user is a %.100s, not its NCall",
                     Py_TYPE(data)->tp_name);
        return NULL;
    }
    return (NCall *)data;
}

/* The preamble of the handlers that get entry data: nargs arguments, the NCall in args[3]. */
static inline NCall *
call_arg(NUser *u, const char *what, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs != want) {
        bad_args(what, nargs, want);
        return NULL;
    }
    return as_call(u, args[3]);
}

/* id(code) in a dict keyed by ids (code objects compare by value, so never a set of them). */
static int
in_selection(PyObject *dict, PyObject *code)
{
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL)
        return -1;
    int r = PyDict_Contains(dict, key);
    Py_DECREF(key);
    return r;
}

/* The function tracer's record: code called at t by parent (a new reference, or NULL: the
 * caller's code, which the record takes) from line where, or from instruction offset where
 * when is_offset (the reader computes the line). Shared by NUser_func and func_direct. */
static void
put_function(rh_ring *r, int64_t t, PyObject *code, PyObject *parent, int where, int is_offset)
{
    rh_stale stale;
    rh_rec *rec = rh_ring_reserve(r, &stale);
    if (rec == NULL) {
        Py_XDECREF(parent); /* (the caller's frame holds its code: nothing is freed) */
        return;
    }
    rec->ts = t;
    rec->code = Py_NewRef(code);
    rec->parent = parent;
    rec->calltime = 0;
    rec->sleep = 0;
    rec->type = RH_FUNCTION;
    rec->depth = where < 0 ? 0 : where;
    rec->flags = is_offset ? RH_CALLER_OFFSET : 0;
    rec->overrun = 0;
    rh_ring_done(&stale);
}

/* ---------------------------------------------------------------------------------------- */
/* The handlers.                                                                             */

/* function: func(code, frame) */
static PyObject *
NUser_func(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && bad_args("func", nargs, 2))
        return NULL;
    TState *st = tstate_of(u);
    if (st == NULL)
        return NULL;
    int64_t t = now_ns();
    if (!st->ring->on)
        Py_RETURN_NONE;
    /* everything that may run Python code (frame objects, decrefs) before the record */
    PyObject *parent = NULL;
    int line = 0, is_offset = 0;
    if (PyFrame_Check(args[1])) { /* a frame some other user wanted: its f_back */
        PyFrameObject *back = PyFrame_GetBack((PyFrameObject *)args[1]);
        if (back != NULL) {
            parent = (PyObject *)PyFrame_GetCode(back);
            line = PyFrame_GetLineNumber(back);
            Py_DECREF(back);
        }
    }
    else if (rh_caller(current_tstate(), &parent, &line, &is_offset) < 0) {
        return NULL; /* (no frame objects: engine/pyframe.h) */
    }
    put_function(st->ring, t, args[0], parent, line, is_offset);
    Py_RETURN_NONE;
}

/* function's direct hook (fgraph_direct.h, "Direct calls of an entry user"): NUser_func's
 * record, on a thread the cache knows, the caller read from the interpreter's frames. A thread
 * without state yet: RH_DIRECT_PREPARE, and the core calls NUser_func, which makes it. */
static int
func_direct(void *self, PyThreadState *tstate, PyObject *code)
{
#if RH_HAVE_IFRAME
    TState *st = tstate_cached(self, tstate);
    if (st == NULL)
        return RH_DIRECT_PREPARE;
    int64_t t = now_ns();
    if (!st->ring->on)
        return 0;
    PyObject *parent;
    int where, is_offset;
    if (rh_caller(tstate, &parent, &where, &is_offset) < 0)
        return -1;
    put_function(st->ring, t, code, parent, where, is_offset);
    return 0;
#else
    return RH_DIRECT_PREPARE; /* frame objects: NUser_func */
#endif
}

/* Whether function_graph records a call on this thread (function_graph.py's entryfunc
 * checks): -1 error, 0 declined, 1 taken with *kind set. A set_graph_notrace function is
 * taken with CALL_NOTRACE: its exit must undo the nesting it starts. */
static int
graph_admit(NUser *u, TState *st, PyObject *code, int *kind)
{
    if (st->notrace)
        return 0;
    *kind = CALL_RECORD;
    if (u->skip != NULL) {
        int r = in_selection(u->skip, code);
        if (r != 0) {
            *kind = CALL_NOTRACE;
            return r;
        }
    }
    if (u->roots != NULL && !st->graph) {
        int r = in_selection(u->roots, code);
        if (r <= 0)
            return r;
        *kind = CALL_ROOT;
    }
    if (u->max_depth && st->depth >= u->max_depth)
        return 0;
    return 1;
}

/* A call enters the graph on this thread at depth *d (taken, or resumed: type says which
 * record it writes): the nesting counters and its record. */
static inline void
graph_enter(NUser *u, TState *st, PyObject *code, int64_t t, int kind, long *d, int type)
{
    if (kind == CALL_NOTRACE) {
        st->notrace++;
        return;
    }
    *d = st->depth;
    if (kind == CALL_ROOT)
        st->graph++;
    st->depth = *d + 1;
    if (!u->thresh)
        put(st->ring, type, t, code, *d);
}

/* A graph call enters on thread st at time t (the engine's; made_before: u->made before st was
 * looked up): its NCall (a new reference), Py_None (new reference) when declined, or NULL with
 * an error set. Shared by entryfunc and the direct generator entry. */
static PyObject *
graph_claim(NUser *u, TState *st, PyObject *code, int64_t t, unsigned long made_before)
{
    int kind;
    int r = graph_admit(u, st, code, &kind);
    if (r <= 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    NCall *c = ncall_new(u, st);
    if (c == NULL)
        return NULL;
    if (u->made != made_before)
        t = c->t0 = fresh_time(u, made_before, t);
    c->kind = kind;
    graph_enter(u, st, code, t, kind, &c->d, RH_FUNCGRAPH_ENTRY);
    return (PyObject *)c;
}

/* function_graph: entryfunc(code, frame, depth, t) -> NCall or None */
static PyObject *
graph_entry(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 && bad_args("entryfunc", nargs, 4))
        return NULL;
    unsigned long made = u->made;
    TState *st = tstate_of(u);
    if (st == NULL)
        return NULL;
    int64_t t;
    if (as_i64(args[3], &t) < 0)
        return NULL;
    return graph_claim(u, st, args[0], t, made);
}

/* A graph call leaves its thread (returns or suspends): undo what its entry did to the
 * nesting counters. 1 for a set_graph_notrace call, which records nothing. */
static inline int
graph_leave(TState *st, int kind, long d)
{
    if (kind == CALL_NOTRACE) {
        st->notrace--;
        return 1;
    }
    st->depth = d;
    if (kind == CALL_ROOT)
        st->graph--;
    return 0;
}

/* The exit record of a call that entered at depth d (tracing_thresh, funcgraph-overrun).
 * Inlined: it is most of a direct exit, which then runs as one function. */
static inline __attribute__((always_inline)) int
graph_exit_record(NUser *u, TState *st, PyObject *code, long d, int64_t t0, int64_t t1,
                  int64_t sleep, long flags, int raised)
{
    int64_t duration = u->sleep_time ? t1 - t0 : t1 - t0 - sleep;
    if (u->thresh && duration <= u->thresh)
        return 0;
    if (raised)
        flags |= u->exit_raised;
    long overrun = 0;
    if (u->overrun_of != NULL) {
        PyObject *o = PyObject_CallNoArgs(u->overrun_of);
        if (o == NULL)
            return -1;
        overrun = PyLong_AsLong(o);
        Py_DECREF(o);
        if (overrun == -1 && PyErr_Occurred())
            return -1;
    }
    /* A return delivered from another thread (teardown) still goes into the call's thread's
     * ring: rings are written under the GIL, by any thread. */
    rh_stale stale;
    rh_rec *rec = rh_ring_reserve(st->ring, &stale);
    if (rec == NULL)
        return 0;
    rh_rec_set_graph(rec, RH_FUNCGRAPH_EXIT, t1, code, t1 - duration, sleep, d, flags, overrun);
    rh_ring_done(&stale);
    return 0;
}

/* ---- the direct entry (fgraph_direct.h): no NCall, no Python objects per call ---------- */

static int
dstack_push(TState *st, DCall c)
{
    if (st->ndstack == st->capdstack) {
        Py_ssize_t cap = st->capdstack ? st->capdstack * 2 : 64;
        DCall *s = PyMem_Realloc(st->dstack, (size_t)cap * sizeof(DCall));
        if (s == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        st->dstack = s;
        st->capdstack = cap;
    }
    st->dstack[st->ndstack++] = c;
    return 0;
}

/* ---- The direct hooks' fast lane --------------------------------------------------------
 * A plain user's call (u->plain: every call is recorded as it comes, at depth st->depth) on a
 * thread the cache knows, with room on the thread's stack and a quiet record in its ring
 * (rh_ring_reserve_quiet): the same DCall and records as below, with no call made, so the
 * hooks stay small. Anything else goes to direct_entry_general / direct_exit_general. */

static int direct_entry_general(NUser *u, PyThreadState *tstate, PyObject *code, int64_t t);
static int direct_exit_general(NUser *u, PyThreadState *tstate, PyObject *code, int64_t t,
                               PyObject *exc, long flags);

static int
direct_entry(void *self, PyThreadState *tstate, PyObject *code, int64_t t)
{
    NUser *u = self;
    TState *st = u->plain ? tstate_cached(u, tstate) : NULL;
    if (st != NULL && !st->notrace && st->ndstack < st->capdstack) {
        rh_rec *rec = rh_ring_reserve_quiet(st->ring);
        if (rec != NULL) {
            long d = st->depth;
            st->dstack[st->ndstack++] = (DCall){t, d, CALL_RECORD};
            st->depth = d + 1;
            rh_rec_set_graph(rec, RH_FUNCGRAPH_ENTRY, t, code, 0, 0, d, 0, 0);
            return 1;
        }
    }
    return direct_entry_general(u, tstate, code, t);
}

static int
direct_exit(void *self, PyThreadState *tstate, PyObject *code, int64_t t, PyObject *exc,
            long flags)
{
    NUser *u = self;
    TState *st = u->plain ? tstate_cached(u, tstate) : NULL;
    if (st != NULL && st->ndstack > 0 && st->dstack[st->ndstack - 1].kind == CALL_RECORD) {
        rh_rec *rec = rh_ring_reserve_quiet(st->ring);
        if (rec != NULL) {
            DCall c = st->dstack[--st->ndstack];
            st->depth = c.d;
            if (exc != NULL && exc != Py_None)
                flags |= u->exit_raised;
            /* (calltime: the entry's; no sleep: a plain function's call does not suspend) */
            rh_rec_set_graph(rec, RH_FUNCGRAPH_EXIT, t, code, c.t0, 0, c.d, flags, 0);
            return 0;
        }
    }
    return direct_exit_general(u, tstate, code, t, exc, flags);
}

/* Runs no Python code: a thread without a state yet is left to direct_prepare(). */
static __attribute__((noinline)) int
direct_entry_general(NUser *u, PyThreadState *tstate, PyObject *code, int64_t t)
{
    TState *st = tstate_known(u, tstate);
    if (st == NULL)
        return RH_DIRECT_PREPARE;
    DCall c = {t, 0, CALL_RECORD};
    int r = graph_admit(u, st, code, &c.kind);
    if (r <= 0)
        return r;
    if (dstack_push(st, c) < 0)
        return -1;
    graph_enter(u, st, code, t, c.kind, &st->dstack[st->ndstack - 1].d, RH_FUNCGRAPH_ENTRY);
    return 1;
}

/* The calling thread's state, with its ring (made through Python). */
static int
direct_prepare(void *self, PyThreadState *tstate)
{
    return tstate_in(self, tstate) == NULL ? -1 : 0;
}

/* The newest direct call of thread st leaves (returns, raises, or is delivered unfinished). */
static inline int
direct_leave(NUser *u, TState *st, PyObject *code, int64_t t, int raised, long flags)
{
    if (st->ndstack == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "rethook: a direct exit without a direct entry on this thread");
        return -1;
    }
    DCall c = st->dstack[--st->ndstack];
    if (graph_leave(st, c.kind, c.d))
        return 0;
    return graph_exit_record(u, st, code, c.d, c.t0, t, 0, flags, raised);
}

static __attribute__((noinline)) int
direct_exit_general(NUser *u, PyThreadState *tstate, PyObject *code, int64_t t, PyObject *exc,
                    long flags)
{
    TState *st = tstate_known(u, tstate); /* (its entry made it: no Python code runs) */
    if (st == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "rethook: a direct exit on a thread the user has no state for");
        return -1;
    }
    return direct_leave(u, st, code, t, exc != NULL && exc != Py_None, flags);
}

/* A direct claim delivered from Python (teardown): its entry data is the ThreadState of the
 * call's thread, whose tid is that thread's threading.get_ident(). */
static PyObject *
direct_unfinished(NUser *u, PyObject *const *args)
{
    PyObject *tid_obj = PyObject_GetAttrString(args[3], "tid");
    if (tid_obj == NULL)
        return NULL;
    unsigned long ident = PyLong_AsUnsignedLong(tid_obj);
    Py_DECREF(tid_obj);
    if (ident == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    int64_t t, flags;
    if (as_i64(args[7], &t) < 0 || as_i64(args[9], &flags) < 0)
        return NULL;
    TState *st = u->states;
    while (st != NULL && st->ident != ident)
        st = st->next;
    if (st == NULL) {
        PyErr_Format(PyExc_RuntimeError, "rethook: no direct calls of thread %lu", ident);
        return NULL;
    }
    if (direct_leave(u, st, args[0], t, args[5] != Py_None, flags) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A graph call's return (returned, raised, or delivered unfinished or closed): its nesting
 * undone and its exit record. Shared by retfunc and the direct generator exit. */
static int
graph_call_exit(NUser *u, NCall *c, PyObject *code, int64_t t0, int64_t t1, int64_t sleep,
                long flags, int raised)
{
    TState *st = c->st;
    if (graph_leave(st, c->kind, c->d))
        return 0;
    if (c->t0)
        t0 = c->t0;
    return graph_exit_record(u, st, code, c->d, t0, t1, sleep, flags, raised);
}

/* A graph call suspends at t (its thread is the one it ran on). */
static inline void
graph_call_suspend(NUser *u, NCall *c, PyObject *code, int64_t t)
{
    TState *st = c->st;
    if (graph_leave(st, c->kind, c->d))
        return;
    if (!u->thresh)
        put(st->ring, RH_FUNCGRAPH_SUSPEND, t, code, c->d);
}

/* A graph call resumes at t on thread st (possibly another one than it suspended on). */
static inline void
graph_call_resume(NUser *u, TState *st, NCall *c, PyObject *code, int64_t t)
{
    c->st = st;
    graph_enter(u, st, code, t, c->kind, &c->d, RH_FUNCGRAPH_RESUME);
}

/* function_graph: retfunc(code, frame, depth, data, retval, exc, t0, t1, sleep, flags) */
static PyObject *
graph_return(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 && bad_args("retfunc", nargs, 10))
        return NULL;
    if (!Py_IS_TYPE(args[3], &NCall_Type))
        return direct_unfinished(u, args);
    NCall *c = as_call(u, args[3]);
    if (c == NULL)
        return NULL;
    int64_t t0, t1, sleep, flags;
    if (as_i64(args[6], &t0) < 0 || as_i64(args[7], &t1) < 0 || as_i64(args[8], &sleep) < 0
        || as_i64(args[9], &flags) < 0)
        return NULL;
    if (graph_call_exit(u, c, args[0], t0, t1, sleep, flags, args[5] != Py_None) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* function_graph: suspendfunc(code, frame, depth, data, t) */
static PyObject *
graph_suspend(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    NCall *c = call_arg(u, "suspendfunc", args, nargs, 5);
    if (c == NULL)
        return NULL;
    int64_t t;
    if (as_i64(args[4], &t) < 0)
        return NULL;
    graph_call_suspend(u, c, args[0], t);
    Py_RETURN_NONE;
}

/* function_graph: resumefunc(code, frame, depth, data, t); possibly in another thread */
static PyObject *
graph_resume(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    NCall *c = call_arg(u, "resumefunc", args, nargs, 5);
    if (c == NULL)
        return NULL;
    int64_t t;
    if (as_i64(args[4], &t) < 0)
        return NULL;
    TState *st = tstate_of(u);
    if (st == NULL)
        return NULL;
    graph_call_resume(u, st, c, args[0], t);
    Py_RETURN_NONE;
}

/* ---- direct generator hooks (fgraph_direct.h's gen_*): the handlers above, with C values --
 * The entry data is the same NCall entryfunc makes, so a claim delivered from Python (sweep,
 * collect_parked, a thread's end) goes through retfunc as any other. */

/* Runs no Python code: a thread without a state yet is left to direct_prepare(). */
static int
direct_gen_entry(void *self, PyThreadState *tstate, PyObject *code, int64_t t, PyObject **data)
{
    NUser *u = self;
    TState *st = tstate_known(u, tstate);
    if (st == NULL)
        return RH_DIRECT_PREPARE;
    PyObject *c = graph_claim(u, st, code, t, u->made);
    if (c == NULL)
        return -1;
    if (c == Py_None) {
        Py_DECREF(c);
        return 0;
    }
    *data = c;
    return 1;
}

static int
direct_gen_suspend(void *self, PyThreadState *Py_UNUSED(tstate), PyObject *code, PyObject *data,
                   int64_t t)
{
    NUser *u = self;
    NCall *c = as_call(u, data);
    if (c == NULL)
        return -1;
    graph_call_suspend(u, c, code, t);
    return 0;
}

/* Runs no Python code: a thread without a state yet is left to direct_prepare(). */
static int
direct_gen_resume(void *self, PyThreadState *tstate, PyObject *code, PyObject *data, int64_t t)
{
    NUser *u = self;
    NCall *c = as_call(u, data);
    if (c == NULL)
        return -1;
    TState *st = tstate_known(u, tstate);
    if (st == NULL)
        return RH_DIRECT_PREPARE;
    graph_call_resume(u, st, c, code, t);
    return 0;
}

static int
direct_gen_exit(void *self, PyThreadState *Py_UNUSED(tstate), PyObject *code, PyObject *data,
                int64_t t0, int64_t t, int64_t sleep, PyObject *exc, long flags)
{
    NUser *u = self;
    NCall *c = as_call(u, data);
    if (c == NULL)
        return -1;
    return graph_call_exit(u, c, code, t0, t, sleep, flags, exc != NULL && exc != Py_None);
}

/* profiler: c goes on top of st's stack, under the call on top (its caller): a hit for code's
 * row and for the caller -> code edge, prim when no call of code (of that edge) is on the
 * stack already. Returns the PRIM_* bits, or -1 with an error set. */
static int
prof_enter(TState *st, NCall *c, PyObject *code)
{
    Row *row = row_of(&st->rows, code, NULL);
    if (row == NULL)
        return -1;
    Row *edge = NULL;
    if (st->nstack) {
        edge = row_of(&st->edges, code, st->stack[st->nstack - 1]->arow->code);
        if (edge == NULL)
            return -1;
    }
    if (stack_push(st, c) < 0)
        return -1;
    int prim = 0;
    row->hit++;
    if (row->active++ == 0) {
        row->prim++;
        prim |= PRIM_ROW;
    }
    if (edge != NULL) {
        edge->hit++;
        if (edge->active++ == 0) {
            edge->prim++;
            prim |= PRIM_EDGE;
        }
    }
    c->arow = row;
    c->aedge = edge;
    return prim;
}

/* profiler: c leaves its thread's stack (suspended, returned, or dropped); *parent gets the
 * open call below it (or NULL). */
static void
prof_leave(NCall *c, NCall **parent)
{
    if (parent != NULL)
        *parent = NULL;
    if (!c->in_stack)
        return;
    stack_remove(c->st, c, parent);
    c->arow->active--;
    if (c->aedge != NULL)
        c->aedge->active--;
}

/* profiler: entryfunc(code, frame, depth, t) -> NCall */
static PyObject *
prof_entry(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 && bad_args("entryfunc", nargs, 4))
        return NULL;
    TState *st = tstate_of(u);
    if (st == NULL)
        return NULL;
    NCall *c = ncall_new(u, st);
    if (c == NULL)
        return NULL;
    int prim = prof_enter(st, c, args[0]);
    if (prim < 0) {
        Py_DECREF(c);
        return NULL;
    }
    c->prim = prim;
    c->row = c->arow;
    c->edge = c->aedge;
    return (PyObject *)c;
}

/* profiler: resumefunc: a resume is a hit, as in cProfile, of the function and of the edge
 * from whatever resumed it */
static PyObject *
prof_resume(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    NCall *c = call_arg(u, "resumefunc", args, nargs, 5);
    if (c == NULL)
        return NULL;
    TState *st = tstate_of(u);
    if (st == NULL)
        return NULL;
    prof_leave(c, NULL);
    c->st = st;
    if (prof_enter(st, c, args[0]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* profiler: suspendfunc: the call leaves the thread's stack until it resumes */
static PyObject *
prof_suspend(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    NCall *c = call_arg(u, "suspendfunc", args, nargs, 5);
    if (c == NULL)
        return NULL;
    prof_leave(c, NULL);
    Py_RETURN_NONE;
}

/* profiler: retfunc: time to the call's row and edge, and to its parent's children's time */
static PyObject *
prof_return(NUser *u, PyObject *const *args, Py_ssize_t nargs)
{
    NCall *c = call_arg(u, "retfunc", args, nargs, 10);
    if (c == NULL)
        return NULL;
    int64_t t0, t1, sleep;
    if (as_i64(args[6], &t0) < 0 || as_i64(args[7], &t1) < 0 || as_i64(args[8], &sleep) < 0)
        return NULL;
    long long total = u->sleep_time ? t1 - t0 : t1 - t0 - sleep;
    NCall *parent;
    prof_leave(c, &parent);
    if (parent != NULL)
        parent->child += total;
    long long self = total - c->child;
    long long spent = u->graph_time ? total : self;
    Row *row = c->row;
    row->time += spent;
    __int128 s = spent;
    row->sq += (unsigned __int128)(s * s);
    row->self += self;
    if (c->prim & PRIM_ROW)
        row->total += total;
    if (c->edge != NULL) {
        c->edge->self += self;
        if (c->prim & PRIM_EDGE)
            c->edge->total += total;
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* The NativeUser type.                                                                      */

static PyObject *
NUser_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"kind", "buffer", "name_of", "roots", "skip", "max_depth",
                            "thresh", "sleep_time", "graph_time", "overrun_of", "exit_raised",
                            NULL};
    const char *kind;
    PyObject *buffer = Py_None, *name_of = Py_None, *roots = Py_None, *skip = Py_None;
    PyObject *overrun_of = Py_None;
    long max_depth = 0;
    long long thresh = 0;
    int sleep_time = 1, graph_time = 1, exit_raised = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|OOOOlLppOi:NativeUser", names, &kind,
                                     &buffer, &name_of, &roots, &skip, &max_depth, &thresh,
                                     &sleep_time, &graph_time, &overrun_of, &exit_raised))
        return NULL;
    int k;
    if (strcmp(kind, "function") == 0)
        k = KIND_FUNCTION;
    else if (strcmp(kind, "function_graph") == 0)
        k = KIND_GRAPH;
    else if (strcmp(kind, "profile") == 0)
        k = KIND_PROFILE;
    else {
        PyErr_Format(PyExc_ValueError,
                     "kind must be 'function', 'function_graph' or 'profile', not %R",
                     args && PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : Py_None);
        return NULL;
    }
    if (k != KIND_PROFILE && buffer == Py_None) {
        PyErr_SetString(PyExc_TypeError, "the function and function_graph users need a buffer");
        return NULL;
    }
    if ((roots != Py_None && !PyDict_Check(roots)) || (skip != Py_None && !PyDict_Check(skip))) {
        PyErr_SetString(PyExc_TypeError, "roots and skip are dicts id(code) -> code, or None");
        return NULL;
    }
    if (max_depth < 0 || thresh < 0) {
        PyErr_SetString(PyExc_ValueError, "max_depth and thresh are >= 0");
        return NULL;
    }
    NUser *u = (NUser *)type->tp_alloc(type, 0);
    if (u == NULL)
        return NULL;
    u->kind = k;
    u->buffer = Py_NewRef(buffer);
    u->name_of = Py_NewRef(name_of);
    u->roots = roots == Py_None ? NULL : Py_NewRef(roots);
    u->skip = skip == Py_None ? NULL : Py_NewRef(skip);
    u->overrun_of = overrun_of == Py_None ? NULL : Py_NewRef(overrun_of);
    u->max_depth = max_depth;
    u->thresh = thresh;
    u->sleep_time = sleep_time;
    u->graph_time = graph_time;
    u->exit_raised = exit_raised;
    u->plain = k == KIND_GRAPH && !u->roots && !u->skip && !u->overrun_of && !max_depth &&
               !thresh;
    return (PyObject *)u;
}

static int
NUser_traverse(NUser *u, visitproc visit, void *arg)
{
    Py_VISIT(u->buffer);
    Py_VISIT(u->name_of);
    Py_VISIT(u->roots);
    Py_VISIT(u->skip);
    Py_VISIT(u->overrun_of);
    return 0;
}

static int
NUser_clear(NUser *u)
{
    Py_CLEAR(u->buffer);
    Py_CLEAR(u->name_of);
    Py_CLEAR(u->roots);
    Py_CLEAR(u->skip);
    Py_CLEAR(u->overrun_of);
    return 0;
}

static void
NUser_dealloc(NUser *u)
{
    PyObject_GC_UnTrack(u);
    if (u->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)u);
    NUser_clear(u);
    TState *st = u->states;
    while (st != NULL) {
        TState *next = st->next;
        Py_XDECREF(st->ring);
        rows_free(&st->rows);
        rows_free(&st->edges);
        PyMem_Free(st->stack); /* empty: every NCall holds its user */
        PyMem_Free(st->dstack);
        PyMem_Free(st);
        st = next;
    }
    u->states = NULL;
    Py_TYPE(u)->tp_free((PyObject *)u);
}

/* The handlers, as attributes: the engine reads them off the ops object (FgraphOps...). */
#define HANDLER(NAME, FN) {NAME, (PyCFunction)(void (*)(void))FN, METH_FASTCALL, NULL}

static PyObject *
NUser_handler(NUser *u, PyObject *name)
{
    /* Bound builtin methods of the kind's handlers: look them up in a per-kind table. */
    static PyMethodDef graph[] = {HANDLER("entryfunc", graph_entry),
                                  HANDLER("retfunc", graph_return),
                                  HANDLER("suspendfunc", graph_suspend),
                                  HANDLER("resumefunc", graph_resume), {NULL}};
    static PyMethodDef prof[] = {HANDLER("entryfunc", prof_entry),
                                 HANDLER("retfunc", prof_return),
                                 HANDLER("suspendfunc", prof_suspend),
                                 HANDLER("resumefunc", prof_resume), {NULL}};
    static PyMethodDef func[] = {HANDLER("func", NUser_func), {NULL}};
    PyMethodDef *defs = u->kind == KIND_GRAPH ? graph : u->kind == KIND_PROFILE ? prof : func;
    const char *want = PyUnicode_AsUTF8(name);
    if (want == NULL)
        return NULL;
    for (PyMethodDef *d = defs; d->ml_name != NULL; d++)
        if (strcmp(d->ml_name, want) == 0)
            return PyCFunction_New(d, (PyObject *)u);
    PyErr_Format(PyExc_AttributeError, "a %s native user has no handler %R",
                 u->kind == KIND_GRAPH ? "function_graph" : u->kind == KIND_PROFILE ? "profile"
                                                                                     : "function",
                 name);
    return NULL;
}

static PyObject *
NUser_handler_method(NUser *u, PyObject *name)
{
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "handler name must be a str");
        return NULL;
    }
    return NUser_handler(u, name);
}

static PyObject *
u128_long(unsigned __int128 v)
{
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(v >> 64));
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)v);
    PyObject *shift = PyLong_FromLong(64);
    PyObject *sh = hi && shift ? PyNumber_Lshift(hi, shift) : NULL;
    PyObject *out = sh && lo ? PyNumber_Or(sh, lo) : NULL;
    Py_XDECREF(hi);
    Py_XDECREF(lo);
    Py_XDECREF(shift);
    Py_XDECREF(sh);
    return out;
}

/* The rows of one table of every thread, as tuples: (tid, code, hit, prim, time, time_sq,
 * total, self) for functions, (tid, caller, code, hit, prim, total, self) for edges. */
static PyObject *
table_rows(NUser *u, int edges)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (TState *st = u->states; st != NULL; st = st->next) {
        RowTable *t = edges ? &st->edges : &st->rows;
        for (size_t i = 0; i < t->size; i++) {
            Row *r = t->slots[i];
            if (r == NULL)
                continue;
            PyObject *item;
            if (edges) {
                item = Py_BuildValue("(kOOLLLL)", st->tid, r->caller, r->code, r->hit, r->prim,
                                     r->total, r->self);
            }
            else {
                PyObject *sq = u128_long(r->sq);
                item = sq ? Py_BuildValue("(kOLLLOLL)", st->tid, r->code, r->hit, r->prim,
                                          r->time, sq, r->total, r->self)
                          : NULL;
                Py_XDECREF(sq);
            }
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(item);
        }
    }
    return out;
}

static PyObject *
NUser_rows(NUser *u, PyObject *Py_UNUSED(ignored))
{
    return table_rows(u, 0);
}

static PyObject *
NUser_edges(NUser *u, PyObject *Py_UNUSED(ignored))
{
    return table_rows(u, 1);
}

/* threads() -> [tid]: the threads this user has seen, oldest first. */
static PyObject *
NUser_threads(NUser *u, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (TState *st = u->states; st != NULL; st = st->next) {
        PyObject *tid = PyLong_FromUnsignedLong(st->tid);
        if (tid == NULL || PyList_Insert(out, 0, tid) < 0) {
            Py_XDECREF(tid);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(tid);
    }
    return out;
}

/* direct() -> capsule or None: the direct hooks of a function_graph user, or the function
 * user's direct hook (fgraph_direct.h). None for the other kinds, and with funcgraph-overrun,
 * whose count is read through Python. */
static PyObject *
NUser_direct(NUser *u, PyObject *Py_UNUSED(ignored))
{
    if (u->kind == KIND_FUNCTION) { /* an entry user: one hook, no reference (as below) */
        u->fdirect.self = u;
        u->fdirect.func = func_direct;
        return PyCapsule_New(&u->fdirect, RH_FDIRECT_CAPSULE, NULL);
    }
    if (u->kind != KIND_GRAPH || u->overrun_of != NULL)
        Py_RETURN_NONE;
    u->direct.self = u;
    u->direct.entry = direct_entry;
    u->direct.exit = direct_exit;
    u->direct.gen_entry = direct_gen_entry;
    u->direct.gen_suspend = direct_gen_suspend;
    u->direct.gen_resume = direct_gen_resume;
    u->direct.gen_exit = direct_gen_exit;
    u->direct.prepare = direct_prepare;
    /* No reference to the user: a capsule is invisible to the GC, so one would make the
     * cycle user -> buffer -> ... -> ops -> capsule -> user uncollectable. The ops object that
     * holds the capsule holds the user too (fgraph_direct.h). */
    return rh_direct_capsule(&u->direct);
}

static PyMethodDef NUser_methods[] = {
    {"direct", (PyCFunction)NUser_direct, METH_NOARGS,
     "direct() -> capsule or None: C hooks the C core calls directly (fgraph_direct.h)."},
    {"handler", (PyCFunction)NUser_handler_method, METH_O,
     "handler(name): the bound C handler ('entryfunc', 'retfunc', 'suspendfunc', "
     "'resumefunc', or 'func' for the function user)."},
    {"rows", (PyCFunction)NUser_rows, METH_NOARGS,
     "rows() -> [(tid, code, hit, prim, time_ns, time_sq_ns, total_ns, self_ns)]: the "
     "profiler's counts per function."},
    {"edges", (PyCFunction)NUser_edges, METH_NOARGS,
     "edges() -> [(tid, caller, code, hit, prim, total_ns, self_ns)]: the profiler's counts "
     "per caller -> callee."},
    {"threads", (PyCFunction)NUser_threads, METH_NOARGS,
     "threads() -> [tid]: threads this user has seen."},
    {NULL},
};

static PyTypeObject NUser_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rethook.tracers._native.NativeUser",
    .tp_basicsize = sizeof(NUser),
    .tp_dealloc = (destructor)NUser_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)NUser_traverse,
    .tp_clear = (inquiry)NUser_clear,
    .tp_weaklistoffset = offsetof(NUser, weakreflist),
    .tp_methods = NUser_methods,
    .tp_new = NUser_new,
    .tp_doc = "NativeUser(kind, buffer=None, name_of=None, roots=None, skip=None, max_depth=0, "
              "thresh=0, sleep_time=True, graph_time=True, overrun_of=None, exit_raised=0)\n\n"
              "A built-in engine user written in C: kind is 'function', 'function_graph' or "
              "'profile'. Its handlers (handler(name)) are what an FtraceOps/FgraphOps "
              "carries; records go to buffer.native_local(name_of), the thread's C ring.",
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rethook.tracers._native",
    .m_doc = "rethook's built-in users (function, function_graph, profiler) written in C.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    /* PyCapsule_Import walks attributes: the submodule must be imported first */
    PyObject *cring = PyImport_ImportModule("rethook.buffer._cring");
    if (cring == NULL)
        return NULL;
    Py_DECREF(cring);
    rh_cring_api *api = PyCapsule_Import(RH_CRING_CAPSULE, 0);
    if (api == NULL)
        return NULL;
    Ring_t = api->ring_type;
    trace_clock = rh_clock_import();
    if (PyType_Ready(&NCall_Type) < 0 || PyType_Ready(&NUser_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "NativeUser", (PyObject *)&NUser_Type) < 0
        || PyModule_AddObjectRef(m, "NCall", (PyObject *)&NCall_Type) < 0
        || PyModule_AddIntConstant(m, "RECORD_BYTES", (long)sizeof(rh_rec)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
