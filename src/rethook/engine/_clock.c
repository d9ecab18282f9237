/* rethook.engine._clock: the one calibration of the trace clock (clock.h says what and why).
 *
 *   now() -> int          the trace clock, ns (CLOCK_MONOTONIC's scale and origin)
 *   source() -> str       "tsc" or "monotonic"
 *   why() -> str          why this source (what was checked)
 *   _C_API                capsule: a const rh_clock * for the other extensions
 *
 * The TSC is used when all of these hold: x86-64; the kernel's clocksource is "tsc" (it checks
 * that the counter is in step on every CPU, and switches away when it is not); /proc/cpuinfo
 * has constant_tsc and nonstop_tsc (the rate never changes, the counter never stops); and
 * RETHOOK_CLOCK is not "monotonic" (or "mono"). The choice is made at import and the
 * calibration finished at the first reading (clock.h); neither changes while the process runs:
 * a trace has one clock.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

static void finish(void);
static rh_clock the_clock = {.finish = finish}; /* use_tsc 0 until chosen */
#if RH_HAVE_TSC
static int64_t start_ns; /* the calibration's first pair, taken at import */
static uint64_t start_tsc;
#endif
static char why_text[200] = "not checked";

/* 1 if the file's first line is exactly want. */
static int
file_is(const char *path, const char *want)
{
    char buf[64] = {0};
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return ok && strcmp(buf, want) == 0;
}

/* 1 if the flags line of /proc/cpuinfo has every one of the words. */
static int
cpu_has(const char *const *words, int n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return 0;
    char line[8192];
    int found = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        found = 1;
        for (int i = 0; i < n && found; i++) {
            size_t len = strlen(words[i]);
            const char *p = line;
            found = 0;
            while ((p = strstr(p, words[i])) != NULL) {
                if ((p[-1] == ' ' || p[-1] == '\t') && (p[len] == ' ' || p[len] == '\n')) {
                    found = 1;
                    break;
                }
                p += len;
            }
        }
        break;
    }
    fclose(f);
    return found;
}

#if RH_HAVE_TSC
/* A CLOCK_MONOTONIC reading and the TSC at its middle: the best of a few tries (the one with
 * the narrowest TSC bracket), so a preemption between the reads does not skew the pair. */
static void
read_pair(int64_t *ns, uint64_t *tsc)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 16; i++) {
        uint64_t a = __rdtsc();
        int64_t t = rh_monotonic_ns();
        uint64_t b = __rdtsc();
        if (b - a < best) {
            best = b - a;
            *ns = t;
            *tsc = a + (b - a) / 2;
        }
    }
}
#endif

static void
choose(void)
{
    const char *env = getenv("RETHOOK_CLOCK");
    if (env != NULL && (strcmp(env, "monotonic") == 0 || strcmp(env, "mono") == 0)) {
        snprintf(why_text, sizeof why_text, "RETHOOK_CLOCK=%s", env);
        return;
    }
#if RH_HAVE_TSC
    static const char *const flags[] = {"constant_tsc", "nonstop_tsc"};
    if (!file_is("/sys/devices/system/clocksource/clocksource0/current_clocksource", "tsc")) {
        snprintf(why_text, sizeof why_text, "the kernel's clocksource is not tsc");
        return;
    }
    if (!cpu_has(flags, 2)) {
        snprintf(why_text, sizeof why_text, "the CPU lacks constant_tsc or nonstop_tsc");
        return;
    }
    read_pair(&start_ns, &start_tsc);
    the_clock.use_tsc = RH_CLOCK_PENDING; /* finish() calibrates, at the first reading */
#else
    snprintf(why_text, sizeof why_text, "no TSC on this architecture");
#endif
}

/* The rest of the calibration: a second pair at least RH_CLOCK_CALIBRATE_NS after the first
 * (waiting only for what is left of that), the scale between them. */
static void
finish(void)
{
#if RH_HAVE_TSC
    if (the_clock.use_tsc != RH_CLOCK_PENDING)
        return;
    int64_t ns1;
    uint64_t tsc1;
    do {
        read_pair(&ns1, &tsc1);
    } while (ns1 - start_ns < RH_CLOCK_CALIBRATE_NS);
    if (tsc1 <= start_tsc) {
        snprintf(why_text, sizeof why_text, "the TSC did not advance while calibrating");
        the_clock.use_tsc = 0;
        return;
    }
    the_clock.mult = (uint64_t)((((unsigned __int128)(ns1 - start_ns)) << RH_CLOCK_SHIFT) /
                                (tsc1 - start_tsc));
    the_clock.tsc0 = tsc1;
    the_clock.ns0 = ns1;
    the_clock.use_tsc = 1;
    snprintf(why_text, sizeof why_text,
             "the kernel's clocksource is tsc; %.4f ns per tick, calibrated over %.1f ms",
             (double)the_clock.mult / (double)(1ULL << RH_CLOCK_SHIFT),
             (double)(ns1 - start_ns) / 1e6);
#endif
}

static PyObject *
now(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    return PyLong_FromLongLong(rh_clock_ns(&the_clock));
}

static PyObject *
source(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    finish(); /* the calibration can still fail (a TSC that does not advance) */
    return PyUnicode_FromString(the_clock.use_tsc ? "tsc" : "monotonic");
}

static PyObject *
why(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    finish();
    return PyUnicode_FromString(why_text);
}

static PyMethodDef methods[] = {
    {"now", now, METH_NOARGS, "now() -> int: the trace clock in ns (CLOCK_MONOTONIC's scale)."},
    {"source", source, METH_NOARGS, "source() -> 'tsc' or 'monotonic'."},
    {"why", why, METH_NOARGS, "why() -> str: why that source was chosen."},
    {NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rethook.engine._clock",
    .m_doc = "The trace clock: CLOCK_MONOTONIC ns, read from the TSC where the kernel trusts it.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__clock(void)
{
    choose();
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    PyObject *capsule = PyCapsule_New((void *)&the_clock, RH_CLOCK_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObjectRef(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(capsule);
    return m;
}
