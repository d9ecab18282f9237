/*
 * rethook.buffer._cring -- the C ring buffer: one array of fixed-size records per thread.
 *
 * This module owns the rh_ring type declared in cring.h: its allocation, its accounting and
 * its readers. Native users (rethook.tracers._native) write records with the inline
 * rh_ring_reserve() of cring.h and find the type through the capsule _C_API; Python writes
 * through Ring.write(). rethook.buffer.ring attaches one ring to each thread's ThreadBuffer
 * and turns the raw records read here into the event tuples its readers merge (native.py).
 * The capsule also exports Ring.consume() in pieces (take, take_in_place, detach, untake,
 * release, events: cring.h), for the trace file writer, which encodes records without event
 * tuples (_tfenc.c's encode_ring).
 *
 * Everything runs under the GIL and nothing here takes a lock. What a method reads or changes
 * in the ring it does in one step that cannot run Python code (no object allocation, no
 * DECREF reaching zero); only then does it build Python objects or release references, from
 * records it has copied or moved out of the ring. Python code that runs meanwhile (a GC
 * finalizer) may write into the ring or read it without seeing it half changed.
 *
 * Invariant: exactly the records with sequence numbers in [floor, head) hold references;
 * every other slot is empty (rh_ring_reserve takes out what the slot it overwrites held,
 * released by rh_ring_done; consume, clear and resize move or release what leaves the
 * readable range). The one exception is the capsule's take_in_place(): its caller owns the
 * references left in the slots it took and empties them before any Python code runs. (An
 * array the capsule's detach() took out of its ring is no ring's: its taker empties it
 * before giving it back.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

#include "cring.h" /* (with ../engine/drainround.h: the drain woken, blocking) */

#if PY_VERSION_HEX < 0x030C0000
#error "rethook's C ring needs CPython 3.12 or newer"
#endif
#ifdef Py_GIL_DISABLED
#error "rethook's C ring relies on the GIL; free-threaded builds use the pure-Python ring"
#endif
#ifdef Py_LIMITED_API
#error "rethook's C ring uses CPython's non-limited API"
#endif

static PyTypeObject Ring_Type;

/* ---------------------------------------------------------------------------------------- */
/* helpers                                                                                   */

/* Record arrays. A big one (a thread's 8 MB default, or buffer_size_kb) is mapped on its
 * own, so that freeing it gives the memory back and a new one starts as untouched zero
 * pages, never memset. 4 KB pages, not transparent huge pages: memory the machine has not
 * touched yet costs its first toucher ~2 us a 4 KB page here either way, but a huge page is
 * faulted whole by the first record that lands in it (4-13 ms were measured on the
 * program's thread for one 2 MB page), while 4 KB pages are paged in by the drain ahead of
 * the writers (_tfenc.c, ahead_of()) in steps the writers rarely catch up with. */
#define MAPPED_MIN ((size_t)256 << 10)

static size_t
recs_bytes(uint64_t n)
{
    return (size_t)n * sizeof(rh_rec);
}

/* An array of n records, zeroed, after its header (cring.h's rh_array_head, zeroed too). */
static rh_rec *
recs_alloc(uint64_t n)
{
    size_t bytes = sizeof(rh_array_head) + recs_bytes(n);
    char *p;
    if (bytes < MAPPED_MIN) {
        p = PyMem_Calloc(1, bytes);
        if (p == NULL)
            return NULL;
    }
    else {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
    }
    return (rh_rec *)(p + sizeof(rh_array_head));
}

static void
recs_free(rh_rec *recs, uint64_t n)
{
    if (recs == NULL)
        return;
    size_t bytes = sizeof(rh_array_head) + recs_bytes(n);
    void *p = rh_array_head_of(recs);
    if (bytes >= MAPPED_MIN)
        munmap(p, bytes);
    else
        PyMem_Free(p);
}

/* A new array of `capacity` records: the part its writer fills first, from record `from` on,
 * as much as it writes before the drain's first wake (a quarter of the ring), paged in by the
 * drain ahead of it (fresh pages cost the first toucher ~3 us each here: drainround.h's
 * page_ahead). Mapped arrays only (a small one is heap memory, mostly touched already), and
 * only where a drain can be woken (round: _ccore's round API). */
static void
page_ahead(const rh_round_api *round, rh_rec *recs, uint64_t capacity, uint64_t from)
{
    if (round == NULL || recs_bytes(capacity) + sizeof(rh_array_head) < MAPPED_MIN)
        return;
    uint64_t to = from + RH_RING_WAKE_WATER(capacity);
    if (to > capacity)
        to = capacity;
    if (to > from)
        round->page_ahead(recs + from, recs_bytes(to - from));
}

/* Release the references of the records [floor, head) of an array of n that is no longer the
 * ring's: the only ones that hold any (the invariant above), so an array mostly unwritten is
 * not read through. */
static void
release_live(rh_rec *recs, uint64_t n, uint64_t floor, uint64_t head)
{
    for (uint64_t seq = floor; seq != head; seq++)
        rh_rec_clear(&recs[seq % n]);
}

/* Release every reference held by n records of an array that is no longer the ring's. */
static void
release_array(rh_rec *recs, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        rh_rec_clear(&recs[i]);
}

/* Copy the readable records [floor, head) into out (room for head - floor), oldest first.
 * take: move their references (the ring slots are left empty); otherwise the copies get new
 * references. Runs no Python code. Returns the count. */
static uint64_t
copy_into(rh_ring *r, int take, rh_rec *out)
{
    uint64_t count = r->head - r->floor;
    /* at most two runs of slots: from floor's slot to the end of the array, then from its
     * start (no division per record) */
    uint64_t start = count ? r->floor % r->capacity : 0;
    uint64_t first = count < r->capacity - start ? count : r->capacity - start;
    memcpy(out, &r->recs[start], (size_t)first * sizeof(rh_rec));
    memcpy(out + first, r->recs, (size_t)(count - first) * sizeof(rh_rec));
    if (take) {
        for (uint64_t i = 0, pos = start; i < count; i++) {
            r->recs[pos].code = NULL;
            r->recs[pos].parent = NULL;
            pos = pos + 1 == r->capacity ? 0 : pos + 1;
        }
    }
    else {
        for (uint64_t i = 0; i < count; i++) {
            Py_XINCREF(out[i].code);
            Py_XINCREF(out[i].parent);
        }
    }
    return count;
}

/* copy_into() a new array. Returns NULL with MemoryError set (the ring unchanged) on
 * failure; *n gets the count. */
static rh_rec *
copy_out(rh_ring *r, int take, uint64_t *n)
{
    uint64_t count = r->head - r->floor;
    /* count <= capacity, whose array was allocated: count * sizeof cannot overflow */
    rh_rec *out = PyMem_Malloc(count ? (size_t)count * sizeof(rh_rec) : 1);
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *n = copy_into(r, take, out);
    return out;
}

/* (type, ts, code, parent_or_None, depth, calltime, sleep, flags, overrun): exported as
 * RAW_RECORD_FIELDS and checked against rethook/buffer/schema.py at import. */
#define RAW_RECORD_FIELDS "type", "ts", "code", "parent", "depth", "calltime", "sleep", \
    "flags", "overrun"
static PyObject *tuple_of(Py_ssize_t n, PyObject **items);

static PyObject *
rec_tuple(const rh_rec *rec)
{
    PyObject *it[9] = {PyLong_FromLong(rec->type), PyLong_FromLongLong(rec->ts),
                       Py_NewRef(rec->code != NULL ? rec->code : Py_None),
                       Py_NewRef(rec->parent != NULL ? rec->parent : Py_None),
                       PyLong_FromLong(rec->type == RH_FUNCTION ? rh_caller_line(rec)
                                                                : rec->depth),
                       PyLong_FromLongLong(rec->calltime), PyLong_FromLongLong(rec->sleep),
                       PyLong_FromLong(rec->type == RH_FUNCTION
                                           ? rec->flags & ~RH_CALLER_OFFSET : rec->flags),
                       PyLong_FromLong(rec->overrun)};
    return tuple_of(9, it);
}

/* A list of the tuples of n copied records (the copies keep their references). */
static PyObject *
rec_list(const rh_rec *recs, uint64_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return NULL;
    for (uint64_t i = 0; i < n; i++) {
        PyObject *t = rec_tuple(&recs[i]);
        if (t == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

static int
parse_capacity(PyObject *arg, uint64_t *out)
{
    Py_ssize_t cap = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (cap == -1 && PyErr_Occurred())
        return -1;
    if (cap < 1) {
        PyErr_Format(PyExc_ValueError, "ring capacity must be >= 1, got %zd", cap);
        return -1;
    }
    if ((size_t)cap > PY_SSIZE_T_MAX / sizeof(rh_rec)) {
        PyErr_NoMemory();
        return -1;
    }
    *out = (uint64_t)cap;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* the type                                                                                  */

/* The ring's capacity and what follows from it. */
static void
set_capacity(rh_ring *r, uint64_t capacity)
{
    r->capacity = capacity;
    r->wake_water = RH_RING_WAKE_WATER(capacity);
    r->high_water = RH_RING_HIGH_WATER(capacity);
    rh_ring_rearm(r);
}

static PyObject *
ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"capacity", "tid", NULL};
    PyObject *cap_obj, *tid_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Ring", kwlist, &cap_obj, &tid_obj))
        return NULL;
    uint64_t capacity;
    if (parse_capacity(cap_obj, &capacity) < 0)
        return NULL;
    if (!PyLong_Check(tid_obj)) {
        PyErr_SetString(PyExc_TypeError, "tid must be an int");
        return NULL;
    }
    unsigned long long tid = PyLong_AsUnsignedLongLong(tid_obj);
    if (tid == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    rh_rec *recs = recs_alloc(capacity);
    if (recs == NULL)
        return PyErr_NoMemory();
    rh_ring *r = (rh_ring *)type->tp_alloc(type, 0);
    if (r == NULL) {
        recs_free(recs, capacity);
        return NULL;
    }
    /* tp_alloc zeroed the counters and weakreflist */
    r->recs = recs;
    r->round = rh_round_api_find();
    set_capacity(r, capacity);
    page_ahead(r->round, recs, capacity, 0);
    r->tid = tid;
    r->on = 1;
    r->overwrite = 1;
    return (PyObject *)r;
}

static void
ring_dealloc(rh_ring *r)
{
    if (r->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)r);
    rh_rec *recs = r->recs;
    uint64_t capacity = r->capacity, floor = r->floor;
    r->recs = NULL;
    r->floor = r->head;
    if (recs != NULL) {
        release_live(recs, capacity, floor, r->head);
        recs_free(recs, capacity);
    }
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *
ring_repr(rh_ring *r)
{
    return PyUnicode_FromFormat("<rethook.buffer._cring.Ring tid=%llu capacity=%llu entries=%llu>",
                                (unsigned long long)r->tid, (unsigned long long)r->capacity,
                                (unsigned long long)(r->head - r->floor));
}

/* ---------------------------------------------------------------------------------------- */
/* methods                                                                                   */

static PyObject *
ring_write(rh_ring *r, PyObject *args)
{
    int type, depth, flags, overrun;
    long long ts, calltime, sleep;
    PyObject *code, *parent;
    if (!PyArg_ParseTuple(args, "iLOOiLLii:write", &type, &ts, &code, &parent, &depth,
                          &calltime, &sleep, &flags, &overrun))
        return NULL;
    /* readers name records with the registry, which knows code objects only */
    if (!PyCode_Check(code)) {
        PyErr_Format(PyExc_TypeError, "code must be a code object, not %.100s",
                     Py_TYPE(code)->tp_name);
        return NULL;
    }
    if (parent == Py_None)
        parent = NULL;
    else if (!PyCode_Check(parent)) {
        PyErr_Format(PyExc_TypeError, "parent must be a code object or None, not %.100s",
                     Py_TYPE(parent)->tp_name);
        return NULL;
    }
    rh_stale stale;
    rh_rec *rec = rh_ring_reserve(r, &stale);
    if (rec == NULL)
        Py_RETURN_FALSE;
    rec->ts = ts;
    rec->code = Py_NewRef(code);
    rec->parent = Py_XNewRef(parent);
    rec->calltime = calltime;
    rec->sleep = sleep;
    rec->type = type;
    rec->depth = depth;
    rec->flags = flags;
    rec->overrun = overrun;
    rh_ring_done(&stale);
    Py_RETURN_TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Decoding in C: records straight into the event tuples the Python tracers append
 * (rethook/buffer/native.py:decode is the reference), so a reader makes one tuple per record
 * and calls name_of once per distinct code object per read. */

#define EV_PRINT 7 /* tracers/formats.py: PRINT, for a record of an unknown type */

/* name_of(code), cached in names (id(code) -> str) for one read: the records being decoded
 * keep their codes alive, so an id cannot be reused meanwhile. Borrowed; NULL on error. */
typedef struct {
    PyObject *dict;      /* id(code) -> name */
    PyObject *last_code; /* borrowed: consecutive records often name the same code */
    PyObject *last_name; /* borrowed from dict */
} Names;

static PyObject *
code_name(Names *names, PyObject *name_of, PyObject *code)
{
    static PyObject *unknown;
    if (code != NULL && code == names->last_code)
        return names->last_name;
    if (code == NULL) {
        if (unknown == NULL && (unknown = PyUnicode_InternFromString("?")) == NULL)
            return NULL;
        return unknown;
    }
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL)
        return NULL;
    PyObject *name = PyDict_GetItemWithError(names->dict, key);
    if (name == NULL && !PyErr_Occurred()) {
        name = PyObject_CallOneArg(name_of, code);
        if (name != NULL) {
            int r = PyDict_SetItem(names->dict, key, name);
            Py_DECREF(name); /* the dict holds it */
            if (r < 0)
                name = NULL;
        }
    }
    Py_DECREF(key);
    if (name != NULL) { /* the dict holds name, and the records being read hold code */
        names->last_code = code;
        names->last_name = name;
    }
    return name;
}

/* A tuple of n items from new references (NULL items: an allocation failed; all released). */
static PyObject *
tuple_of(Py_ssize_t n, PyObject **items)
{
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i] == NULL || t == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, items[i]);
    }
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    /* A tuple of ints and strings can be in no cycle: untrack it, as CPython's own GC does
     * when it meets one, so a drain making millions does not make every collection walk
     * them all. */
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyLong_CheckExact(items[i]) && !PyUnicode_CheckExact(items[i]) && items[i] != Py_None)
            return t;
    PyObject_GC_UnTrack(t);
    return t;
}

static PyObject *
event_tuple(const rh_rec *rec, PyObject *tid, Names *names, PyObject *name_of,
            PyObject *empty)
{
    PyObject *name = code_name(names, name_of, rec->code);
    if (name == NULL)
        return NULL;
    PyObject *type = PyLong_FromLong(rec->type), *ts = PyLong_FromLongLong(rec->ts);
    switch (rec->type) {
    case RH_FUNCGRAPH_ENTRY: {
        PyObject *it[6] = {type, ts, Py_NewRef(tid), PyLong_FromLong(rec->depth),
                           Py_NewRef(name), Py_NewRef(empty)};
        return tuple_of(6, it);
    }
    case RH_FUNCGRAPH_EXIT: {
        PyObject *it[10] = {type, ts, Py_NewRef(tid), PyLong_FromLong(rec->depth),
                            Py_NewRef(name), PyLong_FromLongLong(rec->calltime),
                            PyLong_FromLong(rec->overrun), PyLong_FromLongLong(rec->sleep),
                            PyLong_FromLong(rec->flags), Py_NewRef(empty)};
        return tuple_of(10, it);
    }
    case RH_FUNCGRAPH_SUSPEND:
    case RH_FUNCGRAPH_RESUME: {
        PyObject *it[5] = {type, ts, Py_NewRef(tid), PyLong_FromLong(rec->depth),
                           Py_NewRef(name)};
        return tuple_of(5, it);
    }
    case RH_FUNCTION: {
        PyObject *parent = rec->parent != NULL ? code_name(names, name_of, rec->parent)
                                               : empty;
        PyObject *it[6] = {type, ts, Py_NewRef(tid), Py_NewRef(name), Py_XNewRef(parent),
                           PyLong_FromLong(rh_caller_line(rec))};
        return tuple_of(6, it);
    }
    default: {
        Py_XDECREF(type);
        PyObject *it[4] = {PyLong_FromLong(EV_PRINT), ts, Py_NewRef(tid),
                           PyUnicode_FromFormat("rethook: native record of unknown type %d",
                                                (int)rec->type)};
        return tuple_of(4, it);
    }
    }
}

/* A list of the event tuples of n copied records, or NULL. */
static PyObject *
event_list(const rh_rec *recs, uint64_t n, PyObject *tid, PyObject *name_of)
{
    Names names = {PyDict_New(), NULL, NULL};
    PyObject *empty = PyUnicode_FromString("");
    PyObject *list = names.dict && empty ? PyList_New((Py_ssize_t)n) : NULL;
    for (uint64_t i = 0; list != NULL && i < n; i++) {
        PyObject *t = event_tuple(&recs[i], tid, &names, name_of, empty);
        if (t == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    Py_XDECREF(names.dict);
    Py_XDECREF(empty);
    return list;
}

/* Optional (tid, name_of) of events() and consume(): decode into event tuples. */
static int
decode_args(PyObject *args, PyObject **tid, PyObject **name_of)
{
    *tid = *name_of = NULL;
    if (!PyArg_UnpackTuple(args, "events", 0, 2, tid, name_of))
        return -1;
    if ((*tid == NULL) != (*name_of == NULL)) {
        PyErr_SetString(PyExc_TypeError, "give both tid and name_of, or neither");
        return -1;
    }
    return 0;
}

static PyObject *
ring_events(rh_ring *r, PyObject *args)
{
    uint64_t n;
    PyObject *tid, *name_of;
    if (decode_args(args, &tid, &name_of) < 0)
        return NULL;
    rh_rec *copy = copy_out(r, 0, &n);
    if (copy == NULL)
        return NULL;
    PyObject *list = tid ? event_list(copy, n, tid, name_of) : rec_list(copy, n);
    release_array(copy, n);
    PyMem_Free(copy);
    return list;
}

/* The consuming read, in pieces (the capsule's take, untake and release: cring.h). */

/* Account for a consuming read of the records just copied out into t->recs. */
static void
took(rh_ring *r, rh_taken *t, uint64_t n)
{
    t->n = n;
    t->first = r->floor;
    t->lost_before = r->floor - r->read_pos;
    t->lost_after = r->refused_unreported;
    t->clear_seq = r->clear_seq;
    r->read_pos = r->floor = r->head;
    r->consumed += n;
    r->refused_unreported = 0;
    rh_ring_rearm(r);
    if (r->round != NULL) /* threads waiting for the drain go on */
        r->round->drained();
}

/* Ring.consume()'s: into a new array (t->owned) */
static int
ring_take(rh_ring *r, rh_taken *t)
{
    uint64_t n;
    rh_rec *recs = copy_out(r, 1, &n);
    if (recs == NULL)
        return -1;
    t->recs = recs;
    t->owned = 1;
    took(r, t, n);
    return 0;
}

/* the capsule's: into the caller's array */
static int
ring_take_into(rh_ring *r, rh_taken *t, rh_rec *buf, uint64_t room)
{
    if (r->head - r->floor > room) {
        PyErr_SetString(PyExc_ValueError, "rethook: no room for the records of a ring");
        return -1;
    }
    t->recs = buf;
    t->owned = 0;
    took(r, t, copy_into(r, 1, buf));
    return 0;
}

/* the capsule's: the accounting alone, the records left in their slots (cring.h) */
static void
ring_take_in_place(rh_ring *r, rh_taken *t)
{
    t->recs = NULL;
    t->owned = 0;
    took(r, t, r->head - r->floor);
}

static void
ring_untake(rh_ring *r, const rh_taken *t)
{
    /* The records left the ring but reach no reader. Count them as lost, and have the next
     * consuming read report the whole batch as a gap (after its records: where they were is
     * not known any more). Skipped if a clear intervened. */
    if (r->clear_seq == t->clear_seq && r->consumed >= t->n) {
        r->consumed -= t->n;
        r->refused_unreported += t->lost_before + t->n + t->lost_after;
    }
}

static void
taken_release(rh_taken *t)
{
    rh_rec *recs = t->recs;
    uint64_t n = t->n;
    int owned = t->owned;
    t->recs = NULL;
    t->n = 0;
    if (recs != NULL) {
        release_array(recs, n);
        if (owned)
            PyMem_Free(recs);
    }
}

/* The spare array: one array of records, all slots empty, that detach() puts in a ring in
 * place of the array it takes out. The drain empties each ring it reads this way, one after
 * another, and gives each array back (give_back()) to be the next one's replacement: one
 * array for all the rings, not one per ring. */
static rh_rec *spare;
static uint64_t spare_capacity;

/* The spare freed: the capsule's free_spare (the recording is over), and where the one kept
 * is not the size a ring has now (a ring was resized). */
static void
spare_free(void)
{
    rh_rec *a = spare;
    spare = NULL;
    recs_free(a, spare_capacity);
}

/* the capsule's: the accounting, and the ring's array taken with the records (cring.h) */
static int
ring_detach(rh_ring *r, rh_taken *t, rh_rec **array)
{
    rh_rec *fresh = NULL;
    if (spare != NULL && spare_capacity != r->capacity)
        spare_free();
    if (spare != NULL) {
        fresh = spare;
        spare = NULL;
    }
    else if ((fresh = recs_alloc(r->capacity)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *array = r->recs;
    r->recs = fresh; /* (wpos stays: a slot is a sequence number modulo the capacity) */
    t->recs = NULL;
    t->owned = 0;
    took(r, t, r->head - r->floor);
    return 0;
}

/* the capsule's: an array detach() gave, emptied, kept as the spare (the newest size
 * wins) or freed */
static void
ring_give_back(rh_rec *array, uint64_t capacity)
{
    if (spare != NULL && spare_capacity == capacity) {
        recs_free(array, capacity);
        return;
    }
    spare_free();
    spare = array;
    spare_capacity = capacity;
}

/* the capsule's: the spare made ready for rings of this capacity (cring.h) */
static rh_rec *
ring_reserve_spare(uint64_t capacity)
{
    if (spare != NULL && spare_capacity != capacity)
        spare_free();
    if (spare == NULL) {
        if ((spare = recs_alloc(capacity)) == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        spare_capacity = capacity;
        /* a ring's writer goes on in it after the first detach, about a quarter in */
        page_ahead(rh_round_api_find(), spare, capacity, RH_RING_WAKE_WATER(capacity));
    }
    return spare;
}


static PyObject *
ring_consume(rh_ring *r, PyObject *args)
{
    PyObject *tid, *name_of;
    if (decode_args(args, &tid, &name_of) < 0)
        return NULL;
    rh_taken t;
    if (ring_take(r, &t) < 0)
        return NULL;
    PyObject *records = tid ? event_list(t.recs, t.n, tid, name_of) : rec_list(t.recs, t.n);
    PyObject *result = NULL;
    if (records != NULL)
        result = Py_BuildValue("(KNK)", (unsigned long long)t.lost_before, records,
                               (unsigned long long)t.lost_after);
    if (result == NULL) /* out of memory, or name_of failed */
        ring_untake(r, &t);
    taken_release(&t);
    return result;
}

static PyObject *
ring_stats(rh_ring *r, PyObject *Py_UNUSED(ignored))
{
    uint64_t entries = r->head - r->floor;
    uint64_t written = r->head - r->clear_seq + r->refused;
    uint64_t read = r->consumed;
    uint64_t lost = written - entries - read;
    return Py_BuildValue("(KKKK)", (unsigned long long)entries, (unsigned long long)written,
                         (unsigned long long)lost, (unsigned long long)read);
}

static PyObject *
ring_clear(rh_ring *r, PyObject *Py_UNUSED(ignored))
{
    uint64_t floor = r->floor, head = r->head;
    r->floor = r->clear_seq = r->read_pos = r->head;
    r->consumed = r->refused = r->refused_unreported = 0;
    rh_ring_rearm(r);
    rh_rec *fresh = recs_alloc(r->capacity);
    if (fresh == NULL) {
        /* No spare array: empty the slots in place. A finalizer run by a DECREF could write
         * a record into a slot not cleared yet; empty only the slots below the new head. */
        uint64_t head = r->head, cap = r->capacity;
        for (uint64_t i = 0; i < cap && r->head == head; i++)
            rh_rec_clear(&r->recs[i]);
        Py_RETURN_NONE;
    }
    rh_rec *old = r->recs;
    r->recs = fresh;
    page_ahead(r->round, fresh, r->capacity, r->wpos);
    release_live(old, r->capacity, floor, head);
    recs_free(old, r->capacity);
    Py_RETURN_NONE;
}

static PyObject *
ring_resize(rh_ring *r, PyObject *arg)
{
    uint64_t capacity;
    if (parse_capacity(arg, &capacity) < 0)
        return NULL;
    rh_rec *fresh = recs_alloc(capacity);
    if (fresh == NULL)
        return PyErr_NoMemory();
    uint64_t entries = r->head - r->floor;
    uint64_t keep = entries < capacity ? entries : capacity;
    uint64_t old_capacity = r->capacity, old_floor = r->floor;
    rh_rec *old = r->recs;
    /* move the newest `keep` records; the older ones stay in `old`, released below */
    for (uint64_t seq = r->head - keep; seq != r->head; seq++) {
        rh_rec *s = &old[seq % old_capacity];
        fresh[seq % capacity] = *s;
        s->code = NULL;
        s->parent = NULL;
    }
    r->recs = fresh;
    set_capacity(r, capacity);
    r->wpos = r->head % capacity;
    r->floor = r->head - keep; /* read_pos stays: the next consuming read reports the gap */
    page_ahead(r->round, fresh, capacity, r->wpos);
    release_live(old, old_capacity, old_floor, r->head - keep); /* the ones not moved */
    recs_free(old, old_capacity);
    Py_RETURN_NONE;
}

static PyMethodDef ring_methods[] = {
    {"write", (PyCFunction)ring_write, METH_VARARGS,
     "write(type, ts, code, parent, depth, calltime, sleep, flags, overrun) -> bool\n\n"
     "Write one record as a native user would (parent may be None). False when it is not\n"
     "written: tracing off, or a full ring that does not overwrite (then counted refused)."},
    {"events", (PyCFunction)ring_events, METH_VARARGS,
     "events([tid, name_of]) -> list of (type, ts, code, parent, depth, calltime, sleep, "
     "flags, overrun)\n\n"
     "The readable records, oldest first, without consuming them. With tid and name_of,\n"
     "decoded into the event tuples the Python tracers append (buffer/native.py:decode)."},
    {"consume", (PyCFunction)ring_consume, METH_VARARGS,
     "consume([tid, name_of]) -> (lost_before, records, lost_after)\n\n"
     "Take every readable record (as events() gives them). lost_before: records overwritten\n"
     "since the last consume (they came before these); lost_after: records refused since\n"
     "then."},
    {"stats", (PyCFunction)ring_stats, METH_NOARGS,
     "stats() -> (entries, written, lost, read), counted since the last clear."},
    {"clear", (PyCFunction)ring_clear, METH_NOARGS,
     "clear() -> None: drop every record and reset the counters."},
    {"resize", (PyCFunction)ring_resize, METH_O,
     "resize(capacity) -> None: keep the newest records that fit; the others are lost."},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------- */
/* attributes                                                                                */

static PyObject *
get_on(rh_ring *r, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(r->on);
}

static PyObject *
get_overwrite(rh_ring *r, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(r->overwrite);
}

static int
set_flag(int *field, PyObject *value, const char *name)
{
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "cannot delete %s", name);
        return -1;
    }
    int v = PyObject_IsTrue(value);
    if (v < 0)
        return -1;
    *field = v;
    return 0;
}

static int
set_on(rh_ring *r, PyObject *value, void *Py_UNUSED(closure))
{
    return set_flag(&r->on, value, "on");
}

static int
set_overwrite(rh_ring *r, PyObject *value, void *Py_UNUSED(closure))
{
    /* nothing else to do: the ring never holds more than capacity records, so switching
     * overwrite off loses nothing more than what was already overwritten */
    return set_flag(&r->overwrite, value, "overwrite");
}

static PyGetSetDef ring_getset[] = {
    {"on", (getter)get_on, (setter)set_on,
     "tracing_on for this ring: while false nothing is written nor counted", NULL},
    {"overwrite", (getter)get_overwrite, (setter)set_overwrite,
     "true: a full ring drops its oldest record; false: it refuses the new one", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define RO_U64(name, doc) \
    {#name, Py_T_ULONGLONG, offsetof(rh_ring, name), Py_READONLY, doc}

static PyMemberDef ring_members[] = {
    RO_U64(capacity, "most records the ring holds"),
    RO_U64(tid, "native id of the thread that owns the ring"),
    RO_U64(head, "sequence number of the next record"),
    RO_U64(floor, "oldest readable sequence number"),
    RO_U64(clear_seq, "head at the last clear"),
    RO_U64(read_pos, "where the last consume ended"),
    RO_U64(consumed, "records consumed since the last clear"),
    RO_U64(refused, "records refused since the last clear"),
    RO_U64(refused_unreported, "records refused since the last consume"),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject Ring_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rethook.buffer._cring.Ring",
    .tp_basicsize = sizeof(rh_ring),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ring(capacity, tid)\n--\n\n"
              "One thread's ring of fixed-size records (cring.h's rh_ring).",
    .tp_new = ring_new,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_repr = (reprfunc)ring_repr,
    .tp_weaklistoffset = offsetof(rh_ring, weakreflist),
    .tp_methods = ring_methods,
    .tp_members = ring_members,
    .tp_getset = ring_getset,
};

/* ---------------------------------------------------------------------------------------- */
/* module                                                                                    */

static rh_cring_api cring_api = {&Ring_Type,      ring_take_into, ring_take_in_place,
                                  ring_untake,     taken_release,  event_list,
                                  ring_detach,     ring_give_back, spare_free,
                                  ring_reserve_spare};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rethook.buffer._cring",
    .m_doc = "The C ring buffer: per-thread rings of fixed-size records (see cring.h).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__cring(void)
{
    if (PyType_Ready(&Ring_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    PyObject *capsule = PyCapsule_New(&cring_api, RH_CRING_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObjectRef(m, "_C_API", capsule) < 0 ||
        PyModule_AddObjectRef(m, "Ring", (PyObject *)&Ring_Type) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_BYTES", (long)sizeof(rh_rec)) < 0 ||
        PyModule_AddIntConstant(m, "_C_API_VERSION", RH_CRING_API_VERSION) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(capsule);
    /* the schema as this module was built: {record type id: name}, the raw record's fields
     * (rethook.buffer.native checks both against rethook/buffer/schema.py) */
    PyObject *types = Py_BuildValue("{i:s,i:s,i:s,i:s,i:s}", RH_FUNCTION, "function",
                                    RH_FUNCGRAPH_ENTRY, "funcgraph_entry", RH_FUNCGRAPH_EXIT,
                                    "funcgraph_exit", RH_FUNCGRAPH_SUSPEND, "funcgraph_suspend",
                                    RH_FUNCGRAPH_RESUME, "funcgraph_resume");
    PyObject *fields = Py_BuildValue("(sssssssss)", RAW_RECORD_FIELDS);
    if (types == NULL || fields == NULL || PyModule_AddObjectRef(m, "RECORD_TYPES", types) < 0 ||
        PyModule_AddObjectRef(m, "RAW_RECORD_FIELDS", fields) < 0 ||
        PyModule_AddIntConstant(m, "CALLER_OFFSET", RH_CALLER_OFFSET) < 0) {
        Py_XDECREF(types);
        Py_XDECREF(fields);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(types);
    Py_DECREF(fields);
    return m;
}
