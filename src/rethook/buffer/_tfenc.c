/*
 * rethook.buffer._tfenc -- the trace file writer's column encoder, in C.
 *
 * TraceWriter (rethook.buffer.tracefile) stores a batch of events column by column per event
 * format: every integer column as a constant, in the narrowest fixed width or as deltas
 * (docs/trace-format.md, "Integer columns"), every string as an index into the file's string
 * table, every float as an f64. In Python each column costs a list pulled out of the tuples
 * and several passes over it; encode_group() here encodes all the columns of a group of event
 * tuples straight from the tuples, into one bytes object.
 *
 * The Python code (_encode_ints, TraceWriter._encode_group) stays the reference and the
 * fallback: this module makes exactly the choices it makes and writes exactly the bytes it
 * writes. Whatever it would not handle the same way -- a value that is not an exact int, bool,
 * float or str, an integer column that needs the big-integer encoding, an event that is not a
 * tuple of the format's length, an unknown field type -- it declines: it returns False before
 * changing anything (``out``, the string table), and the writer runs the Python code, which
 * encodes it or raises the errors it always raised.
 *
 * The events are read in one pass, row by row (an event's items are read together, which
 * keeps the memory traffic down), into one array of 64-bit values per column; strings are
 * looked up in the string table on the way. The strings the table lacks are added after
 * that pass, column by column in first-seen order -- the order _encode_strings adds them
 * in, so the indices come out the same -- and then each column is encoded from its array.
 *
 * The encoding constants are duplicated here and checked against tracefile.py at import
 * (tracefile.py imports this module after defining them).
 *
 * encode_group() runs under the GIL. Between the first item read and the return no Python
 * code runs (only exact ints, bools, floats and strs are looked at, and the string table is a
 * dict of str keys), so the borrowed references to the events and their items stay valid.
 *
 * encode_ring() is the fused drain (TraceWriter.write_native): a native ring's records
 * (cring.h) consumed and encoded into event chunks with no event tuple in between, the bytes
 * the tuple path writes (Ring.consume(tid, name_of), then write_events). A call of many
 * records takes the ring's whole array out of it (the ring goes on in a spare one) and names,
 * encodes and releases the records with the GIL released, the program running meanwhile; a
 * small call names the records first (name_of is Python code, which may write the ring: it
 * runs while the records are still the ring's), then takes them with Ring.consume()'s
 * accounting and reads them in their slots with the GIL held. Either way the batches go
 * through the same column arrays and write_ints() as encode_group(). See the sections "The
 * fused drain", "Encoding with the GIL released" and "The detached drain" below. Its
 * names table may be kept from one call to the next (a NameCache, the writer's): a code's
 * name is fixed for a recording, so name_of then runs once per code rather than once per
 * code per drain round.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cring.h" /* the native ring's records, for encode_ring() */
#include "../engine/drainround.h" /* _ccore's drain round, for encode_ring() */

#if PY_VERSION_HEX < 0x030C0000
#error "rethook's C trace file encoder needs CPython 3.12 or newer"
#endif
#ifdef Py_GIL_DISABLED
#error "rethook's C trace file encoder relies on the GIL; free-threaded builds use tracefile.py"
#endif
#ifdef Py_LIMITED_API
#error "rethook's C trace file encoder uses CPython's non-limited API"
#endif

/* tracefile.py's _INT_PLAIN, _INT_DELTA, _INT_CONST and _WIDTH_SAMPLES (checked at import) */
#define INT_PLAIN 0
#define INT_DELTA 1
#define INT_CONST 2
#define WIDTH_SAMPLES 64

/* width codes: the size in bytes, | SIGNED for two's complement (tracefile.py's _Width.code) */
#define SIGNED 0x80
#define SIZE(code) ((code) & 0x0F)

/* what read_int() saw in a column */
#define SEEN_NEG 1 /* a value below 0 */
#define SEEN_BIG 2 /* a value above INT64_MAX (kept as its uint64) */

/* column kinds, from the field type names */
enum { K_INT, K_INT_DELTA, K_STR, K_F64 };

/* Columns one call takes (more: the Python encoder) */
#define MAX_COLUMNS 256

/* Most bytes one column of n values takes: plain u64 is 2 + 8n, delta 10 + 8(n - 1),
 * const at most 1 + 4 + 9, f64 8n. */
#define COLUMN_MAX(n) (14 + 8 * (n))

/* ---------------------------------------------------------------------------------------- */
/* reading values                                                                            */

/* An exact int (or bool) into *dst: 0 done, 1 decline (not an exact int, or outside
 * [INT64_MIN, UINT64_MAX]), -1 error. Values above INT64_MAX are kept as their uint64 and
 * flagged SEEN_BIG; negative values are flagged SEEN_NEG. */
static inline int
read_int(PyObject *o, uint64_t *dst, int *seen)
{
    if (!PyLong_CheckExact(o) && !PyBool_Check(o))
        return 1;
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        Py_ssize_t x = PyUnstable_Long_CompactValue((PyLongObject *)o);
        if (x < 0)
            *seen |= SEEN_NEG;
        *dst = (uint64_t)(int64_t)x;
        return 0;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) {
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (x < 0)
            *seen |= SEEN_NEG;
        *dst = (uint64_t)(int64_t)x;
        return 0;
    }
    if (overflow < 0)
        return 1;
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 1;
    }
    *seen |= SEEN_BIG;
    *dst = (uint64_t)u;
    return 0;
}

/* What array("d", [o]) stores, as bits: 0 done, 1 decline, -1 error. */
static inline int
read_double(PyObject *o, uint64_t *dst)
{
    double d;
    if (PyFloat_CheckExact(o)) {
        d = PyFloat_AS_DOUBLE(o);
    }
    else if (PyLong_CheckExact(o) || PyBool_Check(o)) {
        d = PyLong_AsDouble(o);
        if (d == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            return 1;
        }
    }
    else {
        return 1;
    }
    memcpy(dst, &d, sizeof(d));
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* writing                                                                                    */

static inline void
put16(unsigned char *p, uint64_t x)
{
    p[0] = (unsigned char)x;
    p[1] = (unsigned char)(x >> 8);
}

static inline void
put32(unsigned char *p, uint64_t x)
{
    p[0] = (unsigned char)x;
    p[1] = (unsigned char)(x >> 8);
    p[2] = (unsigned char)(x >> 16);
    p[3] = (unsigned char)(x >> 24);
}

static inline void
put64(unsigned char *p, uint64_t x)
{
    put32(p, x);
    put32(p + 4, x >> 32);
}

static inline uint32_t
get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The head of a chunk: its tag and its payload's length, the layout of tracefile.py's
 * _CHUNK_HEAD, TAG_EVENTS and TAG_STRINGS (checked against them at import:
 * check_chunk_head()), and the most a payload may hold (its MAX_CHUNK_PAYLOAD, checked too). */
#define CHUNK_HEAD_SIZE 8
#define TAG_EVENTS "EVTS"
#define TAG_STRINGS "STR "
#define MAX_CHUNK_PAYLOAD ((uint64_t)1 << 30)
static inline void
tagged_head(unsigned char head[CHUNK_HEAD_SIZE], const char *tag, uint64_t payload_len)
{
    memcpy(head, tag, 4);
    put32(head + 4, payload_len);
}

static inline void
chunk_head(unsigned char head[CHUNK_HEAD_SIZE], uint64_t payload_len)
{
    tagged_head(head, TAG_EVENTS, payload_len);
}

/* The values (or, with delta, the n - 1 differences between neighbours), little-endian in
 * `size` bytes each: the caller has checked that they fit. */
static unsigned char *
pack(unsigned char *p, const uint64_t *v, Py_ssize_t n, int size, int delta)
{
    Py_ssize_t i;
#define PACK(SIZE, PUT)                                                                     \
    if (delta)                                                                              \
        for (i = 1; i < n; i++, p += (SIZE))                                                \
            PUT(p, v[i] - v[i - 1]);                                                        \
    else                                                                                    \
        for (i = 0; i < n; i++, p += (SIZE))                                                \
            PUT(p, v[i]);
#define PUT8(p, x) (*(p) = (unsigned char)(x))
    switch (size) {
    case 1:
        PACK(1, PUT8)
        break;
    case 2:
        PACK(2, put16)
        break;
    case 4:
        PACK(4, put32)
        break;
    default:
        PACK(8, put64)
        break;
    }
#undef PUT8
#undef PACK
    return p;
}

/* _narrowest(lo, hi) for lo <= hi within int64: its width code */
static int
narrowest(int64_t lo, int64_t hi)
{
    if (lo >= 0) {
        uint64_t h = (uint64_t)hi;
        return h <= UINT8_MAX ? 1 : h <= UINT16_MAX ? 2 : h <= UINT32_MAX ? 4 : 8;
    }
    if (lo >= INT8_MIN && hi <= INT8_MAX)
        return SIGNED | 1;
    if (lo >= INT16_MIN && hi <= INT16_MAX)
        return SIGNED | 2;
    if (lo >= INT32_MIN && hi <= INT32_MAX)
        return SIGNED | 4;
    return SIGNED | 8;
}

/* The column scans below, compiled twice where the compiler can: for CPUs with AVX2 (four
 * values compared at once) and for any x86-64; the loader picks one for the CPU (an ifunc:
 * glibc's dynamic loader, not every libc's). */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define SCAN __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef SCAN
#define SCAN
#endif

/* The least and greatest of the n >= 1 values v[] as int64, without branches (a column such
 * as depth or a name's index goes up and down at random) */
static SCAN void
value_range(const uint64_t *v, Py_ssize_t n, int64_t *lo, int64_t *hi)
{
    int64_t l = (int64_t)v[0], h = l;
    for (Py_ssize_t i = 1; i < n; i++) {
        int64_t x = (int64_t)v[i];
        l = x < l ? x : l;
        h = x > h ? x : h;
    }
    *lo = l;
    *hi = h;
}

/* The least and greatest of the n - 1 >= 1 differences v[i] - v[i - 1], none of which
 * overflows int64 (the caller knows) */
static SCAN void
delta_range(const uint64_t *v, Py_ssize_t n, int64_t *lo, int64_t *hi)
{
    int64_t l = (int64_t)(v[1] - v[0]), h = l;
    for (Py_ssize_t i = 2; i < n; i++) {
        int64_t d = (int64_t)(v[i] - v[i - 1]);
        l = d < l ? d : l;
        h = d > h ? d : h;
    }
    *lo = l;
    *hi = h;
}

/* A const column: _INT_CONST, then _bigint(x): a u32 length and
 * x.to_bytes(x.bit_length() // 8 + 1, "little", signed=True). */
static unsigned char *
write_const(unsigned char *p, uint64_t x, int negative)
{
    uint64_t mag = negative ? (uint64_t)0 - x : x;
    int bits = 0;
    while (mag) {
        bits++;
        mag >>= 1;
    }
    int len = bits / 8 + 1; /* at most 9 */
    *p++ = INT_CONST;
    put32(p, (uint64_t)len);
    p += 4;
    for (int k = 0; k < len; k++)
        p[k] = k < 8 ? (unsigned char)(x >> (8 * k)) : (negative ? 0xFF : 0x00);
    return p + len;
}

/* Write at p what _encode_ints(values, out, try_delta) appends for the n values v[] that
 * read_int() read (`seen` is what it saw). Returns the end, or NULL to decline: no values,
 * or a column that needs the big-integer encoding. */
static unsigned char *
write_ints(unsigned char *p, const uint64_t *v, Py_ssize_t n, int seen, int try_delta)
{
    Py_ssize_t i;
    if (n <= 0 || (seen & (SEEN_NEG | SEEN_BIG)) == (SEEN_NEG | SEEN_BIG))
        return NULL;
    if (seen & SEEN_BIG) {
        /* every value in [0, 2**64), some beyond int64: const or plain u64 (never delta,
         * whose values must all fit i64) */
        Py_ssize_t differ = 0;
        for (i = 1; i < n && !differ; i++)
            differ = v[i] != v[0];
        if (!differ)
            return write_const(p, v[0], 0);
        *p++ = INT_PLAIN;
        *p++ = 8;
        return pack(p, v, n, 8, 0);
    }
    /* every value fits int64 */
    int64_t first = (int64_t)v[0], lo, hi;
    value_range(v, n, &lo, &hi);
    if (lo == hi)
        return write_const(p, v[0], first < 0);
    if (try_delta) {
        /* _sample_width: the width guessed from values[::n // _WIDTH_SAMPLES] */
        Py_ssize_t step = n / WIDTH_SAMPLES;
        if (step < 1)
            step = 1;
        int64_t slo = first, shi = first;
        for (i = step; i < n; i += step) {
            int64_t x = (int64_t)v[i];
            slo = x < slo ? x : slo;
            shi = x > shi ? x : shi;
        }
        if (SIZE(narrowest(slo, shi)) == 8) {
            /* the differences, in the narrowest width that holds them all (what _pack ends
             * up with, whatever its guess); one beyond int64 needs 8 bytes: no delta */
            int64_t dlo = (int64_t)(v[1] - v[0]), dhi = dlo;
            int wide = 0;
            if ((uint64_t)hi - (uint64_t)lo <= (uint64_t)INT64_MAX) {
                /* every difference lies in [lo - hi, hi - lo]: none overflows (timestamps,
                 * the usual 8-byte column), so no check a value */
                delta_range(v, n, &dlo, &dhi);
            }
            else {
                for (i = 1; i < n; i++) {
                    int64_t a = (int64_t)v[i], b = (int64_t)v[i - 1];
                    int64_t d = (int64_t)(v[i] - v[i - 1]);
                    if (((a ^ b) & (a ^ d)) < 0) { /* a - b overflowed */
                        wide = 1;
                        break;
                    }
                    dlo = d < dlo ? d : dlo;
                    dhi = d > dhi ? d : dhi;
                }
            }
            int dcode = wide ? 8 : narrowest(dlo, dhi);
            if (SIZE(dcode) < 8) { /* and every value fits i64: _deltas_stay_i64 holds */
                *p++ = INT_DELTA;
                put64(p, v[0]);
                p += 8;
                *p++ = (unsigned char)dcode;
                return pack(p, v, n, SIZE(dcode), 1);
            }
        }
    }
    int code = narrowest(lo, hi);
    *p++ = INT_PLAIN;
    *p++ = (unsigned char)code;
    return pack(p, v, n, SIZE(code), 0);
}

/* ---------------------------------------------------------------------------------------- */
/* the functions                                                                              */

static int
column_kind(PyObject *name)
{
    if (!PyUnicode_CheckExact(name))
        return -1;
    if (PyUnicode_CompareWithASCIIString(name, "u64") == 0 ||
        PyUnicode_CompareWithASCIIString(name, "s64") == 0)
        return K_INT_DELTA;
    if (PyUnicode_CompareWithASCIIString(name, "str") == 0)
        return K_STR;
    if (PyUnicode_CompareWithASCIIString(name, "bool") == 0)
        return K_INT;
    if (PyUnicode_CompareWithASCIIString(name, "f64") == 0)
        return K_F64;
    return -1;
}

/* n values, COLUMN_MAX(n) bytes each for ncols columns, or NULL with MemoryError */
static PyObject *
new_output(Py_ssize_t n, Py_ssize_t ncols)
{
    if (n > (PY_SSIZE_T_MAX / (ncols > 0 ? ncols : 1) - 14) / 8)
        return PyErr_NoMemory();
    return PyBytes_FromStringAndSize(NULL, COLUMN_MAX(n) * (ncols > 0 ? ncols : 1));
}

/* Shrink `res` to end at `end` and append it to `out`: 0, or -1 with an error (res released). */
static int
finish(PyObject *res, unsigned char *end, PyObject *out)
{
    Py_ssize_t used = (Py_ssize_t)(end - (unsigned char *)PyBytes_AS_STRING(res));
    if (_PyBytes_Resize(&res, used) < 0)
        return -1;
    int r = PyList_Append(out, res);
    Py_DECREF(res);
    return r;
}

/* Add a string the table lacks, as _encode_strings does: strings[s] = len(strings), and
 * new_strings.append(s). Its index in *index; 0, or -1 with an error (the table unchanged). */
static int
add_string(PyObject *strings, PyObject *new_strings, PyObject *s, uint64_t *index)
{
    Py_ssize_t next = PyDict_GET_SIZE(strings);
    PyObject *num = PyLong_FromSsize_t(next);
    if (num == NULL)
        return -1;
    int r = PyDict_SetItem(strings, s, num);
    Py_DECREF(num);
    if (r < 0)
        return -1;
    if (PyList_Append(new_strings, s) < 0) {
        PyObject *exc = PyErr_GetRaisedException();
        if (PyDict_DelItem(strings, s) < 0)
            PyErr_Clear();
        PyErr_SetRaisedException(exc);
        return -1;
    }
    *index = (uint64_t)next;
    return 0;
}

PyDoc_STRVAR(encode_group_doc,
"encode_group(group, types, strings, new_strings, out) -> bool\n\
\n\
Append to out (as one bytes object) what TraceWriter._encode_group appends for\n\
the columns 1 .. len(types) of the event tuples in the list group; types[i] is the\n\
field type of column i + 1: 'u64', 's64', 'bool', 'str' or 'f64'. Strings are\n\
looked up in the dict strings (str -> index); those it lacks are added to it and to\n\
the list new_strings, as _encode_strings does. Returns False, having changed\n\
nothing, when the group needs the Python encoder: an event that is not a tuple of\n\
1 + len(types) items, a value of another type, an integer column beyond 64 bits,\n\
an unknown type name, an empty group.");

static PyObject *
encode_group(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "encode_group() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *group = args[0], *types = args[1], *strings = args[2];
    PyObject *new_strings = args[3], *out = args[4];
    if (!PyList_Check(group) || !PyTuple_Check(types) || !PyDict_Check(strings) ||
        !PyList_Check(new_strings) || !PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_group(list, tuple, dict, list, list): wrong argument types");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(group), ncols = PyTuple_GET_SIZE(types), i, c;
    /* a lookup in a dict subclass may run Python code */
    if (n == 0 || ncols == 0 || ncols > MAX_COLUMNS || !PyDict_CheckExact(strings))
        Py_RETURN_FALSE;
    struct column {
        int kind, seen, missing; /* missing: strings the table lacks (their index left 0) */
        PyObject *last;          /* the previous string of the column, often the same object */
        uint64_t last_index;
        uint64_t *v;             /* the n values, or indices of strings, or f64 bits */
    } cols[MAX_COLUMNS];
    for (c = 0; c < ncols; c++) {
        cols[c].kind = column_kind(PyTuple_GET_ITEM(types, c));
        if (cols[c].kind < 0)
            Py_RETURN_FALSE;
        cols[c].seen = cols[c].missing = 0;
        cols[c].last = NULL;
        cols[c].last_index = 0;
    }
    /* 8 bytes per item, as much as the tuples hold in pointers (the output is allocated at
     * its upper bound and shrunk: pages never written are never touched) */
    if (n > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(uint64_t) / ncols)
        return PyErr_NoMemory();
    uint64_t *values = PyMem_Malloc((size_t)n * (size_t)ncols * sizeof(uint64_t));
    if (values == NULL)
        return PyErr_NoMemory();
    for (c = 0; c < ncols; c++)
        cols[c].v = values + c * n;
    PyObject *res = NULL;
    unsigned char *p = NULL;
    int r = 0; /* 0 fine, 1 decline, -1 error */

    /* one pass over the events, row by row (each event's items are read at once): no
     * side effects, so declining here leaves everything as it was */
    for (i = 0; i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(group, i);
        if (!PyTuple_CheckExact(ev) || PyTuple_GET_SIZE(ev) != ncols + 1) {
            r = 1;
            goto done;
        }
        PyObject **items = ((PyTupleObject *)ev)->ob_item + 1;
        for (c = 0; c < ncols; c++) {
            struct column *col = &cols[c];
            PyObject *o = items[c];
            switch (col->kind) {
            case K_F64:
                r = read_double(o, &col->v[i]);
                break;
            case K_STR: {
                if (o == col->last) {
                    col->v[i] = col->last_index;
                    break;
                }
                if (!PyUnicode_CheckExact(o)) {
                    r = 1;
                    break;
                }
                PyObject *index = PyDict_GetItemWithError(strings, o); /* borrowed */
                if (index != NULL) {
                    r = read_int(index, &col->v[i], &col->seen);
                    col->last = o;
                    col->last_index = col->v[i];
                }
                else if (PyErr_Occurred()) {
                    r = -1;
                }
                else {
                    col->missing = 1; /* added below; no side effects in this pass */
                    col->v[i] = 0;
                }
                break;
            }
            default:
                r = read_int(o, &col->v[i], &col->seen);
                break;
            }
            if (r)
                goto done;
        }
    }
    for (c = 0; c < ncols; c++) {
        if ((cols[c].seen & (SEEN_NEG | SEEN_BIG)) == (SEEN_NEG | SEEN_BIG)) {
            r = 1; /* the big-integer encoding */
            goto done;
        }
    }
    /* the strings the table lacks, added column by column in first-seen order (the order
     * _encode_strings adds them in); from here on only an error stops the call (the indices
     * met were read above, or are the ints add_string stores) */
    for (c = 0; c < ncols; c++) {
        struct column *col = &cols[c];
        if (!col->missing)
            continue;
        for (i = 0; i < n; i++) {
            PyObject *s = PyTuple_GET_ITEM(PyList_GET_ITEM(group, i), c + 1);
            PyObject *index = PyDict_GetItemWithError(strings, s);
            if (index != NULL)
                r = read_int(index, &col->v[i], &col->seen);
            else if (PyErr_Occurred())
                r = -1;
            else
                r = add_string(strings, new_strings, s, &col->v[i]);
            if (r)
                goto done;
        }
    }
    if ((res = new_output(n, ncols)) == NULL) {
        r = -1;
        goto done;
    }
    p = (unsigned char *)PyBytes_AS_STRING(res);
    for (c = 0; c < ncols && p != NULL; c++) {
        if (cols[c].kind == K_F64)
            p = pack(p, cols[c].v, n, 8, 0);
        else
            p = write_ints(p, cols[c].v, n, cols[c].seen, cols[c].kind == K_INT_DELTA);
    }
    if (p == NULL)
        r = 1; /* not reached: n > 0, and the big-integer columns were declined above */
done:
    PyMem_Free(values);
    if (r) {
        Py_XDECREF(res);
        if (r < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    if (finish(res, p, out) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(encode_ints_doc,
"encode_ints(values, out, try_delta) -> bool\n\
\n\
Append to out the bytes tracefile._encode_ints(values, out, try_delta) appends for\n\
the list of ints values (as one bytes object). Returns False having appended\n\
nothing when that needs the Python encoder: a value that is not an exact int or\n\
bool, a column beyond 64 bits (the big-integer encoding), an empty list.");

static PyObject *
encode_ints(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "encode_ints() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *values = args[0], *out = args[1];
    if (!PyList_Check(values) || !PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "encode_ints(list, list, bool): wrong argument types");
        return NULL;
    }
    int try_delta = PyObject_IsTrue(args[2]);
    if (try_delta < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), i;
    if (n == 0)
        Py_RETURN_FALSE;
    if ((size_t)n > PY_SSIZE_T_MAX / sizeof(uint64_t))
        return PyErr_NoMemory();
    uint64_t *v = PyMem_Malloc((size_t)n * sizeof(uint64_t));
    if (v == NULL)
        return PyErr_NoMemory();
    int r = 0, seen = 0;
    for (i = 0; i < n && r == 0; i++)
        r = read_int(PyList_GET_ITEM(values, i), &v[i], &seen);
    PyObject *res = NULL;
    unsigned char *end = NULL;
    if (r == 0) {
        res = new_output(n, 1);
        if (res == NULL)
            r = -1;
        else if ((end = write_ints((unsigned char *)PyBytes_AS_STRING(res), v, n, seen,
                                   try_delta)) == NULL)
            r = 1;
    }
    PyMem_Free(v);
    if (r) {
        Py_XDECREF(res);
        if (r < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    if (finish(res, end, out) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* CRC-32 (zlib's), which never releases the GIL                                              */

/* zlib.crc32() releases the GIL for buffers over 5 KB. The drain thread that writes a
 * recording must not: a CPU-bound program holding the GIL then keeps it for a whole switch
 * interval (5 ms), time in which it fills the ring the drain thread is emptying.
 *
 * Two ways, the same CRC: tables (slice-by-16, byte order independent: bytes are assembled
 * little-endian), and on x86-64 CPUs with PCLMULQDQ, folding (crc32_fold(): ~0.4
 * instructions a byte where the tables take ~3.6, a tenth of the drain's work per event). */
#define CRC_POLY 0x04C11DB7u           /* zlib's CRC-32, x^32 left implicit */
#define CRC_POLY_REFLECTED 0xEDB88320u /* the same, bit-reversed (what the tables use) */
static uint32_t crc_table[16][256];
static int crc_ready;
static int crc_clmul; /* crc32_fold() is used (the CPU has PCLMULQDQ; tests: _crc_clmul()) */

/* The CRC state (before the final inversion) after the n bytes at p, from state crc, through
 * the tables */
static uint32_t
crc32_sliced(uint32_t crc, const unsigned char *p, size_t n)
{
    const uint32_t (*T)[256] = (const uint32_t (*)[256])crc_table;
    while (n >= 16) {
        uint32_t w0 = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t w1 = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        uint32_t w2 = (uint32_t)p[8] | (uint32_t)p[9] << 8 | (uint32_t)p[10] << 16 |
                      (uint32_t)p[11] << 24;
        uint32_t w3 = (uint32_t)p[12] | (uint32_t)p[13] << 8 | (uint32_t)p[14] << 16 |
                      (uint32_t)p[15] << 24;
        crc = T[15][w0 & 0xFF] ^ T[14][(w0 >> 8) & 0xFF] ^ T[13][(w0 >> 16) & 0xFF] ^
              T[12][w0 >> 24] ^ T[11][w1 & 0xFF] ^ T[10][(w1 >> 8) & 0xFF] ^
              T[9][(w1 >> 16) & 0xFF] ^ T[8][w1 >> 24] ^ T[7][w2 & 0xFF] ^
              T[6][(w2 >> 8) & 0xFF] ^ T[5][(w2 >> 16) & 0xFF] ^ T[4][w2 >> 24] ^
              T[3][w3 & 0xFF] ^ T[2][(w3 >> 8) & 0xFF] ^ T[1][(w3 >> 16) & 0xFF] ^
              T[0][w3 >> 24];
        p += 16;
        n -= 16;
    }
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^
              T[4][lo >> 24] ^ T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^
              T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = T[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_CRC_FOLD 1
#include <immintrin.h>

/* x^n mod the CRC's polynomial, in the ordinary bit order (bit k: x^k) */
static uint32_t
crc_xpow(unsigned n)
{
    uint32_t r = 1;
    while (n--)
        r = (r & 0x80000000u) ? (r << 1) ^ CRC_POLY : r << 1;
    return r;
}

static uint32_t
reverse32(uint32_t x)
{
    uint32_t r = 0;
    for (int k = 0; k < 32; k++, x >>= 1)
        r = (r << 1) | (x & 1);
    return r;
}

/* What moves 128 bits of data `bits` bits further on, for crc32_fold(): x^(bits + 63) mod P
 * for their low 64-bit half (the first eight bytes: the higher powers), x^(bits - 1) mod P
 * for the high half, each in the bit-reflected order of the data (bit k of a 64-bit half:
 * x^(63 - k)). The extra -1: a carry-less product of two reflected 64-bit halves comes out
 * as the reflected product times x. */
static __m128i
crc_fold_constant(unsigned bits)
{
    uint64_t lo = (uint64_t)reverse32(crc_xpow(bits + 63)) << 32;
    uint64_t hi = (uint64_t)reverse32(crc_xpow(bits - 1)) << 32;
    return _mm_set_epi64x((long long)hi, (long long)lo);
}

/* crc_fold_constant(128 * (k + 1)), k = 0 .. 3 (crc_init()) */
static __m128i crc_fold_by[4];
#define FOLD_16 crc_fold_by[0]
#define FOLD_32 crc_fold_by[1]
#define FOLD_48 crc_fold_by[2]
#define FOLD_64 crc_fold_by[3]

/* a (128 bits of data) moved on as k says: congruent to a * x^bits modulo P, in 128 bits */
__attribute__((target("pclmul"))) static inline __m128i
crc_fold_move(__m128i a, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11));
}

/* a moved on as k says, plus the next 16 bytes at p */
__attribute__((target("pclmul"))) static inline __m128i
crc_fold_in(__m128i a, __m128i k, const unsigned char *p)
{
    return _mm_xor_si128(crc_fold_move(a, k), _mm_loadu_si128((const __m128i *)p));
}

/* The CRC state (before the final inversion) after n >= 64 bytes at p, from state s. The
 * bytes as a polynomial D (the first byte's bit 0 the highest power), s XOR-ed into the first
 * four: s * x^(8n) + D * x^32 is then D' * x^32, D' those bytes. D' is folded 64 bytes at a
 * time in four 128-bit lanes (four independent products: the CPU overlaps them), then into
 * one, then 16 bytes at a time: 128 bits congruent to D' modulo P, whose CRC from state 0
 * is D' * x^32 mod P. The bytes after the last whole 16 go on through the tables. */
__attribute__((target("pclmul"))) static uint32_t
crc32_fold(uint32_t s, const unsigned char *p, size_t n)
{
    __m128i a0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)s));
    __m128i a1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i a2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i a3 = _mm_loadu_si128((const __m128i *)(p + 48));
    for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
        a0 = crc_fold_in(a0, FOLD_64, p);
        a1 = crc_fold_in(a1, FOLD_64, p + 16);
        a2 = crc_fold_in(a2, FOLD_64, p + 32);
        a3 = crc_fold_in(a3, FOLD_64, p + 48);
    }
    __m128i a = _mm_xor_si128(_mm_xor_si128(crc_fold_move(a0, FOLD_48), crc_fold_move(a1, FOLD_32)),
                              _mm_xor_si128(crc_fold_move(a2, FOLD_16), a3));
    for (; n >= 16; p += 16, n -= 16)
        a = crc_fold_in(a, FOLD_16, p);
    unsigned char folded[16];
    _mm_storeu_si128((__m128i *)folded, a);
    return crc32_sliced(crc32_sliced(0, folded, 16), p, n);
}
#endif /* x86-64 */

static void
crc_init(void)
{
    /* Deterministic data written once before use (a second interpreter importing the module
     * at the same moment would write the same values). */
    if (crc_ready)
        return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? CRC_POLY_REFLECTED ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 16; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#ifdef HAVE_CRC_FOLD
    for (int k = 0; k < 4; k++)
        crc_fold_by[k] = crc_fold_constant(128 * (unsigned)(k + 1));
    __builtin_cpu_init();
    crc_clmul = __builtin_cpu_supports("pclmul");
#endif
    crc_ready = 1;
}

/* zlib.crc32(p[:n], crc) */
static uint32_t
crc32_update(uint32_t crc, const unsigned char *p, size_t n)
{
#ifdef HAVE_CRC_FOLD
    if (crc_clmul && n >= 64)
        return ~crc32_fold(~crc, p, n);
#endif
    return ~crc32_sliced(~crc, p, n);
}

PyDoc_STRVAR(crc32_doc,
"crc32(data, value=0) -> int\n\
\n\
zlib.crc32(data, value), computed without releasing the GIL.");

static PyObject *
tfenc_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "crc32() takes 1 or 2 arguments (%zd given)", nargs);
        return NULL;
    }
    unsigned long value = 0;
    if (nargs == 2) {
        /* zlib.crc32 takes the value modulo 2**32 */
        value = PyLong_AsUnsignedLongMask(args[1]);
        if (value == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = crc32_update((uint32_t)value, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc_clmul_doc,
"_crc_clmul([on]) -> bool\n\
\n\
Whether crc32() (and the encoder's chunk CRCs) fold with PCLMULQDQ rather than use\n\
the tables, before the call; on: False makes them use the tables, True folds where\n\
the CPU can (for tests and measurements).");

static PyObject *
tfenc_crc_clmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    int old = crc_clmul;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "_crc_clmul() takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1) {
        int on = PyObject_IsTrue(args[0]);
        if (on < 0)
            return NULL;
        crc_clmul = 0;
#ifdef HAVE_CRC_FOLD
        crc_clmul = on && __builtin_cpu_supports("pclmul");
#endif
    }
    return PyBool_FromLong(old);
}

/* ---------------------------------------------------------------------------------------- */
/* Writing a round's chunks, the GIL held                                                     */

/* os.writev() releases the GIL for the call. The drain thread then waits to get it back: a
 * CPU-bound program thread keeps it a switch interval (5 ms) once asked, and with several
 * program threads waiting the drain wins one handoff in several. A round that writes a chunk
 * run per thread waited that long once per thread, while the rings filled. A write of a
 * round's chunks (a few MB) into the page cache takes well under a millisecond: hold the GIL
 * for it. Only for a regular file (TraceWriter's choice): a pipe may block for as long as its
 * reader pleases. */

PyDoc_STRVAR(write_held_doc,
"write_held(fd, parts) -> int\n\
\n\
Write every bytes-like object of the list parts, in order, to the file descriptor\n\
fd (a regular file), as os.writev does, without releasing the GIL: short writes and\n\
EINTR are retried. Returns the bytes written; raises OSError.");

#define WRITE_HELD_IOV 64 /* pieces per writev() call */
#define NOTHING_WRITTEN (EIO + 1000) /* writev_all(): a write took nothing (not an errno) */

/* Every byte of iov[0..n) written to fd, in order: short writes and EINTR retried (iov is
 * advanced as it goes). 0, NOTHING_WRITTEN, or the errno of the failed writev(). Needs no
 * GIL. */
static int
writev_all(int fd, struct iovec *iov, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (iov[i].iov_len == 0) {
            i++;
            continue;
        }
        int count = n - i < WRITE_HELD_IOV ? (int)(n - i) : WRITE_HELD_IOV;
        ssize_t done = writev(fd, &iov[i], count);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (done == 0)
            return NOTHING_WRITTEN;
        while (i < n && (size_t)done >= iov[i].iov_len) {
            done -= (ssize_t)iov[i].iov_len;
            i++;
        }
        if (done) { /* a short write, mid-piece */
            iov[i].iov_base = (char *)iov[i].iov_base + done;
            iov[i].iov_len -= (size_t)done;
        }
    }
    return 0;
}

/* writev_all()'s failure (err, not 0) as the OSError of the call named `who`. */
static void
write_failed(int err, const char *who)
{
    if (err == NOTHING_WRITTEN) {
        PyErr_Format(PyExc_OSError, "%s: nothing written", who);
        return;
    }
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
}

static PyObject *
write_held(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "write_held(fd, parts): an int and a list");
        return NULL;
    }
    int fd = PyObject_AsFileDescriptor(args[0]);
    if (fd < 0)
        return NULL;
    PyObject *parts = args[1];
    Py_ssize_t n = PyList_GET_SIZE(parts);
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    struct iovec *iov = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(struct iovec));
    Py_ssize_t got = 0, total = 0;
    PyObject *result = NULL;
    if (views == NULL || iov == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* (the list is ours for the call: nothing here runs Python code) */
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(parts, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
        iov[got].iov_base = views[got].buf;
        iov[got].iov_len = (size_t)views[got].len;
    }
    for (Py_ssize_t k = 0; k < n; k++)
        total += (Py_ssize_t)iov[k].iov_len;
    int err = writev_all(fd, iov, n);
    if (err != 0) {
        write_failed(err, "write_held()");
        goto done;
    }
    result = PyLong_FromSsize_t(total);
done:
    for (Py_ssize_t k = 0; k < got; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free(iov);
    return result;
}

/* The same for a read the drain makes between its rounds: the signal wakeup pipe
 * (runner/exits.py's check_signals), non-blocking, which os.read() would make a handoff. */
PyDoc_STRVAR(read_held_doc,
"read_held(fd, n) -> bytes\n\
\n\
Read at most n bytes from the file descriptor fd, as os.read does, without releasing\n\
the GIL: for a descriptor that never blocks (O_NONBLOCK). EINTR is retried; raises\n\
OSError (BlockingIOError when there is nothing to read).");

static PyObject *
read_held(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read_held(fd, n): two ints");
        return NULL;
    }
    int fd = PyObject_AsFileDescriptor(args[0]);
    if (fd < 0)
        return NULL;
    Py_ssize_t n = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n > (1 << 20)) {
        PyErr_Format(PyExc_ValueError, "read_held(): n must be in [0, 2**20], not %zd", n);
        return NULL;
    }
    char *buf = PyMem_Malloc((size_t)(n ? n : 1));
    if (buf == NULL)
        return PyErr_NoMemory();
    ssize_t got;
    do
        got = read(fd, buf, (size_t)n);
    while (got < 0 && errno == EINTR);
    PyObject *result = got < 0 ? PyErr_SetFromErrno(PyExc_OSError)
                               : PyBytes_FromStringAndSize(buf, (Py_ssize_t)got);
    PyMem_Free(buf);
    return result;
}

/* ---------------------------------------------------------------------------------------- */
/* The fused drain: a native ring's records straight into EVTS payloads                       */

/* What TraceWriter.write_events(native.consumed_items(ring.consume(tid, name_of), tid))
 * writes, without an event tuple per record. The records become what _cring's event_tuple()
 * makes of them; here each column of each event group is filled from the records directly
 * and encoded with write_ints(), the same code encode_group() ends in. What the tuple path
 * would do differently -- a record of an unknown type (a PRINT event), a name that is not an
 * exact str, a string table holding something else than the ints it stores -- is declined:
 * the records are then decoded into event tuples (the capsule's events(), what
 * Ring.consume() does) and handed back for write_events().
 *
 * A call that lets the GIL go (releases_gil()) detaches the ring's array: see "The detached
 * drain". The others, with the GIL held throughout, in these steps, and why in this order:
 *   1. name_records(): every readable record is named, in ring order, name_of called once per
 *      distinct code (held by the table from then on; one a NameCache names already is not
 *      named again, see NameCache). name_of runs Python code, during which
 *      the program may write, overwrite, clear or resize the ring: the pass carries on or
 *      starts again, and ends having looked at every record of [floor, head) with no Python
 *      code run since. It notes each record's type and names (slots of the table) by ring
 *      position.
 *   2. take_in_place(): Ring.consume()'s accounting, the records left in their slots.
 *   3. encode_batch() per batch (write_events' slices) reads the records in their slots --
 *      the columns built, names turned into string table indices (strings the table lacks
 *      added as _encode_strings adds them, batch after batch, so the table's order is the
 *      tuple path's), the columns encoded, the payload's CRC computed, into one output
 *      area -- their references taken out as they are read (released at once: no release
 *      frees anything here). Nothing here may run Python code: a writer would release the
 *      references still in the slots.
 *   4. the result built, the names released (codes freed now run their weakref callbacks)
 *      or kept in the NameCache for the next call. */

/* The fused drain's passes are functions of their own in a profile (each runs once a call) */
#if defined(__GNUC__)
#define PASS __attribute__((noinline))
#else
#define PASS
#endif

/* Where the value of a column comes from, in a record */
enum { S_END, S_TS, S_TID, S_DEPTH, S_CODE, S_PARENT, S_EMPTY, S_CALLTIME, S_OVERRUN,
       S_SLEEP, S_FLAGS };

#define RING_TYPES 6 /* record types are 1 .. 5 */
#define RING_COLUMNS 9 /* the most columns a record type has (ts, tid, then its fields) */

/* The columns (ts, tid, fields) of the event each record type becomes (tracers/formats.py,
 * as _cring.c's event_tuple() fills them): the writer checks that its formats have these
 * field types (RING_LAYOUTS) before calling encode_ring(). */
static const unsigned char LAYOUT[RING_TYPES][RING_COLUMNS + 1] = {
    [RH_FUNCTION] = {S_TS, S_TID, S_CODE, S_PARENT, S_DEPTH}, /* depth: the caller's line */
    [RH_FUNCGRAPH_ENTRY] = {S_TS, S_TID, S_DEPTH, S_CODE, S_EMPTY},
    [RH_FUNCGRAPH_EXIT] = {S_TS, S_TID, S_DEPTH, S_CODE, S_CALLTIME, S_OVERRUN, S_SLEEP,
                           S_FLAGS, S_EMPTY},
    [RH_FUNCGRAPH_SUSPEND] = {S_TS, S_TID, S_DEPTH, S_CODE},
    [RH_FUNCGRAPH_RESUME] = {S_TS, S_TID, S_DEPTH, S_CODE},
};

static int
layout_width(int type)
{
    int c = 0;
    while (c < RING_COLUMNS && LAYOUT[type][c] != S_END)
        c++;
    return c;
}

static int
is_str_source(int src)
{
    return src == S_CODE || src == S_PARENT || src == S_EMPTY;
}

/* A string index not known yet (its top bit set: a column's OR of its values shows it):
 * NO_INDEX, the string was not in the table when looked up (slot_index() adds it, looking
 * again first); UNCHECKED, not looked up in this table yet (a NameCache's slot whose index
 * was forgotten: the table is another one, or lost its newest strings). */
#define NO_INDEX UINT64_MAX
#define UNCHECKED (UINT64_MAX - 1)

/* The names of one call, or of a NameCache's calls: code object -> slot, slot -> (name,
 * string table index). The codes are held (a record naming one may be overwritten while
 * name_of runs; a NameCache's, so that no other code gets the address of one it names), the
 * names too. Slot 0 is "" (no parent, no args, no retval); a NULL code (never written by the
 * native users) is named "?" as _cring does. */
typedef struct {
    PyObject *name;
    uint64_t index; /* in the writer's string table, or NO_INDEX, or UNCHECKED */
    PyObject *code; /* the code it names (the table's key holds it), NULL for "" and "?" */
} Slot;

/* An int32 by non-zero 64-bit key (a code's address, a call site), open addressing, at most
 * half full (a full one would never end a probe); key 0: a free place. */
typedef struct {
    uint64_t *keys;
    int32_t *vals;
    size_t mask, used;
} Table;

static inline size_t
key_hash(uint64_t x)
{
    x ^= x >> 4;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 17);
}

/* The value of key, or -1. Runs no Python code, needs no GIL. */
static inline int32_t
table_find(const Table *t, uint64_t key)
{
    if (t->keys == NULL)
        return -1;
    for (size_t j = key_hash(key) & t->mask; t->keys[j] != 0; j = (j + 1) & t->mask)
        if (t->keys[j] == key)
            return t->vals[j];
    return -1;
}

/* Room for one more key: 0, or -1 without memory (the table unchanged, no error set). */
static int
table_room(Table *t)
{
    if (t->keys != NULL && (t->used + 1) * 2 <= t->mask + 1)
        return 0;
    size_t cap = t->keys == NULL ? 64 : (t->mask + 1) * 2;
    uint64_t *keys = PyMem_Calloc(cap, sizeof(uint64_t));
    int32_t *vals = PyMem_Malloc(cap * sizeof(int32_t));
    if (keys == NULL || vals == NULL) {
        PyMem_Free(keys);
        PyMem_Free(vals);
        return -1;
    }
    for (size_t i = 0; t->keys != NULL && i <= t->mask; i++) {
        if (t->keys[i] == 0)
            continue;
        size_t j = key_hash(t->keys[i]) & (cap - 1);
        while (keys[j] != 0)
            j = (j + 1) & (cap - 1);
        keys[j] = t->keys[i];
        vals[j] = t->vals[i];
    }
    PyMem_Free(t->keys);
    PyMem_Free(t->vals);
    t->keys = keys;
    t->vals = vals;
    t->mask = cap - 1;
    return 0;
}

/* Add a key not in the table, once table_room() made room for it. */
static void
table_put(Table *t, uint64_t key, int32_t val)
{
    size_t j = key_hash(key) & t->mask;
    while (t->keys[j] != 0)
        j = (j + 1) & t->mask;
    t->keys[j] = key;
    t->vals[j] = val;
    t->used++;
}

static void
table_free(Table *t)
{
    PyMem_Free(t->keys);
    PyMem_Free(t->vals);
    memset(t, 0, sizeof(*t));
}

typedef struct {
    Table codes; /* code object (its address, a reference held) -> slot */
    Slot *slots;
    int32_t nslots, cap;
    int32_t unknown;    /* the slot of "?", or -1 */
    PyObject *last_code;
    int32_t last_slot;
    /* Callers' lines by (the caller's slot, the call's instruction offset), as the function
     * records' RH_CALLER_OFFSET leave them to readers (lines_find()): learnt with the GIL,
     * read without it (a caller's slot is never 0: no key is) */
    Table lines;
} Names;

/* Release what the table holds (may run Python code: codes freed). */
static void
names_free(Names *nm)
{
    for (size_t i = 0; nm->codes.keys != NULL && i <= nm->codes.mask; i++)
        Py_XDECREF((PyObject *)(uintptr_t)nm->codes.keys[i]);
    for (int32_t s = 0; s < nm->nslots; s++)
        Py_XDECREF(nm->slots[s].name);
    PyMem_Free(nm->slots);
    table_free(&nm->codes);
    table_free(&nm->lines);
    memset(nm, 0, sizeof(*nm));
}

/* A string table index as _encode_strings would use it: 0 found (*index), 1 not in the
 * table, 2 decline (a value other than an int in [0, INT64_MAX]), -1 error. */
static int
table_index(PyObject *strings, PyObject *s, uint64_t *index)
{
    PyObject *v = PyDict_GetItemWithError(strings, s);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 1;
    int seen = 0;
    int r = read_int(v, index, &seen);
    if (r < 0)
        return -1;
    return r == 0 && seen == 0 ? 0 : 2;
}

/* Add a slot holding name (a new reference, stolen), with its index in the string table if
 * it has one. Its number; -1 with an error; -2 decline (the table holds something odd). */
static int32_t
names_add_slot(Names *nm, PyObject *strings, PyObject *name)
{
    if (nm->nslots == nm->cap) {
        int32_t cap = nm->cap ? nm->cap * 2 : 64;
        Slot *slots = cap < INT32_MAX / 2 ? PyMem_Realloc(nm->slots, (size_t)cap * sizeof(Slot))
                                          : NULL;
        if (slots == NULL) {
            Py_DECREF(name);
            PyErr_NoMemory();
            return -1;
        }
        nm->slots = slots;
        nm->cap = cap;
    }
    uint64_t index;
    int r = table_index(strings, name, &index);
    if (r < 0 || r == 2) {
        Py_DECREF(name);
        return r < 0 ? -1 : -2;
    }
    nm->slots[nm->nslots].name = name;
    nm->slots[nm->nslots].index = r == 0 ? index : NO_INDEX;
    nm->slots[nm->nslots].code = NULL;
    return nm->nslots++;
}

/* 0, -1 with an error, -2 decline */
static int
names_init(Names *nm, PyObject *strings)
{
    memset(nm, 0, sizeof(*nm));
    nm->unknown = -1;
    nm->last_slot = -1;
    if (table_room(&nm->codes) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *empty = PyUnicode_FromString("");
    if (empty == NULL)
        return -1;
    int32_t s = names_add_slot(nm, strings, empty);
    return s < 0 ? s : 0;
}

/* The slot of a code already named, or -1. Runs no Python code. */
static inline int32_t
names_find(Names *nm, PyObject *code)
{
    if (code == nm->last_code && nm->last_slot >= 0)
        return nm->last_slot;
    if (code == NULL)
        return nm->unknown;
    int32_t s = table_find(&nm->codes, (uintptr_t)code);
    if (s >= 0) {
        nm->last_code = code;
        nm->last_slot = s;
    }
    return s;
}

static inline uint64_t
line_key(int32_t caller, int32_t offset)
{
    return ((uint64_t)(uint32_t)caller << 32) | (uint32_t)offset;
}

/* The line of the call at offset in the code of slot caller (>= 1), if learnt; else -1.
 * Runs no Python code, needs no GIL (see Names). */
static inline int32_t
lines_find(const Names *nm, int32_t caller, int32_t offset)
{
    return table_find(&nm->lines, line_key(caller, offset));
}

/* Learn a caller's line (with the GIL: a call's naming pass). No memory: not learnt (the next
 * round computes it again), no error. */
static void
lines_add(Names *nm, int32_t caller, int32_t offset, int32_t line)
{
    if (caller >= 1 && lines_find(nm, caller, offset) < 0 && table_room(&nm->lines) == 0)
        table_put(&nm->lines, line_key(caller, offset), line);
}

/* Name a code not named yet: name_of(code), as _cring's code_name() (once per distinct code
 * per read). Its slot; -1: an error; -2: decline (a name that is not an exact str). Runs
 * Python code (not for a NULL code). */
static int32_t
names_add(Names *nm, PyObject *name_of, PyObject *strings, PyObject *code)
{
    if (code == NULL) {
        PyObject *q = PyUnicode_InternFromString("?");
        if (q == NULL)
            return -1;
        int32_t s = names_add_slot(nm, strings, q);
        if (s >= 0)
            nm->unknown = s;
        return s;
    }
    Py_INCREF(code); /* the record holding it may be overwritten meanwhile */
    PyObject *name = PyObject_CallOneArg(name_of, code);
    if (name == NULL || !PyUnicode_CheckExact(name)) {
        int32_t r = name == NULL ? -1 : -2;
        Py_XDECREF(name);
        Py_DECREF(code);
        return r;
    }
    /* the table is ours (name_of cannot have changed it: a NameCache in use is left alone
     * by other calls). Room first: it stays at most half full even when growing fails (a
     * NameCache's table outlives the failed call, and a full one would never end a probe) */
    if (table_room(&nm->codes) < 0) {
        Py_DECREF(name);
        Py_DECREF(code);
        PyErr_NoMemory();
        return -1;
    }
    int32_t s = names_add_slot(nm, strings, name);
    if (s < 0) {
        Py_DECREF(code);
        return s;
    }
    table_put(&nm->codes, (uintptr_t)code, s); /* the reference taken above */
    nm->slots[s].code = code;
    nm->last_code = code;
    nm->last_slot = s;
    return s;
}

/* Forget the string indices from `first` on (from 0: every one, NO_INDEX too): UNCHECKED,
 * looked up again by the next call that meets their slots. Runs no Python code. */
static void
names_forget(Names *nm, uint64_t first)
{
    for (int32_t s = 0; s < nm->nslots; s++) {
        uint64_t x = nm->slots[s].index;
        if (first == 0 || (x >= first && x != NO_INDEX))
            nm->slots[s].index = UNCHECKED;
    }
}

/* Look the string of slot s up if its index is UNCHECKED, as names_add_slot() does: 0, -1
 * with an error, -2 decline (the table holds something odd). Runs no Python code. */
static int
names_check(Names *nm, PyObject *strings, int32_t s)
{
    Slot *slot = &nm->slots[s];
    if (slot->index != UNCHECKED)
        return 0;
    uint64_t index;
    int r = table_index(strings, slot->name, &index);
    if (r < 0 || r == 2)
        return r < 0 ? -1 : -2;
    slot->index = r == 0 ? index : NO_INDEX;
    return 0;
}

/* names_find(), the slot's index checked (names_check()): the slot; -1 not named yet; -2
 * decline; -3 error. Runs no Python code. */
static inline int32_t
names_lookup(Names *nm, PyObject *strings, PyObject *code)
{
    int32_t s = names_find(nm, code);
    if (s >= 0 && nm->slots[s].index == UNCHECKED) {
        int r = names_check(nm, strings, s);
        if (r < 0)
            return r == -1 ? -3 : -2;
    }
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* NameCache: a names table kept between encode_ring() calls                                  */

/* Within a recording a code's name never changes (name_of is the registry's name(), the
 * name fixed when the code was registered), so the names of one drain round are the next
 * round's: a table built afresh each call called name_of (a Python call) for every distinct
 * code of every round -- 70 k to 100 k calls for ~1000 codes in a recording of sqlglot
 * (350 to 550 rounds) -- and looked each name up in the string table again, about a fifth
 * of a call's time (a round of 7900 records over 190 codes: 205 us, 160 us with the cache).
 * A NameCache keeps the table: name_of is called once per distinct code per writer, and
 * each name's index looked up (or added) once per string table.
 *
 * What it holds stays valid:
 *   - the codes are held (strong references), so the address of a code it names is never
 *     another code's; the names too;
 *   - the names are name_of's: called with another name_of (not the same object, nor a
 *     bound method of the same function and object) it drops them;
 *   - the indices are those of one string table, the dict it holds: with another dict they
 *     are forgotten (UNCHECKED), and looked up again as each name is met. The table may grow
 *     (strings are added at len(strings)) but not lose strings unnoticed: whoever deletes the
 *     newest ones (the writer's error paths, encode_ring's own) calls forget_strings(first);
 *   - it is used by one call at a time: a call made while it is in use (name_of drains
 *     another ring with it) has a table of its own.
 * Its size: per code a slot (16 bytes) and two to four hash entries (12 bytes each: the
 * table is kept at most half full), the codes being ones the registry holds too; past
 * NAMES_KEEP_MAX codes (10 to 20 MB) it starts again. */
#define NAMES_KEEP_MAX (1 << 18)

typedef struct {
    PyObject_HEAD
    Names names;       /* nslots 0: empty (names_init() not run) */
    PyObject *strings; /* the dict the indices are of, or NULL */
    PyObject *name_of; /* what named the codes, or NULL */
    int busy;          /* an encode_ring() call uses it (see cache_in_use()) */
    unsigned busy_gen; /* fork_gen when busy was set */
    int clear_pending; /* clear() was called meanwhile: done when that call ends */
    int released;      /* that call reads the indices with the GIL released */
    int forget_set;    /* forget_strings(forget_first) was called meanwhile: done after */
    uint64_t forget_first;
} NameCache;

/* Fork children: a call of another thread that was using a NameCache or the scratch memory
 * when the process forked never ends in the child. fork_gen counts the forks of this process
 * (pthread_atfork), and what is marked in use is so only for the generation that marked it. */
static unsigned fork_gen;

static void
tfenc_after_fork(void)
{
    fork_gen++;
}

static inline int
cache_in_use(const NameCache *c)
{
    return c->busy && c->busy_gen == fork_gen;
}

/* Drop the names (may run Python code: codes freed). The table is detached first: Python
 * code run meanwhile finds the cache empty. */
static void
cache_clear_names(NameCache *c)
{
    Names nm = c->names;
    memset(&c->names, 0, sizeof(c->names));
    names_free(&nm);
}

/* Drop everything (may run Python code). */
static void
cache_clear(NameCache *c)
{
    PyObject *strings = c->strings, *name_of = c->name_of;
    c->strings = c->name_of = NULL;
    c->clear_pending = 0;
    cache_clear_names(c);
    Py_XDECREF(strings);
    Py_XDECREF(name_of);
}

/* Whether names made by name_of a are those of b: the same object, or bound methods of the
 * same function and object (an attribute lookup such as registry.name makes a new one each
 * time). Runs no Python code. */
static int
same_name_of(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    return a != NULL && b != NULL && PyMethod_Check(a) && PyMethod_Check(b) &&
           PyMethod_GET_FUNCTION(a) == PyMethod_GET_FUNCTION(b) &&
           PyMethod_GET_SELF(a) == PyMethod_GET_SELF(b);
}

/* Make c's table ready for a call naming with name_of into strings (c->busy set): 0, -1
 * with an error, -2 decline (an odd string table), as names_init(). May run Python code
 * (names dropped). */
static int
cache_ready(NameCache *c, PyObject *strings, PyObject *name_of)
{
    Names *nm = &c->names;
    if (nm->nslots > 0 && (nm->nslots >= NAMES_KEEP_MAX || !same_name_of(c->name_of, name_of)))
        cache_clear_names(c);
    if (c->name_of != name_of)
        Py_XSETREF(c->name_of, Py_NewRef(name_of));
    if (c->strings != strings) {
        names_forget(nm, 0);
        Py_XSETREF(c->strings, Py_NewRef(strings));
    }
    if (nm->nslots == 0) {
        int r = names_init(nm, strings);
        if (r != 0)
            cache_clear_names(c); /* what it made of the table: holds no code */
        return r;
    }
    return names_check(nm, strings, 0); /* "", which no record's code names */
}

PyDoc_STRVAR(cache_doc,
"NameCache()\n\
\n\
encode_ring()'s table of names, kept between its calls: its 7th argument\n\
(TraceWriter.write_native keeps one per writer). A code's name is fixed for a\n\
recording (the registry's, given at registration), so with it name_of is called once\n\
per distinct code rather than once per distinct code per call (a drain round), and\n\
each name's string table index is looked up once.\n\
\n\
It holds the codes it names (strong references: a freed code's address never gets\n\
another code's name), the names, the string table dict its indices are of and\n\
name_of. Called with another name_of it drops the names; with another dict, the\n\
indices. The dict may gain strings (at len(strings)); whoever deletes its newest\n\
ones calls forget_strings(first). len(): how many codes it holds.");

static PyObject *
cache_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "NameCache() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0); /* zeroed: empty */
}

static int
cache_traverse(PyObject *self, visitproc visit, void *arg)
{
    /* the codes and names are not visited: neither kind is tracked by the GC (no cycle
     * goes through them) */
    NameCache *c = (NameCache *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(c->strings);
    Py_VISIT(c->name_of);
    return 0;
}

static int
cache_tp_clear(PyObject *self)
{
    NameCache *c = (NameCache *)self;
    if (!cache_in_use(c)) /* always: a cache in use is reachable from the call's arguments */
        cache_clear(c);
    return 0;
}

static void
cache_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    cache_clear((NameCache *)self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static Py_ssize_t
cache_len(PyObject *self)
{
    return (Py_ssize_t)((NameCache *)self)->names.codes.used;
}

PyDoc_STRVAR(cache_clear_doc,
"clear() -> None\n\
\n\
Drop everything: the codes, names, string table and name_of it holds (called while\n\
encode_ring() uses it: when that call ends). TraceWriter.close() does.");

static PyObject *
cache_clear_meth(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    NameCache *c = (NameCache *)self;
    if (cache_in_use(c))
        c->clear_pending = 1;
    else
        cache_clear(c);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cache_forget_doc,
"forget_strings(first) -> None\n\
\n\
The string table lost its strings from index first on (deleted: no chunk defines\n\
them): forget the indices held for them. Names keep their codes; their indices are\n\
looked up again when next met (while encode_ring() reads them with the GIL\n\
released, when it has them back).");

static PyObject *
cache_forget_meth(PyObject *self, PyObject *arg)
{
    Py_ssize_t first = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (first == -1 && PyErr_Occurred())
        return NULL;
    if (first < 0) {
        PyErr_SetString(PyExc_ValueError, "forget_strings(): first must be >= 0");
        return NULL;
    }
    NameCache *c = (NameCache *)self;
    if (cache_in_use(c) && c->released) { /* another thread: the call reads the indices */
        if (!c->forget_set || (uint64_t)first < c->forget_first)
            c->forget_first = (uint64_t)first;
        c->forget_set = 1;
    }
    else {
        names_forget(&c->names, (uint64_t)first);
    }
    Py_RETURN_NONE;
}

static PyMethodDef cache_methods[] = {
    {"clear", cache_clear_meth, METH_NOARGS, cache_clear_doc},
    {"forget_strings", cache_forget_meth, METH_O, cache_forget_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot cache_slots[] = {
    {Py_tp_doc, (void *)cache_doc},
    {Py_tp_new, cache_new},
    {Py_tp_dealloc, cache_dealloc},
    {Py_tp_traverse, cache_traverse},
    {Py_tp_clear, cache_tp_clear},
    {Py_tp_methods, cache_methods},
    {Py_sq_length, cache_len},
    {0, NULL},
};

static PyType_Spec cache_spec = {
    .name = "rethook.buffer._tfenc.NameCache",
    .basicsize = sizeof(NameCache),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cache_slots,
};

/* Scratch memory kept between calls (the module's state): the records' types and names by
 * ring position, the column values, the payloads being written and the references being
 * dropped, sized for the largest call so far. Fresh memory for each call would be paged in
 * by each call: at the ~1 us a 4 KB page costs here, about what encoding the records it
 * holds costs. Allocated with PyMem_Raw*: the output area grows while the GIL is released
 * (encode_batch()). */
typedef struct {
    void *p;
    size_t bytes;
} Area;

typedef struct {
    Area types, named, vals, out, drop, refs;
    Area pend, pend_of, pend_order; /* a call's pending strings (see Pend) */
    int busy;          /* a call is using it (name_of, Python code, could make another) */
    unsigned busy_gen; /* fork_gen when busy was set (see scratch_in_use()) */
    int free_pending;  /* free_scratch() was called meanwhile: done when that call ends */
} Scratch;

/* The module's state */
typedef struct {
    Scratch scratch;
    PyTypeObject *cache_type; /* NameCache */
} State;

static inline int
scratch_in_use(const Scratch *sc)
{
    return sc->busy && sc->busy_gen == fork_gen;
}

static void
area_free(Scratch *sc, Area *a)
{
    (void)sc;
    PyMem_RawFree(a->p);
    a->p = NULL;
    a->bytes = 0;
}

/* At least n bytes in a (its contents are not kept): 0, or -1 with MemoryError. */
static int
area_room(Scratch *sc, Area *a, size_t n)
{
    if (a->p != NULL && a->bytes >= n)
        return 0;
    area_free(sc, a);
    if (n > PY_SSIZE_T_MAX || (a->p = PyMem_RawMalloc(n ? n : 1)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    a->bytes = n;
    return 0;
}

/* At least n bytes in a, its contents kept: 0, or -1 (no error set: the GIL may be released;
 * a is unchanged). */
static int
area_grow(Scratch *sc, Area *a, size_t n)
{
    if (a->bytes >= n)
        return 0;
    size_t more = a->bytes + a->bytes / 2;
    if (more > n)
        n = more;
    (void)sc;
    void *p = n > PY_SSIZE_T_MAX ? NULL : PyMem_RawRealloc(a->p, n);
    if (p == NULL)
        return -1;
    a->p = p;
    a->bytes = n;
    return 0;
}

static void
scratch_free(Scratch *sc)
{
    area_free(sc, &sc->types);
    area_free(sc, &sc->named);
    area_free(sc, &sc->vals);
    area_free(sc, &sc->out);
    area_free(sc, &sc->drop);
    area_free(sc, &sc->refs);
    area_free(sc, &sc->pend);
    area_free(sc, &sc->pend_of);
    area_free(sc, &sc->pend_order);
}

/* A record's names: the slots of its code and of a function record's parent (0, "", for the
 * others), noted by name_records() by ring position */
typedef struct {
    int32_t slot, pslot;
} Named;

/* Ring positions [pos, pos + len) */
typedef struct {
    uint64_t pos;
    Py_ssize_t len;
} Run;

/* Values a batch of n records needs: at most RING_COLUMNS each */
#define VALS_MAX(n) ((size_t)(n) * RING_COLUMNS)

/* Most bytes the payload of a batch of n records takes: head (6), groups (5 * 8), the order
 * column, and at most RING_COLUMNS columns per group (each group's values add up to n). */
#define OUT_MAX(n) ((size_t)(6 + 40 + 14 * (1 + RING_TYPES * RING_COLUMNS)) + \
                    (size_t)(n) * 8 * (1 + RING_COLUMNS))

/* Bytes a record usually takes in a payload (a function_graph trace: about 6.5): the output
 * area is sized for a call's records at this, plus a batch at its most. */
#define OUT_USUAL 8

/* One batch: the records [lo, hi) of the ones taken, and once encoded its payload */
typedef struct {
    Py_ssize_t lo, hi;
    Py_ssize_t count[RING_TYPES]; /* records of each type */
    int order[RING_TYPES];        /* the types met (the groups' format ids), in order */
    int k;                        /* how many */
    int done;                     /* encoded: the payload is at off in the output area */
    size_t off, len;
    uint32_t crc;                 /* of the chunk: its head and payload */
    Py_ssize_t added;             /* strings this batch added to the table */
} Encoded;

/* A string the table lacks that a call adds without the GIL (see "New strings without the
 * GIL"): its name (its slot's: the slot holds it) and the index it gets, NO_INDEX until a
 * batch meets it. */
typedef struct {
    PyObject *name;
    uint64_t index;
    const char *utf8; /* its UTF-8 (the str's own, read without the GIL by write_window()), or
                       * NULL: none (lone surrogates, which the writer encodes its own way) */
    Py_ssize_t len;
} Pend;

/* What one encode_ring() call works with */
typedef struct {
    rh_ring *ring;
    Scratch *sc;
    uint8_t *types;        /* by ring position (the capacity's worth): name_records() */
    Named *named;          /* the same */
    rh_rec *detached;      /* the array detached from the ring (encode_detached()), or NULL:
                            * the records are read in the ring */
    uint64_t cap;          /* the ring's capacity */
    uint64_t pos0;         /* the position of the first record taken */
    Names *names;          /* the call's own, or its NameCache's */
    NameCache *cache;      /* or NULL */
    PyObject *name_of;
    uint64_t tid;          /* the tid column's value, and what read_int() saw in it */
    int tid_seen;
    PyObject *strings, *new_strings;
    uint64_t *vals;        /* VALS_MAX(the largest batch) */
    size_t out_used;       /* bytes of the output area (sc->out) the payloads take */
    PyObject **drop;       /* references to release once the ring is left (2 per record) */
    Py_ssize_t ndrop;
    Py_ssize_t moved;      /* records taken whose references are out of the ring */
    uint64_t *refs;        /* detached: the references the records hold, by slot */
    int fd;                /* the file the detached call may write its chunks to, or -1 */
    uint64_t defined;      /* the format ids the file has defined (bit fid) */
    Py_ssize_t written;    /* events the call wrote to fd (its chunks' counts), or -1 */
    int write_errno;       /* the write to fd failed: writev_all()'s answer; 0: it did not */
    /* the strings it adds without the GIL (pend_resolve()), in sc->pend, sc->pend_of and
     * sc->pend_order */
    Pend *pend;
    int32_t npend;
    int32_t *pend_of;      /* slot -> its pending string (-1: none), for slots < pend_slots */
    int32_t pend_slots;
    int32_t *pend_order;   /* the pending strings given an index, in that order */
    int32_t nassigned;
    uint64_t table_next;   /* the index the next one gets */
    int pend_closed;       /* a batch was left: no more indices without the GIL */
} Fused;

/* The records [lo, hi) of the ones taken (n <= the capacity): ring positions, in one run,
 * or two when they wrap (loops over a run step a pointer, with no test for the wrap) */
static inline void
taken_runs(const Fused *f, Py_ssize_t lo, Py_ssize_t hi, Run run[2])
{
    const uint64_t cap = f->cap, pos = (f->pos0 + (uint64_t)lo) % cap;
    const Py_ssize_t n = hi - lo;
    const Py_ssize_t first = (uint64_t)n < cap - pos ? n : (Py_ssize_t)(cap - pos);
    run[0] = (Run){pos, first};
    run[1] = (Run){0, n - first};
}

/* Name every readable record of the ring (its code, and a function record's parent), in
 * ring order, calling name_of for the codes not named yet, and note their slots by position.
 * Python code then runs: the ring may be written, overwritten, cleared or resized meanwhile;
 * the pass goes on from where it was (what it noted for the records before is still
 * theirs), or starts again. 0 when every record of [floor, head) is named, with no Python
 * code run since it was looked at; 1 decline (a record of an unknown type: a PRINT event; a
 * name that is not a str; an odd string table); -1 error. */
static PASS int
name_records(Fused *f, rh_ring *r)
{
    Names *nm = f->names;
again:
    /* (runs no Python code) */
    if (area_room(f->sc, &f->sc->types, (size_t)r->capacity) < 0 ||
        area_room(f->sc, &f->sc->named, (size_t)r->capacity * sizeof(Named)) < 0)
        return -1;
    uint8_t *types = f->types = f->sc->types.p;
    Named *named = f->named = f->sc->named.p;
    rh_rec *recs = r->recs;
    uint64_t cap = r->capacity, clear_seq = r->clear_seq;
    uint64_t seq = r->floor, pos = seq % cap;
    while (seq != r->head) {
        const rh_rec *rec = &recs[pos];
        int t = rec->type;
        if (t < RH_FUNCTION || t > RH_FUNCGRAPH_RESUME)
            return 1;
        PyObject *unnamed;
        int32_t cs = names_lookup(nm, f->strings, rec->code), ps = 0;
        if (cs >= 0 && t == RH_FUNCTION && rec->parent != NULL)
            ps = names_lookup(nm, f->strings, rec->parent);
        if (cs < -1 || ps < -1) /* an odd string table, or an error */
            return (cs < -1 ? cs : ps) == -3 ? -1 : 1;
        if (cs < 0)
            unnamed = rec->code;
        else if (ps < 0)
            unnamed = rec->parent;
        else {
            types[pos] = (uint8_t)t;
            named[pos].slot = cs;
            named[pos].pslot = ps;
            seq++;
            pos = pos + 1 == cap ? 0 : pos + 1;
            continue;
        }
        int32_t s = names_add(nm, f->name_of, f->strings, unnamed);
        if (s < 0)
            return s == -1 ? -1 : 1;
        if (unnamed == NULL) /* named "?": no Python code ran */
            continue;
        if (r->recs != recs || r->capacity != cap || r->clear_seq != clear_seq)
            goto again;
        if (seq < r->floor) { /* overwritten meanwhile; the slots from floor on are intact */
            seq = r->floor;
            pos = seq % cap;
        }
        /* look at this record again */
    }
    return 0;
}

/* A reference taken out of the ring: released at once where that cannot free the object,
 * else kept in f->drop for later (no Python code may run yet). */
static inline void
drop_ref(Fused *f, PyObject *o)
{
    if (o == NULL)
        return;
    if (Py_REFCNT(o) > 1)
        Py_DECREF(o); /* cannot reach zero */
    else
        f->drop[f->ndrop++] = o;
}

/* The references of the record at ring position pos out of the ring, dropped. Runs no Python
 * code. */
static inline void
take_refs(Fused *f, uint64_t pos)
{
    rh_rec *r = &f->ring->recs[pos];
    PyObject *code = r->code, *parent = r->parent;
    r->code = r->parent = NULL;
    drop_ref(f, code);
    drop_ref(f, parent);
}

/* The references of the records [f->moved, upto) out of the ring, dropped.
 * Runs no Python code. */
static void
move_refs(Fused *f, Py_ssize_t upto)
{
    const uint64_t cap = f->cap;
    uint64_t pos = (f->pos0 + (uint64_t)f->moved) % cap;
    for (Py_ssize_t i = f->moved; i < upto; i++, pos = pos + 1 == cap ? 0 : pos + 1)
        take_refs(f, pos);
    f->moved = upto;
}

/* Drop the references count_detached() counted, code by code: as many Py_DECREF()s, which
 * free nothing (the names table holds each code). Holds the GIL; runs no Python code. */
static PASS void
drop_counted(Fused *f)
{
    const Slot *slots = f->names->slots;
    for (int32_t s = 0; s < f->names->nslots; s++) {
        PyObject *o = slots[s].code;
        uint64_t k = f->refs[s];
        if (o == NULL || k == 0)
            continue;
#ifndef Py_REF_DEBUG
        if ((uint64_t)Py_REFCNT(o) > k) { /* (an immortal object's stays as it is) */
            Py_SET_REFCNT(o, Py_REFCNT(o) - (Py_ssize_t)k);
            continue;
        }
#endif
        while (k--)
            Py_DECREF(o);
    }
}

/* The string table index of slot s, adding its string as _encode_strings would: 0, -1 error.
 * Holds the GIL. */
static int
slot_index(Fused *f, int32_t s, uint64_t *out)
{
    Slot *slot = &f->names->slots[s];
    if (slot->index >> 63) { /* NO_INDEX, or UNCHECKED (forgotten since name_records()) */
        uint64_t index;
        int r = table_index(f->strings, slot->name, &index);
        if (r == 1)
            r = add_string(f->strings, f->new_strings, slot->name, &index);
        else if (r == 2) /* not reached: the table has only what name_records() saw, and ours */
            PyErr_SetString(PyExc_SystemError, "rethook: the string table changed");
        if (r != 0)
            return -1;
        slot->index = index;
    }
    *out = slot->index;
    return 0;
}

/* A column that holds one value throughout, which the encoder knows without looking: the
 * tid, and the "" of entries' args and exits' retval (slot 0). encode_batch() stores no
 * values for it. */
static int
is_fixed_source(int src)
{
    return src == S_TID || src == S_EMPTY;
}

/* Where encode_batch()'s hot loop puts a batch's values: each group's columns (but the fixed
 * ones), filled in record order */
typedef struct {
    uint64_t *col[RING_TYPES][RING_COLUMNS];
    uint64_t orv[RING_TYPES][RING_COLUMNS];  /* each column's values OR-ed */
    uint64_t andv[RING_TYPES][RING_COLUMNS]; /* and AND-ed: orv == andv when all are equal */
    Py_ssize_t fill[RING_TYPES];             /* values in each group's columns so far */
    const Slot *slots;
} Columns;

/* One record's values into its group's columns (names: what name_records() noted for it).
 * Ints: the value. Strings: the string table index of the names table's slot (its top bit
 * set: a string the table lacks, or not looked up; name_column() redoes such a column).
 * Each OR-ed into the column's orv (its top bit: a negative value, or such an index) and
 * AND-ed into its andv. Reads the record and the slots' indices, nothing else. Holds the
 * GIL when the record is in the ring (a function record's caller's line reads the caller's
 * code, which the record holds). */
static inline __attribute__((always_inline)) void
put_row(Columns *cs, const rh_rec *r, Named names)
{
    const int t = r->type;
    const Py_ssize_t j = cs->fill[t]++;
    uint64_t **cv = cs->col[t], *o = cs->orv[t], *a = cs->andv[t];
    const Slot *slots = cs->slots;
    uint64_t x;
#define PUT(c, value) (x = (value), cv[c][j] = x, o[c] |= x, a[c] &= x)
    PUT(0, (uint64_t)r->ts);
    switch (t) { /* (the columns of LAYOUT[t], but the fixed ones) */
    case RH_FUNCTION:
        PUT(2, slots[names.slot].index);
        PUT(3, slots[names.pslot].index);
        PUT(4, (uint64_t)(int64_t)rh_caller_line(r));
        break;
    case RH_FUNCGRAPH_EXIT:
        PUT(2, (uint64_t)(int64_t)r->depth);
        PUT(3, slots[names.slot].index);
        PUT(4, (uint64_t)r->calltime);
        PUT(5, (uint64_t)(int64_t)r->overrun);
        PUT(6, (uint64_t)r->sleep);
        PUT(7, (uint64_t)(int64_t)r->flags);
        break;
    default: /* entry, suspend, resume */
        PUT(2, (uint64_t)(int64_t)r->depth);
        PUT(3, slots[names.slot].index);
        break;
    }
#undef PUT
}

/* Where the first record of type t is among the records of the runs (t is there) */
static Py_ssize_t
first_of(const uint8_t *types, const Run run[2], int t)
{
    const uint8_t *at = memchr(types + run[0].pos, t, (size_t)run[0].len);
    if (at != NULL)
        return at - (types + run[0].pos);
    at = memchr(types + run[1].pos, t, (size_t)run[1].len);
    return run[0].len + (at - (types + run[1].pos));
}

/* ---------------------------------------------------------------------------------------- */
/* New strings without the GIL                                                                */

/* The string table is a dict, so a batch naming a string the table lacks was left to be
 * encoded with the GIL held: in a program's first rounds, where most calls meet functions
 * never met before, that was most batches (sqlglot's first round: ~13 ms of encoding with the
 * GIL held, the program waiting for it). Now, with the GIL, before letting it go
 * (pend_resolve()), every slot whose index is not known is looked up: found, it takes the
 * index; not found, it gets a pending string (slots of equal names share one, as the dict
 * would). Without the GIL, a batch that meets a pending string gives it the index the held
 * path would give it when adding it (the table's size, plus the strings given one before it
 * in this call), in the order the held path adds them (batch, group, column, record), and
 * counts it in the batch's `added`. With the GIL back, pend_commit() adds them to the table
 * and new_strings in that order, before anything else can: the file is the same bytes. Once
 * a batch is left (for any reason) no later one gives an index without the GIL: the left
 * batch adds its strings first, with the GIL, in order. */

/* Pending strings for the slots named since the last call of this (all of them the first
 * time in a call). With the GIL; 0, -1 with an error. */
static int
pend_resolve(Fused *f)
{
    Names *nm = f->names;
    Scratch *sc = f->sc;
    const int32_t n = nm->nslots;
    const uint64_t size = (uint64_t)PyDict_GET_SIZE(f->strings);
    if (f->pend_slots > 0 && f->nassigned == 0 && size != f->table_next) {
        /* Python code (name_of, draining another ring into this writer) added strings
         * since: what was pending may be in the table now. All looked up again. */
        f->pend_slots = 0;
        f->npend = 0;
    }
    if (n <= f->pend_slots)
        return 0;
    if (area_grow(sc, &sc->pend_of, (size_t)n * sizeof(int32_t)) < 0 ||
        area_grow(sc, &sc->pend, (size_t)n * sizeof(Pend)) < 0 ||
        area_grow(sc, &sc->pend_order, (size_t)n * sizeof(int32_t)) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    f->pend_of = sc->pend_of.p;
    f->pend = sc->pend.p;
    f->pend_order = sc->pend_order.p;
    if (f->pend_slots == 0)
        f->table_next = size;
    PyObject *seen = NULL; /* name -> its pending string, made when one is needed */
    int rc = 0;
    for (int32_t s = f->pend_slots; s < n && rc == 0; s++) {
        Slot *slot = &nm->slots[s];
        f->pend_of[s] = -1;
        if (!(slot->index >> 63))
            continue;
        uint64_t index;
        int r = table_index(f->strings, slot->name, &index);
        if (r == 0) {
            slot->index = index;
            continue;
        }
        if (r != 1) { /* an error, or a table holding something odd: the held path's */
            rc = r < 0 ? -1 : 0;
            continue;
        }
        if (seen == NULL) {
            if ((seen = PyDict_New()) == NULL) {
                rc = -1;
                break;
            }
            for (int32_t p = 0; p < f->npend && rc == 0; p++) {
                PyObject *v = PyLong_FromLong(p);
                rc = v == NULL ? -1 : PyDict_SetItem(seen, f->pend[p].name, v);
                Py_XDECREF(v);
            }
            if (rc < 0)
                break;
        }
        PyObject *v = PyDict_GetItemWithError(seen, slot->name);
        if (v != NULL)
            f->pend_of[s] = (int32_t)PyLong_AsLong(v);
        else if (PyErr_Occurred())
            rc = -1;
        else {
            int32_t p = f->npend++;
            Py_ssize_t len = 0; /* (its UTF-8 only where write_window() may write it) */
            const char *utf8 = f->fd >= 0 && PyUnicode_Check(slot->name)
                                   ? PyUnicode_AsUTF8AndSize(slot->name, &len) : NULL;
            if (utf8 == NULL)
                PyErr_Clear();
            f->pend[p] = (Pend){slot->name, NO_INDEX, utf8, len};
            f->pend_of[s] = p;
            v = PyLong_FromLong(p);
            rc = v == NULL ? -1 : PyDict_SetItem(seen, slot->name, v);
            Py_XDECREF(v);
        }
    }
    Py_XDECREF(seen);
    f->pend_slots = n;
    return rc;
}

/* The index of slot s's string without the GIL: known, or its pending string's (given the
 * next one the first time a batch meets it, counted in *added). 0; 1 not known (the batch
 * is left). */
static inline int
pend_index(Fused *f, int32_t s, uint64_t *out, Py_ssize_t *added)
{
    Slot *slot = &f->names->slots[s];
    if (!(slot->index >> 63)) {
        *out = slot->index;
        return 0;
    }
    if (f->pend_closed || s >= f->pend_slots || f->pend_of[s] < 0)
        return 1;
    Pend *p = &f->pend[f->pend_of[s]];
    if (p->index == NO_INDEX) {
        p->index = f->table_next++;
        f->pend_order[f->nassigned++] = f->pend_of[s];
        (*added)++;
    }
    *out = slot->index = p->index;
    return 0;
}

/* The pending strings given an index, added to the table and new_strings in that order (what
 * the held path would have added by then). With the GIL; 0, -1 with an error. */
static int
pend_commit(Fused *f)
{
    for (int32_t i = 0; i < f->nassigned; i++) {
        const Pend *p = &f->pend[f->pend_order[i]];
        uint64_t index;
        if ((uint64_t)PyDict_GET_SIZE(f->strings) != p->index) { /* not reached */
            PyErr_SetString(PyExc_SystemError, "rethook: the string table changed");
            return -1;
        }
        if (add_string(f->strings, f->new_strings, p->name, &index) < 0)
            return -1;
    }
    f->nassigned = 0;
    return 0;
}

/* The string column c of group t again, its names' indices not all known when the hot loop
 * read them: each record's slot (src: S_CODE the code's, S_PARENT the parent's) looked up or
 * its string added (slot_index()), in record order, the order _encode_strings adds them in;
 * or, without the GIL (not held), given its pending string's index (pend_index(), counted in
 * *added); the column's orv and andv again. 0; -1 error; 1 a string not known without the
 * GIL (the batch is left). */
static int
name_column(Fused *f, const Run run[2], Columns *cs, int t, int c, int held, Py_ssize_t *added)
{
    const int src = LAYOUT[t][c];
    uint64_t *v = cs->col[t][c], o = 0, a = UINT64_MAX;
    for (int h = 0; h < 2; h++) {
        for (uint64_t pos = run[h].pos, end = pos + (uint64_t)run[h].len; pos < end; pos++) {
            if (f->types[pos] != t)
                continue;
            const Named nm = f->named[pos];
            const int32_t slot = src == S_PARENT ? nm.pslot : nm.slot;
            const int r = held ? slot_index(f, slot, v) : pend_index(f, slot, v, added);
            if (r != 0)
                return r;
            o |= *v;
            a &= *v++;
        }
    }
    cs->orv[t][c] = o;
    cs->andv[t][c] = a;
    return 0;
}

/* What write_ints() writes for values all equal to x (`seen`: what read_int() saw in them) */
static unsigned char *
write_same(unsigned char *p, uint64_t x, int seen)
{
    return write_const(p, x, !(seen & SEEN_BIG) && (int64_t)x < 0);
}

/* The order column of a batch of k > 1 groups (which group each event is in): what
 * write_ints(fids, n, 0, 0) writes for it. The format ids are the record types, 1 .. 5 and
 * not all equal: plain, one byte each, the bytes the naming pass noted by ring position. */
static unsigned char *
write_order(unsigned char *p, const uint8_t *types, const Run run[2])
{
    *p++ = INT_PLAIN;
    *p++ = 1;
    for (int h = 0; h < 2; h++) {
        memcpy(p, types + run[h].pos, (size_t)run[h].len);
        p += run[h].len;
    }
    return p;
}

/* Encode the batch e of the records taken into its EVTS payload, at the end of the output
 * area. Its records are read in the detached array, or in the ring, their references taken
 * out as they are read. With `held` (the GIL held) strings the table lacks are added to it:
 * 0 done, -1 error. Without, it reads the records and the names table, nothing else (no
 * other call uses the table, see run_released()), and leaves a batch naming a string the
 * table lacks, or that has no room, to a call with the GIL: 0 done, 1 left. */
static PASS int
encode_batch(Fused *f, Encoded *e, int held)
{
    const Py_ssize_t n = e->hi - e->lo;
    Py_ssize_t *count = e->count;
    int *order = e->order, k = 0, width[RING_TYPES] = {0};
    const Named *named = f->named;
    const uint8_t *types = f->types;
    Run run[2];
    taken_runs(f, e->lo, e->hi, run);

    /* the groups: how many records of each type (a quick pass over the types the naming
     * pass noted, a byte a record), in first-seen order */
    memset(count, 0, sizeof(e->count));
    for (int h = 0; h < 2; h++)
        for (uint64_t pos = run[h].pos, end = pos + (uint64_t)run[h].len; pos < end; pos++)
            count[types[pos]]++; /* 1 .. 5 */
    for (int t = RH_FUNCTION; t <= RH_FUNCGRAPH_RESUME; t++) {
        if (count[t] == 0)
            continue;
        const Py_ssize_t first = first_of(types, run, t);
        int at = k++; /* (an insertion: k <= 5) */
        for (; at > 0 && first_of(types, run, order[at - 1]) > first; at--)
            order[at] = order[at - 1];
        order[at] = t;
    }
    e->k = k;
    /* each group's columns but the fixed ones, one after another in vals (at most
     * RING_COLUMNS values a record) */
    Columns cs = {.slots = f->names->slots};
    memset(cs.andv, 0xFF, sizeof(cs.andv));
    uint64_t *next = f->vals;
    for (int g = 0; g < k; g++) {
        int t = order[g];
        width[t] = layout_width(t);
        for (int c = 0; c < width[t]; c++) {
            if (!is_fixed_source(LAYOUT[t][c])) {
                cs.col[t][c] = next;
                next += count[t];
            }
        }
    }

    /* The hot loop: one pass over the records, each value into its group's column
     * (put_row()); from a detached array it reads the records and the slots' indices,
     * nothing else, in the ring it takes the references out too */
    for (int h = 0; h < 2; h++) {
        const uint64_t first = run[h].pos, end = first + (uint64_t)run[h].len;
        if (f->detached != NULL) { /* (the references stay: count_detached() takes them) */
            const rh_rec *recs = f->detached;
            for (uint64_t pos = first; pos < end; pos++)
                put_row(&cs, &recs[pos], named[pos]);
        }
        else {
            rh_rec *ring = f->ring->recs;
            for (uint64_t pos = first; pos < end; pos++) {
                rh_rec *rec = &ring[pos];
                put_row(&cs, rec, named[pos]);
                PyObject *code = rec->code, *parent = rec->parent;
                rec->code = rec->parent = NULL;
                drop_ref(f, code);
                drop_ref(f, parent);
            }
        }
    }
    if (f->detached == NULL)
        f->moved = e->hi;
    const Slot *slots = cs.slots;
    uint64_t (*orv)[RING_COLUMNS] = cs.orv, (*andv)[RING_COLUMNS] = cs.andv;

    /* the string columns with an index not known (a string the table lacks, or not looked up
     * since the table changed): with the GIL, their strings added as the writer adds them:
     * group by group, column by column, in first-seen order; without, left */
    Py_ssize_t strings_before = held ? PyList_GET_SIZE(f->new_strings) : 0, added = 0;
    for (int g = 0; g < k; g++) {
        int t = order[g];
        for (int c = 0; c < width[t]; c++) {
            const int src = LAYOUT[t][c];
            if (!is_str_source(src))
                continue;
            if (!((src == S_EMPTY ? slots[0].index : orv[t][c]) >> 63))
                continue;
            uint64_t unused;
            if (!held) { /* the pending strings (see "New strings without the GIL") */
                if (src == S_EMPTY ? pend_index(f, 0, &unused, &added)
                                   : name_column(f, run, &cs, t, c, 0, &added)) {
                    e->added = added; /* (those given an index: pend_commit() adds them) */
                    f->pend_closed = 1;
                    return 1;
                }
                continue;
            }
            if (src == S_EMPTY ? slot_index(f, 0, &unused) < 0
                               : name_column(f, run, &cs, t, c, 1, &added) < 0)
                return -1;
        }
    }
    /* (a batch encoded with the GIL after a try without it: what that try gave an index) */
    e->added = held ? e->added + PyList_GET_SIZE(f->new_strings) - strings_before : added;

    /* the payload, at the end of the output area (at most OUT_MAX(n) bytes) */
    Area *out = &f->sc->out;
    if (area_grow(f->sc, out, f->out_used + OUT_MAX(n)) < 0) {
        if (!held) {
            f->pend_closed = 1;
            return 1;
        }
        PyErr_NoMemory();
        return -1;
    }
    unsigned char *start = (unsigned char *)out->p + f->out_used, *p = start;
    put32(p, (uint64_t)n);
    put16(p + 4, (uint64_t)k);
    p += 6;
    for (int g = 0; g < k; g++) {
        put32(p, (uint64_t)order[g]);
        put32(p + 4, (uint64_t)count[order[g]]);
        p += 8;
    }
    if (k > 1) /* which format each event is: _write_batch's encode_ints(fids, out, False) */
        p = write_order(p, types, run);
    for (int g = 0; g < k && p != NULL; g++) {
        int t = order[g];
        for (int c = 0; c < width[t] && p != NULL; c++) {
            const int src = LAYOUT[t][c];
            const uint64_t *v = cs.col[t][c];
            const Py_ssize_t m = count[t];
            if (src == S_TID)
                p = write_same(p, f->tid, f->tid_seen);
            else if (src == S_EMPTY)
                p = write_same(p, slots[0].index, 0);
            else if (orv[t][c] == andv[t][c]) /* all equal */
                p = write_same(p, v[0], 0);
            else if (is_str_source(src))
                p = write_ints(p, v, m, 0, 0);
            else
                p = write_ints(p, v, m, (orv[t][c] >> 63) ? SEEN_NEG : 0, 1);
        }
    }
    if (p == NULL) { /* not reached: no group is empty, no column mixes sign and size */
        if (!held) {
            f->pend_closed = 1;
            return 1;
        }
        PyErr_SetString(PyExc_SystemError, "rethook: a column the encoder cannot write");
        return -1;
    }
    size_t used = (size_t)(p - start);
    unsigned char head[CHUNK_HEAD_SIZE];
    chunk_head(head, (uint64_t)used);
    e->crc = crc32_update(crc32_update(0, head, CHUNK_HEAD_SIZE), start, used);
    e->off = f->out_used;
    e->len = used;
    e->done = 1;
    f->out_used += used;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Encoding with the GIL released                                                           */

/* A large call encodes its records with the GIL released, so the program runs while the
 * drain encodes, on the other CPU: encoding is ~30 ns a record, which a call storm's program
 * spent waiting for the drain when the drain held the GIL throughout (raytrace: ~0.2 s of
 * 1 s). How it takes them without the GIL: "The detached drain" below.
 *
 * Each time the drain lets the GIL go it must get it back, and a CPU-bound program thread
 * keeps it a switch interval (5 ms) once asked, while its ring fills. So:
 *   - one release per call, for all its batches (two when it meets codes never named:
 *     naming is Python code); none for small calls (fewer than NOGIL_MIN_RECORDS records:
 *     the handoff would cost more than the encoding);
 *   - none when the ring was more than half full and blocking is off: the drain is
 *     falling behind (another process holds the second CPU), and encoding with the GIL held
 *     is what slows the program down to the drain's pace, as before (with blocking on, the
 *     program's threads wait for the drain at three quarters full anyway);
 *   - none while a drain round is open (two or more threads write with blocking off:
 *     _ccore.c's rounds that come first). The round holds the program's threads off while
 *     the drain empties every ring; letting them run in the middle of it, each ring drained
 *     later fills meanwhile (the 4-thread storm lost up to a fifth of its events when the
 *     drain let the GIL go there, on a machine shared with another job);
 *   - while the GIL is released no round is open (one would have the program's threads
 *     hand the GIL to one another at every callback), and just before taking it back the
 *     drain opens one (drainround.h): the program hands the GIL over at its next callback
 *     instead of at the end of its switch interval, and the ring has that much less to hold.
 * Without _ccore loaded (the pure core: no native rings write) the GIL is just released.
 *
 * While it is released another thread may call into this module: encode_ring() finds the
 * scratch memory and the NameCache in use (busy) and takes its own; free_scratch() and
 * NameCache.clear() are done when the call ends; NameCache.forget_strings() once the GIL is
 * back (before the batches left for it). The records are the call's own (a detached array),
 * the names table only read. A TraceWriter is not for two threads at once, as before. */
#define NOGIL_MIN_RECORDS 4096
#define GIL_BACK_NS 10000000 /* the round opened to get the GIL back ends by then at most */

enum { GIL_HOLD, GIL_POLICY, GIL_RELEASE };
static int gil_mode = GIL_POLICY; /* _nogil(), for tests and measurements */
static uint64_t gil_releases;     /* calls that released the GIL to encode (once or twice) */
static uint64_t held_records;     /* records such calls named or encoded with the GIL held */

/* Whether a call that takes n records of a ring of cap lets the GIL go (see above). */
static int
releases_gil(Py_ssize_t n, uint64_t cap, const rh_round_api *round)
{
    if (gil_mode != GIL_POLICY)
        return gil_mode == GIL_RELEASE && n > 0;
    return n >= NOGIL_MIN_RECORDS &&
           ((uint64_t)n <= cap / 2 || (round != NULL && round->blocking())) &&
           (round == NULL || round->current() == 0);
}

/* fn(arg) with the GIL released: no drain round open meanwhile (one the caller had is
 * closed), and one opened just before asking for the GIL back; the caller's after. */
static void
without_gil(const rh_round_api *round, void (*fn)(void *), void *arg)
{
    int64_t caller_round = round != NULL ? round->take() : 0; /* (0 but in tests) */
    Py_BEGIN_ALLOW_THREADS
    fn(arg);
    if (round != NULL) {
        int64_t back = round->now() + GIL_BACK_NS;
        round->open(caller_round > back ? caller_round : back);
    }
    Py_END_ALLOW_THREADS
    if (round != NULL)
        round->open(caller_round);
}

/* fn(arg) with the GIL released, the call's NameCache (if any) marked as read meanwhile. */
static void
run_released(Fused *f, const rh_round_api *round, void (*fn)(void *), void *arg)
{
    NameCache *c = f->cache;
    if (c != NULL)
        c->released = 1;
    without_gil(round, fn, arg);
    if (c != NULL) {
        c->released = 0;
        if (c->forget_set) {
            c->forget_set = 0;
            names_forget(&c->names, c->forget_first);
        }
    }
}

/* The encoded batches as a list of (payload, crc, fids, added), or NULL. */
static PyObject *
batch_list(const char *out, Encoded *enc, Py_ssize_t count)
{
    PyObject *list = PyList_New(count);
    for (Py_ssize_t b = 0; list != NULL && b < count; b++) {
        PyObject *fids = PyTuple_New(enc[b].k);
        for (int g = 0; fids != NULL && g < enc[b].k; g++) {
            PyObject *fid = PyLong_FromLong(enc[b].order[g]);
            if (fid == NULL)
                Py_CLEAR(fids);
            else
                PyTuple_SET_ITEM(fids, g, fid);
        }
        PyObject *payload = fids == NULL ? NULL
                            : PyBytes_FromStringAndSize(out + enc[b].off,
                                                        (Py_ssize_t)enc[b].len);
        PyObject *item = payload == NULL ? NULL
                         : Py_BuildValue("(NkNn)", payload, (unsigned long)enc[b].crc,
                                         fids, enc[b].added);
        if (payload == NULL)
            Py_XDECREF(fids);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, b, item);
    }
    return list;
}

/* The capsule of _cring (its version 2 API), or NULL with ImportError. */
static const rh_cring_api *
cring_api(void)
{
    PyObject *mod = PyImport_ImportModule("rethook.buffer._cring");
    if (mod == NULL)
        return NULL;
    PyObject *version = PyObject_GetAttrString(mod, "_C_API_VERSION");
    Py_DECREF(mod);
    long v = version != NULL ? PyLong_AsLong(version) : -1;
    Py_XDECREF(version);
    if (v == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (v < RH_CRING_API_VERSION) {
        PyErr_SetString(PyExc_ImportError,
                        "rethook.buffer._cring is older than rethook.buffer._tfenc: rebuild");
        return NULL;
    }
    return PyCapsule_Import(RH_CRING_CAPSULE, 0);
}

/* Forget the strings new_strings[start:] (added to strings by this call): 0, or -1. */
static int
forget_strings(PyObject *strings, PyObject *new_strings, Py_ssize_t start)
{
    Py_ssize_t end = PyList_GET_SIZE(new_strings);
    if (end <= start)
        return 0;
    for (Py_ssize_t i = start; i < end; i++)
        if (PyDict_DelItem(strings, PyList_GET_ITEM(new_strings, i)) < 0)
            return -1;
    return PyList_SetSlice(new_strings, start, end, NULL);
}

/* The tuple path's result for the n records in buf, taken from r with t's accounting: their
 * event tuples as (lost_before, lost_after, None, events), or NULL (the records counted lost,
 * as Ring.consume() counts them). The records are released, buf freed. */
static PyObject *
tuple_result(const rh_cring_api *api, rh_ring *r, rh_taken *t, rh_rec *buf, uint64_t n,
             PyObject *tid, PyObject *name_of)
{
    PyObject *events = api->events(buf, n, tid, name_of);
    PyObject *result = events == NULL ? NULL
                       : Py_BuildValue("(KKON)", (unsigned long long)t->lost_before,
                                       (unsigned long long)t->lost_after, Py_None, events);
    if (result == NULL)
        api->untake(r, t);
    rh_taken held = {.recs = buf, .n = n};
    PyObject *exc = PyErr_GetRaisedException();
    api->release(&held); /* may run Python code */
    PyErr_SetRaisedException(exc);
    PyMem_Free(buf);
    return result;
}

/* The tuple path: Ring.consume(tid, name_of) itself, as (lost_before, lost_after, None,
 * events), or NULL. */
static PyObject *
consume_events(const rh_cring_api *api, rh_ring *r, PyObject *tid, PyObject *name_of)
{
    uint64_t count = r->head - r->floor; /* <= capacity, whose array was allocated */
    rh_rec *buf = PyMem_Malloc(count ? (size_t)count * sizeof(rh_rec) : 1);
    if (buf == NULL)
        return PyErr_NoMemory();
    rh_taken t;
    if (api->take(r, &t, buf, count) < 0) { /* not reached: nothing ran since count */
        PyMem_Free(buf);
        return NULL;
    }
    return tuple_result(api, r, &t, buf, t.n, tid, name_of);
}

/* name_of failed: what Ring.consume() does then. The records are taken and reach no reader:
 * counted lost (the next consuming read reports them). Call with no error set. */
static void
consume_lost(const rh_cring_api *api, rh_ring *r)
{
    uint64_t count = r->head - r->floor; /* <= capacity, whose array was allocated */
    rh_rec *buf = PyMem_Malloc(count ? (size_t)count * sizeof(rh_rec) : 1);
    rh_taken t;
    if (buf != NULL && api->take(r, &t, buf, count) == 0) {
        api->untake(r, &t);
        api->release(&t); /* may run Python code */
    }
    else {
        PyErr_Clear(); /* no memory for it: the records stay in the ring */
    }
    PyMem_Free(buf);
}


PyDoc_STRVAR(encode_ring_doc,
"encode_ring(ring, tid, name_of, strings, new_strings, batch[, names[, fd, defined]])\n\
    -> (lost_before, lost_after, batches, events[, written])\n\
\n\
Consume every record of the native ring (a rethook.buffer._cring.Ring) as\n\
ring.consume(tid, name_of) does -- the same accounting, lost_before and lost_after\n\
-- and encode the events they become into EVTS payloads, split as\n\
TraceWriter.write_events() splits [Lost(lost_before)?] + events + [Lost(lost_after)?]\n\
into batches of `batch` items. batches: a list of (payload, crc, fids, added): the\n\
payload, the CRC-32 of the chunk (its head and payload), the format ids of its\n\
groups in order, how many strings it added to the string table (strings and\n\
new_strings, as _encode_strings adds them, for this batch after the ones before).\n\
events is None then. When the records need the tuple path (a record of an unknown\n\
type, a name that is not a str...) batches is None, events the event tuples\n\
ring.consume(tid, name_of) gives, and the string table is unchanged.\n\
On an error the records are counted lost as ring.consume() counts them.\n\
names: a NameCache, whose names and indices this call uses and adds to (name_of\n\
is then called only for the codes it lacks); None: a table for this call alone.\n\
A call of many records (the ring at most half full) encodes them with the GIL\n\
released, once they are copied out of the ring: other threads run meanwhile.\n\
fd, defined: such a call may then also write its EVTS chunks to the file fd (-1:\n\
never) without the GIL, when nothing must come before them: no lost_before, no\n\
string added, every format id in the bit mask defined (bit fid: the file defines\n\
it). written is then the events they hold, and batches is []; None otherwise.\n\
A failed write raises OSError, the records counted lost. Nothing else may write to\n\
fd, or close it, until the call returns.");

/* After a call: its own names table freed, or its NameCache left for the next call (a
 * clear() asked for meanwhile done now). May run Python code (codes freed). */
static void
names_release(Fused *f)
{
    NameCache *c = f->cache;
    if (c == NULL) {
        names_free(f->names);
        return;
    }
    f->cache = NULL;
    c->busy = 0;
    if (c->clear_pending)
        cache_clear(c);
}

/* A call starts using the NameCache c. */
static void
cache_acquire(NameCache *c)
{
    c->busy = 1;
    c->busy_gen = fork_gen;
    c->released = 0;
    if (c->forget_set) { /* (left by a call that a fork ended) */
        c->forget_set = 0;
        names_forget(&c->names, c->forget_first);
    }
}

/* After a call: the scratch memory it used is free again (freed, if free_scratch() was
 * called meanwhile, or if it was the call's own). */
static void
scratch_done(Scratch *sc, Scratch *local)
{
    sc->busy = 0;
    if (sc->free_pending) {
        sc->free_pending = 0;
        scratch_free(sc);
    }
    scratch_free(local);
}

/* The batches of n records (encode_ring()'s enc, room for n / batch + 2): write_events()
 * slices its items, and a Lost before the records takes the first slice's first place.
 * Their number. */
static Py_ssize_t
split_batches(Encoded *enc, Py_ssize_t n, Py_ssize_t batch, uint64_t lost_before)
{
    Py_ssize_t nenc = 0, size = lost_before ? batch - 1 : batch;
    for (Py_ssize_t lo = 0; lo < n; lo += size, size = batch) {
        if (size > 0) {
            enc[nenc].lo = lo;
            enc[nenc++].hi = n - lo < size ? n : lo + size;
        }
    }
    return nenc;
}

/* The end of an encode_ring() call whose records are all out of the ring (no reference of
 * theirs left in a slot): its result built (or, on an error, the records counted lost as
 * Ring.consume() counts them, the strings it added forgotten: no chunk will define them),
 * enc freed, the references kept for now dropped, the names and scratch memory let go. */
static PyObject *
call_result(Fused *f, const rh_cring_api *api, rh_taken *t, Encoded *enc, Py_ssize_t nenc,
            Py_ssize_t strings_start, uint64_t table_start, Scratch *local)
{
    PyObject *batches = NULL, *result = NULL;
    /* (chunks written to the file by the call itself: no payloads to hand back) */
    if (!PyErr_Occurred() &&
        (batches = batch_list(f->sc->out.p, enc, f->written >= 0 ? 0 : nenc)) != NULL)
        result = Py_BuildValue("(KKOO)", (unsigned long long)t->lost_before,
                               (unsigned long long)t->lost_after, batches, Py_None);
    if (result == NULL) {
        api->untake(f->ring, t);
        PyObject *exc = PyErr_GetRaisedException();
        if (forget_strings(f->strings, f->new_strings, strings_start) < 0)
            PyErr_Clear();
        names_forget(f->names, table_start); /* a NameCache's indices of them too */
        PyErr_SetRaisedException(exc);
    }
    Py_XDECREF(batches);
    PyMem_Free(enc);
    /* the references that could not be dropped in the ring (their objects' last ones),
     * and the names' (unless a NameCache keeps them) */
    PyObject *exc = PyErr_GetRaisedException();
    for (Py_ssize_t i = 0; i < f->ndrop; i++)
        Py_DECREF(f->drop[i]); /* may run Python code (weakref callbacks) */
    names_release(f);
    scratch_done(f->sc, local);
    PyErr_SetRaisedException(exc);
    return result;
}

/* ---------------------------------------------------------------------------------------- */
/* The detached drain: a ring's array taken out whole                                        */

/* A call that lets the GIL go takes the ring's array out with its records (the capsule's
 * detach(): the ring goes on in the spare array). The records are then the call's alone, so
 * it names them, encodes them and counts their references with the GIL released, and the
 * program's threads wait for the drain only while it detaches the array (a few stores) and
 * builds the result. Per record nothing is done with the GIL held but what needs Python:
 *   1. without the GIL, name_detached(): each record's names found in the names table; a
 *      record it cannot name so (a code never named, a caller's offset to turn into a line)
 *      is noted, one for each code or call site it misses (Reps); then, if it named them
 *      all, the batches encoded (encode_batch(), reading the array; strings the table lacks
 *      given their indices: "New strings without the GIL") and the references counted by
 *      slot, the slots emptied (count_detached());
 *   2. otherwise, with the GIL, name_reps() names the records noted (name_of: Python code,
 *      which cannot reach the array), then 1 again without the GIL; if that still misses
 *      some (more than REPS new codes), name_detached_held() names the rest with the GIL
 *      and 1's encoding and counting follow without it;
 *   3. with the GIL: the strings given indices added to the table (pend_commit()), the
 *      batches left encoded, the references dropped by code (drop_counted()), the array
 *      given back to be the next ring's spare.
 * A record of an unknown type (or a name that is not a str) sends the records to the tuple
 * path (detached_events()), as in encode_ring(). */

/* The records a naming pass without the GIL could not name, one for each code (or call site)
 * it did not know, in record order: what the GIL is taken to name (name_reps()), rather than
 * every record from the first one unnamed on. In a program's first rounds most calls meet
 * codes never named, one among tens of thousands of records (sqlglot's first round: ~0.8 M
 * records named with the GIL held, ~6 ms of the program's time waiting for it). */
#define REPS 256
typedef struct {
    Py_ssize_t at[REPS]; /* the records, by index among the ones taken */
    int n;
    int full;            /* a miss found no room: the pass stopped there */
    uint64_t keys[2 * REPS]; /* what each missed (open addressing; 0: free) */
} Reps;

/* Note record i, which missed on key (a code's address, or a call site's key with its low
 * bit set), unless a record missing on it is noted: 0; 1 no room (reps->full). */
static int
reps_note(Reps *reps, uint64_t key, Py_ssize_t i)
{
    size_t j = key_hash(key) & (2 * REPS - 1);
    for (; reps->keys[j] != 0; j = (j + 1) & (2 * REPS - 1))
        if (reps->keys[j] == key)
            return 0;
    if (reps->n == REPS) {
        reps->full = 1;
        return 1;
    }
    reps->keys[j] = key;
    reps->at[reps->n++] = i;
    return 0;
}

/* The detached records from index lo on, named from the names table alone (no Python code,
 * no dict: without the GIL), their types and slots noted by ring position, and function
 * records' callers' offsets turned into lines from the lines learnt (lines_find()). A record
 * it cannot name so (a code not named yet, or a call site whose line is not learnt:
 * PyCode_Addr2Line reads the caller's monitoring data when it has line events, which the
 * program may be changing: with the GIL) is left unnamed and noted in reps, if that missed
 * on something new, and the pass goes on; with no reps, or no room left in them, it stops
 * there. The index of the first record left unnamed (n: all named), or -1 at a record of an
 * unknown type. */
static PASS Py_ssize_t
name_detached(Fused *f, Py_ssize_t lo, Py_ssize_t n, Reps *reps)
{
    Names *nm = f->names;
    uint8_t *types = f->types; /* (locals: a store through a byte pointer may alias f's) */
    Named *named = f->named;
    Py_ssize_t i = lo, first_miss = n;
    Run run[2];
    taken_runs(f, lo, n, run);
    for (int h = 0; h < 2; h++) {
        rh_rec *rec = f->detached + run[h].pos;
        for (uint64_t pos = run[h].pos, end = pos + (uint64_t)run[h].len; pos < end;
             pos++, rec++, i++) {
            const int t = rec->type;
            if (t < RH_FUNCTION || t > RH_FUNCGRAPH_RESUME)
                return -1;
            int32_t cs = names_find(nm, rec->code), ps = 0;
            uint64_t miss = 0; /* what it does not know, if anything */
            if (cs < 0)
                miss = (uintptr_t)rec->code;
            if (t == RH_FUNCTION) {
                if (rec->parent != NULL)
                    ps = names_find(nm, rec->parent);
                if (ps < 0 && !miss)
                    miss = (uintptr_t)rec->parent;
                if ((rec->flags & RH_CALLER_OFFSET) && !miss) {
                    int32_t line = rec->parent == NULL ? 0 : lines_find(nm, ps, rec->depth);
                    if (line < 0)
                        miss = line_key(ps, rec->depth) << 1 | 1;
                    else {
                        rec->depth = line; /* (the record is the call's: detached) */
                        rec->flags &= ~RH_CALLER_OFFSET;
                    }
                }
            }
            if (miss) { /* noted for name_reps(), the pass going on, or stopped here */
                if (first_miss == n)
                    first_miss = i;
                if (reps == NULL || reps_note(reps, miss, i))
                    return first_miss;
                continue;
            }
            types[pos] = (uint8_t)t;
            named[pos].slot = cs;
            named[pos].pslot = ps;
        }
    }
    return first_miss;
}

/* A code's slot, named now if it was not (name_of: Python code), as name_records() does: the
 * slot; -1 error; -2 decline. */
static int32_t
name_held(Fused *f, PyObject *code)
{
    int32_t s = names_lookup(f->names, f->strings, code);
    if (s == -1)
        s = names_add(f->names, f->name_of, f->strings, code);
    else if (s < -1)
        s = s == -3 ? -1 : -2;
    return s;
}

/* The detached records from index lo on, named with the GIL held (name_of called for the
 * codes not named yet), function records' callers' offsets turned into lines in place (what
 * rh_caller_line() reads then). 0; 1 decline (a record of an unknown type, a name that is
 * not a str, an odd string table); -1 error. */
static PASS int
name_detached_held(Fused *f, Py_ssize_t lo, Py_ssize_t n)
{
    rh_rec *recs = f->detached;
    const uint64_t cap = f->cap;
    uint64_t pos = (f->pos0 + (uint64_t)lo) % cap;
    for (Py_ssize_t i = lo; i < n; i++, pos = pos + 1 == cap ? 0 : pos + 1) {
        rh_rec *rec = &recs[pos];
        const int t = rec->type;
        if (t < RH_FUNCTION || t > RH_FUNCGRAPH_RESUME)
            return 1;
        int32_t cs = name_held(f, rec->code), ps = 0;
        if (cs >= 0 && t == RH_FUNCTION && rec->parent != NULL)
            ps = name_held(f, rec->parent);
        if (cs < 0 || ps < 0)
            return (cs < 0 ? cs : ps) == -1 ? -1 : 1;
        if (t == RH_FUNCTION && (rec->flags & RH_CALLER_OFFSET)) {
            const int32_t offset = rec->depth;
            rec->depth = rh_caller_line(rec);
            rec->flags &= ~RH_CALLER_OFFSET;
            if (rec->parent != NULL && PyCode_Check(rec->parent))
                lines_add(f->names, ps, offset, rec->depth); /* for the next rounds */
        }
        f->types[pos] = (uint8_t)t;
        f->named[pos].slot = cs;
        f->named[pos].pslot = ps;
    }
    return 0;
}

/* The records reps noted, named with the GIL (name_detached_held(), one each, in record
 * order): 0, -1 error, 1 decline. */
static int
name_reps(Fused *f, const Reps *reps)
{
    for (int k = 0; k < reps->n; k++) {
        int r = name_detached_held(f, reps->at[k], reps->at[k] + 1);
        if (r != 0)
            return r;
    }
    return 0;
}

/* The references the n detached records hold, counted by slot into f->refs (each code's,
 * each function record's parent's), their slots emptied; a parent no column names (of a
 * record that is not a function record) kept in f->drop. Runs no Python code and touches no
 * reference count: without the GIL, or with it. */
static PASS void
count_detached(Fused *f, Py_ssize_t n)
{
    uint64_t *refs = f->refs;
    const Named *named = f->named;
    PyObject **drop = f->drop + f->ndrop;
    Run run[2];
    taken_runs(f, 0, n, run);
    memset(refs, 0, (size_t)f->names->nslots * sizeof(uint64_t));
    for (int h = 0; h < 2; h++) {
        rh_rec *rec = f->detached + run[h].pos;
        for (uint64_t pos = run[h].pos, end = pos + (uint64_t)run[h].len; pos < end;
             pos++, rec++) {
            refs[named[pos].slot]++;
            if (rec->type == RH_FUNCTION)
                refs[named[pos].pslot]++;
            else if (rec->parent != NULL)
                *drop++ = rec->parent;
            rec->code = rec->parent = NULL;
        }
    }
    f->ndrop = drop - f->drop;
}

/* Release the references of the n detached records, their slots emptied (the call failed).
 * With the GIL; may run Python code (the array is the call's: nothing else reaches it). */
static void
release_detached(Fused *f, Py_ssize_t n)
{
    const uint64_t cap = f->cap;
    uint64_t pos = f->pos0;
    for (Py_ssize_t i = 0; i < n; i++, pos = pos + 1 == cap ? 0 : pos + 1)
        rh_rec_clear(&f->detached[pos]);
}

/* The names of the batches the released pass left (their strings not all in the table, or
 * not looked up since the table changed) looked up now, as name_records() looks them up: 0;
 * 1 decline (the table holds something else than the ints it stores); -1 error. Runs no
 * Python code. */
static int
check_left(Fused *f, const Encoded *enc, Py_ssize_t nenc)
{
    const uint64_t cap = f->cap;
    for (Py_ssize_t b = 0; b < nenc; b++) {
        if (enc[b].done)
            continue;
        uint64_t pos = (f->pos0 + (uint64_t)enc[b].lo) % cap;
        for (Py_ssize_t i = enc[b].lo; i < enc[b].hi; i++, pos = pos + 1 == cap ? 0 : pos + 1) {
            int r = names_check(f->names, f->strings, f->named[pos].slot);
            if (r == 0)
                r = names_check(f->names, f->strings, f->named[pos].pslot);
            if (r != 0)
                return r == -1 ? -1 : 1;
        }
    }
    return 0;
}

/* What the call does without the GIL (steps 1 and 2 above) */
typedef struct {
    Fused *f;
    Encoded *enc;
    Py_ssize_t nenc, n;
    Py_ssize_t named; /* records named so far (-1: one of an unknown type) */
    Reps reps;        /* the records the pass could not name (name_detached()) */
    int counted;      /* count_detached() done */
    rh_rec *ahead[4]; /* the parts of the ring's arrays its writers fill next (ahead_of()) */
    size_t ahead_bytes[4];
    uint64_t lost_before; /* the loss the file must show before these events */
} Detached;

/* Without the GIL, once every batch is encoded: the call's chunks written to f->fd in one
 * writev loop, as the writer would write them (each batch's STR chunk of the strings it adds,
 * then its EVTS chunk), when nothing must come before them in the file: no loss to report
 * first, no format the file has not defined (the writer passes fd -1 while it holds
 * definitions of its own to write). The program's threads run meanwhile: the write of a
 * round's chunks into the page cache (~0.2 ms for richards' ~190 KB) was the longest thing
 * the drain did with the GIL held, and in a program's first rounds most calls add strings.
 * Strings are written from their str's own UTF-8 (Pend.utf8); a call adding one without it
 * leaves its chunks to the writer. Sets f->written, or f->write_errno. */
static void
write_window(Fused *f, const Encoded *enc, Py_ssize_t nenc, uint64_t lost_before)
{
    if (f->fd < 0 || lost_before != 0)
        return;
    Py_ssize_t added = 0; /* strings, over the batches */
    for (Py_ssize_t b = 0; b < nenc; b++) {
        if (!enc[b].done)
            return;
        for (int g = 0; g < enc[b].k; g++) {
            int fid = enc[b].order[g];
            if (fid < 0 || fid > 63 || !(f->defined >> fid & 1))
                return;
        }
        if (enc[b].added == 0)
            continue;
        /* the batch's strings: the next `added` given an index (pend_index()), in order */
        uint64_t payload = 8 + 4 * (uint64_t)enc[b].added;
        for (Py_ssize_t k = added; k < added + enc[b].added; k++) {
            const Pend *p = k < f->nassigned ? &f->pend[f->pend_order[k]] : NULL;
            if (p == NULL || p->utf8 == NULL || (uint64_t)p->len > UINT32_MAX ||
                p->index > UINT32_MAX ||
                p->index != f->table_next - (uint64_t)(f->nassigned - k))
                return;
            payload += (uint64_t)p->len;
        }
        if (payload > MAX_CHUNK_PAYLOAD)
            return; /* (the writer says why: a ValueError) */
        added += enc[b].added;
    }
    if (added != f->nassigned)
        return;
    /* the pieces: per batch, [STR head, first, count, lengths][each string][crc] if it adds
     * strings, then [EVTS head][payload][crc]; the fixed parts in one block */
    const size_t fixed = (size_t)nenc * 2 * (CHUNK_HEAD_SIZE + 4) + (size_t)added * 4 +
                         (size_t)nenc * 8;
    const size_t pieces = (size_t)nenc * 5 + (size_t)added;
    unsigned char *block = PyMem_RawMalloc(fixed ? fixed : 1);
    struct iovec *iov = PyMem_RawMalloc(pieces * sizeof(struct iovec));
    if (block == NULL || iov == NULL) {
        PyMem_RawFree(block);
        PyMem_RawFree(iov);
        return; /* (the writer writes them, the GIL held) */
    }
    const char *out = (const char *)f->sc->out.p;
    unsigned char *h = block;
    Py_ssize_t events = 0, k = 0;
    int niov = 0;
    for (Py_ssize_t b = 0; b < nenc; b++) {
        if (enc[b].added > 0) { /* tracefile.TraceWriter._write_strings()'s chunk */
            const Py_ssize_t count = enc[b].added;
            unsigned char *start = h;
            uint64_t len = 8 + 4 * (uint64_t)count;
            for (Py_ssize_t i = 0; i < count; i++)
                len += (uint64_t)f->pend[f->pend_order[k + i]].len;
            tagged_head(h, TAG_STRINGS, len);
            put32(h + CHUNK_HEAD_SIZE, (uint32_t)f->pend[f->pend_order[k]].index);
            put32(h + CHUNK_HEAD_SIZE + 4, (uint32_t)count);
            h += CHUNK_HEAD_SIZE + 8;
            for (Py_ssize_t i = 0; i < count; i++, h += 4)
                put32(h, (uint32_t)f->pend[f->pend_order[k + i]].len);
            uint32_t crc = crc32_update(0, start, (size_t)(h - start));
            iov[niov++] = (struct iovec){start, (size_t)(h - start)};
            for (Py_ssize_t i = 0; i < count; i++, k++) {
                const Pend *p = &f->pend[f->pend_order[k]];
                crc = crc32_update(crc, (const unsigned char *)p->utf8, (size_t)p->len);
                iov[niov++] = (struct iovec){(void *)p->utf8, (size_t)p->len};
            }
            put32(h, crc);
            iov[niov++] = (struct iovec){h, 4};
            h += 4;
        }
        chunk_head(h, enc[b].len);
        put32(h + CHUNK_HEAD_SIZE, enc[b].crc);
        events += (Py_ssize_t)get32((const unsigned char *)out + enc[b].off); /* its count */
        iov[niov++] = (struct iovec){h, CHUNK_HEAD_SIZE};
        iov[niov++] = (struct iovec){(void *)(out + enc[b].off), enc[b].len};
        iov[niov++] = (struct iovec){h + CHUNK_HEAD_SIZE, 4};
        h += CHUNK_HEAD_SIZE + 4;
    }
    f->write_errno = writev_all(f->fd, iov, niov);
    if (f->write_errno == 0)
        f->written = events;
    PyMem_RawFree(block);
    PyMem_RawFree(iov);
}

static void
detached_released(void *arg)
{
    Detached *d = arg;
    for (int i = 0; i < 4; i++) { /* first: the program's thread is writing there now */
        (void)rh_populate(d->ahead[i], d->ahead_bytes[i]); /* (drainround.h) */
        d->ahead_bytes[i] = 0;
    }
    if (d->named < d->n) {
        d->reps.n = d->reps.full = 0;
        memset(d->reps.keys, 0, sizeof(d->reps.keys));
        d->named = name_detached(d->f, d->named, d->n, &d->reps);
        if (d->named != d->n)
            return; /* what it missed is named with the GIL (or goes to the tuple path) */
    }
    int left = 0;
    for (Py_ssize_t b = 0; b < d->nenc; b++)
        left |= encode_batch(d->f, &d->enc[b], 0);
    if (!left) {
        count_detached(d->f, d->n);
        d->counted = 1;
        write_window(d->f, d->enc, d->nenc, d->lost_before);
    }
}

/* Where a ring's writers go on after a detach() that took n records: from its write position,
 * in its new array now and, after the next detach, in the array just taken (the drain gives
 * it back as the spare, which becomes the ring's array then, ~n records further on). The
 * drain pages both in (rh_populate(), what is there kept) before the program's thread reaches
 * them: fresh memory costs ~2 us a page on this VM, which the program would otherwise pay as
 * it writes (richards: ~13 ms of its own run). Twice as far as the call took (at least
 * AHEAD_MIN records): the new array's first part races with its writer, but the taken
 * array's part is ready a whole round before its writer gets there. Only that far: a short
 * program pages in about what it writes, not its rings' whole arrays. And only until an
 * array has had PAGED_LAPS times its size paged in (its header counts): by then the windows,
 * which move on with the writer, have met every page, and walking present pages is not free
 * (~0.1 us a page: richards' drain spent ~25 ms on it). With the GIL, right after the
 * detach. */
#define AHEAD_MIN 4096
#define PAGED_LAPS 3
static void
ahead_in(rh_rec *recs, uint64_t cap, uint64_t wpos, uint64_t want, rh_rec **at, size_t *bytes)
{
    rh_array_head *head = rh_array_head_of(recs);
    if (head->paged >= PAGED_LAPS * cap * sizeof(rh_rec)) {
        bytes[0] = bytes[1] = 0;
        return;
    }
    head->paged += want * sizeof(rh_rec);
    const uint64_t first = want < cap - wpos ? want : cap - wpos;
    at[0] = recs + wpos;
    bytes[0] = (size_t)first * sizeof(rh_rec);
    at[1] = recs;
    bytes[1] = (size_t)(want - first) * sizeof(rh_rec);
}

/* How many records ahead of a ring's writers the drain pages, after a call that took n:
 * twice as many (at least AHEAD_MIN), at most the ring. */
static inline uint64_t
ahead_want(uint64_t n, uint64_t cap)
{
    uint64_t want = 2 * (n > AHEAD_MIN ? n : AHEAD_MIN);
    return want < cap ? want : cap;
}

static void
ahead_of(const rh_ring *rg, rh_rec *taken, uint64_t n, Detached *d, const rh_round_api *round)
{
    if (!rg->on)
        return; /* nothing writes it now (the recording's last drain: its pages would be a
                 * cost for nothing, ~1 ms a 20 k-event program's end) */
    const uint64_t cap = rg->capacity, want = ahead_want(n, cap);
    ahead_in(rg->recs, cap, rg->wpos, want, d->ahead, d->ahead_bytes);
    ahead_in(taken, cap, rg->wpos, want, d->ahead + 2, d->ahead_bytes + 2);
    if (round == NULL)
        return;
    /* The taken array is written a whole round from now: paged in during the drain's next
     * wait (_ccore.c, "Paging ahead"), in steps that the recording's end cuts short, not
     * before this round's encoding, which a program that ends meanwhile waits for
     * (deltablue's only round: ~8 MB, ~1.8 ms of its finish). */
    for (int i = 2; i < 4; i++) {
        if (d->ahead_bytes[i])
            round->page_ahead(d->ahead[i], d->ahead_bytes[i]);
        d->ahead_bytes[i] = 0;
    }
}

/* A call that reads the records in place leaves the writers in the same array: its part
 * they fill next is asked of the drain (drainround.h's page_ahead: paged in during its next
 * wait, without the GIL), as ahead_of() pages it after a detach. */
static void
page_ahead_in_place(const rh_ring *rg, uint64_t n, const rh_round_api *round)
{
    if (round == NULL || !rg->on)
        return;
    const uint64_t cap = rg->capacity, want = ahead_want(n, cap);
    rh_rec *at[2];
    size_t bytes[2];
    ahead_in(rg->recs, cap, rg->wpos, want, at, bytes);
    for (int i = 0; i < 2; i++)
        if (bytes[i] > 0)
            round->page_ahead(at[i], bytes[i]);
}

/* The records of a detached array that need the tuple path: moved out of it into an array
 * of their own (the detached one given back), decoded into event tuples as Ring.consume()
 * decodes them, and the result encode_ring() gives then (see consume_events()). */
static PyObject *
detached_events(Fused *f, const rh_cring_api *api, rh_taken *t, PyObject *tid)
{
    const uint64_t n = t->n, cap = f->cap;
    rh_rec *buf = PyMem_Malloc(n ? (size_t)n * sizeof(rh_rec) : 1);
    if (buf == NULL) {
        api->untake(f->ring, t);
        release_detached(f, (Py_ssize_t)n); /* (may run Python code) */
        api->give_back(f->detached, cap);
        return PyErr_NoMemory();
    }
    uint64_t pos = f->pos0;
    for (uint64_t i = 0; i < n; i++, pos = pos + 1 == cap ? 0 : pos + 1) {
        buf[i] = f->detached[pos];
        f->detached[pos].code = f->detached[pos].parent = NULL;
    }
    api->give_back(f->detached, cap);
    return tuple_result(api, f->ring, t, buf, n, tid, f->name_of);
}

/* The call failed once the records were detached: they reach no reader (lost, as
 * Ring.consume() counts them), their references are released, the array given back. The
 * error stays set. */
static void
detached_failed(Fused *f, const rh_cring_api *api, rh_taken *t, Py_ssize_t n)
{
    api->untake(f->ring, t);
    PyObject *exc = PyErr_GetRaisedException();
    release_detached(f, n); /* may run Python code */
    api->give_back(f->detached, f->cap);
    PyErr_SetRaisedException(exc);
}

/* After a released pass that left records unnamed: name them with the GIL (the records the
 * pass noted, or with `rest` every record from the first one unnamed on), ready the call for
 * the names added (the references' counts, the new strings), and let the GIL go again for
 * the rest. 0 (d->named -1 where a record declines: the tuple path); -1 error. */
static int
name_again(Fused *f, Detached *d, const rh_round_api *round, int rest)
{
    Scratch *sc = f->sc;
    held_records += (uint64_t)(rest ? d->n - d->named : d->reps.n);
    int r = rest ? name_detached_held(f, d->named, d->n) : name_reps(f, &d->reps);
    if (r == 0 && (area_room(sc, &sc->refs, (size_t)f->names->nslots * sizeof(uint64_t)) < 0
                   || pend_resolve(f) < 0))
        r = -1;
    if (r != 0) {
        d->named = -1;
        return r < 0 ? -1 : 0;
    }
    if (rest)
        d->named = d->n;
    f->refs = sc->refs.p;
    run_released(f, round, detached_released, d);
    return 0;
}

/* encode_ring() for a call that lets the GIL go, its records named, encoded and counted
 * without it (see above). f: the call's, its names ready; n: the ring's readable records
 * now (what releases_gil() said yes to). 0: done, *result is the call's (NULL with an
 * error); 1: no memory for the detach (nothing taken, no error set): the caller reads the
 * records in place instead, which needs none. */
static int
encode_detached(Fused *f, const rh_cring_api *api, const rh_round_api *round, Py_ssize_t n,
                Py_ssize_t batch, PyObject *tid, Scratch *local, PyObject **result)
{
    Scratch *sc = f->sc;
    rh_ring *rg = f->ring;
    const uint64_t cap = rg->capacity;
    Py_ssize_t most = n < batch ? n : batch;
    Encoded *enc = PyMem_Calloc((size_t)(n / batch + 2), sizeof(Encoded));
    if (enc == NULL || area_room(sc, &sc->types, (size_t)cap) < 0 ||
        area_room(sc, &sc->named, (size_t)cap * sizeof(Named)) < 0 ||
        area_room(sc, &sc->vals, VALS_MAX(most) * sizeof(uint64_t)) < 0 ||
        area_room(sc, &sc->out, OUT_MAX(most) + (size_t)n * OUT_USUAL) < 0 ||
        area_room(sc, &sc->drop, (size_t)n * sizeof(PyObject *)) < 0 ||
        area_room(sc, &sc->refs, (size_t)f->names->nslots * sizeof(uint64_t)) < 0) {
        PyErr_Clear();
        PyMem_Free(enc);
        return 1;
    }
    rh_taken t;
    rh_rec *array;
    if (api->detach(rg, &t, &array) < 0) {
        PyErr_Clear();
        PyMem_Free(enc);
        return 1;
    }
    /* the records are the call's: Python code may run from here on */
    f->detached = array;
    f->cap = cap;
    f->pos0 = t.n ? t.first % cap : 0;
    f->types = sc->types.p;
    f->named = sc->named.p;
    f->vals = sc->vals.p;
    f->drop = sc->drop.p;
    f->refs = sc->refs.p;
    n = (Py_ssize_t)t.n; /* (the same n: nothing ran since it was read) */
    const Py_ssize_t strings_start = PyList_GET_SIZE(f->new_strings);
    const uint64_t table_start = (uint64_t)PyDict_GET_SIZE(f->strings);
    Detached d = {.f = f, .enc = enc, .nenc = split_batches(enc, n, batch, t.lost_before),
                  .n = n, .lost_before = t.lost_before};
    ahead_of(rg, array, t.n, &d, round);
    gil_releases++; /* (a call, however many times it lets the GIL go) */
    if (pend_resolve(f) < 0) {
        detached_failed(f, api, &t, n);
        goto failed;
    }
    run_released(f, round, detached_released, &d);
    /* what it missed: first the records noted (one a code or call site), then, if it still
     * misses some (more than REPS new ones), every record from the first one unnamed on */
    if ((d.named >= 0 && d.named < n && !d.reps.full && name_again(f, &d, round, 0) < 0) ||
        (d.named >= 0 && d.named < n && name_again(f, &d, round, 1) < 0)) {
        detached_failed(f, api, &t, n);
        goto failed;
    }
    if (d.named >= 0 && !d.counted) {
        int r = check_left(f, enc, d.nenc);
        if (r < 0) { /* (not reached: no dict lookup of a str key fails) */
            detached_failed(f, api, &t, n);
            goto failed;
        }
        if (r > 0)
            d.named = -1;
    }
    if (d.named < 0) { /* the tuple path (no string added; the references still in place) */
        if (f->nassigned > 0) /* (indices given without the GIL, never added) */
            names_forget(f->names, table_start);
        PyMem_Free(enc);
        *result = detached_events(f, api, &t, tid);
        PyObject *exc = PyErr_GetRaisedException();
        names_release(f);
        scratch_done(sc, local);
        PyErr_SetRaisedException(exc);
        return 0;
    }
    /* the strings given an index without the GIL, then the batches left: strings to add */
    if (pend_commit(f) == 0) {
        for (Py_ssize_t b = 0; b < d.nenc; b++) {
            if (enc[b].done)
                continue;
            held_records += (uint64_t)(enc[b].hi - enc[b].lo);
            if (encode_batch(f, &enc[b], 1) < 0)
                break;
        }
    }
    if (!d.counted)
        count_detached(f, n);
    drop_counted(f);
    api->give_back(array, cap);
    if (f->write_errno != 0) /* (call_result() counts the records lost) */
        write_failed(f->write_errno, "encode_ring()");
    *result = call_result(f, api, &t, enc, d.nenc, strings_start, table_start, local);
    return 0;

failed: {
    PyMem_Free(enc);
    if (f->nassigned > 0) /* (indices given without the GIL, never added) */
        names_forget(f->names, table_start);
    PyObject *exc = PyErr_GetRaisedException();
    names_release(f); /* may run Python code */
    scratch_done(sc, local);
    PyErr_SetRaisedException(exc);
    *result = NULL;
    return 0;
}
}

static PyObject *encode_ring_impl(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                  int fd, uint64_t defined, Py_ssize_t *written);

static PyObject *
encode_ring(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 && nargs != 7 && nargs != 9) {
        PyErr_Format(PyExc_TypeError, "encode_ring() takes 6, 7 or 9 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (nargs < 9) {
        Py_ssize_t unused;
        return encode_ring_impl(module, args, nargs, -1, 0, &unused);
    }
    long fd = PyLong_AsLong(args[7]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < -1 || fd > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "encode_ring(): fd must be a file descriptor or -1, "
                     "not %ld", fd);
        return NULL;
    }
    uint64_t defined = PyLong_AsUnsignedLongLong(args[8]);
    if (defined == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t written = -1;
    PyObject *r = encode_ring_impl(module, args, 7, (int)fd, defined, &written);
    if (r == NULL || !PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4)
        return r;
    PyObject *w = written >= 0 ? PyLong_FromSsize_t(written) : Py_NewRef(Py_None);
    PyObject *out = w == NULL ? NULL
                    : Py_BuildValue("(OOOON)", PyTuple_GET_ITEM(r, 0), PyTuple_GET_ITEM(r, 1),
                                    PyTuple_GET_ITEM(r, 2), PyTuple_GET_ITEM(r, 3), w);
    Py_DECREF(r);
    return out;
}

static PyObject *
encode_ring_impl(PyObject *module, PyObject *const *args, Py_ssize_t nargs, int fd,
                 uint64_t defined, Py_ssize_t *written)
{
    State *st = PyModule_GetState(module);
    PyObject *ring = args[0], *tid = args[1], *name_of = args[2], *strings = args[3];
    PyObject *new_strings = args[4];
    NameCache *cache = NULL;
    if (nargs == 7 && args[6] != Py_None) {
        if (!PyObject_TypeCheck(args[6], st->cache_type)) {
            PyErr_Format(PyExc_TypeError, "encode_ring(): names must be a NameCache or None, "
                                          "not %.100s", Py_TYPE(args[6])->tp_name);
            return NULL;
        }
        cache = (NameCache *)args[6];
    }
    if (!PyDict_CheckExact(strings) || !PyList_CheckExact(new_strings)) {
        PyErr_SetString(PyExc_TypeError, "encode_ring(): strings must be a dict and "
                                         "new_strings a list");
        return NULL;
    }
    Py_ssize_t batch = PyNumber_AsSsize_t(args[5], PyExc_OverflowError);
    if (batch == -1 && PyErr_Occurred())
        return NULL;
    if (batch < 1 || batch > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "encode_ring(): batch must be in [1, 2**24], not %zd",
                     batch);
        return NULL;
    }
    const rh_cring_api *api = cring_api();
    if (api == NULL)
        return NULL;
    const rh_round_api *round = rh_round_api_find();
    if (!PyObject_TypeCheck(ring, api->ring_type)) {
        PyErr_Format(PyExc_TypeError, "encode_ring(): expected a Ring, not %.100s",
                     Py_TYPE(ring)->tp_name);
        return NULL;
    }
    rh_ring *rg = (rh_ring *)ring;
    Fused f = {.ring = rg, .name_of = name_of, .strings = strings,
               .new_strings = new_strings, .fd = fd, .defined = defined, .written = -1};
    {
        uint64_t tv;
        int seen = 0;
        if (read_int(tid, &tv, &seen) != 0 || (seen & (SEEN_NEG | SEEN_BIG)) ==
                                                  (SEEN_NEG | SEEN_BIG)) {
            if (PyErr_Occurred())
                return NULL;
            return consume_events(api, rg, tid, name_of); /* the big-integer encoding */
        }
        f.tid = tv;
        f.tid_seen = seen;
    }
    /* the scratch memory: the module's, unless a call in progress uses it (name_of runs
     * Python code, which could make another call; another thread may while a call has
     * released the GIL) */
    Scratch *kept = &st->scratch, local = {0};
    Scratch *sc = scratch_in_use(kept) ? &local : kept;
    sc->busy = 1;
    sc->busy_gen = fork_gen;
    f.sc = sc;
    /* the names: the cache's (when a call in progress does not use it: name_of may make
     * this call), or a table of the call's own */
    Names own;
    int r;
    if (cache != NULL && !cache_in_use(cache)) {
        cache_acquire(cache);
        f.cache = cache;
        f.names = &cache->names;
        r = cache_ready(cache, strings, name_of); /* may run Python code */
    }
    else {
        f.names = &own;
        r = names_init(&own, strings);
    }
    if (r == 0) {
        Py_ssize_t n = (Py_ssize_t)(rg->head - rg->floor);
        PyObject *result;
        if (n > 0 && releases_gil(n, rg->capacity, round) &&
            encode_detached(&f, api, round, n, batch, tid, &local, &result) == 0) {
            *written = result != NULL ? f.written : -1;
            return result;
        }
        r = name_records(&f, rg);
    }
    if (r != 0) { /* the records need the tuple path, or an error */
        PyObject *result = NULL;
        if (r > 0 || r == -2) {
            result = consume_events(api, rg, tid, name_of);
            names_release(&f);
        }
        else {
            PyObject *exc = PyErr_GetRaisedException();
            consume_lost(api, rg);
            names_release(&f); /* may run Python code */
            PyErr_SetRaisedException(exc);
        }
        scratch_done(sc, &local);
        return result;
    }

    /* Every record of [floor, head) is named, nothing has run since: from here until they
     * are all out of the ring, no Python code runs (and the GIL stays: a call that lets it
     * go detaches the array, above). */
    uint64_t count = rg->head - rg->floor; /* <= capacity, whose array was allocated */
    Py_ssize_t n = (Py_ssize_t)count;
    Py_ssize_t most = n < batch ? n : batch;
    Encoded *enc = PyMem_Calloc((size_t)(n / batch + 2), sizeof(Encoded));
    if (enc == NULL || area_room(sc, &sc->vals, VALS_MAX(most) * sizeof(uint64_t)) < 0 ||
        area_room(sc, &sc->out, OUT_MAX(most) + (size_t)n * OUT_USUAL) < 0 ||
        area_room(sc, &sc->drop, (size_t)n * 2 * sizeof(PyObject *)) < 0) {
        if (enc == NULL)
            PyErr_NoMemory();
        PyMem_Free(enc);
        names_release(&f);
        scratch_done(sc, &local);
        return NULL;
    }
    f.vals = sc->vals.p;
    f.drop = sc->drop.p;
    f.cap = rg->capacity;

    /* Ring.consume()'s accounting, the records left in their slots */
    rh_taken t;
    api->take_in_place(rg, &t);
    f.pos0 = count ? t.first % f.cap : 0;
    page_ahead_in_place(rg, count, round);
    const Py_ssize_t strings_start = PyList_GET_SIZE(new_strings);
    const uint64_t table_start = (uint64_t)PyDict_GET_SIZE(strings); /* this call's first */
    Py_ssize_t nenc = split_batches(enc, n, batch, t.lost_before);
    for (Py_ssize_t b = 0; b < nenc; b++) {
        if (encode_batch(&f, &enc[b], 1) < 0) {
            move_refs(&f, n); /* (the references left in the ring) */
            break;
        }
    }
    /* all out of the ring: Python code may run again */
    return call_result(&f, api, &t, enc, nenc, strings_start, table_start, &local);
}

PyDoc_STRVAR(reserve_doc,
"reserve(records, batch) -> None\n\
\n\
Make encode_ring()'s scratch memory ready for rings of up to `records` records and\n\
batches of `batch`, and the rings' spare array: allocated now (MemoryError here, before\n\
a recording starts). Their pages are met as they are used: the encoder's by the calls\n\
that write them, a ring's array ahead of its writers by the call that detached the\n\
array before it (see encode_ring()).");

/* The scratch areas a call of n records in batches of at most `batch` writes, and how many
 * bytes of each: what reserve() makes room for, and what page_first_round() pages in. */
#define SCRATCH_AREAS 5
static void
scratch_needs(Scratch *sc, size_t n, size_t batch, Area *areas[SCRATCH_AREAS],
              size_t bytes[SCRATCH_AREAS])
{
    size_t most = n < batch ? n : batch;
    areas[0] = &sc->types, bytes[0] = n;
    areas[1] = &sc->named, bytes[1] = n * sizeof(Named);
    areas[2] = &sc->vals, bytes[2] = VALS_MAX(most) * sizeof(uint64_t);
    areas[3] = &sc->out, bytes[3] = OUT_MAX(most) + n * OUT_USUAL;
    areas[4] = &sc->drop, bytes[4] = n * 2 * sizeof(PyObject *);
}

/* What a drain round of a quarter ring (the drain's wake: cring.h) writes of the scratch
 * areas, asked of the drain to page in while it waits (drainround.h's page_ahead): a short
 * program's records are all encoded by the recording's last drain, as it finishes, which
 * would otherwise meet each of those fresh pages there (~1.7 us each here). */
static void
page_first_round(Scratch *sc, size_t records, size_t batch)
{
    const rh_round_api *round = rh_round_api_find();
    size_t n = (size_t)RH_RING_WAKE_WATER(records);
    if (round == NULL || n == 0)
        return;
    Area *areas[SCRATCH_AREAS];
    size_t bytes[SCRATCH_AREAS];
    scratch_needs(sc, n, batch, areas, bytes);
    for (int i = 0; i < SCRATCH_AREAS; i++)
        round->page_ahead(areas[i]->p, bytes[i] < areas[i]->bytes ? bytes[i] : areas[i]->bytes);
}

static PyObject *
reserve(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "reserve() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t records = PyNumber_AsSsize_t(args[0], PyExc_OverflowError);
    if (records == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t batch = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (batch == -1 && PyErr_Occurred())
        return NULL;
    if (records < 0 || batch < 1 || batch > (1 << 24) ||
        (size_t)records > PY_SSIZE_T_MAX / sizeof(rh_rec)) {
        PyErr_SetString(PyExc_ValueError, "reserve(): records >= 0, batch in [1, 2**24]");
        return NULL;
    }
    Scratch *sc = &((State *)PyModule_GetState(module))->scratch;
    if (scratch_in_use(sc))
        Py_RETURN_NONE;
    Area *areas[SCRATCH_AREAS];
    size_t bytes[SCRATCH_AREAS];
    scratch_needs(sc, (size_t)records, (size_t)batch, areas, bytes);
    for (int i = 0; i < SCRATCH_AREAS; i++)
        if (area_room(sc, areas[i], bytes[i]) < 0)
            return NULL;
    /* the rings' spare array (encode_detached()), made now rather than by the first detach */
    const rh_cring_api *api = cring_api();
    if (api == NULL)
        return NULL;
    if (records > 0 && api->reserve_spare((uint64_t)records) == NULL)
        return NULL;
    page_first_round(sc, (size_t)records, (size_t)batch);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(free_scratch_doc,
"free_scratch() -> None\n\
\n\
Free the memory encode_ring() keeps between calls (TraceWriter.close() does; while a\n\
call uses it, when that call ends), and the rings' spare array.");

static PyObject *
free_scratch(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    Scratch *sc = &((State *)PyModule_GetState(module))->scratch;
    if (scratch_in_use(sc))
        sc->free_pending = 1;
    else
        scratch_free(sc);
    const rh_cring_api *api = cring_api(); /* and the rings' spare array (encode_detached) */
    if (api == NULL)
        PyErr_Clear();
    else
        api->free_spare();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(nogil_doc,
"_nogil([mode]) -> (mode, releases, held)\n\
\n\
For tests and measurements: when encode_ring() releases the GIL. mode 0: never;\n\
1: the policy (a call of 4096 records or more, from a ring at most half full);\n\
2: every call that takes records. Returns the mode before the call, how many\n\
calls have released the GIL since the import, and how many records such calls\n\
named or encoded with it held all the same (codes never named, strings the table\n\
lacks).");

static PyObject *
tfenc_nogil(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    int old = gil_mode;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "_nogil() takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1) {
        long m = PyLong_AsLong(args[0]);
        if (m == -1 && PyErr_Occurred())
            return NULL;
        if (m < GIL_HOLD || m > GIL_RELEASE) {
            PyErr_SetString(PyExc_ValueError, "_nogil(): mode 0, 1 or 2");
            return NULL;
        }
        gil_mode = (int)m;
    }
    return Py_BuildValue("(iKK)", old, (unsigned long long)gil_releases,
                         (unsigned long long)held_records);
}

static PyMethodDef methods[] = {
    {"encode_group", (PyCFunction)(void (*)(void))encode_group, METH_FASTCALL, encode_group_doc},
    {"encode_ints", (PyCFunction)(void (*)(void))encode_ints, METH_FASTCALL, encode_ints_doc},
    {"encode_ring", (PyCFunction)(void (*)(void))encode_ring, METH_FASTCALL, encode_ring_doc},
    {"crc32", (PyCFunction)(void (*)(void))tfenc_crc32, METH_FASTCALL, crc32_doc},
    {"write_held", (PyCFunction)(void (*)(void))write_held, METH_FASTCALL, write_held_doc},
    {"read_held", (PyCFunction)(void (*)(void))read_held, METH_FASTCALL, read_held_doc},
    {"reserve", (PyCFunction)(void (*)(void))reserve, METH_FASTCALL, reserve_doc},
    {"free_scratch", free_scratch, METH_NOARGS, free_scratch_doc},
    {"_nogil", (PyCFunction)(void (*)(void))tfenc_nogil, METH_FASTCALL, nogil_doc},
    {"_crc_clmul", (PyCFunction)(void (*)(void))tfenc_crc_clmul, METH_FASTCALL, crc_clmul_doc},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------- */
/* import: check the constants against tracefile.py                                          */

static int
check_constant(PyObject *tf, const char *name, long want)
{
    PyObject *v = PyObject_GetAttrString(tf, name);
    if (v == NULL)
        return -1;
    long got = PyLong_AsLong(v);
    Py_DECREF(v);
    if (got == -1 && PyErr_Occurred())
        return -1;
    if (got != want) {
        PyErr_Format(PyExc_ImportError,
                     "rethook: tracefile.%s is %ld, the C trace file encoder was built for %ld",
                     name, got, want);
        return -1;
    }
    return 0;
}

/* tracefile.<name>[k] is a _Width with this code, lo and hi */
static int
check_width(PyObject *tf, const char *name, Py_ssize_t k, int code)
{
    int size = SIZE(code), is_signed = (code & SIGNED) != 0;
    PyObject *widths = NULL, *w = NULL, *want = NULL, *got = NULL;
    int ok = -1;
    if ((widths = PyObject_GetAttrString(tf, name)) == NULL ||
        (w = PySequence_GetItem(widths, k)) == NULL)
        goto out;
    static const char *const attrs[] = {"code", "lo", "hi"};
    for (int a = 0; a < 3; a++) {
        if (a == 0)
            want = PyLong_FromLong(code);
        else if (is_signed)
            want = PyLong_FromLongLong(a == 1 ? -(long long)((1ULL << (8 * size - 1)) - 1) - 1
                                              : (long long)((1ULL << (8 * size - 1)) - 1));
        else
            want = PyLong_FromUnsignedLongLong(
                a == 1 ? 0 : (size == 8 ? UINT64_MAX : (1ULL << (8 * size)) - 1));
        if (want == NULL || (got = PyObject_GetAttrString(w, attrs[a])) == NULL)
            goto out;
        int same = PyObject_RichCompareBool(got, want, Py_EQ);
        if (same < 0)
            goto out;
        if (!same) {
            PyErr_Format(PyExc_ImportError,
                         "rethook: tracefile.%s[%zd].%s is %R, the C trace file encoder was "
                         "built for %R", name, k, attrs[a], got, want);
            goto out;
        }
        Py_CLEAR(want);
        Py_CLEAR(got);
    }
    ok = 0;
out:
    Py_XDECREF(widths);
    Py_XDECREF(w);
    Py_XDECREF(want);
    Py_XDECREF(got);
    return ok;
}

/* tracefile._CHUNK_HEAD.pack(tracefile.<name>, n) is tagged_head(tag)'s (the chunks
 * write_window() writes) */
static int
check_tagged_head(PyObject *tf, const char *name, const char *tag)
{
    const uint64_t n = 0x01020304;
    unsigned char head[CHUNK_HEAD_SIZE];
    tagged_head(head, tag, n);
    PyObject *want = PyBytes_FromStringAndSize((const char *)head, CHUNK_HEAD_SIZE);
    PyObject *pack = PyObject_GetAttrString(tf, "_CHUNK_HEAD");
    PyObject *value = PyObject_GetAttrString(tf, name);
    PyObject *got = want && pack && value ? PyObject_CallMethod(pack, "pack", "Ok", value, n)
                                          : NULL;
    int same = got != NULL ? PyObject_RichCompareBool(got, want, Py_EQ) : -1;
    if (same == 0)
        PyErr_Format(PyExc_ImportError, "rethook: tracefile.%s: the %.4s chunk head is %R, "
                     "the C trace file encoder was built for %R", name, tag, got, want);
    Py_XDECREF(want);
    Py_XDECREF(pack);
    Py_XDECREF(value);
    Py_XDECREF(got);
    return same == 1 ? 0 : -1;
}

static int
check_chunk_head(PyObject *tf)
{
    return check_tagged_head(tf, "TAG_EVENTS", TAG_EVENTS) < 0 ||
           check_tagged_head(tf, "TAG_STRINGS", TAG_STRINGS) < 0 ||
           check_constant(tf, "MAX_CHUNK_PAYLOAD", (long)MAX_CHUNK_PAYLOAD) < 0 ? -1 : 0;
}

/* RING_LAYOUTS: {record type: the field types (after ts and tid) of the event it becomes}, as
 * encode_ring() encodes them; the writer checks its formats against it. */
static int
add_layouts(PyObject *module)
{
    PyObject *layouts = PyDict_New();
    if (layouts == NULL)
        return -1;
    for (int t = RH_FUNCTION; t < RING_TYPES; t++) {
        int w = layout_width(t);
        PyObject *types = PyTuple_New(w - 2);
        PyObject *key = PyLong_FromLong(t);
        for (int c = 2; types != NULL && c < w; c++) {
            PyObject *name = PyUnicode_FromString(is_str_source(LAYOUT[t][c]) ? "str" : "u64");
            if (name == NULL)
                Py_CLEAR(types);
            else
                PyTuple_SET_ITEM(types, c - 2, name);
        }
        int r = types != NULL && key != NULL ? PyDict_SetItem(layouts, key, types) : -1;
        Py_XDECREF(types);
        Py_XDECREF(key);
        if (r < 0) {
            Py_DECREF(layouts);
            return -1;
        }
    }
    int r = PyModule_AddObjectRef(module, "RING_LAYOUTS", layouts);
    Py_DECREF(layouts);
    return r;
}

static int
tfenc_exec(PyObject *module)
{
    static const int codes[] = {1, 2, 4, 8};
    /* tracefile.py imports this module once these are defined; the module is then partly
     * initialised, and importing it again returns it as it is */
    PyObject *tf = PyImport_ImportModule("rethook.buffer.tracefile");
    if (tf == NULL)
        return -1;
    int bad = check_constant(tf, "_INT_PLAIN", INT_PLAIN) < 0 ||
              check_constant(tf, "_INT_DELTA", INT_DELTA) < 0 ||
              check_constant(tf, "_INT_CONST", INT_CONST) < 0 ||
              check_constant(tf, "_WIDTH_SAMPLES", WIDTH_SAMPLES) < 0 ||
              check_chunk_head(tf) < 0;
    for (Py_ssize_t k = 0; k < 4 && !bad; k++)
        bad = check_width(tf, "_UNSIGNED", k, codes[k]) < 0 ||
              check_width(tf, "_SIGNED", k, SIGNED | codes[k]) < 0;
    Py_DECREF(tf);
    if (bad && !PyErr_ExceptionMatches(PyExc_ImportError)) {
        /* tracefile.py has changed shape: an ImportError, so the writer falls back to Python */
        PyObject *cause = PyErr_GetRaisedException();
        PyErr_Format(PyExc_ImportError,
                     "rethook: cannot check the C trace file encoder against tracefile.py: %S",
                     cause);
        PyObject *exc = PyErr_GetRaisedException();
        PyException_SetCause(exc, cause);
        PyErr_SetRaisedException(exc);
    }
    if (bad)
        return -1;
    crc_init();
    static int atfork_set; /* (once per process, whatever the interpreters) */
    if (!atfork_set && pthread_atfork(NULL, NULL, tfenc_after_fork) == 0)
        atfork_set = 1;
    State *st = PyModule_GetState(module);
    st->cache_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &cache_spec, NULL);
    if (st->cache_type == NULL || PyModule_AddType(module, st->cache_type) < 0)
        return -1;
    return add_layouts(module);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, tfenc_exec},
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
    {0, NULL},
};

static int
tfenc_traverse(PyObject *module, visitproc visit, void *arg)
{
    State *st = PyModule_GetState(module);
    if (st != NULL)
        Py_VISIT(st->cache_type);
    return 0;
}

static int
tfenc_clear(PyObject *module)
{
    State *st = PyModule_GetState(module);
    if (st != NULL)
        Py_CLEAR(st->cache_type);
    return 0;
}

static void
tfenc_free(void *module)
{
    State *st = PyModule_GetState((PyObject *)module);
    if (st != NULL) {
        /* At the runtime's end the scratch memory (tens of MB, paged in) goes with the
         * process: freeing it would give it back page by page (~1 ms) for nothing. */
#if PY_VERSION_HEX >= 0x030D0000
        int ending = Py_IsFinalizing();
#else
        int ending = _Py_IsFinalizing();
#endif
        if (!ending)
            scratch_free(&st->scratch);
        Py_CLEAR(st->cache_type);
    }
}

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rethook.buffer._tfenc",
    .m_doc = "The C twin of the trace file writer's column encoder (rethook.buffer.tracefile).",
    .m_size = sizeof(State),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = tfenc_traverse,
    .m_clear = tfenc_clear,
    .m_free = tfenc_free,
};

PyMODINIT_FUNC
PyInit__tfenc(void)
{
    return PyModuleDef_Init(&moduledef);
}
