/* Direct calls: the C core calling a graph user written in C without Python objects.
 *
 * The kernel attaches a function with a single ftrace_ops through a trampoline that calls that
 * ops directly instead of walking the list. rethook's twin: a graph user written in C may offer
 * `ops.direct`, a capsule named RH_DIRECT_CAPSULE holding an rh_direct. When such a user is the
 * only user of a function (no entry users, and no user that wants the frame), the engine puts a
 * *direct entry* in the function's dispatch: the shared tuple (code, registration, capsule).
 *
 * Plain functions (entry and exit hooks):
 *
 *   entry   pushes the direct entry itself onto the thread's shadow stack and calls
 *           entry(self, tstate, code, t). 1: the user claimed the call and keeps its entry data
 *           on a per-thread stack of its own; 0: declined (the entry becomes the function's
 *           marker); -1: an error is set (counted on the registration, as a handler's
 *           exception, and the call is declined).
 *   exit    PY_RETURN / PY_UNWIND whose top entry is a direct entry of the code: pops it and
 *           calls exit(self, tstate, code, t, exc, flags) on the same thread; exc is the
 *           exception or NULL, flags the return handler's flags (FLAG_UNFINISHED when the slow
 *           exit path flushes calls that left unseen). The user pops its newest claimed call.
 *
 * Generators and coroutines (the gen_* hooks; read only from a capsule made by
 * rh_direct_capsule(), whose context says the struct has them). A suspended call moves between
 * threads and is parked by frame (the engine's rule 3), so it cannot share one tuple: each call
 * gets a *direct record*, a record list (the engine's RECORD shape: key and frame, code, one
 * claim (registration, data)) of the C core's own list subtype, whose three times (entry time,
 * time suspended so far, time of the last suspension) are C integers. The engine's Python code
 * (sweeps, collect_parked, a thread's end) reads them as rec[REC_TIME], rec[REC_SLEEP],
 * rec[REC_PARKED_AT], which the subtype answers from the C fields: exact, made only when read.
 *
 *   entry   PY_START: the direct record is pushed, then
 *           gen_entry(self, tstate, code, t, &data): 1: claimed, *data is a new reference to the
 *           call's entry data (a Python object of the user's, the claim's data); 0 declined;
 *           -1 error (as above). Declined: the record is popped (a generator has no marker).
 *   suspend PY_YIELD: the record is parked (its time of suspension t), then
 *           gen_suspend(self, tstate, code, data, t).
 *   resume  PY_RESUME / PY_THROW, on any thread: the record is unparked, t - (time of
 *           suspension) is added to its sleep, gen_resume(self, tstate, code, data, t) runs on
 *           the resuming thread (tstate), then the record is pushed onto that thread's stack.
 *   exit    PY_RETURN / PY_UNWIND of the record's frame, or the slow exit path
 *           (FLAG_UNFINISHED): the claim is taken off the record, then
 *           gen_exit(self, tstate, code, data, t0, t, sleep, exc, flags), with the entry time,
 *           the exit time and the time spent suspended.
 *   The hooks are called only while the record still holds its claim (a sweep may have
 *   delivered it), each claim's exit exactly once.
 *
 * Preparing a thread (version 3: the prepare hook). A user with prepare never runs Python code
 * in entry: when the calling thread has no per-thread state of the user yet, entry does
 * nothing and returns RH_DIRECT_PREPARE; the core then marks the thread busy, holds what the
 * call needs, calls prepare(self, tstate) (which may run Python code to make that state: 0
 * done, -1 an error is set) and enters the call again with a fresh time. So the core's fast
 * path calls entry with no reference held and no busy mark: nothing can run between its look
 * at the dispatch and the hook's return. The same holds for gen_entry and gen_resume, the
 * generator hooks that may be a thread's first call of the user (a generator resumed on another
 * thread): they answer RH_DIRECT_PREPARE too, and the core prepares the thread and calls again.
 * Such a user also promises that releasing its entry data runs no Python code, so that a
 * generator call enters, suspends, resumes and ends with nothing held and the thread not
 * marked busy. Without prepare (older users), entry, gen_entry and gen_resume may run Python
 * code on a thread's first call and the core guards every call.
 *
 * No Python object is made per event: a plain function's shadow-stack entry is shared by every
 * call of it, a generator call's record (from a freelist) and entry data are made once per
 * call, the timestamps stay C integers. Rules the user must keep:
 *   - the hooks run no Python code, never release the GIL and never call the engine (so no
 *     sweep can see the stack between the push and the call); the one exception is the user's
 *     first call on a thread, which may make its per-thread state through Python (the thread is
 *     marked busy meanwhile, so a sweep waits for it);
 *   - returns come newest first on each thread (the engine's rule 2), so a stack suffices for
 *     plain functions; a generator call's data is its own object and may be resumed (and end)
 *     on another thread;
 *   - a claim delivered from Python (the engine's sweep at unregister/stop, the end of a
 *     thread) calls the user's ordinary retfunc (collect_parked's closed calls go through the
 *     core's close_parked, which gives a direct record's claim to gen_exit, as a return
 *     would): for a plain function's direct entry
 *     with the ThreadState of the call's thread as its entry data:
 *     retfunc(code, None, depth, thread_state, None, None, 0, t, 0, flags) (ThreadState.tid is
 *     that thread's threading.get_ident()); for a generator's direct record with the record's
 *     header and its claim's data, as for any record: retfunc(code, frame, depth, data, None,
 *     exc, t0, t, sleep, flags). The user's suspendfunc/resumefunc are never called for a
 *     direct record.
 */
#ifndef RETHOOK_FGRAPH_DIRECT_H
#define RETHOOK_FGRAPH_DIRECT_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#define RH_DIRECT_CAPSULE "rethook.engine.fgraph_direct"

typedef struct rh_direct {
    void *self; /* the user's C object. The capsule holds no reference to it (a capsule is
                 * invisible to the GC, so it could close an uncollectable cycle): the ops
                 * object that carries the capsule must keep the user alive, and every
                 * direct entry holds the registration, which holds the ops. */
    /* tstate: the calling thread's PyThreadState (saves the user a thread-local lookup) */
    int (*entry)(void *self, PyThreadState *tstate, PyObject *code, int64_t t);
    int (*exit)(void *self, PyThreadState *tstate, PyObject *code, int64_t t, PyObject *exc,
                long flags);
    /* --- version 2: generators and coroutines (see above). Appended: a capsule of the first
     * version (no context) has none of these; NULL hooks mean the same. --- */
    int (*gen_entry)(void *self, PyThreadState *tstate, PyObject *code, int64_t t,
                     PyObject **data);
    int (*gen_suspend)(void *self, PyThreadState *tstate, PyObject *code, PyObject *data,
                       int64_t t);
    int (*gen_resume)(void *self, PyThreadState *tstate, PyObject *code, PyObject *data,
                      int64_t t);
    int (*gen_exit)(void *self, PyThreadState *tstate, PyObject *code, PyObject *data,
                    int64_t t0, int64_t t, int64_t sleep, PyObject *exc, long flags);
    /* --- version 3: preparing a thread (see above); NULL: entry may run Python code --- */
    int (*prepare)(void *self, PyThreadState *tstate);
} rh_direct;

/* What a version-3 entry returns when the thread has no state of the user yet. */
#define RH_DIRECT_PREPARE 2

/* The size of the first version's struct (entry and exit only). */
#define RH_DIRECT_SIZE_V1 (offsetof(rh_direct, gen_entry))

/* The capsule a user offers as ops.direct: its context is the size of the rh_direct the user
 * was built with, so a core built against a longer struct never reads past the user's. */
static inline PyObject *
rh_direct_capsule(rh_direct *d)
{
    PyObject *capsule = PyCapsule_New(d, RH_DIRECT_CAPSULE, NULL);
    if (capsule != NULL &&
        PyCapsule_SetContext(capsule, (void *)(uintptr_t)sizeof(rh_direct)) < 0) {
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

/* The size of the rh_direct behind a capsule: its context, RH_DIRECT_SIZE_V1 without one. */
static inline size_t
rh_direct_size(PyObject *capsule)
{
    void *ctx = PyCapsule_GetContext(capsule);
    if (ctx == NULL) {
        PyErr_Clear();
        return RH_DIRECT_SIZE_V1;
    }
    return (size_t)(uintptr_t)ctx;
}

/* Whether the rh_direct d (of size bytes) has the four generator hooks. */
static inline int
rh_direct_has_gen(const rh_direct *d, size_t size)
{
    return size >= offsetof(rh_direct, gen_exit) + sizeof(d->gen_exit) && d->gen_entry &&
           d->gen_suspend && d->gen_resume && d->gen_exit;
}

/* Whether the rh_direct d (of size bytes) has the prepare hook. */
static inline int
rh_direct_has_prepare(const rh_direct *d, size_t size)
{
    return size >= offsetof(rh_direct, prepare) + sizeof(d->prepare) && d->prepare;
}

/* ---- Direct calls of an entry user ---------------------------------------------------------
 *
 * The kernel's ftrace direct call, for the entry users (engine.FtraceOps, the kernel's
 * ftrace_ops: one call at entry, nothing at return). An entry user written in C may offer
 * `ops.direct`, a capsule named RH_FDIRECT_CAPSULE holding an rh_fdirect. Where it is the only
 * user of a function and no user wants the frame, the engine puts (code, registration,
 * capsule) in the dispatch's direct slot, and the C core's PY_START fast lane calls
 *
 *   func(self, tstate, code)   0: done; -1: an error is set (counted on the registration, as
 *                              its Python-visible func's exception would be);
 *                              RH_DIRECT_PREPARE: the hook did nothing (the thread has no
 *                              state of the user yet, or the call needs Python code): the core
 *                              calls the user's ordinary func(code, None) instead.
 *
 * Nothing is pushed on the shadow stack (a function with entry users only has no return
 * events). The hook runs no Python code, never releases the GIL and never calls the engine;
 * whenever the fast lane is not taken (a busy thread, a sweep, a drain round) the user's
 * ordinary func is called, so the two must record the same. */
#define RH_FDIRECT_CAPSULE "rethook.engine.ftrace_direct"

typedef struct rh_fdirect {
    void *self; /* the user's C object; no reference (as rh_direct's self) */
    int (*func)(void *self, PyThreadState *tstate, PyObject *code);
} rh_fdirect;

#endif
