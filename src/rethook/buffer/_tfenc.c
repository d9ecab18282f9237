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
 * Everything runs under the GIL. Between the first item read and the return no Python code
 * runs (only exact ints, bools, floats and strs are looked at, and the string table is a dict
 * of str keys), so the borrowed references to the events and their items stay valid.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
    int64_t first = (int64_t)v[0], lo = first, hi = first;
    for (i = 1; i < n; i++) {
        int64_t x = (int64_t)v[i];
        if (x < lo)
            lo = x;
        else if (x > hi)
            hi = x;
    }
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
            if (x < slo)
                slo = x;
            else if (x > shi)
                shi = x;
        }
        if (SIZE(narrowest(slo, shi)) == 8) {
            /* the differences, in the narrowest width that holds them all (what _pack ends
             * up with, whatever its guess); one beyond int64 needs 8 bytes: no delta */
            int64_t dlo = (int64_t)(v[1] - v[0]), dhi = dlo;
            int wide = 0;
            for (i = 1; i < n; i++) {
                int64_t a = (int64_t)v[i], b = (int64_t)v[i - 1];
                int64_t d = (int64_t)(v[i] - v[i - 1]);
                if (((a ^ b) & (a ^ d)) < 0) { /* a - b overflowed */
                    wide = 1;
                    break;
                }
                if (d < dlo)
                    dlo = d;
                else if (d > dhi)
                    dhi = d;
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

static PyMethodDef methods[] = {
    {"encode_group", (PyCFunction)(void (*)(void))encode_group, METH_FASTCALL, encode_group_doc},
    {"encode_ints", (PyCFunction)(void (*)(void))encode_ints, METH_FASTCALL, encode_ints_doc},
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

static int
tfenc_exec(PyObject *module)
{
    (void)module;
    static const int codes[] = {1, 2, 4, 8};
    /* tracefile.py imports this module once these are defined; the module is then partly
     * initialised, and importing it again returns it as it is */
    PyObject *tf = PyImport_ImportModule("rethook.buffer.tracefile");
    if (tf == NULL)
        return -1;
    int bad = check_constant(tf, "_INT_PLAIN", INT_PLAIN) < 0 ||
              check_constant(tf, "_INT_DELTA", INT_DELTA) < 0 ||
              check_constant(tf, "_INT_CONST", INT_CONST) < 0 ||
              check_constant(tf, "_WIDTH_SAMPLES", WIDTH_SAMPLES) < 0;
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
    return bad ? -1 : 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, tfenc_exec},
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rethook.buffer._tfenc",
    .m_doc = "The C twin of the trace file writer's column encoder (rethook.buffer.tracefile).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__tfenc(void)
{
    return PyModuleDef_Init(&moduledef);
}
