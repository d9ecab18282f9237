/* drainround.h: the drain's turn at the GIL, as _ccore exports it to other extensions.
 *
 * _ccore keeps one value, the end of the open drain round (engine/_ccore.c, "The drain's turn
 * at the GIL"): while a round is open, a program thread entering a callback hands the GIL over
 * (GIVE_WAY). The recorder's drain opens rounds from Python (core.drain_wait); the trace file
 * encoder (buffer/_tfenc.c) lets the GIL go while it encodes a ring's records, and uses these
 * to close the round while it does not want the GIL (program threads handing it to one another
 * at every callback would only slow the program), and to open one just before it asks for the
 * GIL back (so it does not wait out a switch interval while the ring fills).
 *
 * Capsule RH_ROUND_CAPSULE, an attribute of rethook.engine._ccore (read only when that module
 * is loaded: the pure core has no rounds). Each function is a relaxed atomic access to that
 * one value: callable with or without the GIL. Fields are only ever added at the end; the
 * capsule's context is the struct's size. */
#ifndef RETHOOK_DRAINROUND_H
#define RETHOOK_DRAINROUND_H

#include <stdint.h>

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
} rh_round_api;

#endif
