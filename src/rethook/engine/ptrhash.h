/* ptrhash.h: the hash of a pointer, for the C core's and the native users' open-addressing
 * tables keyed by an object's address (the dispatch table, the thread caches, the parked table,
 * the profiler's rows).
 *
 * Fibonacci hashing: the product's bits 32 and up depend on every bit of the address below
 * them, so addresses that differ only in their low (aligned) bits spread; two instructions on
 * the hot path where a mixer of shifts and xors took seven. Callers mask the result with their
 * table's size (a power of two, below 2**32).
 */
#ifndef RETHOOK_PTRHASH_H
#define RETHOOK_PTRHASH_H

#include <stddef.h>
#include <stdint.h>

static inline size_t
rh_hash_ptr(const void *p)
{
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ULL) >> 32);
}

#endif
