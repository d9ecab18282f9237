/*
 * rethook.engine._ccore -- the C twin of rethook.engine.core's hot path.
 *
 * Same contract as core.py's module docstring (record layout, rules 1-7, "Contract of the hot
 * path"); docs/ccore.md maps each piece. In short:
 *
 *  - The six sys.monitoring callbacks (on_start, on_return, on_unwind, on_yield, on_resume for
 *    PY_RESUME and PY_THROW) are METH_FASTCALL builtins, registered by select.CCore.install.
 *  - State is SHARED with core.py, so everything the engine and the rest of rethook do through
 *    core.py (notrace, flush_thread, deliver, handler_failed, the engine's sweep) sees the same
 *    thing: the per-thread ThreadState objects (core._local.ts, created by
 *    core._new_thread_state, listed in core._threads), the sweep lock (core.sweep_lock,
 *    read at each use: after_fork_in_child rebinds it) and the internal-error counter
 *    (core.internal_error). The parked table is the C core's own (parktable.h: a dict
 *    churns at every yield and resume), which CCore.parked() hands the engine. Records
 *    stay Python lists and markers the dispatch's (code,) tuples, exactly as the pure core builds them; a direct record (below)
 *    is a list too, of a subtype whose header times Python reads exactly by item access.
 *  - Only the values the pure core keeps in module globals for its own callbacks are C
 *    statics here: the dispatch table (a C hash keyed by the code object's address, built by
 *    publish() from the engine's dict), max_depth, the sweeping flag, the overflow hook and
 *    its limit.
 *  - ThreadState and Registration are core.py's __slots__ classes; their slots are read and
 *    written at the offsets their member descriptors give (looked up once at import), so the
 *    hot path never does an attribute lookup. Objects of another type fall back to getattr.
 *  - The current thread's ThreadState is cached in a small table indexed by the
 *    PyThreadState's address and checked by its unique id. The cached pointer is borrowed
 *    from a _TSGuard stored in the same threading.local (core._local._ccore_guard): the guard
 *    owns a reference to the ThreadState and clears the entry when the thread's local dict
 *    goes away.
 *  - Direct entries (fgraph_direct.h): where a function's one graph user is written in C and
 *    offers hooks, on_start pushes the dispatch's shared (code, reg, capsule) tuple and calls
 *    the hook with C values; the exits call its exit hook. No Python object per call.
 *  - Direct records (fgraph_direct.h): the same for a generator or coroutine whose one user
 *    has generator hooks. Each call gets a record (DirectRecord, a list subtype, from a
 *    freelist) with its three times as C fields; yield, resume and exit call the user's
 *    gen_* hooks with C values, with no Python int, argument vector or vectorcall per event
 *    and no frame object made after the entry's (frame_peek). Parking is the same table,
 *    keyed by frame, so every engine rule (any-thread resume, sweeps, collect_parked, the
 *    overflow hook, FLAG_UNFINISHED at teardown) treats them as the records they are.
 *  - Timestamps come from the trace clock (clock.h), shared with Python through _clock.
 *  - Discovery (core.py's "Discovery"): on_start hands PY_START of code that is not in the
 *    table to sight(), which asks the registry's hook about unknown code, dispatches the call
 *    if that hooked it, and otherwise answers sys.monitoring.DISABLE (recording the code's id
 *    in core._disabled), all without letting another thread run between its last look at the
 *    table and the answer.
 *
 * Every callback runs with the GIL held. Python handlers it calls may release it; the objects
 * the callback works on are held by strong references across every such call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "clock.h"
#include "drainround.h"

#include "fasttstate.h"
#include "fgraph_direct.h"
#include "pyframe.h"
#include "parktable.h"
#include "ptrhash.h"

#if PY_VERSION_HEX < 0x030C0000
#error "rethook's C core needs CPython 3.12 or newer (sys.monitoring)"
#endif
#ifdef Py_GIL_DISABLED
#error "rethook's C core relies on the GIL; free-threaded builds use the pure-Python core"
#endif
#ifdef Py_LIMITED_API
#error "rethook's C core uses CPython's non-limited API"
#endif

#define current_tstate() rh_tstate_real()

/* Record layout and flags: the same numbers as core.py (checked against it at import). */
enum { REC_KEY, REC_CODE, REC_FRAME, REC_TIME, REC_SLEEP, REC_PARKED_AT, REC_HEADER };
#define WANT_FRAME 1
#define WANT_TIME 2
#define GENERATOR 4
#define FLAG_UNFINISHED 1
#define FLAG_CLOSED 2
/* Shadow-stack entry shapes (core.py's MARKER_ITEMS, DIRECT_ITEMS; its entry_kind() is the
 * Python twin of is_direct() and rec_len() below). */
#define MARKER_ITEMS 1
#define DIRECT_ITEMS 3

/* ---------------------------------------------------------------------------------------- */
/* Module state (single-phase init: one interpreter, like the pure core's module globals).   */

static PyObject *core_mod;            /* rethook.engine.core */
static PyObject *local_obj;           /* core._local (a threading.local) */
static ParkTable *parked;             /* frame -> record: core._parked's role (parktable.h) */
static PyObject *new_thread_state_fn; /* core._new_thread_state */
static PyObject *internal_error_fn;   /* core.internal_error */
static PyObject *handler_failed_fn;   /* core.handler_failed */
static PyTypeObject *ThreadState_t, *Registration_t, *EntryRegistration_t;
static Py_ssize_t ts_stack, ts_busy, ts_waiting, ts_recursion, ts_overrun, ts_inflight;
static Py_ssize_t rg_entryfunc, rg_retfunc, rg_suspendfunc, rg_resumefunc, rg_nmissed;
static Py_ssize_t er_func, er_nmissed;
static PyObject *s_ts, *s_guard, *s_sweep_lock, *s_acquire, *s_release, *s_stack, *s_busy,
    *s_waiting, *s_recursion, *s_overrun, *s_inflight, *s_entryfunc, *s_retfunc,
    *s_suspendfunc, *s_resumefunc, *s_func, *s_nmissed;
static PyObject *zero; /* the int 0 */

static Py_ssize_t max_depth = 65536;
static int sweeping;
static PyObject *overflow_hook; /* None or NULL: no hook */
static Py_ssize_t park_limit = 1024;
/* Discovery (set_discovery): the registry's hook or NULL (off), its id(code) dicts of functions
 * and of module and class bodies, core._disabled and sys.monitoring.DISABLE. */
static PyObject *discover_hook, *known_ids, *known_bodies, *disabled_ids, *monitoring_disable;
/* Hooking on first call (set_discovery): the engine's dict id(code) -> code of functions its
 * users selected but not hooked yet, and its arm(code), which hooks one; or NULL. */
static PyObject *unarmed_ids, *arm_hook;
static int arm_known; /* set_arm_known(): every known function goes to arm_hook too */
static PyObject *fast_arm; /* set_fast_arm()'s template, or NULL: see "A first call armed in C" */
static PyObject *own_package, *own_prefix; /* core.OWN_PACKAGE, and it with a dot */
static PyObject *s_name;                   /* "__name__" */

/* ---------------------------------------------------------------------------------------- */
/* The drain's turn at the GIL                                                               */

/* The recorder's drain writes the native rings out while holding the GIL (rethook/buffer/
 * _tfenc.c). Each time it asks for the GIL back, a CPU-bound program thread keeps it a switch
 * interval (5 ms), and with several program threads waiting the drain wins one handoff in
 * several: 30 to 130 ms were measured between its rounds with 4 threads, and rounds that lost
 * the GIL midway took 10 to 70 ms, while each thread's ring filled past its size. So when
 * two or more threads write records and blocking is off (below: with it, a thread waits for
 * the drain when its ring must), a drain round has the GIL first: drain_wait() sleeps,
 * then opens a round (until drain_end(), the next drain_wait(), or ROUND_MAX_NS at most) and
 * takes the GIL back. (With one thread the drain waits one switch interval at most, which the
 * ring absorbs; rounds that came first would only be smaller and more: sqlglot's whole run
 * took 15% longer.) While a round is open a
 * program thread entering a callback hands the GIL over (GIVE_WAY: once it knows it runs the
 * program's code, not rethook's, which may hold a lock the drain needs; and before it reads
 * anything shared, so this is the switch the interpreter could make between two
 * instructions), lets the waiting threads take it, and asks for it again. While the drain
 * holds the GIL the program's threads wait anyway: they give it up only when the drain wants
 * it. The trace file encoder, which lets the GIL go while it encodes a large call's records,
 * reads and sets the same value through the capsule _ROUND_API (drainround.h): no round
 * while it does not want the GIL, and a short one to get it back. */
static int64_t round_until; /* __atomic: CLOCK_MONOTONIC ns the open round ends by; 0: none */

#define ROUND_MAX_NS 50000000 /* a round not closed by then (a drain gone) closes itself */
#define GIVE_WAY_YIELDS 8     /* sched_yield()s between letting the GIL go and asking again */

static inline int64_t
mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void
give_way(int64_t until)
{
    if (mono_ns() >= until) {
        __atomic_compare_exchange_n(&round_until, &until, 0, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
        return;
    }
    PyThreadState *ts = PyEval_SaveThread();
    for (int i = 0; i < GIVE_WAY_YIELDS; i++)
        sched_yield();
    PyEval_RestoreThread(ts);
}

/* ---- Blocking: the program waits for the drain rather than lose records ----------------
 *
 * However the rounds go, a drain can fall behind: the thread descheduled for tens of ms, a
 * slow write, the first rounds of new threads. A ring then overwrites records the drain has
 * not written out. With blocking on (drain_blocking(), LTTng's blocking-timeout; rethook
 * record's --blocking-timeout), a writer whose ring is three quarters full reports it
 * (cring.h's rh_ring_reserve calls rh_round_api.full: one compare per record otherwise),
 * and every program thread, at its next event of hooked code (WAIT_FOR_DRAIN), waits for the
 * drain with the GIL released (wait_for_drain). The wait ends when a consuming read takes a
 * ring's records (rh_round_api.drained, from _cring.c) or the drain finds nothing left
 * (drain_wait); or
 * when blocking_ns have passed since the report: the threads go on, what no longer fits is
 * lost and counted as without blocking, and no thread waits again until the drain shows
 * progress (a drain that is gone or stuck does not stall the program at every call).
 * Only while a drain runs (from its drain_blocking to its drain_end): a ring nobody consumes
 * just overwrites. A ring's quarter of headroom holds what its thread writes until its next
 * event of hooked code. */
static int64_t full_at;       /* __atomic: when a ring was reported full (mono ns); 0: none */
static int64_t blocking_ns;   /* __atomic: how long threads may wait; 0: never */
static int drain_running;     /* __atomic: drain_blocking(> 0) since the last drain_end */
static int blocking_stalled;  /* __atomic: the last wait timed out; none until progress */

#define BLOCKING_STEP_NS 50000 /* how often a waiting thread looks at the flag */

/* Whether a drain runs with blocking on. */
static int
round_blocking(void)
{
    return __atomic_load_n(&drain_running, __ATOMIC_RELAXED) &&
           __atomic_load_n(&blocking_ns, __ATOMIC_RELAXED) != 0;
}

static void
round_full(void)
{
    if (__atomic_load_n(&full_at, __ATOMIC_RELAXED) != 0 || !round_blocking() ||
        __atomic_load_n(&blocking_stalled, __ATOMIC_RELAXED))
        return;
    int64_t none = 0;
    __atomic_compare_exchange_n(&full_at, &none, mono_ns(), 0, __ATOMIC_RELEASE,
                                __ATOMIC_RELAXED);
}

static void
round_drained(void)
{
    __atomic_store_n(&blocking_stalled, 0, __ATOMIC_RELAXED);
    if (__atomic_load_n(&full_at, __ATOMIC_RELAXED) != 0)
        __atomic_store_n(&full_at, 0, __ATOMIC_RELEASE);
}

static void
wait_for_drain(void)
{
    int64_t since = __atomic_load_n(&full_at, __ATOMIC_ACQUIRE);
    if (since == 0)
        return;
    int64_t deadline = since + __atomic_load_n(&blocking_ns, __ATOMIC_RELAXED);
    PyThreadState *ts = PyEval_SaveThread();
    /* until this report is cleared (a later one has its own deadline: the next wait's) */
    while (__atomic_load_n(&full_at, __ATOMIC_ACQUIRE) == since) {
        if (mono_ns() >= deadline) {
            __atomic_store_n(&blocking_stalled, 1, __ATOMIC_RELAXED);
            __atomic_compare_exchange_n(&full_at, &since, 0, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED);
            break;
        }
        struct timespec d = {0, BLOCKING_STEP_NS};
        nanosleep(&d, NULL);
    }
    PyEval_RestoreThread(ts);
}

/* ---- Waking the drain --------------------------------------------------------------------
 *
 * Between rounds the drain waits (drain_wait) without the GIL until a writer's ring is a
 * quarter full (cring.h's wake mark: round_wake, once per ring until its next consuming
 * read), until drain_wake() (the recorder stopping it), or until its timeout. Each round
 * takes the GIL from the program, and a handoff costs the program the drain's time holding
 * it plus the wait to get it back: polling every millisecond, sqlglot's ~1 s run gave it up
 * ~800 times (~0.2 s of wall time). Woken by a ring, a round is bigger than a poll's and
 * the encoder lets the GIL go while it encodes it (_tfenc.c). The writer, holding the GIL,
 * takes wake_mu only to wake; the drain holds it only to wait, without the GIL. */
static pthread_mutex_t wake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cv; /* on CLOCK_MONOTONIC (wake_init) */
static int drain_woken;        /* written under wake_mu; writers read it first, __atomic */

static int
wake_init(void)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return -1;
    int e = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (e == 0)
        e = pthread_cond_init(&wake_cv, &a);
    pthread_condattr_destroy(&a);
    return e == 0 ? 0 : -1;
}

static void
round_wake(void)
{
    if (__atomic_load_n(&drain_woken, __ATOMIC_RELAXED))
        return; /* (woken already: the drain has not waited since) */
    pthread_mutex_lock(&wake_mu);
    __atomic_store_n(&drain_woken, 1, __ATOMIC_RELAXED);
    pthread_cond_signal(&wake_cv);
    pthread_mutex_unlock(&wake_mu);
}

/* ---- Paging ahead for the writers ----------------------------------------------------
 *
 * A new ring's first records land on memory nobody has touched yet: ~3 us a 4 KB page on
 * this VM, paid by the program's thread as it writes (deltablue: ~1,500 such faults in its
 * 70 ms), up to the first consuming read, after which the drain pages ahead of the writers
 * itself (_tfenc.c, ahead_of()). The ring module asks for its new arrays' first parts
 * (round_page_ahead) and the drain pages them in while it waits between rounds, without the
 * GIL, on its own CPU. Only madvise(MADV_POPULATE_WRITE), never a touch: a range freed
 * meanwhile (a ring resized or gone) just fails, and memory mapped there since is only
 * paged in. Requests past PAGE_REQUESTS are dropped (the writer pages them, as before), and
 * so are those left when the drain ends (drain_end); a poll (the last rounds of a recording)
 * pages nothing. */
#define PAGE_REQUESTS 16
static struct {
    void *p;
    size_t n;
} page_req[PAGE_REQUESTS]; /* under wake_mu */
static int page_nreq;
static int page_cut; /* under wake_mu: drain_wake() ends the paging of the wait it ends */

static void
round_page_ahead(void *p, size_t n)
{
    pthread_mutex_lock(&wake_mu);
    if (page_nreq < PAGE_REQUESTS) {
        page_req[page_nreq].p = p;
        page_req[page_nreq].n = n;
        page_nreq++;
        pthread_cond_signal(&wake_cv);
    }
    pthread_mutex_unlock(&wake_mu);
}

/* How much of a request one madvise pages in: steps end on multiples of it (a multiple of the
 * page size), so they cover their request as one call would. Requests are 1-3 MB (a ring's
 * first quarter, the encoder's scratch areas) and one madvise of that took ~1.5 ms; paged in
 * whole, they cost a two-line program ~5 ms of its start and end (bench_startup, interleaved
 * A/B, 4 rounds of 15: +25.6 -> +20.5 ms over python; 64 KB and 1 MB steps: +21.3 and +21.5;
 * a program of 22 k calls unchanged), though the paging had ended before the program did:
 * each call holds the process's memory map for reading, which the program thread's own mmap
 * and munmap wait for (the likely cause). Between two steps page_requests() also looks
 * whether drain_wake() asked the drain to stop (a recording's end, a fork): that waits for
 * one step, ~0.1 ms, rather than for what is left of ~11 MB (a program that ends as it
 * starts). A round that is due does not stop the paging: its writer is the one paged for. */
#define PAGE_STEP ((size_t)256 * 1024)

/* With wake_mu held: the requests so far paged in, newest first, the mutex let go meanwhile,
 * unless drain_wake() cut the paging short (drain_end() drops what is left). */
static void
page_requests(void)
{
    while (page_nreq > 0 && !page_cut) {
        void *p = page_req[page_nreq - 1].p;
        size_t n = page_req[page_nreq - 1].n;
        size_t step = PAGE_STEP - (size_t)((uintptr_t)p % PAGE_STEP);
        if (step >= n) {
            step = n;
            page_nreq--;
        }
        else {
            page_req[page_nreq - 1].p = (char *)p + step;
            page_req[page_nreq - 1].n = n - step;
        }
        pthread_mutex_unlock(&wake_mu);
        (void)rh_populate(p, step); /* (drainround.h) */
        pthread_mutex_lock(&wake_mu);
    }
}

/* Without the GIL: wait up to s seconds for round_wake() (none if s <= 0), paging in what the
 * writers asked for meanwhile; whether a wake came (since the last wait, too). */
static int
wait_woken(double s)
{
    struct timespec until = {0, 0};
    if (s > 0) {
        clock_gettime(CLOCK_MONOTONIC, &until);
        int64_t ns = until.tv_nsec + (int64_t)(s * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
    }
    pthread_mutex_lock(&wake_mu);
    if (s > 0) /* (a poll, such as the last rounds of a recording, pages nothing) */
        page_requests();
    while (s > 0 && !drain_woken) {
        int timedout = pthread_cond_timedwait(&wake_cv, &wake_mu, &until) == ETIMEDOUT;
        page_requests();
        if (timedout)
            break;
    }
    int woken = drain_woken;
    __atomic_store_n(&drain_woken, 0, __ATOMIC_RELAXED);
    page_cut = 0; /* (a cut is the wait's it ended: the next wait pages again) */
    pthread_mutex_unlock(&wake_mu);
    return woken;
}

/* In every callback, once the thread is known not to be busy: one relaxed load. */
#define GIVE_WAY()                                                          \
    do {                                                                    \
        int64_t until_ = __atomic_load_n(&round_until, __ATOMIC_RELAXED);   \
        if (until_ != 0)                                                    \
            give_way(until_);                                               \
    } while (0)

/* At an event of hooked code (which may write a record), once the thread is known not to be
 * busy, before the callback reads anything shared (the GIL goes meanwhile): one relaxed
 * load. Not at discovery's PY_START of other code (on_start looks its code up first): a
 * thread of rethook's own runs some before it is marked busy (the drain itself, as it
 * starts), and must not wait for the drain. */
#define WAIT_FOR_DRAIN()                                                    \
    do {                                                                    \
        if (__atomic_load_n(&full_at, __ATOMIC_RELAXED) != 0)               \
            wait_for_drain();                                               \
    } while (0)

/* A fork child has no drain (a round open then is the parent's; a report too). */
static void
round_after_fork(void)
{
    __atomic_store_n(&round_until, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&drain_running, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&blocking_stalled, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&full_at, 0, __ATOMIC_RELAXED);
    pthread_mutex_init(&wake_mu, NULL); /* (no drain waits in the child) */
    wake_init();
    __atomic_store_n(&drain_woken, 0, __ATOMIC_RELAXED);
    page_nreq = 0; /* (the parent's requests: its drain's) */
    page_cut = 0;
}

PyDoc_STRVAR(drain_wait_doc,
"drain_wait(seconds, first) -> bool\n\
\n\
Close the open drain round, wait up to `seconds` without the GIL until a native ring is a\n\
quarter full (or drain_wake()), then take the GIL back; whether one of those ended the wait\n\
(or came since the last wait). With `first` true and blocking off (drain_blocking(0)),\n\
open a round before: until drain_end() (or the next drain_wait()) the program's threads\n\
hand the GIL over at their next callback whenever they have it. For the thread that writes\n\
the program's records out (the recorder's drain).");

static PyObject *
drain_wait(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "drain_wait() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    double s = PyFloat_AsDouble(args[0]);
    if (s == -1.0 && PyErr_Occurred())
        return NULL;
    int first = PyObject_IsTrue(args[1]);
    if (first < 0)
        return NULL;
    __atomic_store_n(&round_until, 0, __ATOMIC_RELAXED);
    round_drained(); /* (it found nothing left to write) */
    int woken;
    Py_BEGIN_ALLOW_THREADS
    woken = wait_woken(s);
    if (first && !round_blocking()) /* (blocking: the threads wait when a ring must) */
        __atomic_store_n(&round_until, mono_ns() + ROUND_MAX_NS, __ATOMIC_RELEASE);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(woken);
}

PyDoc_STRVAR(drain_wake_doc,
"drain_wake() -> None\n\
\n\
End the drain's wait (drain_wait) now: for the thread that stops it.");

static PyObject *
drain_wake(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    pthread_mutex_lock(&wake_mu);
    page_cut = 1; /* (the paging stops at its next step: page_requests) */
    pthread_mutex_unlock(&wake_mu);
    round_wake();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(drain_end_doc,
"drain_end() -> None\n\
\n\
Close the open drain round (see drain_wait).");

static PyObject *
drain_end(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    __atomic_store_n(&round_until, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&drain_running, 0, __ATOMIC_RELAXED);
    round_drained();
    pthread_mutex_lock(&wake_mu); /* paging asked for the drain that ends: not for the next */
    page_nreq = 0;
    page_cut = 0;
    pthread_mutex_unlock(&wake_mu);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(drain_blocking_doc,
"drain_blocking(seconds) -> None\n\
\n\
For the thread that writes the program's records out, as it starts: until its drain_end(),\n\
the program's threads may wait for it up to `seconds` when a native ring is three quarters\n\
full, rather than let records be overwritten. 0: they never wait.");

static PyObject *
drain_blocking(PyObject *Py_UNUSED(module), PyObject *arg)
{
    double s = PyFloat_AsDouble(arg);
    if (s == -1.0 && PyErr_Occurred())
        return NULL;
    /* (how long is the command line's to bound: rethook/limits.py; here only what the
     * clock's int64 ns hold, with room to add it to a time) */
    if (!(s >= 0 && s < 4e9)) {
        PyErr_Format(PyExc_ValueError, "drain_blocking(): %R is not a number of seconds "
                     "from 0 to 4e9", arg);
        return NULL;
    }
    __atomic_store_n(&blocking_ns, (int64_t)(s * 1e9), __ATOMIC_RELAXED);
    __atomic_store_n(&drain_running, s > 0, __ATOMIC_RELAXED);
    round_drained();
    Py_RETURN_NONE;
}

/* The same value for the trace file encoder, which lets the GIL go while it encodes a round's
 * records (drainround.h, the capsule _ROUND_API). */
static int64_t
round_take(void)
{
    return __atomic_exchange_n(&round_until, 0, __ATOMIC_RELAXED);
}

static void
round_open(int64_t until)
{
    __atomic_store_n(&round_until, until, __ATOMIC_RELEASE);
}

static int64_t
round_current(void)
{
    return __atomic_load_n(&round_until, __ATOMIC_RELAXED);
}

static const rh_round_api round_api = {round_take, round_open, mono_ns, round_current,
                                       round_full, round_drained, round_wake,
                                       round_blocking, round_page_ahead};


/* ---------------------------------------------------------------------------------------- */
/* The dispatch table: code address -> (entry_regs, graph_regs, flags, marker, direct).      */

typedef struct {
    void *key;          /* the code object's address (the engine's id(code)); NULL: empty */
    PyObject *dispatch; /* strong: the engine's dispatch tuple (its entry users: item 0) */
    const rh_fdirect *fdirect; /* the one entry user's direct hook, or NULL (fgraph_direct.h) */
    PyObject *graph;    /* borrowed from dispatch: tuple of Registration */
    PyObject *marker;   /* borrowed from dispatch: (code,) or NULL for None */
    PyObject *direct_entry;   /* borrowed: (code, reg, capsule) or NULL (fgraph_direct.h) */
    const rh_direct *direct;  /* the capsule's hooks, or NULL (for a generator's code: only
                               * when the capsule has the generator hooks) */
    int flags;
    int prepared;             /* direct has a prepare hook: its entry runs no Python code */
} Slot; /* 64 bytes, a cache line: the slots are aligned to lines (publish()) */

#define SLOT_ALIGN 64 /* a cache line: a lookup misses once, not twice */

/* A slot's entry users (borrowed): the tuple of EntryRegistration its dispatch holds. */
static inline PyObject *
slot_entry(const Slot *s)
{
    return PyTuple_GET_ITEM(s->dispatch, 0);
}
typedef struct {
    size_t mask;
    Py_ssize_t used;
    PyObject *dict; /* the published dict (kept for table()) */
    Slot slots[] __attribute__((aligned(SLOT_ALIGN)));
} Table;
_Static_assert(sizeof(Slot) <= SLOT_ALIGN, "a slot fits one cache line");

static Table empty_table = {0, 0, NULL, {}};
static Table *table = &empty_table;

static inline const Slot *
lookup(const void *code)
{
    Table *tb = table;
    if (tb->used == 0)
        return NULL;
    size_t i = rh_hash_ptr(code) & tb->mask;
    for (;;) {
        const Slot *s = &tb->slots[i];
        if (s->key == code)
            return s;
        if (s->key == NULL)
            return NULL;
        i = (i + 1) & tb->mask;
    }
}

static void
table_free(Table *tb)
{
    if (tb == &empty_table)
        return;
    for (size_t i = 0; i <= tb->mask; i++)
        Py_XDECREF(tb->slots[i].dispatch);
    Py_XDECREF(tb->dict);
    free(tb); /* (aligned_alloc) */
}

/* ---------------------------------------------------------------------------------------- */
/* Small helpers.                                                                           */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* What the fast lanes call only when something is out of the ordinary (an error, a thread met
 * for the first time, every event the fast lanes do not take): out of line and away from the
 * hot code, so that the callbacks' usual paths stay a few cache lines long. */
#define RH_COLD __attribute__((noinline, cold))

static inline void
slot_store(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = Py_NewRef(value);
    Py_XDECREF(old);
}

static const rh_clock *trace_clock; /* _clock's calibration, or NULL: CLOCK_MONOTONIC */

static inline long long
now_ns(void)
{
    return rh_clock_ns(trace_clock); /* the trace clock (clock.h), shared with Python */
}

/* Length of a shadow-stack entry (a record list or a marker tuple); -1 for anything else. */
static inline Py_ssize_t
rec_len(PyObject *rec)
{
    if (PyList_CheckExact(rec) || PyList_Check(rec))
        return PyList_GET_SIZE(rec);
    if (PyTuple_Check(rec))
        return PyTuple_GET_SIZE(rec);
    return -1;
}

/* Borrowed item i of a record or marker, NULL (no error set) when there is none. */
static inline PyObject *
rec_item(PyObject *rec, Py_ssize_t i)
{
    if (PyList_CheckExact(rec) || PyList_Check(rec))
        return i < PyList_GET_SIZE(rec) ? PyList_GET_ITEM(rec, i) : NULL;
    if (PyTuple_Check(rec))
        return i < PyTuple_GET_SIZE(rec) ? PyTuple_GET_ITEM(rec, i) : NULL;
    return NULL;
}

/* list.pop() of the last item: a new reference, or NULL (no error set) if the list is empty. */
static PyObject *
list_pop(PyObject *list)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n == 0)
        return NULL;
    PyObject *v = PyList_GET_ITEM(list, n - 1);
    Py_ssize_t allocated = ((PyListObject *)list)->allocated;
    if (allocated > 256 && n - 1 < allocated / 4) {
        /* let the list give memory back after a deep stack, as list.pop() does */
        Py_INCREF(v);
        if (PyList_SetSlice(list, n - 1, n, NULL) < 0) {
            PyErr_Clear();
            Py_SET_SIZE(list, n - 1);
            Py_DECREF(v); /* the list's reference, which it no longer holds */
        }
        return v;
    }
    Py_SET_SIZE(list, n - 1); /* the list's reference becomes ours */
    return v;
}

/* A direct entry (fgraph_direct.h): the shared tuple (code, registration, capsule). */
static inline int
is_direct(PyObject *entry)
{
    return PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == DIRECT_ITEMS;
}

/* Records: lists with room for the header and one claim. Records whose last reference the
 * core drops are kept (emptied) on a short freelist and reused, which saves the allocation
 * and the release of the list and its item array on every call. */
#define REC_ROOM (REC_HEADER + 2)
#define REC_FREELIST 32
#define REC_RECYCLE_MAX 64 /* records with more room than this are freed */
static PyObject *rec_free[REC_FREELIST];
static int rec_nfree;

/* An empty record list (size 0, room for REC_ROOM items), or NULL with an error. */
static inline PyObject *
rec_new(void)
{
    if (rec_nfree > 0)
        return rec_free[--rec_nfree];
    PyObject *rec = PyList_New(REC_ROOM);
    if (rec != NULL)
        Py_SET_SIZE(rec, 0);
    return rec;
}

/* Drop the core's reference to a record: onto the freelist when it was the last one. */
static void drec_release(PyObject *rec);
#define IS_DREC(o) Py_IS_TYPE((o), &DRecord_Type)
static PyTypeObject DRecord_Type;

static void
rec_release(PyObject *rec)
{
    if (rec == NULL)
        return;
    if (IS_DREC(rec)) {
        drec_release(rec);
        return;
    }
    if (Py_REFCNT(rec) != 1 || !PyList_CheckExact(rec) || rec_nfree >= REC_FREELIST ||
        ((PyListObject *)rec)->allocated < REC_ROOM ||
        ((PyListObject *)rec)->allocated > REC_RECYCLE_MAX) {
        Py_DECREF(rec);
        return;
    }
    PyObject *items[REC_RECYCLE_MAX]; /* (size <= allocated <= REC_RECYCLE_MAX) */
    Py_ssize_t n = PyList_GET_SIZE(rec);
    for (Py_ssize_t i = 0; i < n; i++)
        items[i] = PyList_GET_ITEM(rec, i);
    Py_SET_SIZE(rec, 0);
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(items[i]); /* (may run a finaliser: check again below) */
    if (Py_REFCNT(rec) != 1 || PyList_GET_SIZE(rec) != 0 || rec_nfree >= REC_FREELIST ||
        ((PyListObject *)rec)->allocated < REC_ROOM ||
        ((PyListObject *)rec)->allocated > REC_RECYCLE_MAX) {
        Py_DECREF(rec);
        return;
    }
    rec_free[rec_nfree++] = rec;
}

/* rec += (reg, data), in place when the record has room. */
static inline int
rec_add_claim(PyObject *rec, PyObject *reg, PyObject *data)
{
    Py_ssize_t n = PyList_GET_SIZE(rec);
    if (((PyListObject *)rec)->allocated >= n + 2) {
        PyObject **it = ((PyListObject *)rec)->ob_item;
        it[n] = Py_NewRef(reg);
        it[n + 1] = Py_NewRef(data);
        Py_SET_SIZE(rec, n + 2);
        return 0;
    }
    if (PyList_Append(rec, reg) < 0)
        return -1;
    if (PyList_Append(rec, data) < 0) {
        Py_XDECREF(list_pop(rec)); /* no half claim */
        return -1;
    }
    return 0;
}

/* ---- Direct records: a generator call whose one user has direct hooks (fgraph_direct.h) ----
 *
 * A record list of a subtype of list, so the engine's Python code (which tells entries apart
 * with isinstance(entry, list)) sees an ordinary record: key and frame, code, one claim. Its
 * three times are C fields; the list's own REC_TIME, REC_SLEEP and REC_PARKED_AT items hold 0,
 * and item access (rec[i], the only way rethook reads a record's header), iteration, slices and
 * repr() answer from the fields, so Python reads exactly what a plain record would hold. The
 * core itself never reads those items of a direct record: every path below routes a direct
 * record to the helpers that use the fields (drec_*, gen_direct_*). List methods that bypass
 * item access (copy(), index(), count(), ==) see the stored zeros. */
typedef struct {
    PyListObject list;
    PyObject *direct_entry;  /* strong: the dispatch's (code, reg, capsule) the call entered by:
                              * it holds the registration, which keeps the hooks' user alive */
    const rh_direct *d;      /* the capsule's hooks (generator hooks present) */
    int prepared;            /* d has a prepare hook: its hooks run no Python code */
    int64_t t0;              /* REC_TIME: entry time */
    int64_t sleep;           /* REC_SLEEP: ns spent suspended so far */
    int64_t parked_at;       /* REC_PARKED_AT: when last suspended */
} DRecord;

static ssizeargfunc list_sq_item;     /* list's own slots, read at import */
static binaryfunc list_mp_subscript;
static objobjargproc list_mp_ass_subscript;

static inline int
drec_is_time(Py_ssize_t i)
{
    return i == REC_TIME || i == REC_SLEEP || i == REC_PARKED_AT;
}

static inline int64_t *
drec_field(DRecord *r, Py_ssize_t i)
{
    return i == REC_TIME ? &r->t0 : i == REC_SLEEP ? &r->sleep : &r->parked_at;
}

/* A plain list with the record's items, the times as ints. */
static PyObject *
drec_snapshot(PyObject *self)
{
    Py_ssize_t n = PyList_GET_SIZE(self);
    PyObject *copy = PyList_GetSlice(self, 0, n);
    if (copy == NULL)
        return NULL;
    for (Py_ssize_t i = REC_TIME; i <= REC_PARKED_AT && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(*drec_field((DRecord *)self, i));
        if (v == NULL || PyList_SetItem(copy, i, v) < 0) {
            Py_DECREF(copy);
            return NULL;
        }
    }
    return copy;
}

static PyObject *
drec_sq_item(PyObject *self, Py_ssize_t i)
{
    if (drec_is_time(i) && i < PyList_GET_SIZE(self))
        return PyLong_FromLongLong(*drec_field((DRecord *)self, i));
    return list_sq_item(self, i);
}

/* The time field an item names (an index; negative ones count from the end): 1 and *field;
 * 0, not one (not an index, or another item); -1 with an error. */
static int
drec_time_item(PyObject *self, PyObject *item, int64_t **field)
{
    if (!PyIndex_Check(item))
        return 0;
    Py_ssize_t i = PyNumber_AsSsize_t(item, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i < 0)
        i += PyList_GET_SIZE(self);
    if (!drec_is_time(i) || i >= PyList_GET_SIZE(self))
        return 0;
    *field = drec_field((DRecord *)self, i);
    return 1;
}

/* op(a plain copy of the record, its times as ints): for what reads the whole record. */
static PyObject *
drec_on_copy(PyObject *self, PyObject *(*op)(PyObject *))
{
    PyObject *copy = drec_snapshot(self);
    if (copy == NULL)
        return NULL;
    PyObject *r = op(copy);
    Py_DECREF(copy);
    return r;
}

static PyObject *
drec_subscript(PyObject *self, PyObject *item)
{
    int64_t *field;
    int r = drec_time_item(self, item, &field);
    if (r != 0)
        return r < 0 ? NULL : PyLong_FromLongLong(*field);
    if (PyIndex_Check(item))
        return list_mp_subscript(self, item);
    PyObject *copy = drec_snapshot(self); /* a slice */
    if (copy == NULL)
        return NULL;
    PyObject *v = PyObject_GetItem(copy, item);
    Py_DECREF(copy);
    return v;
}

static int
drec_ass_subscript(PyObject *self, PyObject *item, PyObject *value)
{
    int64_t *field;
    int r = value != NULL ? drec_time_item(self, item, &field) : 0;
    if (r < 0)
        return -1;
    if (r) {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred())
            return -1;
        *field = v;
        return 0;
    }
    return list_mp_ass_subscript(self, item, value);
}

static PyObject *
drec_iter(PyObject *self)
{
    return drec_on_copy(self, PyObject_GetIter);
}

static PyObject *
drec_repr(PyObject *self)
{
    return drec_on_copy(self, PyObject_Repr);
}

static int
drec_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((DRecord *)self)->direct_entry);
    return PyList_Type.tp_traverse(self, visit, arg);
}

static int
drec_clear(PyObject *self)
{
    Py_CLEAR(((DRecord *)self)->direct_entry);
    return PyList_Type.tp_clear(self);
}

static void
drec_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(((DRecord *)self)->direct_entry);
    PyList_Type.tp_dealloc(self); /* (frees with our tp_free: it is not an exact list) */
}

static PySequenceMethods drec_as_sequence = {.sq_item = drec_sq_item};
static PyMappingMethods drec_as_mapping = {.mp_subscript = drec_subscript,
                                           .mp_ass_subscript = drec_ass_subscript};

static PyTypeObject DRecord_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rethook.engine._ccore.DirectRecord",
    .tp_basicsize = sizeof(DRecord),
    .tp_dealloc = drec_dealloc,
    .tp_repr = drec_repr,
    .tp_as_sequence = &drec_as_sequence,
    .tp_as_mapping = &drec_as_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .tp_traverse = drec_traverse,
    .tp_clear = drec_clear,
    .tp_iter = drec_iter,
    .tp_doc = "A generator call's record whose one claim is a direct user's "
              "(engine/fgraph_direct.h): a record list whose times are C fields.",
};

/* Direct records the core dropped its last reference to, emptied, for reuse. */
static PyObject *drec_free[REC_FREELIST];
static int drec_nfree;

/* An empty direct record (size 0, room for REC_ROOM items, no direct entry), or NULL with an
 * error. */
static DRecord *
drec_new(void)
{
    if (drec_nfree > 0)
        return (DRecord *)drec_free[--drec_nfree];
    DRecord *r = (DRecord *)PyType_GenericAlloc(&DRecord_Type, 0);
    if (r == NULL)
        return NULL;
    r->list.ob_item = PyMem_Calloc(REC_ROOM, sizeof(PyObject *));
    if (r->list.ob_item == NULL) {
        Py_DECREF(r);
        PyErr_NoMemory();
        return NULL;
    }
    r->list.allocated = REC_ROOM;
    return r;
}

static inline int
drec_reusable(PyObject *rec, Py_ssize_t size)
{
    return Py_REFCNT(rec) == 1 && PyList_GET_SIZE(rec) == size && drec_nfree < REC_FREELIST &&
           ((PyListObject *)rec)->allocated >= REC_ROOM &&
           ((PyListObject *)rec)->allocated <= REC_RECYCLE_MAX;
}

/* Drop the core's reference to a direct record: onto the freelist when it was the last. */
static void
drec_release(PyObject *rec)
{
    Py_ssize_t n = PyList_GET_SIZE(rec);
    if (!drec_reusable(rec, n)) {
        Py_DECREF(rec);
        return;
    }
    PyObject *items[REC_RECYCLE_MAX];
    for (Py_ssize_t i = 0; i < n; i++)
        items[i] = PyList_GET_ITEM(rec, i);
    Py_SET_SIZE(rec, 0);
    PyObject *entry = ((DRecord *)rec)->direct_entry;
    ((DRecord *)rec)->direct_entry = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(items[i]); /* (may run a finaliser: check again below) */
    Py_XDECREF(entry);
    if (!drec_reusable(rec, 0) || ((DRecord *)rec)->direct_entry != NULL) {
        Py_DECREF(rec);
        return;
    }
    drec_free[drec_nfree++] = rec;
}

/* The claim of a direct record (borrowed), if it still has it: a sweep may have taken it. */
static inline int
drec_claim(PyObject *rec, PyObject **reg, PyObject **data)
{
    if (PyList_GET_SIZE(rec) != REC_HEADER + 2 || ((DRecord *)rec)->direct_entry == NULL)
        return 0;
    *reg = PyList_GET_ITEM(rec, REC_HEADER);
    *data = PyList_GET_ITEM(rec, REC_HEADER + 1);
    return 1;
}

/* The frame that fired the event, borrowed, if it has a frame object already; NULL if not
 * (then no record can be keyed by it: a record holds its frame object, which stays the
 * interpreter frame's own until the frame ends). No thread-local lookup, no allocation. */
static inline PyObject *
frame_peek(PyThreadState *tstate)
{
#if RH_HAVE_IFRAME
    _PyInterpreterFrame *f = rh_running_frame(tstate);
    return f != NULL ? (PyObject *)f->frame_obj : NULL;
#else
    (void)tstate;
    return (PyObject *)PyEval_GetFrame();
#endif
}

static inline PyObject *
current_frame(void)
{
    /* sys._getframe(1) in a Python callback: the frame that fired the event. A builtin has no
     * frame of its own, so that is the current frame. */
    PyFrameObject *f = PyEval_GetFrame();
    return f ? Py_NewRef((PyObject *)f) : Py_NewRef(Py_None);
}

/* Add one to an int held in a slot (or an attribute). */
static int
slot_incr(PyObject *obj, PyTypeObject *tp, Py_ssize_t off, PyObject *name)
{
    PyObject *old;
    if (Py_TYPE(obj) == tp) {
        old = SLOT(obj, off);
        if (old == NULL) {
            PyErr_SetObject(PyExc_AttributeError, name);
            return -1;
        }
        Py_INCREF(old);
    }
    else if ((old = PyObject_GetAttr(obj, name)) == NULL) {
        return -1;
    }
    PyObject *one = PyLong_FromLong(1);
    PyObject *v = one ? PyNumber_Add(old, one) : NULL;
    Py_XDECREF(one);
    Py_DECREF(old);
    if (v == NULL)
        return -1;
    if (Py_TYPE(obj) == tp) {
        PyObject *prev = SLOT(obj, off);
        SLOT(obj, off) = v;
        Py_XDECREF(prev);
        return 0;
    }
    int r = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return r;
}

/* A registration's handler (a new reference; None when unset). */
static inline PyObject *
reg_get(PyObject *reg, PyTypeObject *tp, Py_ssize_t off, PyObject *name)
{
    if (Py_TYPE(reg) == tp) {
        PyObject *v = SLOT(reg, off);
        if (v == NULL) {
            PyErr_SetObject(PyExc_AttributeError, name);
            return NULL;
        }
        return Py_NewRef(v);
    }
    return PyObject_GetAttr(reg, name);
}

/* ---------------------------------------------------------------------------------------- */
/* Errors: a handler's (counted per registration, the program never sees it) and our own.    */

/* The current exception is rethook's, not the program's (core.internal_error: counted,
 * reported once). A BaseException that is not an Exception (KeyboardInterrupt, SystemExit)
 * is kept in *pending instead, to be raised once the call's bookkeeping is done. */
static RH_COLD void
stash_error(PyObject **pending)
{
    PyObject *exc = PyErr_GetRaisedException();
    if (exc == NULL)
        return;
    if (!PyErr_GivenExceptionMatches(exc, PyExc_Exception)) {
        Py_XSETREF(*pending, exc);
        return;
    }
    PyObject *r = PyObject_CallOneArg(internal_error_fn, exc);
    if (r == NULL) {
        PyObject *again = PyErr_GetRaisedException();
        if (again && !PyErr_GivenExceptionMatches(again, PyExc_Exception))
            Py_XSETREF(*pending, again);
        else
            Py_XDECREF(again);
    }
    Py_XDECREF(r);
    Py_DECREF(exc);
}

/* A handler of `reg` raised (the exception is set). An Exception goes to
 * core.handler_failed(reg, exc) and 0 is returned; a BaseException is kept in *pending and 1
 * is returned. */
static RH_COLD int
handler_error(PyObject *reg, PyObject **pending)
{
    PyObject *exc = PyErr_GetRaisedException();
    if (exc == NULL)
        return 0;
    if (!PyErr_GivenExceptionMatches(exc, PyExc_Exception)) {
        Py_XSETREF(*pending, exc);
        return 1;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(handler_failed_fn, reg, exc, NULL);
    Py_DECREF(exc);
    if (r == NULL)
        stash_error(pending);
    Py_XDECREF(r);
    return 0;
}

static PyObject *
finish(PyObject *pending)
{
    if (pending != NULL) {
        PyErr_SetRaisedException(pending);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* The current thread's ThreadState (core.py's object, shared with notrace and the engine).  */

typedef struct {
    PyObject_HEAD
    PyObject *ts;
    PyThreadState *tstate; /* the thread state whose local dict holds this guard */
    uint64_t id;           /* its unique id (pointers can be reused, ids are not) */
} TSGuard;

/* The cache: a small table indexed by the PyThreadState's address (no thread-local storage of
 * our own: in a shared object every access to it is a __tls_get_addr call). Only callbacks
 * touch it, under the GIL. An entry's ThreadState is borrowed from the TSGuard that set it,
 * which clears it when it goes away. Two threads hashing to one entry only cost slow paths. */
#define TS_CACHE 64
typedef struct {
    PyThreadState *tstate;
    uint64_t id;
    PyObject *ts;
} TSCacheEntry;
static TSCacheEntry ts_cache[TS_CACHE];

static inline TSCacheEntry *
ts_entry(PyThreadState *tstate)
{
    return &ts_cache[rh_hash_ptr(tstate) & (TS_CACHE - 1)];
}

static void
TSGuard_dealloc(TSGuard *self)
{
    if (self->tstate != NULL) {
        TSCacheEntry *e = ts_entry(self->tstate);
        if (e->tstate == self->tstate && e->id == self->id) { /* the local dict goes away */
            e->tstate = NULL;
            e->id = 0;
            e->ts = NULL;
        }
    }
    Py_XDECREF(self->ts);
    PyObject_Free(self);
}

static PyTypeObject TSGuard_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rethook.engine._ccore._TSGuard",
    .tp_basicsize = sizeof(TSGuard),
    .tp_dealloc = (destructor)TSGuard_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Holds a thread's ThreadState for the C core's thread-local cache.",
};

/* Slow path of current_ts: the cache is cold (new thread, or another PyThreadState).
 * Returns a borrowed reference, or NULL (with an error set, or without one when the thread
 * has no state and create is 0). */
static RH_COLD PyObject *
current_ts_slow(PyThreadState *tstate, int create)
{
    rh_tstate_check(tstate); /* (a thread met for the first time: the fast lanes' read agrees) */
    PyObject *ts = PyObject_GetAttr(local_obj, s_ts);
    if (ts == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        if (!create)
            return NULL;
        ts = PyObject_CallNoArgs(new_thread_state_fn);
        if (ts == NULL)
            return NULL;
    }
    if (Py_TYPE(ts) != ThreadState_t) {
        PyErr_Format(PyExc_TypeError, "rethook: core._local.ts is a %.100s, not a ThreadState",
                     Py_TYPE(ts)->tp_name);
        Py_DECREF(ts);
        return NULL;
    }
    PyObject *g = PyObject_GetAttr(local_obj, s_guard);
    if (g == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            Py_DECREF(ts);
            return NULL;
        }
        PyErr_Clear();
    }
    if (g == NULL || !Py_IS_TYPE(g, &TSGuard_Type) || ((TSGuard *)g)->ts != ts) {
        Py_XDECREF(g);
        g = (PyObject *)PyObject_New(TSGuard, &TSGuard_Type);
        if (g == NULL) {
            Py_DECREF(ts);
            return NULL;
        }
        ((TSGuard *)g)->ts = Py_NewRef(ts);
        ((TSGuard *)g)->tstate = NULL;
        ((TSGuard *)g)->id = 0;
        if (PyObject_SetAttr(local_obj, s_guard, g) < 0) {
            Py_DECREF(g);
            Py_DECREF(ts);
            return NULL;
        }
    }
    TSCacheEntry *e = ts_entry(tstate);
    ((TSGuard *)g)->tstate = tstate;
    ((TSGuard *)g)->id = tstate->id;
    e->tstate = tstate;
    e->id = tstate->id;
    e->ts = ts;
    Py_DECREF(g);  /* core._local holds the guard */
    Py_DECREF(ts); /* the guard holds the ThreadState */
    return ts;
}

/* The ThreadState the cache holds for tstate (borrowed), or NULL: a cold cache. */
static inline PyObject *
ts_cached(PyThreadState *tstate)
{
    TSCacheEntry *e = ts_entry(tstate);
    return e->tstate == tstate && e->id == tstate->id ? e->ts : NULL;
}

static inline PyObject *
current_ts_in(PyThreadState *tstate, int create)
{
    if (tstate == NULL)
        return NULL;
    PyObject *ts = ts_cached(tstate);
    return ts != NULL ? ts : current_ts_slow(tstate, create);
}

static inline int
ts_is_busy(PyObject *ts)
{
    PyObject *v = SLOT(ts, ts_busy);
    if (v == Py_False || v == NULL)
        return 0;
    if (v == Py_True)
        return 1;
    int r = PyObject_IsTrue(v);
    if (r < 0) {
        PyErr_Clear();
        return 1;
    }
    return r;
}

#define SET_BUSY(ts, v) slot_store((ts), ts_busy, (v) ? Py_True : Py_False)

/* ts.stack as a new reference, or NULL with an error. */
static inline PyObject *
ts_get_stack(PyObject *ts)
{
    PyObject *stack = SLOT(ts, ts_stack);
    if (stack == NULL || !(PyList_CheckExact(stack) || PyList_Check(stack))) {
        PyErr_SetString(PyExc_TypeError, "rethook: ThreadState.stack is not a list");
        return NULL;
    }
    return Py_NewRef(stack);
}

/* ---------------------------------------------------------------------------------------- */
/* Slow paths shared by the callbacks (core.py's helpers of the same names).                 */

/* Hold this thread at the start of a transition while the engine sweeps (rule 7). */
static RH_COLD int
wait_sweep(PyObject *ts)
{
    slot_store(ts, ts_waiting, Py_True);
    int ok = -1;
    PyObject *lock = PyObject_GetAttr(core_mod, s_sweep_lock);
    if (lock != NULL) {
        PyObject *r = PyObject_CallMethodNoArgs(lock, s_acquire);
        if (r != NULL) {
            Py_DECREF(r);
            r = PyObject_CallMethodNoArgs(lock, s_release);
            if (r != NULL) {
                Py_DECREF(r);
                ok = 0;
            }
        }
        Py_DECREF(lock);
    }
    slot_store(ts, ts_waiting, Py_False);
    return ok;
}

/* Charge a call nobody could see to each user that wanted it (their nmissed). */
static int
missed(PyObject *code, int graph_only)
{
    const Slot *s = lookup(code);
    if (s == NULL)
        return 0;
    PyObject *dispatch = Py_NewRef(s->dispatch);
    PyObject *groups[2] = {graph_only ? NULL : slot_entry(s), s->graph};
    int r = 0;
    for (int g = 0; g < 2 && r == 0; g++) {
        PyObject *regs = groups[g];
        if (regs == NULL)
            continue;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(regs); i++) {
            PyObject *reg = PyTuple_GET_ITEM(regs, i);
            if (Py_TYPE(reg) == EntryRegistration_t)
                r = slot_incr(reg, EntryRegistration_t, er_nmissed, s_nmissed);
            else
                r = slot_incr(reg, Registration_t, rg_nmissed, s_nmissed);
            if (r < 0)
                break;
        }
    }
    Py_DECREF(dispatch);
    return r;
}

/* A direct entry left the stack (the caller holds it): its user's exit hook, on this thread. */
static PyObject *last_capsule;      /* strong: the capsule last_direct came from */
static const rh_direct *last_direct; /* (PyCapsule_GetPointer compares names with strcmp) */

/* The hooks behind a capsule other than last_capsule (which becomes it), or NULL with an
 * error set. */
static RH_COLD const rh_direct *
direct_hooks_of(PyObject *capsule)
{
    const rh_direct *d = PyCapsule_GetPointer(capsule, RH_DIRECT_CAPSULE);
    if (d != NULL) {
        Py_XSETREF(last_capsule, Py_NewRef(capsule));
        last_direct = d;
    }
    return d;
}

/* The hooks of a direct entry, or NULL with an error set. */
static inline const rh_direct *
direct_hooks(PyObject *entry)
{
    PyObject *capsule = PyTuple_GET_ITEM(entry, 2);
    return capsule == last_capsule ? last_direct : direct_hooks_of(capsule);
}

/* The exit hook of a direct entry: 0, or -1 with an error set (the hook's, or no hooks). */
static inline int
direct_exit_hook(PyObject *entry, PyObject *exc, long flags, long long t,
                 PyThreadState *tstate)
{
    const rh_direct *d = direct_hooks(entry);
    return d == NULL ? -1 : d->exit(d->self, tstate, PyTuple_GET_ITEM(entry, 0), t,
                                    exc == Py_None ? NULL : exc, flags);
}

/* A direct hook's error, counted as its handler's (reg: the registration, borrowed). That runs
 * Python code, as rethook's own: the fast paths, which do not mark the thread busy and hold
 * nothing, mark the thread now, and ts and reg are held while it runs. */
static RH_COLD void
direct_hook_failed(PyObject *ts, PyObject *reg, PyObject **pending)
{
    Py_INCREF(ts);
    Py_INCREF(reg);
    SET_BUSY(ts, 1);
    handler_error(reg, pending);
    SET_BUSY(ts, 0);
    Py_DECREF(reg);
    Py_DECREF(ts);
}

static void
direct_exit(PyObject *entry, PyObject *exc, long flags, long long t, PyThreadState *tstate,
            PyObject **pending)
{
    if (direct_exit_hook(entry, exc, flags, t, tstate) < 0)
        handler_error(PyTuple_GET_ITEM(entry, 1), pending);
}

/* A prepared user's answer after prepare(): r, or -1 with SystemError set when the hook still
 * says RH_DIRECT_PREPARE (prepare() left the thread without state). */
static int
prepared_answer(int r)
{
    if (r != RH_DIRECT_PREPARE)
        return r;
    PyErr_SetString(PyExc_SystemError, "rethook: a direct user's prepare() left the thread "
                    "unprepared");
    return -1;
}

/* gen_entry's answer ok, or -1 with SystemError set when it claimed a call (1) without
 * giving its entry data. */
static int
gen_entry_answer(int ok, PyObject *data)
{
    if (ok != 1 || data != NULL)
        return ok;
    PyErr_SetString(PyExc_SystemError, "a direct user's gen_entry claimed a call without "
                    "entry data");
    return -1;
}

/* A direct record's suspension or resumption at t: its user's hook, if the record still has
 * its claim (the caller holds the record). answer: what the hook already answered, or
 * DREC_ASK to call it. A resumption on a thread the user has no state for yet
 * (RH_DIRECT_PREPARE, a prepared user's answer) prepares it and asks again. */
#define DREC_ASK (-100)
static void
drec_notify(PyObject *rec, PyThreadState *tstate, int64_t t, int resume, int answer,
            PyObject **pending)
{
    PyObject *reg, *data;
    if (!drec_claim(rec, &reg, &data))
        return;
    const rh_direct *d = ((DRecord *)rec)->d;
    PyObject *code = Py_NewRef(PyList_GET_ITEM(rec, REC_CODE));
    Py_INCREF(reg);
    Py_INCREF(data);
    int r = answer != DREC_ASK ? answer
            : resume ? d->gen_resume(d->self, tstate, code, data, t)
                     : d->gen_suspend(d->self, tstate, code, data, t);
    if (r == RH_DIRECT_PREPARE) /* the thread's first call of this user: Python code */
        r = prepared_answer(d->prepare(d->self, tstate) < 0
                            ? -1 : d->gen_resume(d->self, tstate, code, data, t));
    if (r < 0)
        handler_error(reg, pending);
    Py_DECREF(data);
    Py_DECREF(reg);
    Py_DECREF(code);
}

/* A direct record's call ends at t (exc: the exception or NULL; flags: the return flags): its
 * claim, if it still has it, is taken off and delivered to its user's exit hook. */
static void
drec_exit(PyObject *rec, PyThreadState *tstate, PyObject *exc, long flags, int64_t t,
          PyObject **pending)
{
    PyObject *reg, *data;
    if (!drec_claim(rec, &reg, &data))
        return;
    DRecord *r = (DRecord *)rec;
    PyObject *entry = Py_NewRef(r->direct_entry); /* keeps the hooks' user alive */
    data = list_pop(rec);
    reg = list_pop(rec);
    PyObject *code = Py_NewRef(PyList_GET_ITEM(rec, REC_CODE));
    const rh_direct *d = r->d;
    if (d->gen_exit(d->self, tstate, code, data, r->t0, t, r->sleep,
                    exc == Py_None ? NULL : exc, flags) < 0)
        handler_error(reg, pending);
    Py_DECREF(code);
    Py_DECREF(reg);
    Py_DECREF(data);
    Py_DECREF(entry);
}

/* Pop every claim off a record (newest first) and call each return handler once (core.deliver;
 * depth_obj, retval, exc, t and flags are passed through). */
static int
deliver(PyObject *ts, PyObject *rec, PyObject *depth_obj, PyObject *retval, PyObject *exc,
        PyObject *t, long flags, PyObject **pending)
{
    if (is_direct(rec) || IS_DREC(rec)) {
        long long tn = PyLong_AsLongLong(t);
        if (tn == -1 && PyErr_Occurred())
            return -1;
        if (IS_DREC(rec))
            drec_exit(rec, current_tstate(), exc, flags, tn, pending);
        else
            direct_exit(rec, exc, flags, tn, current_tstate(), pending);
        return 0;
    }
    if (!PyList_Check(rec) || PyList_GET_SIZE(rec) <= REC_HEADER)
        return 0; /* a marker, or a record whose claims were all swept */
    PyObject *code = Py_NewRef(PyList_GET_ITEM(rec, REC_CODE));
    PyObject *frame = Py_NewRef(PyList_GET_ITEM(rec, REC_FRAME));
    PyObject *t0 = Py_NewRef(PyList_GET_ITEM(rec, REC_TIME));
    PyObject *sleep = Py_NewRef(PyList_GET_ITEM(rec, REC_SLEEP));
    PyObject *flags_obj = PyLong_FromLong(flags);
    PyObject *inflight = SLOT(ts, ts_inflight);
    int r = 0;
    if (flags_obj == NULL || inflight == NULL || !PyList_Check(inflight)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "rethook: ThreadState.inflight is not a list");
        r = -1;
        goto out;
    }
    Py_INCREF(inflight);
    /* A handler may unregister another user of this very call: the engine's sweep then finds
     * the record in inflight and takes that user's claim (FLAG_UNFINISHED). */
    if (PyList_Append(inflight, rec) < 0) {
        Py_DECREF(inflight);
        r = -1;
        goto out;
    }
    while (PyList_GET_SIZE(rec) > REC_HEADER) {
        PyObject *data = list_pop(rec);
        PyObject *reg = list_pop(rec);
        PyObject *fn = reg_get(reg, Registration_t, rg_retfunc, s_retfunc);
        if (fn == NULL) {
            stash_error(pending);
        }
        else if (fn != Py_None) {
            PyObject *argv[11] = {NULL, code, frame, depth_obj, data, retval, exc, t0, t,
                                  sleep, flags_obj};
            PyObject *res = PyObject_Vectorcall(fn, argv + 1,
                                                10 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (res == NULL)
                handler_error(reg, pending);
            Py_XDECREF(res);
        }
        Py_XDECREF(fn);
        Py_DECREF(reg);
        Py_DECREF(data);
    }
    {
        PyObject *last = list_pop(inflight);
        Py_XDECREF(last);
    }
    Py_DECREF(inflight);
out:
    Py_XDECREF(flags_obj);
    Py_DECREF(sleep);
    Py_DECREF(t0);
    Py_DECREF(frame);
    Py_DECREF(code);
    return r;
}

/* Tell a record's users that its generator/coroutine was suspended or resumed. */
static void
notify(PyObject *rec, Py_ssize_t depth, PyObject *t, int resume, PyObject **pending)
{
    if (!PyList_Check(rec) || PyList_GET_SIZE(rec) <= REC_HEADER)
        return;
    PyObject *code = Py_NewRef(PyList_GET_ITEM(rec, REC_CODE));
    PyObject *frame = Py_NewRef(PyList_GET_ITEM(rec, REC_FRAME));
    PyObject *depth_obj = PyLong_FromSsize_t(depth);
    if (depth_obj == NULL) {
        stash_error(pending);
        goto out;
    }
    /* A handler can make the engine take claims off this record: re-read its length. */
    for (Py_ssize_t i = REC_HEADER; i + 1 < PyList_GET_SIZE(rec); i += 2) {
        PyObject *reg = Py_NewRef(PyList_GET_ITEM(rec, i));
        PyObject *data = Py_NewRef(PyList_GET_ITEM(rec, i + 1));
        PyObject *fn = resume ? reg_get(reg, Registration_t, rg_resumefunc, s_resumefunc)
                              : reg_get(reg, Registration_t, rg_suspendfunc, s_suspendfunc);
        if (fn == NULL) {
            stash_error(pending);
        }
        else if (fn != Py_None) {
            PyObject *argv[6] = {NULL, code, frame, depth_obj, data, t};
            PyObject *res = PyObject_Vectorcall(fn, argv + 1,
                                                5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (res == NULL)
                handler_error(reg, pending);
            Py_XDECREF(res);
        }
        Py_XDECREF(fn);
        Py_DECREF(data);
        Py_DECREF(reg);
    }
out:
    Py_XDECREF(depth_obj);
    Py_DECREF(frame);
    Py_DECREF(code);
}

/* Slow exit path: pop frame's entry; flush the ones above it, which left unseen (delivered
 * FLAG_UNFINISHED). A new reference to the entry, or NULL (an error set only on failure). */
static PyObject *
find_exit(PyObject *ts, PyObject *stack, PyObject *frame, PyObject **pending)
{
    Py_ssize_t i = PyList_GET_SIZE(stack) - 1;
    for (; i >= 0; i--) {
        PyObject *rec = PyList_GET_ITEM(stack, i);
        if (rec_len(rec) > REC_FRAME && rec_item(rec, REC_FRAME) == frame)
            break;
    }
    if (i < 0)
        return NULL; /* entered before its events were on: nothing to do */
    PyObject *t = PyLong_FromLongLong(now_ns());
    if (t == NULL)
        return NULL;
    while (PyList_GET_SIZE(stack) > i + 1) {
        PyObject *stale = list_pop(stack);
        PyObject *depth_obj = PyLong_FromSsize_t(PyList_GET_SIZE(stack));
        if (depth_obj == NULL || deliver(ts, stale, depth_obj, Py_None, Py_None, t,
                                         FLAG_UNFINISHED, pending) < 0)
            stash_error(pending);
        Py_XDECREF(depth_obj);
        Py_DECREF(stale);
    }
    Py_DECREF(t);
    /* (a handler may have cleared the stack: engine.stop from a return handler) */
    return list_pop(stack);
}

/* An exit whose code is not the top entry's key: a generator's, or an unmatched one. */
static PyObject *
exit_by_frame(PyObject *ts, PyObject *stack, PyObject *frame, PyObject **pending)
{
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (n == 0)
        return NULL;
    if (rec_item(PyList_GET_ITEM(stack, n - 1), REC_KEY) == frame)
        return list_pop(stack);
    return find_exit(ts, stack, frame, pending);
}

/* ---------------------------------------------------------------------------------------- */
/* The sys.monitoring callbacks.                                                            */

/* Run the entry users (ftrace_ops) of a call. 1 if one raised a BaseException (in *pending). */
static int
call_entry_users(PyObject *entry, PyObject *code, PyObject *frame, PyObject **pending)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(entry); i++) {
        PyObject *e = PyTuple_GET_ITEM(entry, i);
        PyObject *fn = reg_get(e, EntryRegistration_t, er_func, s_func);
        if (fn == NULL) {
            stash_error(pending);
            if (*pending)
                return 1;
            continue;
        }
        PyObject *argv[3] = {NULL, code, frame};
        PyObject *res = PyObject_Vectorcall(fn, argv + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                            NULL);
        Py_DECREF(fn);
        if (res == NULL) {
            if (handler_error(e, pending))
                return 1;
        }
        else {
            Py_DECREF(res);
        }
    }
    return 0;
}

static inline int
push(PyObject *stack, PyObject *entry, PyObject **pending)
{
    if (entry == NULL)
        return 0;
    if (PyList_Append(stack, entry) < 0) {
        stash_error(pending);
        return -1;
    }
    return 0;
}

static inline int
accepted(PyObject *data)
{
    return data != Py_None && data != Py_False;
}

/* ---- The direct fast path (fgraph_direct.h) -------------------------------------------
 *
 * A call of a function whose one user is written in C needs little of the general path: no
 * record, no Python ints, no argument vectors, no extra references to the dispatch or the
 * stack (the user's hooks run no Python code on their hot path, so neither can change). The
 * thread is still marked busy around the hook (the user's first call on a thread makes its
 * ring through Python). These paths run only when the thread is not busy and no sweep is on,
 * and leave everything else to the general path:
 *
 *   entry   the shadow stack gets the direct entry (in place when the list has room), then
 *           the user's entry hook; declined -> the function's marker. A user with a prepare
 *           hook runs no Python code in entry, so for it nothing is held and the thread is
 *           not marked busy: the call touches the slot and the direct entry, nothing else of
 *           the dispatch (sqlglot: the dispatch tuple's line missed the cache on most calls).
 *           Its answer RH_DIRECT_PREPARE leaves the call to the general path.
 *   exit    the top entry is this code's direct entry and is not its last reference (the
 *           dispatch still holds it, so popping it frees nothing): popped, then the exit hook.
 *
 * Both return 1 when they handled the event, 0 to fall through to the general path. */
static inline __attribute__((always_inline)) int
direct_start_prepared(PyThreadState *tstate, PyObject *ts, const Slot *s, PyObject *code,
                      PyObject *stack, Py_ssize_t n, PyObject **pending)
{
    PyObject *entry = s->direct_entry;
    const rh_direct *d = s->direct;
    long long tn = now_ns();
    PyObject **items = ((PyListObject *)stack)->ob_item;
    items[n] = Py_NewRef(entry);
    Py_SET_SIZE(stack, n + 1);
    int r = d->entry(d->self, tstate, code, tn);
    if (r == 1)
        return 1;
    /* (the dispatch holds other references to the entry and the marker: nothing is freed) */
    if (r == RH_DIRECT_PREPARE) { /* the thread's first call: the general path prepares it */
        Py_SET_SIZE(stack, n);
        Py_DECREF(entry);
        return 0;
    }
    ((PyListObject *)stack)->ob_item[n] = Py_NewRef(s->marker); /* declined, or failed */
    Py_DECREF(entry);
    if (r < 0)
        direct_hook_failed(ts, PyTuple_GET_ITEM(s->graph, 0), pending);
    return 1;
}

/* ts's shadow stack if a direct entry can be stored into it in place (an exact list, below
 * max_depth, with room), else NULL (an overrun, or a list that must grow: the general path). */
static inline PyObject *
direct_room(PyObject *ts)
{
    PyObject *stack = SLOT(ts, ts_stack);
    if (stack == NULL || !PyList_CheckExact(stack))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(stack);
    return n < max_depth && ((PyListObject *)stack)->allocated > n ? stack : NULL;
}

static inline int
direct_start(PyThreadState *tstate, PyObject *ts, const Slot *s, PyObject *code,
             PyObject **pending)
{
    PyObject *stack = direct_room(ts);
    if (stack == NULL)
        return 0;
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (s->prepared)
        return direct_start_prepared(tstate, ts, s, code, stack, n, pending);
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    /* The dispatch holds the direct entry, the marker and the registration: held across the
     * hook, whose first call on a thread runs Python code (another thread may publish). */
    PyObject *dispatch = Py_NewRef(s->dispatch);
    PyObject *entry = s->direct_entry, *marker = s->marker, *reg = PyTuple_GET_ITEM(s->graph, 0);
    const rh_direct *d = s->direct;
    Py_INCREF(stack);
    long long tn = now_ns();
    ((PyListObject *)stack)->ob_item[n] = Py_NewRef(entry);
    Py_SET_SIZE(stack, n + 1);
    int r = d->entry(d->self, tstate, code, tn);
    if (r <= 0) { /* declined (or failed: counted as its handler's error) */
        Py_ssize_t m = PyList_GET_SIZE(stack);
        if (m && PyList_GET_ITEM(stack, m - 1) == entry) {
            PyList_GET_ITEM(stack, m - 1) = Py_NewRef(marker);
            Py_DECREF(entry); /* (the dispatch holds another reference) */
        }
        if (r < 0)
            handler_error(reg, pending);
    }
    Py_DECREF(stack);
    Py_DECREF(dispatch);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    return 1;
}

/* An entry user's direct hook (fgraph_direct.h): 1 when it handled the call, 0 when it did
 * nothing (RH_DIRECT_PREPARE) and the user's ordinary func is to be called. Runs with nothing
 * held and the thread not marked busy: the hook runs no Python code, so the slot stays. */
static inline int
fdirect_start(PyThreadState *tstate, PyObject *ts, const Slot *s, PyObject *code,
              PyObject **pending)
{
    const rh_fdirect *f = s->fdirect;
    int r = f->func(f->self, tstate, code);
    if (r == RH_DIRECT_PREPARE)
        return 0;
    if (r < 0)
        direct_hook_failed(ts, PyTuple_GET_ITEM(slot_entry(s), 0), pending);
    return 1;
}

static inline __attribute__((always_inline)) int
direct_return(PyThreadState *tstate, PyObject *ts, PyObject *code, PyObject *exc,
              PyObject **pending)
{
    PyObject *stack = SLOT(ts, ts_stack);
    if (stack == NULL || !PyList_CheckExact(stack))
        return 0;
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (n == 0)
        return 0;
    PyObject *top = PyList_GET_ITEM(stack, n - 1);
    if (!is_direct(top) || PyTuple_GET_ITEM(top, 0) != code || Py_REFCNT(top) < 2)
        return 0;
    Py_SET_SIZE(stack, n - 1); /* our reference to top now */
    /* An exit hook runs no Python code (fgraph_direct.h): no busy mark but for an error */
    if (direct_exit_hook(top, exc, 0, now_ns(), tstate) < 0)
        direct_hook_failed(ts, PyTuple_GET_ITEM(top, 1), pending);
    Py_DECREF(top);
    return 1;
}

/* ---- Direct records (generators and coroutines whose one user has generator hooks) -------
 *
 * The same idea for the calls that suspend: per event no Python int, no argument vector, no
 * handler lookup, no vectorcall, no frame object made after the entry's (the frame is found
 * with frame_peek). Per call: the record (a freelist) and the user's entry data. The parked
 * table is the one other records use, keyed by frame, so parking, resuming on another
 * thread, the sweep, collect_parked and the overflow hook see direct records as any other.
 *
 *   entry   (on_start, fast or general path) the direct record is pushed, then gen_entry;
 *           declined: popped, as a generator's record with no claim.
 *   yield   the top entry is the frame's direct record: popped, parked with its C time, then
 *           gen_suspend.
 *   resume  (on_resume) a direct record unparked: sleep added in C, gen_resume, pushed.
 *   exit    the top entry is the frame's direct record: popped, its claim to gen_exit.
 * The fast paths (no busy thread, no sweep) return 1 when they handled the event, 0 to leave
 * it to the general path, which routes direct records to the same helpers. */

/* A direct record for a call of code in frame (a new reference; times: entry at t0), or NULL
 * with an error set. */
static DRecord *
drec_make(PyObject *frame, PyObject *code, PyObject *direct_entry, const rh_direct *d,
          int prepared, int64_t t0)
{
    DRecord *r = drec_new();
    if (r == NULL)
        return NULL;
    PyObject **it = r->list.ob_item;
    it[REC_KEY] = Py_NewRef(frame);
    it[REC_CODE] = Py_NewRef(code);
    it[REC_FRAME] = Py_NewRef(frame);
    it[REC_TIME] = Py_NewRef(zero); /* (the times are the C fields) */
    it[REC_SLEEP] = Py_NewRef(zero);
    it[REC_PARKED_AT] = Py_NewRef(zero);
    Py_SET_SIZE(r, REC_HEADER);
    r->direct_entry = Py_NewRef(direct_entry);
    r->d = d;
    r->prepared = prepared;
    r->t0 = t0;
    r->sleep = 0;
    r->parked_at = 0;
    return r;
}

/* Push a direct record for a call of code (in frame) and ask the user. direct_entry, d and
 * reg are the dispatch's (the caller holds the dispatch). */
static void
gen_direct_enter(PyThreadState *tstate, PyObject *stack, PyObject *code, PyObject *frame,
                 PyObject *direct_entry, const rh_direct *d, int prepared, PyObject *reg,
                 PyObject **pending)
{
    DRecord *r = drec_make(frame, code, direct_entry, d, prepared, now_ns());
    if (r == NULL) {
        stash_error(pending);
        return;
    }
    PyObject *rec = (PyObject *)r;
    /* Push first, then ask the user (rule 1). */
    if (PyList_Append(stack, rec) < 0) {
        stash_error(pending);
        drec_release(rec);
        return;
    }
    PyObject *data = NULL;
    int ok = d->gen_entry(d->self, tstate, code, r->t0, &data);
    if (ok == RH_DIRECT_PREPARE) { /* the thread's first call of a prepared user */
        r->t0 = now_ns();         /* (after: making the thread's ring is no part of the call) */
        ok = prepared_answer(d->prepare(d->self, tstate) < 0
                             ? -1 : d->gen_entry(d->self, tstate, code, r->t0, &data));
    }
    ok = gen_entry_answer(ok, data);
    if (ok > 0) {
        if (rec_add_claim(rec, reg, data) < 0) /* (never: the record has room for it) */
            stash_error(pending);
        Py_DECREF(data);
    }
    else if (ok < 0) {
        handler_error(reg, pending); /* (declined) */
    }
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (PyList_GET_SIZE(rec) == REC_HEADER && n && PyList_GET_ITEM(stack, n - 1) == rec)
        Py_DECREF(list_pop(stack)); /* nobody wants the return: a generator has no marker */
    drec_release(rec);
}

/* A prepared user's generator call enters (gen_direct_start's common case). Nothing is held
 * and the thread is not marked busy: the hook runs no Python code, and neither do the
 * allocations here (the frame object, a record past the freelist): a collection they cause
 * waits for the eval loop (3.12+). 1: done (claimed, declined, or failed and reported); 0: the
 * general path's to do, nothing changed (the thread's first call of the user, a list that must
 * grow, an allocation that failed). */
static inline int
gen_direct_start_prepared(PyThreadState *tstate, PyObject *ts, const Slot *s, PyObject *code,
                          PyObject *stack, PyObject **pending)
{
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (((PyListObject *)stack)->allocated <= n)
        return 0;
    PyObject *frame = frame_peek(tstate);
    frame = frame != NULL ? Py_NewRef(frame) : current_frame(); /* (makes it: the entry) */
    const rh_direct *d = s->direct;
    DRecord *r = drec_make(frame, code, s->direct_entry, d, 1, now_ns());
    Py_DECREF(frame); /* (the interpreter frame holds it, and now the record) */
    if (r == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *rec = (PyObject *)r;
    ((PyListObject *)stack)->ob_item[n] = rec; /* the stack takes our reference */
    Py_SET_SIZE(stack, n + 1);
    PyObject *data = NULL;
    int ok = d->gen_entry(d->self, tstate, code, r->t0, &data);
    PyObject *reg = PyTuple_GET_ITEM(s->graph, 0);
    if (ok == 1 && data != NULL) {
        PyObject **it = r->list.ob_item;
        it[REC_HEADER] = Py_NewRef(reg);
        it[REC_HEADER + 1] = data; /* (the hook's reference) */
        Py_SET_SIZE(rec, REC_HEADER + 2);
        return 1;
    }
    /* Not claimed: the record goes (a generator has no marker). It frees nothing: the frame,
     * the code and the direct entry all have other owners. */
    Py_SET_SIZE(stack, n);
    drec_release(rec);
    if (ok == RH_DIRECT_PREPARE)
        return 0;
    ok = gen_entry_answer(ok, data); /* (claimed without data: an error) */
    if (ok < 0)
        direct_hook_failed(ts, reg, pending);
    return 1;
}

static inline int
gen_direct_start(PyThreadState *tstate, PyObject *ts, const Slot *s, PyObject *code,
                 PyObject **pending)
{
    PyObject *stack = SLOT(ts, ts_stack);
    if (stack == NULL || !PyList_CheckExact(stack) || PyList_GET_SIZE(stack) >= max_depth)
        return 0; /* (an overrun: the general path counts it) */
    if (s->prepared && gen_direct_start_prepared(tstate, ts, s, code, stack, pending))
        return 1;
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    /* The dispatch holds the direct entry and the registration: held across the hook, whose
     * first call on a thread runs Python code (another thread may publish meanwhile). */
    PyObject *dispatch = Py_NewRef(s->dispatch);
    PyObject *direct_entry = s->direct_entry, *reg = PyTuple_GET_ITEM(s->graph, 0);
    const rh_direct *d = s->direct;
    int prepared = s->prepared;
    Py_INCREF(stack);
    PyObject *frame = frame_peek(tstate);
    frame = frame != NULL ? Py_NewRef(frame) : current_frame(); /* (makes it: the entry) */
    gen_direct_enter(tstate, stack, code, frame, direct_entry, d, prepared, reg, pending);
    Py_DECREF(frame);
    Py_DECREF(stack);
    Py_DECREF(dispatch);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    return 1;
}

/* The top entry of ts's stack if it is the direct record of the frame that fired the event
 * (borrowed), else NULL. */
static inline PyObject *
gen_direct_top(PyThreadState *tstate, PyObject *ts)
{
    PyObject *stack = SLOT(ts, ts_stack);
    if (stack == NULL || !PyList_CheckExact(stack))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (n == 0)
        return NULL;
    PyObject *top = PyList_GET_ITEM(stack, n - 1);
    if (!IS_DREC(top))
        return NULL;
    PyObject *frame = frame_peek(tstate);
    return frame != NULL && PyList_GET_ITEM(top, REC_KEY) == frame ? top : NULL;
}

/* A prepared user's generator call, whose direct record (rec) the caller took off the stack,
 * ends at t (exc: the exception or NULL): drec_exit() and drec_release() with nothing held and
 * the thread not marked busy. The exit hook runs no Python code and neither does releasing the
 * claim's data (the prepared user's promise, fgraph_direct.h); the registration and the direct
 * entry are checked to have other owners (the dispatch), and the record's header items have
 * theirs (the frame, which is still running, holds its frame object and code). */
static inline void
drec_exit_prepared(PyObject *rec, PyThreadState *tstate, PyObject *ts, PyObject *exc,
                   int64_t t, PyObject **pending)
{
    DRecord *r = (DRecord *)rec;
    PyObject *reg, *data;
    if (drec_claim(rec, &reg, &data)) {
        Py_SET_SIZE(rec, REC_HEADER); /* the claim's references are ours */
        if (r->d->gen_exit(r->d->self, tstate, PyList_GET_ITEM(rec, REC_CODE), data, r->t0, t,
                           r->sleep, exc == Py_None ? NULL : exc, 0) < 0)
            direct_hook_failed(ts, reg, pending);
        Py_DECREF(data);
        Py_DECREF(reg);
    }
    drec_release(rec);
}

/* Whether ending rec (a direct record) with drec_exit_prepared() runs no Python code. */
static inline int
drec_quiet_exit(PyObject *rec)
{
    DRecord *r = (DRecord *)rec;
    return r->prepared && r->direct_entry != NULL && Py_REFCNT(r->direct_entry) > 1 &&
           (PyList_GET_SIZE(rec) != REC_HEADER + 2 ||
            Py_REFCNT(PyList_GET_ITEM(rec, REC_HEADER)) > 1);
}

/* PY_RETURN / PY_UNWIND (exc) of a generator whose direct record is on top. */
static inline int
gen_direct_return(PyThreadState *tstate, PyObject *ts, PyObject *exc, PyObject **pending)
{
    PyObject *top = gen_direct_top(tstate, ts);
    if (top == NULL)
        return 0;
    if (drec_quiet_exit(top)) {
        PyObject *stack = SLOT(ts, ts_stack);
        Py_SET_SIZE(stack, PyList_GET_SIZE(stack) - 1); /* the stack's reference is ours now */
        drec_exit_prepared(top, tstate, ts, exc, now_ns(), pending);
        return 1;
    }
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    PyObject *stack = SLOT(ts, ts_stack);
    Py_SET_SIZE(stack, PyList_GET_SIZE(stack) - 1); /* the stack's reference is ours now */
    drec_exit(top, tstate, exc, 0, now_ns(), pending);
    drec_release(top);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    return 1;
}

/* Park rec under frame (the table takes its own references): 0, or -1 with the error stashed. */
static int
park(PyObject *frame, PyObject *rec, PyObject **pending)
{
    PyObject *old;
    if (park_put(parked, frame, rec, &old) < 0) {
        stash_error(pending);
        return -1;
    }
    Py_XDECREF(old); /* (a record parked twice under one frame: not expected) */
    return 0;
}

/* After a park: more than park_limit calls parked runs the engine's overflow hook
 * (collect_parked: generators closed or collected without an event). */
static void
park_overflow(PyObject **pending)
{
    if (parked->used <= park_limit || overflow_hook == NULL || overflow_hook == Py_None)
        return;
    PyObject *hook = Py_NewRef(overflow_hook);
    PyObject *r = PyObject_CallNoArgs(hook);
    Py_DECREF(hook);
    if (r == NULL)
        stash_error(pending);
    Py_XDECREF(r);
}

/* Park a direct record (the caller's reference; frame: its key) at t: parked[frame], the
 * suspend hook, the overflow hook past the limit. */
static void
drec_park(PyObject *rec, PyObject *frame, PyThreadState *tstate, int64_t t, PyObject **pending)
{
    ((DRecord *)rec)->parked_at = t;
    if (park(frame, rec, pending) < 0)
        return;
    drec_notify(rec, tstate, t, 0, DREC_ASK, pending);
    park_overflow(pending);
}

/* PY_YIELD of a generator whose direct record is on top. Its suspend hook runs no Python code
 * (the call ran on this thread, so it is not the thread's first: fgraph_direct.h), so nothing
 * is held and the thread is marked busy only for what runs Python code: a hook's error and the
 * overflow hook. The stack's reference to the record passes to the parked table. */
static inline __attribute__((always_inline)) int
gen_direct_yield(PyThreadState *tstate, PyObject *ts, PyObject **pending)
{
    PyObject *top = gen_direct_top(tstate, ts);
    if (top == NULL)
        return 0;
    DRecord *r = (DRecord *)top;
    int64_t t = now_ns();
    r->parked_at = t;
    PyObject *old;
    if (park_put_ref(parked, PyList_GET_ITEM(top, REC_KEY), top, &old) < 0) {
        PyErr_Clear();
        return 0; /* (MemoryError: the general path tries again, and reports it) */
    }
    PyObject *stack = SLOT(ts, ts_stack);
    Py_SET_SIZE(stack, PyList_GET_SIZE(stack) - 1); /* its reference is the table's now */
    PyObject *reg, *data;
    if (drec_claim(top, &reg, &data) &&
        r->d->gen_suspend(r->d->self, tstate, PyList_GET_ITEM(top, REC_CODE), data, t) < 0)
        direct_hook_failed(ts, reg, pending);
    if (old != NULL || parked->used > park_limit) {
        Py_INCREF(ts);
        SET_BUSY(ts, 1);
        Py_XDECREF(old); /* (a record parked twice under one frame: not expected) */
        park_overflow(pending);
        SET_BUSY(ts, 0);
        Py_DECREF(ts);
    }
    return 1;
}

/* The rare part of gen_direct_resume(): the user's answer was not "done". r is the hook's
 * answer; the record (rec) is the caller's and not on the stack yet. */
static void
gen_direct_resumed_slowly(int r, PyObject *rec, PyThreadState *tstate, PyObject *ts,
                          int64_t t, PyObject **pending)
{
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    drec_notify(rec, tstate, t, 1, r, pending);
    PyObject *stack = SLOT(ts, ts_stack); /* (Python code ran: read it again) */
    if (stack != NULL && PyList_Check(stack))
        push(stack, rec, pending); /* (after the hook, even one that failed: rule 6) */
    Py_DECREF(rec);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
}

/* PY_RESUME / PY_THROW of frame, whose parked record is a direct record of a prepared user
 * (its hooks run no Python code; on a thread it has no state for yet, its resume hook says
 * RH_DIRECT_PREPARE). The record leaves the table, its sleep grows, the user's resume hook
 * runs, and the table's reference to the record passes to the stack. Nothing is held and the
 * thread is not marked busy unless the hook's answer needs Python code. */
static inline __attribute__((always_inline)) int
gen_direct_resume(PyThreadState *tstate, PyObject *ts, PyObject *frame, PyObject **pending)
{
    ParkSlot *slot = park_find(parked, frame);
    if (slot == NULL || !IS_DREC(slot->rec) || !((DRecord *)slot->rec)->prepared)
        return 0;
    PyObject *stack = SLOT(ts, ts_stack);
    if (stack == NULL || !PyList_CheckExact(stack) ||
        ((PyListObject *)stack)->allocated <= PyList_GET_SIZE(stack))
        return 0; /* (the list must grow: the general path) */
    PyObject *rec = slot->rec;
    PyObject *key = slot->frame;
    park_remove_slot(parked, slot);
    Py_DECREF(key); /* (the record holds the frame too) */
    DRecord *r = (DRecord *)rec;
    int64_t t = now_ns();
    r->sleep += t - r->parked_at;
    PyObject *reg, *data;
    int answer = 0;
    if (drec_claim(rec, &reg, &data))
        answer = r->d->gen_resume(r->d->self, tstate, PyList_GET_ITEM(rec, REC_CODE), data, t);
    if (answer != 0) {
        gen_direct_resumed_slowly(answer, rec, tstate, ts, t, pending);
        return 1;
    }
    Py_ssize_t n = PyList_GET_SIZE(stack);
    ((PyListObject *)stack)->ob_item[n] = rec; /* the table's reference */
    Py_SET_SIZE(stack, n + 1);
    return 1;
}

static PyObject *on_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* core.is_own_module(name), for any object: 1, 0, or -1 with an error. */
static int
is_own_name(PyObject *name)
{
    if (!PyUnicode_Check(name))
        return 0;
    if (PyUnicode_Compare(name, own_package) == 0)
        return 1;
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t r = PyUnicode_Tailmatch(name, own_prefix, 0, PY_SSIZE_T_MAX, -1);
    return r < 0 ? -1 : (int)r;
}

/* Whether the code whose PY_START this is belongs to rethook's own modules (by its globals'
 * __name__): 1, 0, or -1 with an error. */
static int
own_code(void)
{
    PyObject *globals = PyEval_GetGlobals(); /* (borrowed: the frame the event is for) */
    if (globals == NULL || !PyDict_Check(globals))
        return 0;
    PyObject *name = PyDict_GetItemWithError(globals, s_name);
    if (name == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return is_own_name(name);
}

static PyObject *on_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* hook(code), or hook(code, frame) with the program's frame, or hook() (code NULL), as
 * rethook's own work: the thread marked busy meanwhile, so what the hook runs is not
 * discovered as the program's, and a signal handler that finishes the trace waits (exits.py). A new reference, or NULL with an
 * error set (core.py's _rethooks_work). */
static PyObject *
rethooks_work(PyObject *hook, PyObject *code, int with_frame)
{
    PyObject *ts = current_ts_in(current_tstate(), 1);
    if (ts == NULL)
        return NULL;
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    hook = Py_NewRef(hook);
    PyObject *frame = with_frame ? current_frame() : NULL;
    /* a vectorcall (no argument tuple made), with a slot before the arguments for the bound
     * method's self (the hooks are the registry's and the engine's methods) */
    PyObject *argv[3] = {NULL, code, frame};
    size_t nargsf = (code == NULL ? 0 : frame != NULL ? 2 : 1) | PY_VECTORCALL_ARGUMENTS_OFFSET;
    PyObject *r = PyObject_Vectorcall(hook, argv + 1, nargsf, NULL);
    Py_XDECREF(frame);
    Py_DECREF(hook);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    return r;
}

/* ---- A first call armed in C -------------------------------------------------------------
 * The engine's _arm (engine.py) for its common case, the same steps in the same order: while
 * one set of users takes every known function (-l '*'), a function's dispatch is what those
 * users share (Engine._shared_dispatch) plus its own marker or direct entry (_dispatch_of).
 * The engine hands that over (set_fast_arm) when its users are settled and takes it back
 * (None) before they change; its lock is read from it at each use. What the template does
 * not settle goes to the engine's arm as before: a function the registry does not know or
 * that is rethook's own, code whose events are set already, an empty table. The ~2.7 us (warm; ~6 cold) of Python a first call took
 * becomes ~0.5 us, most of it sys.monitoring.set_local_events (sqlglot: ~1,100 first calls). */
enum { FA_EVENTS, FA_ENTRY, FA_GRAPH, FA_FLAGS, FA_MASK, FA_CAPSULE, FA_SET_EVENTS, FA_TOOL,
       FA_RESTART, FA_LATE, FA_ENGINE, FA_ITEMS };
static PyObject *s_module_attr, *s_late, *s_lock; /* "module", "_late", "_lock" */

static int publish_one(PyObject *key, PyObject *dispatch);

/* Python's _dispatch_of(code, parts) from the template: a new reference, or NULL. */
static PyObject *
fast_dispatch(PyObject *t, PyObject *code)
{
    PyObject *entry = PyTuple_GET_ITEM(t, FA_ENTRY), *graph = PyTuple_GET_ITEM(t, FA_GRAPH);
    PyObject *capsule = PyTuple_GET_ITEM(t, FA_CAPSULE);
    long flags = PyLong_AsLong(PyTuple_GET_ITEM(t, FA_FLAGS));
    if (flags == -1 && PyErr_Occurred())
        return NULL;
    int suspending = ((PyCodeObject *)code)->co_flags &
                     (CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR);
    if (suspending)
        flags |= GENERATOR | WANT_FRAME;
    PyObject *users = PyTuple_GET_SIZE(graph) ? graph : entry;
    PyObject *marker = PyTuple_GET_SIZE(graph) && !suspending ? PyTuple_Pack(1, code)
                                                              : Py_NewRef(Py_None);
    PyObject *direct = capsule == Py_None || PyTuple_GET_SIZE(users) == 0
                           ? Py_NewRef(Py_None)
                           : PyTuple_Pack(3, code, PyTuple_GET_ITEM(users, 0), capsule);
    PyObject *f = PyLong_FromLong(flags);
    PyObject *d = marker && direct && f ? PyTuple_Pack(5, entry, graph, f, marker, direct) : NULL;
    Py_XDECREF(marker);
    Py_XDECREF(direct);
    Py_XDECREF(f);
    return d;
}

/* Hook `code` (key: its id) as the template says, the engine's lock held: 1 when done, 0 when
 * it is not the template's to settle, -1 with an error set. */
static int
fast_hook(PyObject *t, PyObject *code, PyObject *key)
{
    if (unarmed_ids != NULL && PyDict_GET_SIZE(unarmed_ids) > 0) { /* _unarmed.pop(key) */
        int in = PyDict_Contains(unarmed_ids, key);
        if (in < 0 || (in && PyDict_DelItem(unarmed_ids, key) < 0))
            return -1;
    }
    if (lookup(code) != NULL)
        return 1; /* hooked meanwhile */
    PyObject *events = PyTuple_GET_ITEM(t, FA_EVENTS);
    int has = PyDict_Contains(events, key);
    if (has != 0 || known_ids == NULL || table->dict == NULL)
        return has < 0 ? -1 : 0; /* (events set already: _hook_one reconciles) */
    PyObject *info = PyDict_GetItemWithError(known_ids, key); /* borrowed */
    if (info == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *module = PyObject_GetAttr(info, s_module_attr);
    int own = module == NULL ? -1 : is_own_name(module);
    Py_XDECREF(module);
    if (own != 0)
        return own < 0 ? -1 : 0; /* (rethook's own: _arm declines it) */
    PyObject *dispatch = fast_dispatch(t, code);
    if (dispatch == NULL)
        return -1;
    PyObject *mask = PyTuple_GET_ITEM(t, FA_MASK);
    PyObject *argv[4] = {NULL, PyTuple_GET_ITEM(t, FA_TOOL), code, mask};
    PyObject *r = PyObject_Vectorcall(PyTuple_GET_ITEM(t, FA_SET_EVENTS), argv + 1,
                                      3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    int rc = r == NULL ? -1 : 0;
    Py_XDECREF(r);
    /* events first, then the table (as _hook_one) */
    PyObject *pair = rc == 0 ? PyTuple_Pack(2, code, mask) : NULL;
    if (pair == NULL || PyDict_SetItem(events, key, pair) < 0 ||
        PyDict_SetItem(table->dict, key, dispatch) < 0 || publish_one(key, dispatch) < 0)
        rc = -1;
    Py_XDECREF(pair);
    Py_DECREF(dispatch);
    if (rc < 0)
        return -1;
    int off = PySet_Contains(disabled_ids, key); /* _rearm: discovery disabled it before */
    if (off > 0) {
        if (PySet_Clear(disabled_ids) < 0)
            return -1;
        r = PyObject_CallNoArgs(PyTuple_GET_ITEM(t, FA_RESTART));
        Py_XDECREF(r);
        if (r == NULL)
            return -1;
    }
    return off < 0 ? -1 : 1;
}

/* The engine's _arm(code) where the template settles it: 1 (hooked, or the engine's lock was
 * busy: the next call asks again), 0 (ask the engine), -1 with an error set. */
static int
arm_fast(PyObject *code)
{
    PyObject *t = fast_arm;
    if (t == NULL)
        return 0;
    Py_INCREF(t);
    int r = -1, locked = 0;
    /* (the engine's lock read each time: a fork's child gets a new one, forklocks.py) */
    PyObject *lock = PyObject_GetAttr(PyTuple_GET_ITEM(t, FA_ENGINE), s_lock);
    PyObject *key = lock ? PyLong_FromVoidPtr(code) : NULL;
    PyObject *got = key ? PyObject_CallMethodOneArg(lock, s_acquire, Py_False) : NULL;
    if (got != NULL) {
        locked = got == Py_True;
        Py_DECREF(got);
        r = locked ? fast_hook(t, code, key) : 1;
        if (locked) {
            PyObject *exc = r < 0 ? PyErr_GetRaisedException() : NULL;
            PyObject *done = PyObject_CallMethodNoArgs(lock, s_release);
            if (done == NULL)
                r = -1;
            Py_XDECREF(done);
            if (exc != NULL) {
                if (PyErr_Occurred())
                    PyErr_Clear();
                PyErr_SetRaisedException(exc);
            }
        }
    }
    if (r > 0 && locked) { /* as _arm: what another thread found while this one held it */
        PyObject *late = PyObject_GetAttr(PyTuple_GET_ITEM(t, FA_ENGINE), s_late);
        int some = late == NULL ? -1 : PyObject_IsTrue(late);
        Py_XDECREF(late);
        PyObject *res = some > 0 ? rethooks_work(PyTuple_GET_ITEM(t, FA_LATE), NULL, 0) : NULL;
        if (some < 0 || (some > 0 && res == NULL))
            r = -1;
        Py_XDECREF(res);
    }
    Py_XDECREF(key);
    Py_XDECREF(lock);
    Py_DECREF(t);
    return r;
}

/* PY_START of a function the engine's users selected and left to hook at its first call
 * (set_discovery's unarmed, or any known function with arm_known): the engine's arm(code)
 * hooks it, then this call is dispatched as a hooked one. Not hooked (the engine busy in
 * another thread, or stopped): nothing now, the next call asks again (PY_START stays
 * enabled). arm() answering False (no user selects it): NULL with *declined set and no
 * error, for the caller to disable it as code nobody wants. */
static PyObject *
arm_and_start(PyObject *const *args, Py_ssize_t nargs, int *declined)
{
    PyObject *code = args[0], *pending = NULL;
    if (arm_hook == NULL)
        Py_RETURN_NONE;
    int fast = arm_fast(code);
    if (fast > 0)
        return lookup(code) != NULL ? on_start(NULL, args, nargs) : Py_NewRef(Py_None);
    PyObject *r = fast < 0 ? NULL : rethooks_work(arm_hook, code, 0);
    if (r == NULL) {
        if (PyErr_ExceptionMatches(PyExc_RecursionError)) {
            PyErr_Clear(); /* the program is at its recursion limit: the next call */
            Py_RETURN_NONE;
        }
        stash_error(&pending);
        return finish(pending);
    }
    int no = r == Py_False;
    Py_DECREF(r);
    if (no) {
        *declined = 1;
        return NULL;
    }
    if (lookup(code) != NULL)
        return on_start(NULL, args, nargs);
    Py_RETURN_NONE;
}

/* arm_and_start() for sight(): 1 with *res its answer (and key released) when that settled
 * the call; 0 when arm() declined it (no user selects it: sight() disables it). */
static int
armed_start(PyObject *const *args, Py_ssize_t nargs, PyObject *key, PyObject **res)
{
    int declined = 0;
    PyObject *r = arm_and_start(args, nargs, &declined);
    if (declined)
        return 0;
    Py_DECREF(key);
    *res = r;
    return 1;
}

/* Whether code is a function that arm_known hands to arm_hook (a known module or class
 * body is never hooked). */
static inline int
arms_known(PyObject *code)
{
    return arm_known && PyCode_Check(code) && (((PyCodeObject *)code)->co_flags & CO_NEWLOCALS);
}

/* PY_START of code that is not in the table (core.py's _sight, see "Discovery" there): unknown
 * code goes to the discovery hook (not while the thread is busy: then it is let through, but
 * rethook's own code is disabled at once) and, if that hooked it, this very call is
 * dispatched; code the engine left to hook at its first call goes to arm_and_start(); anything
 * else gets DISABLE. */
static RH_COLD PyObject *
sight(PyObject *const *args, Py_ssize_t nargs, int busy)
{
    if (discover_hook == NULL)
        Py_RETURN_NONE; /* discovery is off: only hooked code has PY_START */
    PyObject *code = args[0], *pending = NULL;
    PyObject *key = PyLong_FromVoidPtr(code);
    int known = key ? PyDict_Contains(known_ids, key) : -1;
    if (known == 0 && known_bodies != NULL && PyCode_Check(code) &&
        !(((PyCodeObject *)code)->co_flags & CO_NEWLOCALS))
        known = PyDict_Contains(known_bodies, key); /* a body walked: no call needed */
    if (known < 0)
        goto error;
    if (known && unarmed_ids != NULL) {
        int u = arms_known(code) ? 1 : PyDict_Contains(unarmed_ids, key);
        if (u < 0)
            goto error;
        if (u) { /* selected, hooked at its first call: now, or the program's next one */
            if (busy) {
                Py_DECREF(key);
                Py_RETURN_NONE;
            }
            PyObject *res;
            if (armed_start(args, nargs, key, &res))
                return res; /* (else nobody selects it: disabled below) */
        }
    }
    int own = known ? 0 : own_code();
    if (own < 0)
        goto error;
    if (own) {
        /* rethook's own code, never hooked: disabled below without the registry's work (its
         * runner's and drain's functions, ~65 us each to register and decline) */
    }
    else if (!known && busy) { /* a handler or rethook's own work: discovered when the
                                 * program runs it */
        Py_DECREF(key);
        Py_RETURN_NONE;
    }
    else if (!known) {
        PyObject *r = rethooks_work(discover_hook, code, 1); /* the registry's work */
        int seen = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        if (seen < 0 && PyErr_ExceptionMatches(PyExc_RecursionError)) {
            PyErr_Clear(); /* the program is at its recursion limit: look again next time */
            Py_DECREF(key);
            Py_RETURN_NONE;
        }
        if (seen < 0)
            goto error;
        if (lookup(code) != NULL) { /* a filter wants it: this very call is a hooked one */
            Py_DECREF(key);
            return on_start(NULL, args, nargs);
        }
        int u = unarmed_ids != NULL ? PyDict_Contains(unarmed_ids, key) : 0;
        if (u == 0 && unarmed_ids != NULL && arms_known(code))
            u = PyDict_Contains(known_ids, key);
        if (u < 0)
            goto error;
        if (u) { /* registered just now, to be hooked at its first call: this one */
            PyObject *res;
            if (armed_start(args, nargs, key, &res))
                return res; /* (else nobody selects it: disabled below) */
        }
        else if (!seen || discover_hook == NULL) { /* not registered now (look again next
                                                     * time), or the engine stopped */
            Py_DECREF(key);
            Py_RETURN_NONE;
        }
    }
    /* No Python code runs from here to the answer (an int into a set), so the engine, which
     * looks at _disabled right after publishing a table, cannot miss this DISABLE. A module
     * or class body is never hooked: not noted. */
    if (PyCode_Check(code) && (((PyCodeObject *)code)->co_flags & CO_NEWLOCALS) &&
        PySet_Add(disabled_ids, key) < 0)
        goto error;
    Py_DECREF(key);
    if (lookup(code) != NULL)
        Py_RETURN_NONE;
    return Py_NewRef(monitoring_disable);
error:
    Py_XDECREF(key);
    stash_error(&pending);
    return finish(pending);
}

/* PY_START(code, offset): rule 1 (entry), rule 4 (recursion), rule 5 (depth). The general
 * callback: every case, in the order the rules need (on_start below takes the commonest first). */
static RH_COLD PyObject *
on_start_general(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1)
        Py_RETURN_NONE;
    PyObject *code = args[0];
    PyObject *pending = NULL;
    PyThreadState *tstate = current_tstate();
    PyObject *ts = current_ts_in(tstate, 1);
    if (ts == NULL) {
        stash_error(&pending);
        return finish(pending);
    }
    if (ts_is_busy(ts)) {
        if (lookup(code) == NULL) /* discovery's global PY_START: not a missed call */
            return sight(args, nargs, 1);
        if (slot_incr(ts, ThreadState_t, ts_recursion, s_recursion) < 0 || missed(code, 0) < 0)
            stash_error(&pending);
        return finish(pending);
    }
    GIVE_WAY();
    if (__atomic_load_n(&full_at, __ATOMIC_RELAXED) != 0 && lookup(code) != NULL)
        wait_for_drain(); /* (hooked code only; before anything is read: the GIL goes) */
    if (!sweeping) {
        const Slot *fs = lookup(code);
        if (fs == NULL)
            return sight(args, nargs, 0); /* unknown code (discovery), or no longer hooked */
        if (fs->direct != NULL &&
            ((fs->flags & GENERATOR) ? gen_direct_start(tstate, ts, fs, code, &pending)
                                     : direct_start(tstate, ts, fs, code, &pending)))
            return finish(pending);
        if (fs->fdirect != NULL && fdirect_start(tstate, ts, fs, code, &pending))
            return finish(pending);
    }
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    PyObject *dispatch = NULL, *stack = NULL, *frame = NULL, *t = NULL, *depth_obj = NULL;
    PyObject *rec = NULL;
    int unseen = 0;
    if (sweeping && wait_sweep(ts) < 0) {
        stash_error(&pending);
        goto done;
    }
    const Slot *s = lookup(code);
    if (s == NULL) {
        unseen = 1; /* not hooked: seen for the first time (discovery), or no longer hooked */
        goto done;
    }
    dispatch = Py_NewRef(s->dispatch);
    PyObject *entry = slot_entry(s), *graph = s->graph, *marker = s->marker;
    long flags = s->flags;
    if ((stack = ts_get_stack(ts)) == NULL) {
        stash_error(&pending);
        goto done;
    }
    frame = (flags & WANT_FRAME) ? current_frame() : Py_NewRef(Py_None);
    if (PyTuple_GET_SIZE(entry) && call_entry_users(entry, code, frame, &pending)) {
        push(stack, marker, &pending); /* keep the exit matched, then let it through */
        goto done;
    }
    Py_ssize_t ngraph = PyTuple_GET_SIZE(graph);
    if (ngraph == 0) {
        push(stack, marker, &pending); /* draining: keep exits of this function matched */
        goto done;
    }
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    if (depth >= max_depth) { /* the shadow stack is full: count, keep the exit matched */
        if (slot_incr(ts, ThreadState_t, ts_overrun, s_overrun) < 0 || missed(code, 1) < 0)
            stash_error(&pending);
        push(stack, marker, &pending);
        goto done;
    }
    if (s->direct != NULL && (flags & GENERATOR)) {
        /* A generator's one user is written in C: a direct record (fgraph_direct.h). */
        gen_direct_enter(tstate, stack, code, frame, s->direct_entry, s->direct, s->prepared,
                         PyTuple_GET_ITEM(graph, 0), &pending);
        goto done;
    }
    if (s->direct != NULL) {
        /* Its one user is written in C: no record, no Python objects (fgraph_direct.h).
         * Pushed first as below; the hooks run no Python code, so nothing sees the stack
         * between the push and the answer. */
        long long tn = now_ns();
        PyObject *direct_entry = s->direct_entry; /* (s may go if prepare() runs) */
        const rh_direct *d = s->direct;
        if (PyList_Append(stack, direct_entry) < 0) {
            stash_error(&pending);
            push(stack, marker, &pending);
            goto done;
        }
        int r = d->entry(d->self, tstate, code, tn);
        if (r == RH_DIRECT_PREPARE) { /* the thread's first call of a version-3 user */
            r = prepared_answer(d->prepare(d->self, tstate) < 0
                                ? -1 : d->entry(d->self, tstate, code, now_ns()));
        }
        if (r <= 0) { /* declined (or failed: counted as its handler's error) */
            if (r < 0)
                handler_error(PyTuple_GET_ITEM(graph, 0), &pending);
            Py_ssize_t n = PyList_GET_SIZE(stack);
            if (n && PyList_GET_ITEM(stack, n - 1) == direct_entry &&
                PyList_SetItem(stack, n - 1, Py_NewRef(marker)) < 0)
                stash_error(&pending);
        }
        goto done;
    }
    t = (flags & WANT_TIME) ? PyLong_FromLongLong(now_ns()) : Py_NewRef(zero);
    depth_obj = PyLong_FromSsize_t(depth);
    /* Push first, then ask the users (the kernel's order): while entry handlers run, the call
     * is on the stack, so a sweep they cause (unregister, set_filter) sees it. Room for one
     * claim is allocated with the header, so the common case is one allocation. */
    rec = (t && depth_obj) ? rec_new() : NULL;
    if (rec == NULL) {
        stash_error(&pending);
        push(stack, marker, &pending);
        goto done;
    }
    {
        PyObject **it = ((PyListObject *)rec)->ob_item;
        it[REC_KEY] = Py_NewRef((flags & GENERATOR) ? frame : code);
        it[REC_CODE] = Py_NewRef(code);
        it[REC_FRAME] = Py_NewRef(frame);
        it[REC_TIME] = Py_NewRef(t);
        it[REC_SLEEP] = Py_NewRef(zero);
        it[REC_PARKED_AT] = Py_NewRef(zero);
        Py_SET_SIZE(rec, REC_HEADER);
    }
    if (push(stack, rec, &pending) < 0) {
        push(stack, marker, &pending);
        goto done;
    }
    PyObject *argv[5] = {NULL, code, frame, depth_obj, t};
    for (Py_ssize_t i = 0; i < ngraph; i++) {
        PyObject *reg = PyTuple_GET_ITEM(graph, i);
        PyObject *fn = reg_get(reg, Registration_t, rg_entryfunc, s_entryfunc);
        if (fn == NULL) {
            stash_error(&pending);
            continue;
        }
        PyObject *data = PyObject_Vectorcall(fn, argv + 1, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                             NULL);
        Py_DECREF(fn);
        if (data == NULL) {
            if (handler_error(reg, &pending))
                goto done; /* KeyboardInterrupt/SystemExit: the record stays, exit matched */
            continue;
        }
        if (accepted(data) && rec_add_claim(rec, reg, data) < 0)
            stash_error(&pending); /* (the data of that entry is lost) */
        Py_DECREF(data);
    }
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (PyList_GET_SIZE(rec) == REC_HEADER && n && PyList_GET_ITEM(stack, n - 1) == rec) {
        /* nobody wants the return */
        if (marker == NULL) {
            Py_DECREF(list_pop(stack));
        }
        else if (PyList_SetItem(stack, n - 1, Py_NewRef(marker)) < 0) {
            stash_error(&pending);
        }
    }
done:
    rec_release(rec);
    Py_XDECREF(depth_obj);
    Py_XDECREF(t);
    Py_XDECREF(frame);
    Py_XDECREF(stack);
    Py_XDECREF(dispatch);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    if (unseen && pending == NULL)
        return sight(args, nargs, 0);
    return finish(pending);
}

/* Common start of the exit-side callbacks: the thread's state and stack, or nothing to do. */
static inline PyObject *
exit_state(PyThreadState *tstate, PyObject **pending)
{
    PyObject *ts = current_ts_in(tstate, 0);
    if (ts == NULL) {
        if (PyErr_Occurred())
            stash_error(pending);
        return NULL; /* this thread never pushed anything */
    }
    PyObject *stack = SLOT(ts, ts_stack);
    if (stack == NULL || !(PyList_CheckExact(stack) || PyList_Check(stack)) ||
        PyList_GET_SIZE(stack) == 0)
        return NULL;
    if (ts_is_busy(ts))
        return NULL; /* (exits inside handlers belong to calls the handler made) */
    return ts;
}

/* PY_RETURN(code, offset, retval): rule 2. The general callback (as on_start_general). */
static RH_COLD PyObject *
on_return_general(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3)
        Py_RETURN_NONE;
    PyObject *code = args[0], *retval = args[2];
    PyObject *pending = NULL;
    PyThreadState *tstate = current_tstate();
    PyObject *ts = exit_state(tstate, &pending);
    if (ts == NULL)
        return finish(pending);
    GIVE_WAY();
    WAIT_FOR_DRAIN(); /* (an event of hooked code: its local events) */
    if (!sweeping && (direct_return(tstate, ts, code, NULL, &pending) ||
                      gen_direct_return(tstate, ts, NULL, &pending)))
        return finish(pending);
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    PyObject *stack = NULL, *rec = NULL, *frame = NULL;
    if (sweeping && wait_sweep(ts) < 0) {
        stash_error(&pending);
        goto done;
    }
    if ((stack = ts_get_stack(ts)) == NULL) {
        stash_error(&pending);
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (n == 0)
        goto done; /* (the engine stopped while this thread waited for its sweep) */
    if (rec_item(PyList_GET_ITEM(stack, n - 1), REC_KEY) == code) {
        rec = list_pop(stack);
    }
    else {
        frame = current_frame();
        rec = exit_by_frame(ts, stack, frame, &pending);
        if (rec == NULL) {
            if (PyErr_Occurred())
                stash_error(&pending);
            goto done;
        }
    }
    if (is_direct(rec)) {
        direct_exit(rec, NULL, 0, now_ns(), tstate, &pending);
        goto done;
    }
    if (IS_DREC(rec)) {
        drec_exit(rec, tstate, NULL, 0, now_ns(), &pending);
        goto done;
    }
    if (!(PyList_CheckExact(rec) || PyList_Check(rec)))
        goto done; /* a marker */
    Py_ssize_t len = PyList_GET_SIZE(rec);
    if (len == REC_HEADER + 2) { /* the common case: one claim, delivered in place */
        PyObject *reg = Py_NewRef(PyList_GET_ITEM(rec, REC_HEADER));
        PyObject *fn = reg_get(reg, Registration_t, rg_retfunc, s_retfunc);
        if (fn == NULL) {
            stash_error(&pending);
        }
        else if (fn != Py_None) {
            PyObject *t0 = Py_NewRef(PyList_GET_ITEM(rec, REC_TIME));
            PyObject *rframe = Py_NewRef(PyList_GET_ITEM(rec, REC_FRAME));
            PyObject *data = Py_NewRef(PyList_GET_ITEM(rec, REC_HEADER + 1));
            PyObject *sleep = Py_NewRef(PyList_GET_ITEM(rec, REC_SLEEP));
            int timed = t0 == zero ? 0 : PyObject_IsTrue(t0);
            PyObject *t1 = timed > 0 ? PyLong_FromLongLong(now_ns()) : Py_NewRef(zero);
            PyObject *depth_obj = PyLong_FromSsize_t(PyList_GET_SIZE(stack));
            if (timed < 0 || t1 == NULL || depth_obj == NULL) {
                stash_error(&pending);
            }
            else {
                PyObject *argv[11] = {NULL, code, rframe, depth_obj, data, retval, Py_None,
                                      t0, t1, sleep, zero};
                PyObject *res = PyObject_Vectorcall(fn, argv + 1,
                                                    10 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
                if (res == NULL)
                    handler_error(reg, &pending);
                Py_XDECREF(res);
            }
            Py_XDECREF(depth_obj);
            Py_XDECREF(t1);
            Py_DECREF(sleep);
            Py_DECREF(data);
            Py_DECREF(rframe);
            Py_DECREF(t0);
        }
        Py_XDECREF(fn);
        Py_DECREF(reg);
    }
    else if (len > REC_HEADER) { /* several claims: newest first, each exactly once */
        PyObject *t0 = PyList_GET_ITEM(rec, REC_TIME);
        int timed = t0 == zero ? 0 : PyObject_IsTrue(t0);
        PyObject *t = timed > 0 ? PyLong_FromLongLong(now_ns()) : Py_NewRef(zero);
        PyObject *depth_obj = PyLong_FromSsize_t(PyList_GET_SIZE(stack));
        if (timed < 0 || t == NULL || depth_obj == NULL ||
            deliver(ts, rec, depth_obj, retval, Py_None, t, 0, &pending) < 0)
            stash_error(&pending);
        Py_XDECREF(depth_obj);
        Py_XDECREF(t);
    }
done:
    Py_XDECREF(frame);
    rec_release(rec);
    Py_XDECREF(stack);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    return finish(pending);
}

/* ---- The fast lane: PY_START and PY_RETURN of a plain function whose one user is a prepared
 * direct user, the commonest events of a recording. These only read until they know the event
 * is that case on an idle thread with nothing else going on (no drain round open, no ring
 * reported full, no sweep); anything else goes to the general callbacks, from the top. Kept in
 * small functions of their own so that the compiler keeps their few values in registers
 * instead of saving the general callbacks' (sqlglot: ~15 instructions an event). */

/* Nothing out of the ordinary for a callback to attend to first. */
static inline int
quiet(void)
{
    return __atomic_load_n(&round_until, __ATOMIC_RELAXED) == 0 &&
           __atomic_load_n(&full_at, __ATOMIC_RELAXED) == 0 && !sweeping;
}

/* The calling thread's ThreadState (borrowed) if the cache has it and the thread is not busy;
 * else NULL (the general callbacks find out why). */
static inline PyObject *
idle_ts(PyThreadState *tstate) /* (tstate: rh_tstate_fast()'s, used only if the cache has it) */
{
    PyObject *ts = tstate != NULL ? ts_cached(tstate) : NULL;
    if (ts == NULL)
        return NULL;
    PyObject *busy = SLOT(ts, ts_busy);
    return busy == Py_False || busy == NULL ? ts : NULL;
}

/* PY_START(code, offset): the fast lane, then on_start_general. */
static PyObject *
on_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs >= 1 && quiet()) {
        PyThreadState *tstate = rh_tstate_fast();
        PyObject *ts = idle_ts(tstate);
        const Slot *s = ts != NULL ? lookup(args[0]) : NULL;
        if (s != NULL && s->prepared && !(s->flags & GENERATOR)) { /* (prepared: direct) */
            PyObject *stack = direct_room(ts);
            PyObject *pending = NULL;
            if (stack != NULL && direct_start_prepared(tstate, ts, s, args[0], stack,
                                                       PyList_GET_SIZE(stack), &pending))
                return finish(pending);
        }
        else if (s != NULL && s->fdirect != NULL) {
            PyObject *pending = NULL;
            if (fdirect_start(tstate, ts, s, args[0], &pending))
                return finish(pending);
        }
    }
    return on_start_general(module, args, nargs);
}

/* PY_RETURN(code, offset, retval): the fast lane, then on_return_general. */
static PyObject *
on_return(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs >= 3 && quiet()) {
        PyThreadState *tstate = rh_tstate_fast();
        PyObject *ts = idle_ts(tstate);
        PyObject *pending = NULL;
        if (ts != NULL && direct_return(tstate, ts, args[0], NULL, &pending))
            return finish(pending);
    }
    return on_return_general(module, args, nargs);
}

/* PY_UNWIND(code, offset, exc): a global event, for every frame an exception leaves. */
static PyObject *
on_unwind(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3)
        Py_RETURN_NONE;
    PyObject *code = args[0], *exc = args[2];
    PyObject *pending = NULL;
    PyThreadState *tstate = current_tstate();
    PyObject *ts = exit_state(tstate, &pending);
    if (ts == NULL)
        return finish(pending);
    GIVE_WAY();
    PyObject *stack = SLOT(ts, ts_stack);
    if (rec_item(PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1), REC_KEY) != code &&
        lookup(code) == NULL)
        Py_RETURN_NONE; /* not hooked (draining code stays in the table) */
    WAIT_FOR_DRAIN();
    if (!sweeping && gen_direct_return(tstate, ts, exc, &pending))
        return finish(pending);
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    PyObject *rec = NULL, *frame = NULL;
    stack = NULL;
    if (sweeping && wait_sweep(ts) < 0) {
        stash_error(&pending);
        goto done;
    }
    if ((stack = ts_get_stack(ts)) == NULL) {
        stash_error(&pending);
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (n == 0)
        goto done;
    if (rec_item(PyList_GET_ITEM(stack, n - 1), REC_KEY) == code) {
        rec = list_pop(stack);
    }
    else {
        frame = current_frame();
        rec = exit_by_frame(ts, stack, frame, &pending);
        if (rec == NULL) {
            if (PyErr_Occurred())
                stash_error(&pending);
            goto done;
        }
    }
    if (is_direct(rec)) {
        direct_exit(rec, exc, 0, now_ns(), tstate, &pending);
    }
    else if (IS_DREC(rec)) {
        drec_exit(rec, tstate, exc, 0, now_ns(), &pending);
    }
    else if (PyList_Check(rec) && PyList_GET_SIZE(rec) > REC_HEADER) { /* not a marker */
        int timed = PyList_GET_ITEM(rec, REC_TIME) == zero
                        ? 0 : PyObject_IsTrue(PyList_GET_ITEM(rec, REC_TIME));
        PyObject *t = timed > 0 ? PyLong_FromLongLong(now_ns()) : Py_NewRef(zero);
        PyObject *depth_obj = PyLong_FromSsize_t(PyList_GET_SIZE(stack));
        if (timed < 0 || t == NULL || depth_obj == NULL ||
            deliver(ts, rec, depth_obj, Py_None, exc, t, 0, &pending) < 0)
            stash_error(&pending);
        Py_XDECREF(depth_obj);
        Py_XDECREF(t);
    }
done:
    Py_XDECREF(frame);
    rec_release(rec);
    Py_XDECREF(stack);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    return finish(pending);
}

/* PY_YIELD(code, offset, value): rule 3, the record moves to the parked table. The general
 * callback (as on_start_general). */
static RH_COLD PyObject *
on_yield_general(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    if (nargs < 1)
        Py_RETURN_NONE;
    PyObject *pending = NULL;
    PyThreadState *tstate = current_tstate();
    PyObject *ts = exit_state(tstate, &pending);
    if (ts == NULL)
        return finish(pending);
    GIVE_WAY();
    WAIT_FOR_DRAIN(); /* (an event of hooked code: its local events) */
    if (!sweeping && gen_direct_yield(tstate, ts, &pending))
        return finish(pending);
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    PyObject *stack = NULL, *rec = NULL, *frame = NULL, *t = NULL;
    if (sweeping && wait_sweep(ts) < 0) {
        stash_error(&pending);
        goto done;
    }
    if ((stack = ts_get_stack(ts)) == NULL) {
        stash_error(&pending);
        goto done;
    }
    /* A frame with no frame object yet is no record's (records hold theirs): nothing to do,
     * and none is made (a generator entered before its events were on, say). */
    if ((frame = frame_peek(tstate)) == NULL)
        goto done;
    Py_INCREF(frame);
    rec = exit_by_frame(ts, stack, frame, &pending);
    if (rec == NULL) {
        if (PyErr_Occurred())
            stash_error(&pending);
        goto done;
    }
    if (IS_DREC(rec)) {
        drec_park(rec, frame, tstate, now_ns(), &pending);
        goto done;
    }
    if (!PyList_Check(rec) || PyList_GET_SIZE(rec) < REC_HEADER) {
        PyErr_SetString(PyExc_TypeError, "rethook: a suspended call's entry is not a record");
        stash_error(&pending);
        goto done;
    }
    t = PyLong_FromLongLong(now_ns());
    if (t == NULL) {
        stash_error(&pending);
        goto done;
    }
    Py_SETREF(((PyListObject *)rec)->ob_item[REC_PARKED_AT], Py_NewRef(t));
    if (park(frame, rec, &pending) < 0)
        goto done;
    notify(rec, PyList_GET_SIZE(stack), t, 0, &pending);
    park_overflow(&pending);
done:
    Py_XDECREF(t);
    Py_XDECREF(frame);
    rec_release(rec);
    Py_XDECREF(stack);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    return finish(pending);
}

/* PY_RESUME(code, offset) and PY_THROW(code, offset, exc): the parked record comes back onto
 * the resuming thread's stack (possibly another thread) with its suspended time added. The
 * general callback (as on_start_general). */
static RH_COLD PyObject *
on_resume_general(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (parked->used == 0)
        Py_RETURN_NONE;
    PyObject *pending = NULL;
    PyThreadState *tstate = current_tstate();
    PyObject *ts = current_ts_in(tstate, 1);
    if (ts == NULL) {
        stash_error(&pending);
        return finish(pending);
    }
    if (ts_is_busy(ts))
        Py_RETURN_NONE;
    GIVE_WAY(); /* (no WAIT_FOR_DRAIN: PY_THROW reaches any frame, rethook's own too) */
    /* A frame with no frame object is no parked record's key (a record holds its frame, which
     * stays its interpreter frame's own): nothing to unpark, and no frame object is made (a
     * PY_THROW into any frame). */
    PyObject *frame = frame_peek(tstate);
    if (frame == NULL)
        Py_RETURN_NONE;
    if (!sweeping && gen_direct_resume(tstate, ts, frame, &pending))
        return finish(pending);
    Py_INCREF(frame);
    Py_INCREF(ts);
    SET_BUSY(ts, 1);
    PyObject *stack = NULL, *rec = NULL, *t = NULL;
    if (sweeping && wait_sweep(ts) < 0) {
        stash_error(&pending);
        goto done;
    }
    if ((stack = ts_get_stack(ts)) == NULL) {
        stash_error(&pending);
        goto done;
    }
    PyObject *key = NULL;
    rec = park_take(parked, frame, &key);
    if (rec == NULL)
        goto done; /* not parked */
    Py_DECREF(key); /* (frame holds another reference) */
    if (IS_DREC(rec)) {
        DRecord *r = (DRecord *)rec;
        int64_t tn = now_ns();
        r->sleep += tn - r->parked_at;
        drec_notify(rec, tstate, tn, 1, DREC_ASK, &pending);
        push(stack, rec, &pending); /* (after the hook, even one that failed: rule 6) */
        goto done;
    }
    if (!PyList_Check(rec) || PyList_GET_SIZE(rec) < REC_HEADER) {
        PyErr_SetString(PyExc_TypeError, "rethook: a parked entry is not a record");
        stash_error(&pending);
        goto done;
    }
    long long tn = now_ns();
    long long slept = PyLong_AsLongLong(PyList_GET_ITEM(rec, REC_SLEEP));
    long long at = slept == -1 && PyErr_Occurred()
                       ? -1 : PyLong_AsLongLong(PyList_GET_ITEM(rec, REC_PARKED_AT));
    PyObject *sleep = PyErr_Occurred() ? NULL : PyLong_FromLongLong(slept + (tn - at));
    t = PyLong_FromLongLong(tn);
    if (sleep == NULL || t == NULL) {
        Py_XDECREF(sleep);
        stash_error(&pending);
        goto done;
    }
    Py_SETREF(((PyListObject *)rec)->ob_item[REC_SLEEP], sleep);
    notify(rec, PyList_GET_SIZE(stack), t, 1, &pending);
    push(stack, rec, &pending); /* (after the handlers, even one that raised: rule 6) */
done:
    Py_XDECREF(t);
    Py_XDECREF(frame);
    rec_release(rec);
    Py_XDECREF(stack);
    SET_BUSY(ts, 0);
    Py_DECREF(ts);
    return finish(pending);
}

/* PY_YIELD: the fast lane (a prepared user's direct record on top of an idle thread's stack,
 * as on_start's), then on_yield_general. */
static PyObject *
on_yield(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs >= 1 && quiet()) {
        PyThreadState *tstate = rh_tstate_fast();
        PyObject *ts = idle_ts(tstate);
        PyObject *pending = NULL;
        if (ts != NULL && gen_direct_yield(tstate, ts, &pending))
            return finish(pending);
    }
    return on_yield_general(module, args, nargs);
}

/* PY_RESUME / PY_THROW: nothing when nothing is parked; the fast lane (a prepared user's
 * parked direct record, an idle thread), then on_resume_general. */
static PyObject *
on_resume(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (parked->used == 0)
        Py_RETURN_NONE;
    if (quiet()) {
        PyThreadState *tstate = rh_tstate_fast();
        PyObject *ts = idle_ts(tstate);
        PyObject *frame = ts != NULL ? frame_peek(tstate) : NULL;
        PyObject *pending = NULL;
        if (frame != NULL && gen_direct_resume(tstate, ts, frame, &pending))
            return finish(pending);
    }
    return on_resume_general(module, args, nargs);
}

/* ---------------------------------------------------------------------------------------- */
/* What CCore (rethook.engine.select) drives.                                               */

/* Read one entry of the engine's dict into *out (dispatch borrowed); -1 with an error set. */
static int
parse_entry(PyObject *key, PyObject *value, Slot *out)
{
    void *addr = PyLong_AsVoidPtr(key);
    if (addr == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "publish(): a key is 0");
        return -1;
    }
    if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) < 4 || PyTuple_GET_SIZE(value) > 5 ||
        !PyTuple_Check(PyTuple_GET_ITEM(value, 0)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(value, 1)) ||
        !PyLong_Check(PyTuple_GET_ITEM(value, 2)) ||
        (PyTuple_GET_ITEM(value, 3) != Py_None && !PyTuple_Check(PyTuple_GET_ITEM(value, 3)))) {
        PyErr_SetString(PyExc_TypeError, "publish(): a dispatch entry is not "
                        "(entry_regs tuple, graph_regs tuple, flags int, marker[, direct])");
        return -1;
    }
    long flags = PyLong_AsLong(PyTuple_GET_ITEM(value, 2));
    if (flags == -1 && PyErr_Occurred())
        return -1;
    PyObject *direct_entry = PyTuple_GET_SIZE(value) == 5 ? PyTuple_GET_ITEM(value, 4) : Py_None;
    const rh_direct *direct = NULL;
    const rh_fdirect *fdirect = NULL;
    if (direct_entry != Py_None && is_direct(direct_entry) &&
        PyCapsule_IsValid(PyTuple_GET_ITEM(direct_entry, 2), RH_FDIRECT_CAPSULE)) {
        /* one entry user, nothing else: its direct hook (fgraph_direct.h) */
        if (PyTuple_GET_SIZE(PyTuple_GET_ITEM(value, 0)) != 1 ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(value, 1)) ||
            PyTuple_GET_ITEM(value, 3) != Py_None) {
            PyErr_SetString(PyExc_TypeError, "publish(): an entry user's direct entry is "
                            "(code, reg, capsule), for one entry user and no marker");
            return -1;
        }
        fdirect = PyCapsule_GetPointer(PyTuple_GET_ITEM(direct_entry, 2), RH_FDIRECT_CAPSULE);
        if (fdirect == NULL)
            return -1;
    }
    else if (direct_entry != Py_None) {
        /* one graph user, no entry user; a plain function's with its marker, a generator's
         * (matched by frame) with none */
        int gen = (flags & GENERATOR) != 0;
        if (!is_direct(direct_entry) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(value, 0)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(value, 1)) != 1 ||
            (PyTuple_GET_ITEM(value, 3) == Py_None) != gen) {
            PyErr_SetString(PyExc_TypeError, "publish(): a direct entry is "
                            "(code, reg, capsule), for one graph user and a marker "
                            "(none for a generator)");
            return -1;
        }
        PyObject *capsule = PyTuple_GET_ITEM(direct_entry, 2);
        direct = PyCapsule_GetPointer(capsule, RH_DIRECT_CAPSULE);
        if (direct == NULL)
            return -1;
        if (gen && !rh_direct_has_gen(direct, rh_direct_size(capsule)))
            direct = NULL; /* a user without generator hooks: ordinary records */
    }
    out->key = addr;
    out->dispatch = value;
    out->fdirect = fdirect;
    out->graph = PyTuple_GET_ITEM(value, 1);
    out->marker = PyTuple_GET_ITEM(value, 3) == Py_None ? NULL : PyTuple_GET_ITEM(value, 3);
    out->direct_entry = direct ? direct_entry : NULL;
    out->direct = direct;
    out->flags = (int)flags;
    out->prepared = direct != NULL && rh_direct_has_prepare(
                        direct, rh_direct_size(PyTuple_GET_ITEM(direct_entry, 2)));
    return 0;
}

/* The slot of `addr` in tb: its own, or the empty one where it goes. */
static Slot *
probe(Table *tb, const void *addr)
{
    size_t i = rh_hash_ptr(addr) & tb->mask;
    while (tb->slots[i].key != NULL && tb->slots[i].key != addr)
        i = (i + 1) & tb->mask;
    return &tb->slots[i];
}

/* Store a parsed entry (taking a reference to its dispatch). */
static void
slot_store_entry(Table *tb, const Slot *e)
{
    Slot *s = probe(tb, e->key);
    if (s->key == NULL)
        tb->used++;
    PyObject *old = s->dispatch;
    *s = *e;
    Py_INCREF(s->dispatch);
    Py_XDECREF(old);
}

/* publish(dict, added=None) where dict is the published dict grown in place by `added` (code
 * the table does not hold): store just those in the live table, if it has room. Every reader
 * runs under the GIL and no slot a reader may hold moves or changes, so adding in place is as
 * atomic as the swap. Returns 1 when done, 0 when the whole table must be rebuilt, -1 on
 * error (nothing changed). */
static int
publish_added(PyObject *added)
{
    Table *tb = table;
    Py_ssize_t n = PyDict_GET_SIZE(added);
    if (tb == &empty_table || (size_t)(tb->used + n) * 2 > tb->mask + 1)
        return 0;
    Slot *parsed = PyMem_Calloc(n ? n : 1, sizeof(Slot));
    if (parsed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    int r = 1;
    while (PyDict_Next(added, &pos, &key, &value)) { /* all or nothing: check every one */
        if (parse_entry(key, value, &parsed[i]) < 0) {
            r = -1;
            break;
        }
        if (probe(tb, parsed[i].key)->key != NULL) {
            r = 0; /* not new: rebuild */
            break;
        }
        i++;
    }
    if (r == 1)
        for (Py_ssize_t j = 0; j < n; j++)
            slot_store_entry(tb, &parsed[j]);
    PyMem_Free(parsed);
    return r;
}

static int publish_dict(PyObject *dict);

/* publish(dict, {key: dispatch}) of one entry the published dict just took. */
static int
publish_one(PyObject *key, PyObject *dispatch)
{
    PyObject *added = PyDict_New();
    int r = added == NULL || PyDict_SetItem(added, key, dispatch) < 0 ? -1 : publish_added(added);
    Py_XDECREF(added);
    return r != 0 ? (r < 0 ? -1 : 0) : publish_dict(table->dict);
}

static PyObject *
publish(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *dict = nargs > 0 ? args[0] : NULL;
    PyObject *added = nargs > 1 ? args[1] : Py_None;
    if (nargs > 2 || dict == NULL || !PyDict_Check(dict) ||
        (added != Py_None && !PyDict_Check(added))) {
        PyErr_SetString(PyExc_TypeError,
                        "publish() needs a dict {id(code): dispatch} (and the dict it added)");
        return NULL;
    }
    if (added != Py_None && dict == table->dict) {
        int r = publish_added(added);
        if (r != 0)
            return r < 0 ? NULL : Py_NewRef(Py_None);
    }
    return publish_dict(dict) < 0 ? NULL : Py_NewRef(Py_None);
}

/* The table rebuilt from the engine's whole dict (publish()'s general case); -1 with an error
 * set (nothing changed). */
static int
publish_dict(PyObject *dict)
{
    Py_ssize_t n = PyDict_GET_SIZE(dict);
    Table *tb = &empty_table;
    if (n > 0) {
        size_t cap = 8;
        while (cap < (size_t)n * 3) /* room to grow in place by half as much again */
            cap <<= 1;
        size_t size = sizeof(Table) + cap * sizeof(Slot);
        tb = aligned_alloc(SLOT_ALIGN, (size + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN);
        if (tb == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(tb, 0, size);
        tb->mask = cap - 1;
        tb->dict = Py_NewRef(dict);
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        Slot e;
        while (PyDict_Next(dict, &pos, &key, &value)) {
            if (parse_entry(key, value, &e) < 0)
                goto fail;
            slot_store_entry(tb, &e);
        }
    }
    /* One pointer store under the GIL: every thread sees the old table or the new one. A
     * callback that read the old one holds its dispatch tuple, so the old table can go now. */
    Table *old = table;
    table = tb;
    table_free(old);
    return 0;
fail:
    table_free(tb);
    return -1;
}

/* finished_frames(frames): those of the frames (parked generators' and coroutines') whose
 * generator has finished (what makes its gi_frame None: the frame state of the generator that
 * holds the frame's data, _PyFrame_GetGenerator()) or gone (the frame object owns its data:
 * take_ownership(), pycore_frame.h). None where the internal frame cannot be read. What
 * collect_parked asked gc.get_referrers() on 3.13, where a closed generator can still hold its
 * frame: a walk of the whole heap (~6 ms at sqlglot's end). */
static PyObject *
finished_frames(PyObject *Py_UNUSED(module), PyObject *frames)
{
#if RH_HAVE_IFRAME
    PyObject *seq = PySequence_Fast(frames, "finished_frames() needs a sequence of frames");
    if (seq == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *f = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyFrame_Check(f)) {
            PyErr_Format(PyExc_TypeError, "finished_frames(): a %.100s is not a frame",
                         Py_TYPE(f)->tp_name);
            Py_CLEAR(out);
        }
        else {
            _PyInterpreterFrame *data = ((PyFrameObject *)f)->f_frame;
            int done = data->owner != FRAME_OWNED_BY_GENERATOR ||
                       FRAME_STATE_FINISHED(_PyFrame_GetGenerator(data)->gi_frame_state);
            if (done && PyList_Append(out, f) < 0)
                Py_CLEAR(out);
        }
    }
    Py_DECREF(seq);
    return out;
#else
    (void)frames;
    Py_RETURN_NONE;
#endif
}

/* close_parked(frames, counts): engine.collect_parked's deliveries, core.close_parked's twin.
 * Each frame still parked (a generator or coroutine closed or collected silently) has its
 * record taken out of the table and its claims delivered as deliver() does, with FLAG_CLOSED,
 * a new GeneratorExit and the time of its last suspension: a direct record's to its user's
 * gen_exit hook, so none of it runs Python code unless a user's handler does. counts is a
 * list [records closed, claims whose user still had a return handler], added to as the walk
 * goes, so it stands when a handler's BaseException (not an Exception) ends the walk after
 * that record's deliveries (the rest stay parked) and is raised. The caller marks the thread
 * busy. At sqlglot's end (~850 parked generators) the Python loop took ~5-7 ms. */
static int
add_count(PyObject *counts, Py_ssize_t i, Py_ssize_t n)
{
    PyObject *old = PyList_GET_ITEM(counts, i);
    PyObject *sum = PyLong_FromSsize_t(n);
    PyObject *total = sum == NULL ? NULL : PyNumber_Add(old, sum);
    Py_XDECREF(sum);
    if (total == NULL)
        return -1;
    PyList_SET_ITEM(counts, i, total);
    Py_DECREF(old);
    return 0;
}

static PyObject *
close_parked(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[1]) || PyList_GET_SIZE(args[1]) != 2) {
        PyErr_SetString(PyExc_TypeError, "close_parked(frames, counts): counts a list of 2");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "close_parked() needs a sequence of frames");
    if (seq == NULL)
        return NULL;
    PyObject *counts = args[1];
    PyObject *ts = current_ts_in(current_tstate(), 1);
    if (ts == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_INCREF(ts);
    Py_INCREF(counts);
    PyObject *pending = NULL, *zero_depth = PyLong_FromLong(0);
    for (Py_ssize_t i = 0; zero_depth != NULL && pending == NULL && !PyErr_Occurred() &&
                           i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *key = NULL;
        PyObject *rec = park_take(parked, PySequence_Fast_GET_ITEM(seq, i), &key);
        if (rec == NULL)
            continue;
        Py_DECREF(key); /* (the record holds the frame too) */
        if (!PyList_Check(rec) || PyList_GET_SIZE(rec) <= REC_HEADER) {
            rec_release(rec); /* a record whose claims were all swept */
            continue;
        }
        /* count the returns really delivered: not claims of users that discarded their entry
         * (unregistered from inside it: their retfunc is gone) */
        Py_ssize_t handled = 0;
        for (Py_ssize_t k = REC_HEADER; k + 1 < PyList_GET_SIZE(rec); k += 2) {
            PyObject *fn = reg_get(PyList_GET_ITEM(rec, k), Registration_t, rg_retfunc,
                                   s_retfunc);
            if (fn == NULL)
                stash_error(&pending);
            else if (fn != Py_None)
                handled++;
            Py_XDECREF(fn);
        }
        if (add_count(counts, 0, 1) < 0 || add_count(counts, 1, handled) < 0) {
            rec_release(rec);
            break;
        }
        PyObject *exc = PyObject_CallNoArgs(PyExc_GeneratorExit);
        PyObject *t = exc == NULL ? NULL
                      : IS_DREC(rec) ? PyLong_FromLongLong(((DRecord *)rec)->parked_at)
                                     : Py_NewRef(PyList_GET_ITEM(rec, REC_PARKED_AT));
        if (t == NULL || deliver(ts, rec, zero_depth, Py_None, exc, t, FLAG_CLOSED,
                                 &pending) < 0)
            stash_error(&pending);
        Py_XDECREF(t);
        Py_XDECREF(exc);
        rec_release(rec);
    }
    Py_XDECREF(zero_depth);
    Py_DECREF(counts);
    Py_DECREF(ts);
    Py_DECREF(seq);
    if (pending != NULL)
        PyErr_SetRaisedException(pending);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
parked_py(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    return Py_NewRef((PyObject *)parked);
}

static PyObject *
get_table(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    return table->dict ? Py_NewRef(table->dict) : PyDict_New();
}

static PyObject *
lookup_py(PyObject *Py_UNUSED(module), PyObject *code)
{
    const Slot *s = lookup(code);
    return Py_NewRef(s ? s->dispatch : Py_None);
}

static PyObject *
set_max_depth(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_ssize_t d = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    max_depth = d;
    Py_RETURN_NONE;
}

static PyObject *
get_max_depth(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    return PyLong_FromSsize_t(max_depth);
}

static PyObject *
set_sweeping(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    sweeping = on;
    Py_RETURN_NONE;
}

static PyObject *
fast_tstate(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
#if RH_FAST_TSTATE
    return PyBool_FromLong(rh_tstate_offset != 0);
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *
get_sweeping(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    return PyBool_FromLong(sweeping);
}

static PyObject *
set_overflow(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_overflow(hook, limit)");
        return NULL;
    }
    Py_ssize_t limit = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *hook = args[0] == Py_None ? NULL : Py_NewRef(args[0]);
    Py_XSETREF(overflow_hook, hook);
    park_limit = limit;
    Py_RETURN_NONE;
}

static PyObject *
set_discovery(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *bodies = nargs >= 3 ? args[2] : Py_None;
    PyObject *unarmed = nargs >= 4 ? args[3] : Py_None, *arm = nargs == 5 ? args[4] : Py_None;
    if (nargs < 2 || nargs > 5 || (args[0] != Py_None && !PyDict_Check(args[1])) ||
        (args[0] != Py_None && bodies != Py_None && !PyDict_Check(bodies)) ||
        (args[0] != Py_None && unarmed != Py_None &&
         (!PyDict_Check(unarmed) || !PyCallable_Check(arm)))) {
        PyErr_SetString(PyExc_TypeError,
                        "set_discovery(hook, known: dict[, bodies: dict[, unarmed: dict, "
                        "arm]]) or (None, None)");
        return NULL;
    }
    arm_known = 0; /* (until set_arm_known) */
    Py_CLEAR(fast_arm); /* (until set_fast_arm) */
    if (args[0] == Py_None) {
        Py_CLEAR(discover_hook);
        Py_CLEAR(unarmed_ids);
        Py_CLEAR(arm_hook);
        Py_CLEAR(known_ids);
        Py_CLEAR(known_bodies);
    }
    else { /* the dicts first: sight() reads the hook, then them */
        Py_XSETREF(known_ids, Py_NewRef(args[1]));
        Py_XSETREF(known_bodies, bodies == Py_None ? NULL : Py_NewRef(bodies));
        Py_XSETREF(arm_hook, unarmed == Py_None ? NULL : Py_NewRef(arm));
        Py_XSETREF(unarmed_ids, unarmed == Py_None ? NULL : Py_NewRef(unarmed));
        Py_XSETREF(discover_hook, Py_NewRef(args[0]));
    }
    Py_RETURN_NONE;
}

static PyObject *
set_arm_known(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    arm_known = on && arm_hook != NULL;
    Py_RETURN_NONE;
}

static PyObject *
set_fast_arm(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (arg != Py_None &&
        (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != FA_ITEMS ||
         !PyDict_CheckExact(PyTuple_GET_ITEM(arg, FA_EVENTS)) ||
         !PyTuple_Check(PyTuple_GET_ITEM(arg, FA_ENTRY)) ||
         !PyTuple_Check(PyTuple_GET_ITEM(arg, FA_GRAPH)) ||
         !PyLong_Check(PyTuple_GET_ITEM(arg, FA_FLAGS)) ||
         !PyLong_Check(PyTuple_GET_ITEM(arg, FA_MASK)))) {
        PyErr_SetString(PyExc_TypeError,
                        "set_fast_arm((events, entry, graph, flags, mask, capsule, "
                        "set_local_events, tool_id, restart_events, hook_late, engine)) or None");
        return NULL;
    }
    Py_XSETREF(fast_arm, arg == Py_None ? NULL : Py_NewRef(arg));
    Py_RETURN_NONE;
}

static PyObject *
now_py(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    return PyLong_FromLongLong(now_ns());
}

/* compile(source, filename, "exec", dont_inherit=True) without compile()'s first step: its
 * check whether source is an AST object, which on its first call in a process makes the ast
 * module's node types (~120 classes, ~11 M instructions, ~3 ms of every recording's
 * start-up). The same flags as compile()'s: the source is UTF-8 unless bytes with a PEP 263
 * cookie say otherwise, no __future__ flag of the caller's, the interpreter's -O level. */
PyDoc_STRVAR(compile_source_doc,
"compile_source(source, filename) -> code\n\
\n\
compile(source, filename, 'exec', dont_inherit=True) for source a str or bytes, without\n\
compile()'s check whether source is an AST (which makes the ast module's node types\n\
the first time, ~3 ms). For the command line, which compiles the program it runs.");

static PyObject *
compile_source(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "compile_source() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *source = args[0], *filename = args[1];
    if (!PyUnicode_Check(filename)) {
        PyErr_Format(PyExc_TypeError, "compile_source() filename must be str, not %.100s",
                     Py_TYPE(filename)->tp_name);
        return NULL;
    }
    PyCompilerFlags cf = {.cf_flags = PyCF_SOURCE_IS_UTF8,
                          .cf_feature_version = PY_MINOR_VERSION};
    const char *str;
    Py_ssize_t size;
    if (PyUnicode_Check(source)) {
        cf.cf_flags |= PyCF_IGNORE_COOKIE; /* (as compile(): a str is decoded already) */
        str = PyUnicode_AsUTF8AndSize(source, &size);
        if (str == NULL)
            return NULL;
    }
    else if (PyBytes_Check(source)) {
        str = PyBytes_AS_STRING(source);
        size = PyBytes_GET_SIZE(source);
    }
    else {
        PyErr_Format(PyExc_TypeError, "compile_source() source must be str or bytes, not "
                     "%.100s", Py_TYPE(source)->tp_name);
        return NULL;
    }
    if (strlen(str) != (size_t)size) {
        PyErr_SetString(PyExc_SyntaxError, "source code string cannot contain null bytes");
        return NULL;
    }
    return Py_CompileStringObject(str, filename, Py_file_input, &cf, -1);
}

/* ---- The callbacks as sys.monitoring calls them ------------------------------------------
 *
 * Each callback is a Hook, an object CPython calls through its own vectorcall slot, straight
 * into the callback. As a builtin function each event would also pay the builtin's wrapper
 * (~30 instructions: the thread state read from thread-local storage, a recursion check, a
 * keyword check): the callbacks need none of it, since their fast lanes run no Python code
 * and what they call on the general paths checks recursion itself. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    const char *name;
} Hook;

static PyObject *
hook_repr(Hook *self)
{
    return PyUnicode_FromFormat("<rethook C core callback %s>", self->name);
}

static PyTypeObject Hook_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rethook.engine._ccore.Hook",
    .tp_basicsize = sizeof(Hook),
    .tp_dealloc = (destructor)PyObject_Free,
    .tp_repr = (reprfunc)hook_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A sys.monitoring callback of the C core, called (code, offset[, arg]).",
};

/* The vectorcall function of callback cb: positional arguments only. */
#define HOOK_VECTORCALL(cb)                                                                   \
    static PyObject *cb##_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,    \
                                     PyObject *kwnames)                                       \
    {                                                                                         \
        if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {                               \
            PyErr_Format(PyExc_TypeError, "%s takes no keyword arguments",                    \
                         ((Hook *)self)->name);                                               \
            return NULL;                                                                      \
        }                                                                                     \
        return cb(NULL, args, PyVectorcall_NARGS(nargsf));                                    \
    }
HOOK_VECTORCALL(on_start)
HOOK_VECTORCALL(on_return)
HOOK_VECTORCALL(on_unwind)
HOOK_VECTORCALL(on_yield)
HOOK_VECTORCALL(on_resume)

static const struct {
    const char *name;
    vectorcallfunc vectorcall;
} hooks[] = {
    {"on_start", on_start_vectorcall},   /* PY_START (code, offset) */
    {"on_return", on_return_vectorcall}, /* PY_RETURN (code, offset, retval) */
    {"on_unwind", on_unwind_vectorcall}, /* PY_UNWIND (code, offset, exc) */
    {"on_yield", on_yield_vectorcall},   /* PY_YIELD (code, offset, value) */
    {"on_resume", on_resume_vectorcall}, /* PY_RESUME (code, offset), PY_THROW (..., exc) */
};

/* Add the callbacks to module m: 0, or -1 with an error set. */
static int
add_hooks(PyObject *m)
{
    if (PyType_Ready(&Hook_Type) < 0)
        return -1;
    for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++) {
        Hook *h = PyObject_New(Hook, &Hook_Type);
        if (h == NULL)
            return -1;
        h->vectorcall = hooks[i].vectorcall;
        h->name = hooks[i].name;
        int r = PyModule_AddObjectRef(m, hooks[i].name, (PyObject *)h);
        Py_DECREF(h);
        if (r < 0)
            return -1;
    }
    return 0;
}

/* Native no-op handlers: measure the core's own cost (bench), or stand in for a user's. */
static PyObject *
accept_all(PyObject *Py_UNUSED(module), PyObject *const *Py_UNUSED(args),
           Py_ssize_t Py_UNUSED(nargs))
{
    Py_RETURN_TRUE;
}

static PyObject *
ignore(PyObject *Py_UNUSED(module), PyObject *const *Py_UNUSED(args),
       Py_ssize_t Py_UNUSED(nargs))
{
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"drain_wait", (PyCFunction)(void (*)(void))drain_wait, METH_FASTCALL, drain_wait_doc},
    {"drain_end", drain_end, METH_NOARGS, drain_end_doc},
    {"drain_wake", drain_wake, METH_NOARGS, drain_wake_doc},
    {"drain_blocking", drain_blocking, METH_O, drain_blocking_doc},
    {"publish", (PyCFunction)(void (*)(void))publish, METH_FASTCALL,
     "publish(table, added=None): swap in a new dispatch table {id(code): dispatch}, or (added"
     " given, table the one published) add those entries to it."},
    {"table", get_table, METH_NOARGS, "The dispatch dict last published."},
    {"parked", parked_py, METH_NOARGS,
     "The parked table (frame -> record of a suspended call): a mapping (parktable.h)."},
    {"compile_source", (PyCFunction)(void (*)(void))compile_source, METH_FASTCALL,
     compile_source_doc},
    {"close_parked", (PyCFunction)(void (*)(void))close_parked, METH_FASTCALL,
     "close_parked(frames, counts): deliver the parked calls of these frames as closed, "
     "adding to counts [records, handlers]."},
    {"finished_frames", finished_frames, METH_O,
     "finished_frames(frames): those whose generator has finished (None: cannot tell)."},
    {"lookup", lookup_py, METH_O, "The dispatch entry of a code object, or None."},
    {"set_max_depth", set_max_depth, METH_O, "Depth past which calls count as overruns."},
    {"max_depth", get_max_depth, METH_NOARGS, "The current max depth."},
    {"set_sweeping", set_sweeping, METH_O, "Hold threads at transitions (engine sweep)."},
    {"sweeping", get_sweeping, METH_NOARGS, "Whether a sweep is on."},
    {"fast_tstate", fast_tstate, METH_NOARGS,
     "Whether the callbacks' fast lanes read the thread state directly (fasttstate.h)."},
    {"set_overflow", (PyCFunction)(void (*)(void))set_overflow, METH_FASTCALL,
     "set_overflow(hook, limit): hook() runs when more than limit records are parked."},
    {"set_fast_arm", set_fast_arm, METH_O,
     "set_fast_arm(template or None): arm first calls in C while one set of users takes every "
     "known function (the engine's _arm_in_core says what the template holds)"},
    {"set_arm_known", set_arm_known, METH_O,
     "set_arm_known(on): also call set_discovery's arm on the first call of every known "
     "function, not only of those in unarmed (off again at each set_discovery)"},
    {"set_discovery", (PyCFunction)(void (*)(void))set_discovery, METH_FASTCALL,
     "set_discovery(hook, known[, bodies]): discover code not in known (nor, for a module or "
     "class body, in bodies) on its first call; (None, None) "
     "turns it off."},
    {"accept_all", (PyCFunction)(void (*)(void))accept_all, METH_FASTCALL,
     "A native entry handler that accepts every call (entry data True)."},
    {"ignore", (PyCFunction)(void (*)(void))ignore, METH_FASTCALL,
     "A native handler that does nothing (any arguments)."},
    {"now", now_py, METH_NOARGS, "The core's clock (time.perf_counter_ns's), in ns."},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------- */
/* Import: bind to core.py's objects.                                                       */

static int
slot_offset(PyTypeObject *tp, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)tp, name);
    if (d == NULL)
        return -1;
    int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
             ((PyMemberDescrObject *)d)->d_member->type == Py_T_OBJECT_EX;
    if (ok)
        *out = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok) {
        PyErr_Format(PyExc_ImportError, "rethook: %s.%s is not a __slots__ member",
                     tp->tp_name, name);
        return -1;
    }
    return 0;
}

static int
get_type(const char *name, PyTypeObject **out)
{
    PyObject *t = PyObject_GetAttrString(core_mod, name);
    if (t == NULL)
        return -1;
    if (!PyType_Check(t)) {
        Py_DECREF(t);
        PyErr_Format(PyExc_ImportError, "rethook: core.%s is not a class", name);
        return -1;
    }
    *out = (PyTypeObject *)t;
    return 0;
}

static int
check_constant(const char *name, long want)
{
    PyObject *v = PyObject_GetAttrString(core_mod, name);
    if (v == NULL)
        return -1;
    long got = PyLong_AsLong(v);
    Py_DECREF(v);
    if (got == -1 && PyErr_Occurred())
        return -1;
    if (got != want) {
        PyErr_Format(PyExc_ImportError, "rethook: core.%s is %ld, the C core was built for %ld",
                     name, got, want);
        return -1;
    }
    return 0;
}

static PyObject *
intern(const char *s)
{
    return PyUnicode_InternFromString(s);
}

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rethook.engine._ccore",
    .m_doc = "The C twin of rethook.engine.core's hot path (see docs/ccore.md).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__ccore(void)
{
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        /* its state is C statics bound to the main interpreter's rethook.engine.core */
        PyErr_SetString(PyExc_ImportError,
                        "rethook's C core runs in the main interpreter only");
        return NULL;
    }
    rh_tstate_init();
    if (PyType_Ready(&TSGuard_Type) < 0)
        return NULL;
    if (wake_init() < 0) {
        PyErr_SetString(PyExc_OSError, "rethook: cannot make the drain's condition variable");
        return NULL;
    }
    static int atfork_set;
    if (!atfork_set && pthread_atfork(NULL, NULL, round_after_fork) == 0)
        atfork_set = 1;
    list_sq_item = PyList_Type.tp_as_sequence->sq_item;
    list_mp_subscript = PyList_Type.tp_as_mapping->mp_subscript;
    list_mp_ass_subscript = PyList_Type.tp_as_mapping->mp_ass_subscript;
    DRecord_Type.tp_base = &PyList_Type;
    if (PyType_Ready(&DRecord_Type) < 0)
        return NULL;
    trace_clock = rh_clock_import();
    core_mod = PyImport_ImportModule("rethook.engine.core");
    if (core_mod == NULL)
        return NULL;
    if (check_constant("REC_KEY", REC_KEY) < 0 || check_constant("REC_CODE", REC_CODE) < 0 ||
        check_constant("REC_FRAME", REC_FRAME) < 0 || check_constant("REC_TIME", REC_TIME) < 0 ||
        check_constant("REC_SLEEP", REC_SLEEP) < 0 ||
        check_constant("REC_PARKED_AT", REC_PARKED_AT) < 0 ||
        check_constant("REC_HEADER", REC_HEADER) < 0 ||
        check_constant("WANT_FRAME", WANT_FRAME) < 0 || check_constant("WANT_TIME", WANT_TIME) < 0 ||
        check_constant("GENERATOR", GENERATOR) < 0 ||
        check_constant("FLAG_UNFINISHED", FLAG_UNFINISHED) < 0 ||
        check_constant("FLAG_CLOSED", FLAG_CLOSED) < 0 ||
        check_constant("MARKER_ITEMS", MARKER_ITEMS) < 0 ||
        check_constant("DIRECT_ITEMS", DIRECT_ITEMS) < 0)
        return NULL;
    if ((local_obj = PyObject_GetAttrString(core_mod, "_local")) == NULL ||
        (new_thread_state_fn = PyObject_GetAttrString(core_mod, "_new_thread_state")) == NULL ||
        (internal_error_fn = PyObject_GetAttrString(core_mod, "internal_error")) == NULL ||
        (handler_failed_fn = PyObject_GetAttrString(core_mod, "handler_failed")) == NULL)
        return NULL;
    if (PyType_Ready(&ParkTable_Type) < 0 ||
        (parked = PyObject_New(ParkTable, &ParkTable_Type)) == NULL)
        return NULL;
    parked->front.frame = parked->front.rec = NULL;
    parked->slots = NULL;
    parked->mask = 0;
    parked->used = 0;
    if ((disabled_ids = PyObject_GetAttrString(core_mod, "_disabled")) == NULL ||
        (monitoring_disable = PyObject_GetAttrString(core_mod, "_DISABLE")) == NULL ||
        (own_package = PyObject_GetAttrString(core_mod, "OWN_PACKAGE")) == NULL ||
        (s_name = PyUnicode_InternFromString("__name__")) == NULL ||
        (s_module_attr = PyUnicode_InternFromString("module")) == NULL ||
        (s_late = PyUnicode_InternFromString("_late")) == NULL ||
        (s_lock = PyUnicode_InternFromString("_lock")) == NULL)
        return NULL;
    if (!PyUnicode_Check(own_package) ||
        (own_prefix = PyUnicode_FromFormat("%U.", own_package)) == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ImportError, "rethook: core.OWN_PACKAGE is not a str");
        return NULL;
    }
    if (!PySet_Check(disabled_ids)) {
        PyErr_SetString(PyExc_ImportError, "rethook: core._disabled is not a set");
        return NULL;
    }
    if (get_type("ThreadState", &ThreadState_t) < 0 ||
        get_type("Registration", &Registration_t) < 0 ||
        get_type("EntryRegistration", &EntryRegistration_t) < 0)
        return NULL;
    if (slot_offset(ThreadState_t, "stack", &ts_stack) < 0 ||
        slot_offset(ThreadState_t, "busy", &ts_busy) < 0 ||
        slot_offset(ThreadState_t, "waiting", &ts_waiting) < 0 ||
        slot_offset(ThreadState_t, "recursion", &ts_recursion) < 0 ||
        slot_offset(ThreadState_t, "overrun", &ts_overrun) < 0 ||
        slot_offset(ThreadState_t, "inflight", &ts_inflight) < 0 ||
        slot_offset(Registration_t, "entryfunc", &rg_entryfunc) < 0 ||
        slot_offset(Registration_t, "retfunc", &rg_retfunc) < 0 ||
        slot_offset(Registration_t, "suspendfunc", &rg_suspendfunc) < 0 ||
        slot_offset(Registration_t, "resumefunc", &rg_resumefunc) < 0 ||
        slot_offset(Registration_t, "nmissed", &rg_nmissed) < 0 ||
        slot_offset(EntryRegistration_t, "func", &er_func) < 0 ||
        slot_offset(EntryRegistration_t, "nmissed", &er_nmissed) < 0)
        return NULL;
    if ((s_ts = intern("ts")) == NULL || (s_guard = intern("_ccore_guard")) == NULL ||
        (s_sweep_lock = intern("sweep_lock")) == NULL || (s_acquire = intern("acquire")) == NULL ||
        (s_release = intern("release")) == NULL || (s_stack = intern("stack")) == NULL ||
        (s_busy = intern("busy")) == NULL || (s_waiting = intern("waiting")) == NULL ||
        (s_recursion = intern("recursion")) == NULL || (s_overrun = intern("overrun")) == NULL ||
        (s_inflight = intern("inflight")) == NULL || (s_entryfunc = intern("entryfunc")) == NULL ||
        (s_retfunc = intern("retfunc")) == NULL || (s_suspendfunc = intern("suspendfunc")) == NULL ||
        (s_resumefunc = intern("resumefunc")) == NULL || (s_func = intern("func")) == NULL ||
        (s_nmissed = intern("nmissed")) == NULL)
        return NULL;
    if ((zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (add_hooks(m) < 0 || PyModule_AddIntConstant(m, "REC_HEADER", REC_HEADER) < 0 ||
        PyModule_AddObjectRef(m, "DirectRecord", (PyObject *)&DRecord_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *round_capsule = PyCapsule_New((void *)&round_api, RH_ROUND_CAPSULE, NULL);
    int bad = round_capsule == NULL ||
              PyCapsule_SetContext(round_capsule, (void *)(uintptr_t)sizeof(round_api)) < 0 ||
              PyModule_AddObjectRef(m, "_ROUND_API", round_capsule) < 0;
    Py_XDECREF(round_capsule);
    if (bad) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
