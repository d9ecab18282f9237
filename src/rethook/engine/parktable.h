/* parktable.h: the C core's parked table, frame -> record of a suspended call (rule 3).
 *
 * What core._parked (a dict) is to the pure core. Every yield inserts and every resume
 * deletes, and a dict does that badly: its deleted entries stay as dummies until the next
 * insert finds no room, which rebuilds the table at the size of what is live -- every few
 * yields for a handful of suspended generators. In sqlglot's run that was ~610 instructions a
 * yield/resume pair (PyDict_SetItem 342, PyDict_Pop 272), as many pairs as calls. This table:
 *
 *     slots[mask + 1]   { frame, rec }   frame NULL: empty
 *     home(frame) = hash of the frame's address & mask; linear probing from there
 *     insert: grows (doubles) before it would be half full, so a probe ends quickly
 *     delete: backward shift -- the entries after the hole that may move into it do -- so
 *             no tombstones, and a table that churns never needs a rebuild
 *     front   the newest entry waits outside the slots; the next insert moves it in. A
 *             generator suspended and resumed before anything else parks (a `for` loop over
 *             it, most of them) is parked and taken with no hashing at all.
 *
 * Frames are keys by identity, as in the dict (frame objects hash and compare by identity).
 * It holds one strong reference to each frame and each record, as the dict did: collect_parked
 * tells a collected generator's frame by its reference count (engine.py, _UNREFERENCED).
 * Python code (the engine, tests) sees a small mapping: len, in, [], []=, del, pop, keys,
 * values, items (lists: snapshots), clear, iter. Runs under the GIL; no Python code runs while
 * the slots are being changed: the references an operation drops (park_put's replaced record,
 * park_take's, park_clear's) are released once the table is consistent again.
 */
#ifndef RETHOOK_PARKTABLE_H
#define RETHOOK_PARKTABLE_H

#include <Python.h>
#include <stdint.h>

#include "ptrhash.h"

#define PARK_MIN_SLOTS 16 /* a power of two */

typedef struct {
    PyObject *frame; /* NULL: empty */
    PyObject *rec;
} ParkSlot;

typedef struct {
    PyObject_HEAD
    ParkSlot front;  /* the newest entry, outside the slots (frame NULL: none) */
    ParkSlot *slots; /* mask + 1 of them, or NULL before the first insert into them */
    size_t mask;
    Py_ssize_t used; /* entries, the front's included */
} ParkTable;

/* Entries in the slots (the front's is not) */
static inline Py_ssize_t
park_slots_used(const ParkTable *t)
{
    return t->used - (t->front.frame != NULL);
}

static inline size_t
park_home(const ParkTable *t, const void *frame)
{
    return rh_hash_ptr(frame) & t->mask;
}

/* Where frame is, or the empty slot its probe ends at (slots allocated). */
static inline ParkSlot *
park_probe(const ParkTable *t, const PyObject *frame)
{
    for (size_t i = park_home(t, frame);; i = (i + 1) & t->mask) {
        ParkSlot *s = &t->slots[i];
        if (s->frame == frame || s->frame == NULL)
            return s;
    }
}

/* The slot of frame (the front, or one of the slots), or NULL. */
static inline ParkSlot *
park_find(ParkTable *t, const PyObject *frame)
{
    if (t->front.frame == frame && frame != NULL)
        return &t->front;
    if (park_slots_used(t) == 0)
        return NULL;
    ParkSlot *s = park_probe(t, frame);
    return s->frame != NULL ? s : NULL;
}

static inline size_t
park_capacity(const ParkTable *t)
{
    return t->slots == NULL ? 0 : t->mask + 1;
}

/* The slots doubled (rehashed), or made: an insert grows the table before it would be half
 * full. 0, or -1 with MemoryError set (nothing changed). */
static int
park_grow(ParkTable *t)
{
    size_t cap = park_capacity(t);
    size_t ncap = cap ? cap * 2 : PARK_MIN_SLOTS;
    ParkSlot *fresh = PyMem_Calloc(ncap, sizeof(ParkSlot));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ParkSlot *old = t->slots;
    t->slots = fresh;
    t->mask = ncap - 1;
    for (size_t i = 0; i < cap; i++) {
        if (old[i].frame == NULL)
            continue;
        size_t j = park_home(t, old[i].frame);
        while (fresh[j].frame != NULL)
            j = (j + 1) & t->mask;
        fresh[j] = old[i];
    }
    PyMem_Free(old);
    return 0;
}

/* t[frame] = rec, the caller's reference to rec passing to the table (a new one is taken to
 * frame). A record it replaces is handed back in *old (the caller releases it once it is done
 * with the table), else *old is NULL. 0, or -1 with MemoryError set (the caller keeps its
 * reference). */
static inline int
park_put_ref(ParkTable *t, PyObject *frame, PyObject *rec, PyObject **old)
{
    *old = NULL;
    ParkSlot *s = park_find(t, frame);
    if (s != NULL) {
        *old = s->rec;
        s->rec = rec;
        return 0;
    }
    if (t->front.frame != NULL) { /* the front moves into the slots, the new entry takes it */
        if ((size_t)(park_slots_used(t) + 1) * 2 > park_capacity(t) && park_grow(t) < 0)
            return -1;
        *park_probe(t, t->front.frame) = t->front;
    }
    t->front.frame = Py_NewRef(frame);
    t->front.rec = rec;
    t->used++;
    return 0;
}

/* t[frame] = rec (new references taken); as park_put_ref() otherwise. */
static int
park_put(ParkTable *t, PyObject *frame, PyObject *rec, PyObject **old)
{
    if (park_put_ref(t, frame, Py_NewRef(rec), old) < 0) {
        Py_DECREF(rec); /* (the caller's reference remains) */
        return -1;
    }
    return 0;
}

/* Empty slot s and close the hole: each later entry of the run that its home lets move back
 * does (backward shift deletion). */
static void
park_remove_slot(ParkTable *t, ParkSlot *s)
{
    if (s == &t->front) {
        s->frame = s->rec = NULL;
        t->used--;
        return;
    }
    size_t hole = (size_t)(s - t->slots);
    t->slots[hole].frame = t->slots[hole].rec = NULL;
    t->used--;
    for (size_t j = (hole + 1) & t->mask; t->slots[j].frame != NULL; j = (j + 1) & t->mask) {
        size_t home = park_home(t, t->slots[j].frame);
        /* j stays unless its home is cyclically outside (hole, j] */
        int stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (stays)
            continue;
        t->slots[hole] = t->slots[j];
        t->slots[j].frame = t->slots[j].rec = NULL;
        hole = j;
    }
}

/* The record parked under frame, taken out of the table (the table's reference to it is now
 * the caller's; the frame's is *frame_ref, for the caller to release), or NULL. */
static inline PyObject *
park_take(ParkTable *t, PyObject *frame, PyObject **frame_ref)
{
    ParkSlot *s = park_find(t, frame);
    if (s == NULL)
        return NULL;
    PyObject *rec = s->rec;
    *frame_ref = s->frame;
    park_remove_slot(t, s);
    return rec;
}

/* Every entry taken out; their references released after (which may run Python code that
 * uses the table: it is already empty and consistent). */
static void
park_clear(ParkTable *t)
{
    ParkSlot *old = t->slots, front = t->front;
    size_t cap = park_capacity(t);
    t->front.frame = t->front.rec = NULL;
    t->slots = NULL;
    t->mask = 0;
    t->used = 0;
    Py_XDECREF(front.frame);
    Py_XDECREF(front.rec);
    for (size_t i = 0; i < cap; i++) {
        Py_XDECREF(old[i].frame);
        Py_XDECREF(old[i].rec);
    }
    PyMem_Free(old);
}

/* ---- what Python sees ---------------------------------------------------------------- */

static PyObject *
park_list(ParkTable *t, int what) /* 0 keys, 1 values, 2 (key, value) tuples */
{
    PyObject *out = PyList_New(t->used);
    if (out == NULL)
        return NULL;
    Py_ssize_t n = 0;
    for (size_t i = 0; i <= park_capacity(t); i++) { /* the slots, then the front */
        ParkSlot *s = i < park_capacity(t) ? &t->slots[i] : &t->front;
        if (s->frame == NULL)
            continue;
        PyObject *item = what == 0 ? Py_NewRef(s->frame)
                         : what == 1 ? Py_NewRef(s->rec)
                                     : PyTuple_Pack(2, s->frame, s->rec);
        if (item == NULL) { /* (no Python code ran: the table is as it was) */
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, n++, item);
    }
    return out;
}

static PyObject *
park_keys(PyObject *self, PyObject *Py_UNUSED(arg))
{
    return park_list((ParkTable *)self, 0);
}

static PyObject *
park_values(PyObject *self, PyObject *Py_UNUSED(arg))
{
    return park_list((ParkTable *)self, 1);
}

static PyObject *
park_items(PyObject *self, PyObject *Py_UNUSED(arg))
{
    return park_list((ParkTable *)self, 2);
}

static PyObject *
park_clear_py(PyObject *self, PyObject *Py_UNUSED(arg))
{
    park_clear((ParkTable *)self);
    Py_RETURN_NONE;
}

static PyObject *
park_pop(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(frame[, default])");
        return NULL;
    }
    PyObject *frame_ref = NULL;
    PyObject *rec = park_take((ParkTable *)self, args[0], &frame_ref);
    if (rec != NULL) {
        Py_DECREF(frame_ref);
        return rec;
    }
    if (nargs == 2)
        return Py_NewRef(args[1]);
    PyErr_SetObject(PyExc_KeyError, args[0]);
    return NULL;
}

static Py_ssize_t
park_len(PyObject *self)
{
    return ((ParkTable *)self)->used;
}

static PyObject *
park_getitem(PyObject *self, PyObject *frame)
{
    ParkSlot *s = park_find((ParkTable *)self, frame);
    if (s == NULL) {
        PyErr_SetObject(PyExc_KeyError, frame);
        return NULL;
    }
    return Py_NewRef(s->rec);
}

static int
park_setitem(PyObject *self, PyObject *frame, PyObject *rec)
{
    ParkTable *t = (ParkTable *)self;
    if (rec == NULL) { /* del t[frame] */
        PyObject *frame_ref = NULL;
        PyObject *old = park_take(t, frame, &frame_ref);
        if (old == NULL) {
            PyErr_SetObject(PyExc_KeyError, frame);
            return -1;
        }
        Py_DECREF(frame_ref);
        Py_DECREF(old);
        return 0;
    }
    if (!PyFrame_Check(frame)) {
        PyErr_Format(PyExc_TypeError, "the parked table's keys are frames, not %.100s",
                     Py_TYPE(frame)->tp_name);
        return -1;
    }
    PyObject *old;
    if (park_put(t, frame, rec, &old) < 0)
        return -1;
    Py_XDECREF(old);
    return 0;
}

static int
park_contains(PyObject *self, PyObject *frame)
{
    return park_find((ParkTable *)self, frame) != NULL;
}

static PyObject *
park_iter(PyObject *self)
{
    PyObject *keys = park_list((ParkTable *)self, 0);
    if (keys == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyObject *
park_repr(PyObject *self)
{
    return PyUnicode_FromFormat("<parked table: %zd calls>", ((ParkTable *)self)->used);
}

static void
park_dealloc(PyObject *self)
{
    park_clear((ParkTable *)self);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef park_methods[] = {
    {"keys", park_keys, METH_NOARGS, "The parked frames (a list)."},
    {"values", park_values, METH_NOARGS, "The parked records (a list)."},
    {"items", park_items, METH_NOARGS, "(frame, record) pairs (a list)."},
    {"pop", (PyCFunction)(void (*)(void))park_pop, METH_FASTCALL,
     "pop(frame[, default]): the record parked under frame, taken out."},
    {"clear", park_clear_py, METH_NOARGS, "Take every record out."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods park_as_mapping = {
    .mp_length = park_len,
    .mp_subscript = park_getitem,
    .mp_ass_subscript = park_setitem,
};

static PySequenceMethods park_as_sequence = {.sq_contains = park_contains};

static PyTypeObject ParkTable_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rethook.engine._ccore.ParkTable",
    .tp_basicsize = sizeof(ParkTable),
    .tp_dealloc = park_dealloc,
    .tp_repr = park_repr,
    .tp_as_sequence = &park_as_sequence,
    .tp_as_mapping = &park_as_mapping,
    .tp_iter = park_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The C core's parked calls: frame -> record (parktable.h).",
    .tp_methods = park_methods,
};

#endif /* RETHOOK_PARKTABLE_H */
