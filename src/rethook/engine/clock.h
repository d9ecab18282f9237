/* clock.h: the trace clock of rethook's C code, the twin of rethook/engine/clock.py.
 *
 * Every timestamp of a trace comes from one clock: CLOCK_MONOTONIC nanoseconds (what
 * time.perf_counter_ns() returns on Linux), so events of all threads, from C and from Python,
 * merge in the order they happened. Reading it costs ~19 ns through the vDSO here; the hot
 * path reads it twice per call. Where the kernel itself keeps time with the TSC (its
 * clocksource is "tsc": the counter is invariant and in step on every CPU), the C code reads
 * the TSC (~8 ns) and scales it onto CLOCK_MONOTONIC:
 *
 *     ns = ns0 + ((tsc - tsc0) * mult) >> RH_CLOCK_SHIFT
 *
 * with (tsc0, ns0) one reading of both taken together and mult measured against
 * CLOCK_MONOTONIC from _clock's import to the first reading of the clock, and over at least
 * RH_CLOCK_CALIBRATE_NS (error a few ppm: a few microseconds per second of trace against the
 * system clock; durations are off by as much). Until that first reading use_tsc is
 * RH_CLOCK_PENDING and the reader calls finish(), which waits out what is left of the
 * interval; a command line's start-up is longer than that, so in practice nobody waits, and
 * the import does not spin for it.
 * rethook.engine._clock owns the one calibration; _ccore and _native read it through the
 * capsule RH_CLOCK_CAPSULE, and Python reads it with _clock.now(). Without _clock, everything
 * reads CLOCK_MONOTONIC directly, which is the same clock.
 */
#ifndef RETHOOK_CLOCK_H
#define RETHOOK_CLOCK_H

#include <Python.h>
#include <stdint.h>
#include <time.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <x86intrin.h>
#define RH_HAVE_TSC 1
#else
#define RH_HAVE_TSC 0
#endif

#define RH_CLOCK_CAPSULE "rethook.engine._clock._C_API"
#define RH_CLOCK_SHIFT 32
#define RH_CLOCK_CALIBRATE_NS 5000000 /* 5 ms at least */
#define RH_CLOCK_PENDING (-1)           /* use_tsc: the TSC, once finish() has calibrated it */

typedef struct {
    int use_tsc;   /* 1: the TSC; 0: clock_gettime(CLOCK_MONOTONIC); or RH_CLOCK_PENDING */
    uint64_t tsc0; /* a TSC reading ... */
    int64_t ns0;   /* ... and CLOCK_MONOTONIC at the same moment */
    uint64_t mult; /* ns per TSC tick << RH_CLOCK_SHIFT */
    void (*finish)(void); /* ends the calibration (use_tsc becomes 1); callers hold the GIL */
} rh_clock;

static inline int64_t
rh_monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + (int64_t)t.tv_nsec;
}

#if RH_HAVE_TSC
/* The calibrated TSC's reading, in CLOCK_MONOTONIC nanoseconds. */
static inline __attribute__((always_inline)) int64_t
rh_tsc_ns(const rh_clock *c)
{
    uint64_t d = __rdtsc() - c->tsc0;
    return c->ns0 + (int64_t)(((unsigned __int128)d * c->mult) >> RH_CLOCK_SHIFT);
}
#endif

/* The trace clock when it is not the calibrated TSC: the first reading (which ends the
 * calibration), CLOCK_MONOTONIC, or c NULL. Kept out of line, with the cold code: the
 * callbacks that inline rh_clock_ns() stay a few lines of code long. */
static __attribute__((noinline, cold, unused)) int64_t
rh_clock_slow(const rh_clock *c)
{
#if RH_HAVE_TSC
    if (c != NULL) {
        if (c->use_tsc == RH_CLOCK_PENDING)
            c->finish(); /* the first reading, once */
        if (c->use_tsc > 0)
            return rh_tsc_ns(c);
    }
#endif
    (void)c;
    return rh_monotonic_ns();
}

/* The trace clock; c may be NULL (CLOCK_MONOTONIC). Always inlined: it is on every event, and
 * its usual case (the TSC, calibrated) is one compare. */
static inline __attribute__((always_inline)) int64_t
rh_clock_ns(const rh_clock *c)
{
#if RH_HAVE_TSC
    if (__builtin_expect(c != NULL && c->use_tsc == 1, 1))
        return rh_tsc_ns(c);
#endif
    return rh_clock_slow(c);
}

/* For _ccore and _native: _clock's calibration, or NULL (CLOCK_MONOTONIC) when it is not built,
 * which is what rethook/engine/clock.py falls back to as well. */
static inline const rh_clock *
rh_clock_import(void)
{
    PyObject *m = PyImport_ImportModule("rethook.engine._clock");
    if (m == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(m);
    const rh_clock *c = PyCapsule_Import(RH_CLOCK_CAPSULE, 0);
    if (c == NULL)
        PyErr_Clear();
    return c;
}

#endif
