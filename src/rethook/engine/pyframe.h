/* pyframe.h: the caller of the running Python function, read without frame objects.
 *
 * The function tracer records every call's caller (its code and line). Through the public API
 * that costs two frame objects per call: PyEval_GetFrame() materializes the callee's
 * PyFrameObject and PyFrame_GetBack() the caller's (an allocation each, freed when the frame
 * ends). The interpreter's own frames (_PyInterpreterFrame) already hold both: the thread's
 * current frame is the callee (PY_START fires inside it) and `previous` links to the caller.
 * This header walks them the way PyFrame_GetBack() does (skipping incomplete frames and the
 * C-stack shims between them) and reads the caller's code and instruction offset with the
 * public PyUnstable_InterpreterFrame_* functions; the line is computed when the record is read
 * (cring.h's RH_CALLER_OFFSET).
 *
 * The frame struct is CPython-internal (internal/pycore_frame.h, for the exact version this is
 * compiled against): 3.12 and 3.13 are the versions built and tested here; another version
 * falls back to the public, allocating path (RH_HAVE_IFRAME is 0).
 */
#ifndef RETHOOK_PYFRAME_H
#define RETHOOK_PYFRAME_H

#include <Python.h>
#include <frameobject.h>

#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_LIMITED_API)
#define RH_HAVE_IFRAME 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#define RH_UNDEF_BUILD_CORE
#endif
#include "internal/pycore_frame.h"
#ifdef RH_UNDEF_BUILD_CORE
#undef Py_BUILD_CORE
#undef RH_UNDEF_BUILD_CORE
#endif
#else
#define RH_HAVE_IFRAME 0
#endif

#if RH_HAVE_IFRAME
/* The first complete frame from f on, skipping the C-stack shims between frames (the rule of
 * PyEval_GetFrame() and PyFrame_GetBack()), or NULL. */
static inline _PyInterpreterFrame *
rh_complete_frame(_PyInterpreterFrame *f)
{
    while (f != NULL && _PyFrame_IsIncomplete(f))
        f = f->previous;
    return f;
}

/* The frame running on tstate (PyEval_GetFrame()'s: in a callback, the frame that fired the
 * event), or NULL. */
static inline _PyInterpreterFrame *
rh_running_frame(PyThreadState *tstate)
{
#if PY_VERSION_HEX >= 0x030D0000
    return rh_complete_frame(tstate->current_frame);
#else
    return rh_complete_frame(tstate->cframe->current_frame);
#endif
}
#endif

/* The caller of the function running on tstate: *code gets a new reference to its code (NULL
 * when there is none: the outermost frame), and *where its line (*is_offset 0), or where
 * computing the line is left to the reader, its instruction offset in bytes (*is_offset 1:
 * PyCode_Addr2Line(code, offset) is the line). 0, or -1 with an error set. */
static inline int
rh_caller(PyThreadState *tstate, PyObject **code, int *where, int *is_offset)
{
    *code = NULL;
    *where = 0;
    *is_offset = 0;
#if RH_HAVE_IFRAME
    _PyInterpreterFrame *f = rh_running_frame(tstate); /* the callee */
    if (f == NULL)
        return 0;
    f = rh_complete_frame(f->previous); /* its caller */
    if (f == NULL)
        return 0;
    *code = PyUnstable_InterpreterFrame_GetCode(f); /* a strong reference */
    *where = PyUnstable_InterpreterFrame_GetLasti(f);
    *is_offset = 1;
    return 0;
#else
    PyFrameObject *frame = PyThreadState_GetFrame(tstate);
    if (frame == NULL)
        return 0;
    PyFrameObject *back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    if (back != NULL) {
        *code = (PyObject *)PyFrame_GetCode(back);
        int l = PyFrame_GetLineNumber(back);
        *where = l < 0 ? 0 : l;
        Py_DECREF(back);
    }
    return 0;
#endif
}

#endif
