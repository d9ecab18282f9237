/* drainround.h: the drain's turn at the GIL, as _ccore exports it to other extensions.
 *
 * _ccore keeps one value, the end of the open drain round (engine/_ccore.c, "The drain's turn
 * at the GIL"): while a round is open, a program thread entering a callback hands the GIL over
 * (GIVE_WAY). The recorder's drain opens rounds from Python (core.drain_wait); the trace file
 * encoder (buffer/_tfenc.c) lets the GIL go while it encodes a ring's records, and uses these
 * to close the round while it does not want the GIL (program threads handing it to one another
 * at every callback would only slow the program), and to open one just before it asks for the
 * GIL back (so it does not wait out a switch interval while the ring fills). The ring module
 * (buffer/_cring.c, cring.h) reports a ring close to full and every consuming read, for the
 * program's threads to wait for the drain rather than lose records ("blocking"), and a ring a
 * quarter full, which wakes the drain from its wait between rounds (drain_wait).
 *
 * Capsule RH_ROUND_CAPSULE, an attribute of rethook.engine._ccore (read only when that module
 * is loaded: the pure core has no rounds). Each function is a relaxed atomic access to that
 * one value or to the blocking flags, but wake, which takes the drain's mutex for as long as
 * it signals: all callable with or without the GIL. Fields are only ever added at the end;
 * the capsule's context is the struct's size. */
#ifndef RETHOOK_DRAINROUND_H
#define RETHOOK_DRAINROUND_H

#include <Python.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define RH_ROUND_CAPSULE "rethook.engine._ccore._ROUND_API"

typedef struct {
    /* Close the open round; returns when it would have ended (CLOCK_MONOTONIC ns), 0 if none
     * was open. */
    int64_t (*take)(void);
    /* Open a round ending at `until` (CLOCK_MONOTONIC ns); 0 closes it. */
    void (*open)(int64_t until);
    /* CLOCK_MONOTONIC, ns */
    int64_t (*now)(void);
    /* When the open round ends, 0 if none is open (nothing changed). */
    int64_t (*current)(void);
    /* A writer's ring is three quarters full (cring.h): with blocking on, while a drain runs,
     * the program's threads wait for the drain at their next event of hooked code (_ccore.c,
     * "Blocking").
     * Under the GIL, from inside rh_ring_reserve(): runs no Python code. */
    void (*full)(void);
    /* A consuming read took a ring's records (or the drain found none left): the threads
     * waiting for the drain go on. */
    void (*drained)(void);
    /* A writer's ring is a quarter full (cring.h): the drain's wait between rounds ends.
     * Under the GIL, from inside rh_ring_reserve(), once per ring until its next consuming
     * read: runs no Python code. */
    void (*wake)(void);
    /* Whether a drain runs with blocking on: the program's threads wait for it past three
     * quarters of a ring, so it need not keep up by other means (rounds, the GIL held). */
    int (*blocking)(void);
    /* A writer's new array: ask the drain to page [p, p + bytes) in for writing, in its wait
     * between rounds, without the GIL, before the writer gets there (_ccore.c, "Paging
     * ahead"). Only a request: at most a few are kept; memory freed meanwhile is left alone.
     * Under the GIL (or not); runs no Python code. */
    void (*page_ahead)(void *p, size_t bytes);
} rh_round_api;

/* Page the whole pages of [p, p + n) in for writing, what they hold kept (page_ahead's work,
 * and the encoder's after a detach): 0, or -1 where the kernel cannot (no
 * MADV_POPULATE_WRITE before Linux 5.14) or the range is not mapped writable. Never touches
 * the memory: a range freed meanwhile only fails. Without the GIL. */
static inline int
rh_populate(void *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1), e = ((uintptr_t)p + n) & ~(page - 1);
    if (p == NULL || e <= a)
        return 0;
    return madvise((void *)a, e - a, MADV_POPULATE_WRITE) == 0 ? 0 : -1;
#else
    (void)p;
    (void)n;
    return -1;
#endif
}

/* For the other extensions: _ccore's struct, or NULL while _ccore is not loaded (the pure
 * core has no rounds: look again later). Holds the GIL; runs no Python code (a module's
 * attribute, no import); once found, never unloaded. */
static inline const rh_round_api *
rh_round_api_find(void)
{
    static const rh_round_api *found;
    if (found != NULL)
        return found;
    PyObject *exc = PyErr_GetRaisedException();
    PyObject *name = PyUnicode_FromString("rethook.engine._ccore");
    PyObject *mod = name != NULL ? PyImport_GetModule(name) : NULL;
    PyObject *capsule = mod != NULL ? PyObject_GetAttrString(mod, "_ROUND_API") : NULL;
    if (capsule != NULL && PyCapsule_IsValid(capsule, RH_ROUND_CAPSULE) &&
        (size_t)(uintptr_t)PyCapsule_GetContext(capsule) >= sizeof(rh_round_api))
        found = PyCapsule_GetPointer(capsule, RH_ROUND_CAPSULE);
    Py_XDECREF(capsule);
    Py_XDECREF(mod);
    Py_XDECREF(name);
    PyErr_Clear();
    PyErr_SetRaisedException(exc);
    return found;
}

#endif
