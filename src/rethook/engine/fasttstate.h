/* fasttstate.h: the calling thread's PyThreadState for the callbacks' fast lanes, read where
 * the interpreter itself keeps it.
 *
 * CPython keeps the running thread state in a thread-local variable of its own, which it does
 * not export: an extension asks PyThreadState_GetUnchecked(), a call into libpython that, for
 * a shared libpython, goes through __tls_get_addr (~18 instructions; the fast lanes ask once
 * per event, twice per call). A library loaded with the program keeps its thread-local
 * variables in every thread's static TLS block, at one offset from the thread pointer that is
 * the same in every thread: read there, the same variable costs two loads.
 *
 *      thread pointer (%fs:0)
 *              |
 *   ... [ libpython's TLS block: ... | tstate | ... ] [ other static TLS ] |  (x86-64: below)
 *                                        ^
 *                                        tp + rh_tstate_offset
 *
 * rh_tstate_init() (module import, GIL held) finds that offset once: the object holding
 * PyThreadState_GetUnchecked (libpython, or the executable for a static build), its TLS block
 * in this thread (dl_iterate_phdr's dlpi_tls_data), and the one 8-byte slot of it that holds
 * the current thread state. It keeps the offset only if exactly one slot matches and the block
 * lies in the static TLS area just below the thread pointer (a libpython loaded with dlopen
 * has its block elsewhere: then there is no fixed offset, and no fast read).
 *
 * Contract for callers: rh_tstate_fast() is read only in the fast lanes, and its value is used
 * only after a thread cache hit, whose entries hold thread states that the real function
 * returned (the slow path fills them); a fast read that were wrong in some thread would only
 * miss the cache. The slow path also calls rh_tstate_check(), which compares both ways and
 * turns the fast read off for good if they differ. Elsewhere (not x86-64 glibc Linux)
 * rh_tstate_fast() is the real function.
 */
#ifndef RETHOOK_FASTTSTATE_H
#define RETHOOK_FASTTSTATE_H

#include <Python.h>

#if PY_VERSION_HEX >= 0x030D0000
#define rh_tstate_real() PyThreadState_GetUnchecked()
#else
#define rh_tstate_real() _PyThreadState_UncheckedGet()
#endif

#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && defined(__GNUC__)
#define RH_FAST_TSTATE 1
#include <elf.h>
#include <link.h>
#include <stdint.h>

#define RH_STATIC_TLS_SPAN ((intptr_t)1 << 20) /* the static TLS area is far smaller */

static intptr_t rh_tstate_offset; /* from the thread pointer; 0: no fast read */

static inline char *
rh_thread_pointer(void)
{
    char *tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp;
}

static inline PyThreadState *
rh_tstate_fast(void)
{
    intptr_t off = rh_tstate_offset;
    if (__builtin_expect(off != 0, 1))
        return *(PyThreadState **)(rh_thread_pointer() + off);
    return rh_tstate_real();
}

/* The object that defines `addr`, and its TLS block in the calling thread. */
typedef struct {
    uintptr_t addr;
    char *block;  /* dlpi_tls_data: this thread's instance of the object's PT_TLS, or NULL */
    size_t size;  /* its p_memsz */
} rh_tls_search;

static int
rh_tls_find(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    rh_tls_search *s = data;
    int here = 0;
    size_t tls_size = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && s->addr >= start && s->addr < start + ph->p_memsz)
            here = 1;
        if (ph->p_type == PT_TLS)
            tls_size = ph->p_memsz;
    }
    if (!here)
        return 0;
    s->block = info->dlpi_tls_data;
    s->size = tls_size;
    return 1;
}

/* Find rh_tstate_offset (see the top); leaves it 0 where it cannot be trusted. */
static void
rh_tstate_init(void)
{
    rh_tstate_offset = 0;
    PyThreadState *now = rh_tstate_real();
    if (now == NULL)
        return;
#if PY_VERSION_HEX >= 0x030D0000
    rh_tls_search s = {(uintptr_t)(void *)&PyThreadState_GetUnchecked, NULL, 0};
#else
    rh_tls_search s = {(uintptr_t)(void *)&_PyThreadState_UncheckedGet, NULL, 0};
#endif
    if (!dl_iterate_phdr(rh_tls_find, &s) || s.block == NULL)
        return;
    char *tp = rh_thread_pointer(), *found = NULL;
    for (size_t at = 0; at + sizeof(void *) <= s.size; at += sizeof(void *)) {
        if (*(PyThreadState **)(s.block + at) == now) {
            if (found != NULL)
                return; /* two slots hold it: which one is the interpreter's is unknown */
            found = s.block + at;
        }
    }
    if (found == NULL || found >= tp || tp - found > RH_STATIC_TLS_SPAN)
        return;
    rh_tstate_offset = found - tp;
}

/* A thread met for the first time (the slow path, `real` from rh_tstate_real()): the fast
 * read must agree, or it is turned off for every thread. */
static inline void
rh_tstate_check(PyThreadState *real)
{
    intptr_t off = rh_tstate_offset;
    if (off != 0 && *(PyThreadState **)(rh_thread_pointer() + off) != real)
        rh_tstate_offset = 0;
}

#else
#define RH_FAST_TSTATE 0
#define rh_tstate_fast() rh_tstate_real()
#define rh_tstate_init() ((void)0)
#define rh_tstate_check(real) ((void)(real))
#endif

#endif
