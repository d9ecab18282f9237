/* Direct calls: the C core calling a graph user written in C without Python objects.
 *
 * The kernel attaches a function with a single ftrace_ops through a trampoline that calls that
 * ops directly instead of walking the list. rethook's twin: a graph user written in C may offer
 * `ops.direct`, a capsule named RH_DIRECT_CAPSULE holding an rh_direct. When such a user is the
 * only user of a plain function (no entry users, not a generator or coroutine), the engine puts
 * a *direct entry* in the function's dispatch, and the C core then:
 *
 *   entry   pushes the direct entry, the shared tuple (code, registration, capsule), onto the
 *           thread's shadow stack and calls entry(self, tstate, code, t). 1: the user claimed the call
 *           and keeps its entry data on a per-thread stack of its own; 0: declined (the entry
 *           becomes the function's marker); -1: an error is set (counted on the registration,
 *           as a handler's exception, and the call is declined).
 *   exit    PY_RETURN / PY_UNWIND whose top entry is a direct entry of the code: pops it and
 *           calls exit(self, tstate, code, t, exc, flags) on the same thread; exc is the exception or
 *           NULL, flags the return handler's flags (FLAG_UNFINISHED when the slow exit path
 *           flushes calls that left unseen). The user pops its newest claimed call.
 *
 * No Python object is made per call: the shadow-stack entry is shared by every call of the
 * function, the timestamps stay C integers. Rules the user must keep:
 *   - entry and exit run no Python code, never release the GIL and never call the engine
 *     (so no sweep can see the stack between the push and the call);
 *   - returns come newest first on each thread (the engine's rule 2), so a stack suffices;
 *   - a claim delivered from Python (the engine's sweep at unregister/stop, or the end of a
 *     thread) calls the user's ordinary retfunc with the ThreadState of the call's thread as
 *     its entry data: retfunc(code, None, depth, thread_state, None, None, 0, t, 0, flags).
 *     ThreadState.tid is that thread's threading.get_ident().
 */
#ifndef RETHOOK_FGRAPH_DIRECT_H
#define RETHOOK_FGRAPH_DIRECT_H

#include <Python.h>
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
} rh_direct;

#endif
