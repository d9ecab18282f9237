/* rethook.engine._cregistry: the function registry's per-function work, in C.
 *
 * A module's import names every code object its body will make (sqlglot and its dialects:
 * ~6,600), most of which never run. registry.py's ``_collect``, ``_commit`` and
 * ``_namespace_functions`` do that in Python at ~5 us a function; these are the same three
 * steps, the same results in the same order, at a tenth of the cost. registry.py stays the
 * reference and owns every fact they use (kind names, the FunctionInfo layout, what counts as
 * anonymous): ``setup()`` hands them over once, and tests/test_registry.py checks that both
 * give the same names, kinds and order.
 *
 *   setup(kinds, anonymous, info_type, fields, partial)
 *       kinds: the 10 kind names in KIND_* order; anonymous: the frozenset of anonymous leaf
 *       names; info_type: FunctionInfo; fields: its 8 slot descriptors in _FunctionFields
 *       order; partial: functools.partial (a body's weak reference calls partial(drop, key))
 *   collect(code, module, qualname, entries, by_id, register_top, order, bodies, drop)
 *       -> order
 *       registry._collect: code and its unknown nested code into the batch ``entries``
 *   collect_tops(tops, entries, by_id, order, bodies, drop) -> order
 *       registry._register_tops' two loops over its sorted (code, module, qualname) tops
 *   commit(entries, by_id, taken, column) -> list of new FunctionInfo
 *       registry._name_batch and _name_apart (column: registry._column, asked only when
 *       several functions of one name share a line)
 *   namespace_functions(module, known, owners) -> list of functions
 *       registry._namespace_functions
 *   tops(functions, by_id, own) -> (tops, rest)
 *       registry._tops' common case: (code, module, qualname) of each function with new
 *       code whose globals name a module not rethook's (``own``) and whose file is one; the
 *       first function of each new code that is none of these goes to ``rest``, for
 *       registry._top_of
 *   codes_by_id(infos, dicts)
 *       registry.codes_by_id: id(info.code) -> info.code into each dict
 *
 * Nothing here runs user code: only builtin types' fields and plain dicts are read (but for
 * codes_by_id given something other than a FunctionInfo: its ``code`` attribute).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030D0000
#define PyObject_GetOptionalAttr _PyObject_LookupAttr /* (3.12's name for it) */
#endif

/* co_flags bits (CPython's, as registry.py names them) */
#define CO_NEWLOCALS_ 0x0002
#define CO_GENERATOR_ 0x0020
#define CO_COROUTINE_ 0x0080
#define CO_ITERABLE_COROUTINE_ 0x0100
#define CO_ASYNC_GENERATOR_ 0x0200

/* The kinds, in the order of setup()'s tuple (registry.py's _C_KINDS). */
enum {
    KIND_MODULE, KIND_CLASS, KIND_GENEXPR, KIND_LAMBDA, KIND_ASYNC_GENERATOR, KIND_COROUTINE,
    KIND_GENERATOR, KIND_TYPE_PARAMS, KIND_COMPREHENSION, KIND_FUNCTION, N_KINDS
};
enum { F_CODE, F_NAME, F_MODULE, F_QUALNAME, F_FILENAME, F_FIRSTLINENO, F_KIND, F_SUFFIX,
       N_FIELDS };
/* An entry of a batch: (code, module, qualname, kind, order, id(code)) (registry's _Entry) */
enum { E_CODE, E_MODULE, E_QUALNAME, E_KIND, E_ORDER, E_KEY, N_ENTRY };
#define MAX_DEPTH 6 /* the namespace walk's and _functions_of's limit (registry.py's) */

static PyObject *kinds[N_KINDS];
static PyObject *anonymous;  /* frozenset of str */
static PyTypeObject *info_type;
static PyObject *fields[N_FIELDS];
static PyObject *partial_type; /* functools.partial (setup) */
static PyObject *s_code, *s_wrapped, *s_func, *s_fget, *s_fset, *s_fdel, *s_module, *s_name,
    *s_dot, *s_lambda, *s_genexpr, *s_listcomp, *s_setcomp, *s_dictcomp, *s_generic,
    *s_module_body, *s_empty, *s_frozen;

static int
ready(void)
{
    if (info_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_cregistry.setup() was not called");
        return 0;
    }
    return 1;
}

/* registry.code_kind */
static int
kind_of(PyCodeObject *c)
{
    int flags = c->co_flags;
    PyObject *name = c->co_name;
    if (!(flags & CO_NEWLOCALS_)) {
        return PyUnicode_Compare(name, s_module_body) == 0 ? KIND_MODULE : KIND_CLASS;
    }
    if (PyUnicode_Compare(name, s_genexpr) == 0)
        return KIND_GENEXPR;
    if (PyUnicode_Compare(name, s_lambda) == 0)
        return KIND_LAMBDA;
    if (flags & CO_ASYNC_GENERATOR_)
        return KIND_ASYNC_GENERATOR;
    if (flags & CO_COROUTINE_)
        return KIND_COROUTINE;
    if (flags & (CO_GENERATOR_ | CO_ITERABLE_COROUTINE_))
        return KIND_GENERATOR;
    if (PyUnicode_Tailmatch(name, s_generic, 0, PY_SSIZE_T_MAX, -1) == 1)
        return KIND_TYPE_PARAMS;
    if (PyUnicode_Compare(name, s_listcomp) == 0 || PyUnicode_Compare(name, s_setcomp) == 0 ||
        PyUnicode_Compare(name, s_dictcomp) == 0)
        return KIND_COMPREHENSION;
    return KIND_FUNCTION;
}

static PyObject *
setup(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *k, *anon, *type, *f, *part;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O", &PyTuple_Type, &k, &PyFrozenSet_Type, &anon,
                          &PyType_Type, &type, &PyTuple_Type, &f, &part))
        return NULL;
    if (PyTuple_GET_SIZE(k) != N_KINDS || PyTuple_GET_SIZE(f) != N_FIELDS) {
        PyErr_Format(PyExc_ValueError, "_cregistry.setup: %d kinds and %d fields expected",
                     N_KINDS, N_FIELDS);
        return NULL;
    }
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *d = PyTuple_GET_ITEM(f, i);
        if (Py_TYPE(d)->tp_descr_set == NULL) {
            PyErr_SetString(PyExc_TypeError, "_cregistry.setup: fields must be slot descriptors");
            return NULL;
        }
    }
    for (int i = 0; i < N_KINDS; i++)
        Py_XSETREF(kinds[i], Py_NewRef(PyTuple_GET_ITEM(k, i)));
    for (int i = 0; i < N_FIELDS; i++)
        Py_XSETREF(fields[i], Py_NewRef(PyTuple_GET_ITEM(f, i)));
    Py_XSETREF(anonymous, Py_NewRef(anon));
    Py_XSETREF(info_type, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(partial_type, Py_NewRef(part));
    Py_RETURN_NONE;
}

/* --- collect ----------------------------------------------------------------------------- */

/* One code object waiting to be walked: its id, the code, its qualname if given, and the
 * (old, new) prefixes of its parent's renaming (NULL: none). Borrowed code (held by its
 * parent's co_consts, or the caller); owned strings. */
typedef struct {
    PyObject *key;
    PyObject *code;
    PyObject *qualname;
    PyObject *rename_old, *rename_new;
} Pending;

typedef struct {
    Pending *items;
    Py_ssize_t n, cap;
} Stack;

static int
push(Stack *s, PyObject *key, PyObject *code, PyObject *qualname, PyObject *old, PyObject *new)
{
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 64;
        Pending *items = PyMem_Realloc(s->items, cap * sizeof(Pending));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->items = items;
        s->cap = cap;
    }
    s->items[s->n++] = (Pending){Py_NewRef(key), code, Py_XNewRef(qualname), Py_XNewRef(old),
                                 Py_XNewRef(new)};
    return 0;
}

static void
pending_clear(Pending *p)
{
    Py_XDECREF(p->key);
    Py_XDECREF(p->qualname);
    Py_XDECREF(p->rename_old);
    Py_XDECREF(p->rename_new);
}

/* registry._remember_body: bodies[key] = weakref.ref(code, partial(drop, key)) */
static int
remember_body(PyObject *bodies, PyObject *drop, PyObject *code, PyObject *key)
{
    int has = PyDict_Contains(bodies, key);
    if (has != 0)
        return has < 0 ? -1 : 0;
    PyObject *callback = PyObject_CallFunctionObjArgs(partial_type, drop, key, NULL);
    if (callback == NULL)
        return -1;
    PyObject *ref = PyWeakref_NewRef(code, callback);
    Py_DECREF(callback);
    if (ref == NULL)
        return -1;
    int rc = PyDict_SetItem(bodies, key, ref);
    Py_DECREF(ref);
    return rc;
}

/* A new tuple of the entry, or NULL. */
static PyObject *
make_entry(PyObject *code, PyObject *module, PyObject *qualname, int kind, Py_ssize_t order,
           PyObject *key)
{
    PyObject *o = PyLong_FromSsize_t(order);
    if (o == NULL)
        return NULL;
    PyObject *e = PyTuple_Pack(N_ENTRY, code, module, qualname, kinds[kind], o, key);
    Py_DECREF(o);
    return e;
}

/* The qualname a nested code object gets: its own, with the parent's renamed prefix. */
static PyObject *
renamed(PyObject *cq, PyObject *old, PyObject *new)
{
    if (old != NULL && PyUnicode_Tailmatch(cq, old, 0, PY_SSIZE_T_MAX, -1) == 1) {
        PyObject *tail = PyUnicode_Substring(cq, PyUnicode_GET_LENGTH(old),
                                             PyUnicode_GET_LENGTH(cq));
        if (tail == NULL)
            return NULL;
        PyObject *q = PyUnicode_Concat(new, tail);
        Py_DECREF(tail);
        return q;
    }
    return Py_NewRef(cq);
}

/* registry._collect for one code (qualname NULL: its own): the new order, or -1 with an
 * error set. */
static Py_ssize_t
collect_one(PyObject *code, PyObject *module, PyObject *qualname, PyObject *entries,
            PyObject *by_id, int register_top, Py_ssize_t order, PyObject *bodies,
            PyObject *drop)
{
    Stack stack = {0};
    PyObject *key0 = PyLong_FromVoidPtr(code);
    if (key0 == NULL || push(&stack, key0, code, qualname, NULL, NULL) < 0) {
        Py_XDECREF(key0);
        return -1;
    }
    Py_DECREF(key0);
    int failed = 0;
    while (stack.n && !failed) {
        Pending p = stack.items[--stack.n];
        PyCodeObject *c = (PyCodeObject *)p.code;
        PyObject *cq = c->co_qualname;
        PyObject *q = p.qualname != NULL ? Py_NewRef(p.qualname) : renamed(cq, p.rename_old,
                                                                          p.rename_new);
        if (q == NULL) {
            pending_clear(&p);
            failed = 1;
            break;
        }
        int kind = kind_of(c);
        int in_entries = p.code == code ? PyDict_Contains(entries, p.key) : 0;
        if (in_entries < 0) {
            failed = 1;
        }
        else if (in_entries) {
            /* already in the batch as a function of its own */
        }
        else if ((kind != KIND_MODULE && kind != KIND_CLASS) ||
                 (register_top && p.code == code)) {
            PyObject *e = make_entry(p.code, module, q, kind, ++order, p.key);
            failed = e == NULL || PyDict_SetItem(entries, p.key, e) < 0;
            Py_XDECREF(e);
        }
        else {
            failed = remember_body(bodies, drop, p.code, p.key) < 0;
        }
        /* the children's renaming: this code's, if its qualname was changed */
        PyObject *old = p.rename_old, *new = p.rename_new;
        PyObject *child_old = NULL, *child_new = NULL;
        if (!failed) {
            int same = PyUnicode_Compare(q, cq);
            if (same == -1 && PyErr_Occurred())
                failed = 1;
            else if (same != 0) {
                child_old = PyUnicode_Concat(cq, s_dot);
                child_new = child_old ? PyUnicode_Concat(q, s_dot) : NULL;
                failed = child_new == NULL;
                old = child_old;
                new = child_new;
            }
        }
        /* pushed in reverse so that nested code is numbered in source order */
        PyObject *consts = c->co_consts;
        for (Py_ssize_t i = PyTuple_GET_SIZE(consts) - 1; i >= 0 && !failed; i--) {
            PyObject *k = PyTuple_GET_ITEM(consts, i);
            if (Py_TYPE(k) != &PyCode_Type)
                continue;
            PyObject *kk = PyLong_FromVoidPtr(k);
            if (kk == NULL) {
                failed = 1;
                break;
            }
            int known = PyDict_Contains(by_id, kk);
            if (known == 0)
                known = PyDict_Contains(entries, kk);
            if (known < 0 || (known == 0 && push(&stack, kk, k, NULL, old, new) < 0))
                failed = 1;
            Py_DECREF(kk);
        }
        Py_XDECREF(child_old);
        Py_XDECREF(child_new);
        Py_DECREF(q);
        pending_clear(&p);
    }
    while (stack.n)
        pending_clear(&stack.items[--stack.n]);
    PyMem_Free(stack.items);
    return failed ? -1 : order;
}

static PyObject *
collect(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *code, *module, *qualname, *entries, *by_id, *bodies, *drop;
    int register_top;
    Py_ssize_t order;
    if (!PyArg_ParseTuple(args, "O!UOO!O!pnO!O", &PyCode_Type, &code, &module, &qualname,
                          &PyDict_Type, &entries, &PyDict_Type, &by_id, &register_top, &order,
                          &PyDict_Type, &bodies, &drop))
        return NULL;
    if (!ready())
        return NULL;
    if (qualname == Py_None)
        qualname = NULL;
    else if (!PyUnicode_Check(qualname)) {
        PyErr_SetString(PyExc_TypeError, "collect: qualname must be a str or None");
        return NULL;
    }
    order = collect_one(code, module, qualname, entries, by_id, register_top, order, bodies,
                        drop);
    return order < 0 ? NULL : PyLong_FromSsize_t(order);
}

/* registry._register_tops' two loops: each top (code, module, qualname) into the batch
 * entries, in order, then what is nested in each (collect_one, register_top off). */
static PyObject *
collect_tops(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *tops, *entries, *by_id, *bodies, *drop;
    Py_ssize_t order;
    if (!PyArg_ParseTuple(args, "O!O!O!nO!O", &PyList_Type, &tops, &PyDict_Type, &entries,
                          &PyDict_Type, &by_id, &order, &PyDict_Type, &bodies, &drop))
        return NULL;
    if (!ready())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(tops);
    for (Py_ssize_t i = 0; i < n; i++) { /* every function's own code first */
        PyObject *t = PyList_GET_ITEM(tops, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 ||
            !PyCode_Check(PyTuple_GET_ITEM(t, 0)) || !PyUnicode_Check(PyTuple_GET_ITEM(t, 1)) ||
            !PyUnicode_Check(PyTuple_GET_ITEM(t, 2))) {
            PyErr_SetString(PyExc_TypeError, "collect_tops: (code, module, qualname) tuples");
            return NULL; /* (the batch is the caller's to drop, as after any error) */
        }
        PyObject *code = PyTuple_GET_ITEM(t, 0);
        PyObject *key = PyLong_FromVoidPtr(code);
        PyObject *e = key == NULL ? NULL
                                  : make_entry(code, PyTuple_GET_ITEM(t, 1), PyTuple_GET_ITEM(t, 2),
                                               kind_of((PyCodeObject *)code), ++order, key);
        int failed = e == NULL || PyDict_SetItem(entries, key, e) < 0;
        Py_XDECREF(e);
        Py_XDECREF(key);
        if (failed)
            return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* then what is nested in them */
        PyObject *t = PyList_GET_ITEM(tops, i);
        order = collect_one(PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1),
                            PyTuple_GET_ITEM(t, 2), entries, by_id, 0, order, bodies, drop);
        if (order < 0)
            return NULL;
    }
    return PyLong_FromSsize_t(order);
}

/* --- commit ------------------------------------------------------------------------------ */

/* registry._new_info: a FunctionInfo made without its __init__ (filename and firstlineno
 * from the code), its slots stored through their descriptors. */
static PyObject *
new_info(PyObject *code, PyObject *name, PyObject *module, PyObject *qualname, PyObject *kind,
         PyObject *suffix)
{
    PyCodeObject *c = (PyCodeObject *)code;
    PyObject *line = PyLong_FromLong(c->co_firstlineno);
    if (line == NULL)
        return NULL;
    PyObject *info = info_type->tp_alloc(info_type, 0);
    if (info == NULL) {
        Py_DECREF(line);
        return NULL;
    }
    PyObject *values[N_FIELDS] = {code, name, module, qualname, c->co_filename, line, kind,
                                  suffix};
    for (int i = 0; i < N_FIELDS; i++) {
        if (Py_TYPE(fields[i])->tp_descr_set(fields[i], info, values[i]) < 0) {
            Py_DECREF(line);
            Py_DECREF(info);
            return NULL;
        }
    }
    Py_DECREF(line);
    /* Out of the cyclic GC's sight: a FunctionInfo holds a code object, strings and an int
     * and can be assigned nothing, so it is never part of a cycle, and a registry keeps
     * thousands of them for as long as it lives (every collection of an older generation
     * would walk them all). */
    PyObject_GC_UnTrack(info);
    return info;
}

/* module + "." + qualname (both str) */
static PyObject *
dotted(PyObject *a, PyObject *b)
{
    if (!PyUnicode_Check(a) || !PyUnicode_Check(b)) {
        PyErr_SetString(PyExc_TypeError, "commit: module and qualname must be str");
        return NULL;
    }
    Py_ssize_t na = PyUnicode_GET_LENGTH(a), nb = PyUnicode_GET_LENGTH(b);
    Py_UCS4 max = PyUnicode_MAX_CHAR_VALUE(a) > PyUnicode_MAX_CHAR_VALUE(b)
                      ? PyUnicode_MAX_CHAR_VALUE(a) : PyUnicode_MAX_CHAR_VALUE(b);
    PyObject *s = PyUnicode_New(na + 1 + nb, max);
    if (s == NULL)
        return NULL;
    PyUnicode_CopyCharacters(s, 0, a, 0, na);
    PyUnicode_WriteChar(s, na, '.');
    PyUnicode_CopyCharacters(s, na + 1, b, 0, nb);
    return s;
}

/* Whether a qualname's last part is anonymous ("<lambda>"...): every such name ends with ">" */
static int
is_anonymous(PyObject *q)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(q);
    if (n == 0 || PyUnicode_READ_CHAR(q, n - 1) != '>')
        return 0;
    Py_ssize_t dot = PyUnicode_FindChar(q, '.', 0, n, -1);
    if (dot == -2)
        return -1;
    PyObject *leaf = dot < 0 ? Py_NewRef(q) : PyUnicode_Substring(q, dot + 1, n);
    if (leaf == NULL)
        return -1;
    int r = PySet_Contains(anonymous, leaf);
    Py_DECREF(leaf);
    return r;
}

/* Name and publish one entry: base + suffix, its qualname + suffix. */
static int
publish(PyObject *e, PyObject *base, PyObject *suffix, PyObject *by_id, PyObject *taken,
        PyObject *new)
{
    PyObject *name = PyUnicode_Concat(base, suffix);
    PyObject *q = name ? PyUnicode_Concat(PyTuple_GET_ITEM(e, E_QUALNAME), suffix) : NULL;
    PyObject *info = NULL;
    int rc = -1;
    if (q != NULL && PySet_Add(taken, name) == 0) {
        info = new_info(PyTuple_GET_ITEM(e, E_CODE), name, PyTuple_GET_ITEM(e, E_MODULE), q,
                        PyTuple_GET_ITEM(e, E_KIND), suffix);
        if (info != NULL && PyDict_SetItem(by_id, PyTuple_GET_ITEM(e, E_KEY), info) == 0)
            rc = PyList_Append(new, info);
    }
    Py_XDECREF(name);
    Py_XDECREF(q);
    Py_XDECREF(info);
    return rc;
}

typedef struct {
    int line;
    long key;          /* what it is sorted by: its line, then its column among its line's */
    Py_ssize_t order;  /* the entry's order in the batch */
    PyObject *e;       /* borrowed from members */
} Member;

/* By key, then by the batch's order */
static int
by_key(const void *a, const void *b)
{
    const Member *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* registry._name_apart: the entries that share the name ``base`` (or take one already taken,
 * or are anonymous) get ``@LINE``, and ``@LINE#N`` when several are on one line (numbered in
 * source order: column, then the batch's order) or the line's name is taken. */
static int
name_apart(PyObject *base, PyObject *members, PyObject *by_id, PyObject *taken,
           PyObject *column, PyObject *new)
{
    Py_ssize_t n = PyList_GET_SIZE(members);
    Member *m = PyMem_Malloc(n * sizeof(Member));
    if (m == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(members, i);
        Py_ssize_t order = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, E_ORDER));
        if (order == -1 && PyErr_Occurred()) {
            PyMem_Free(m);
            return -1;
        }
        const int line = ((PyCodeObject *)PyTuple_GET_ITEM(e, E_CODE))->co_firstlineno;
        m[i] = (Member){line, line, order, e};
    }
    qsort(m, n, sizeof(Member), by_key);
    int rc = 0;
    for (Py_ssize_t i = 0, j; i < n && rc == 0; i = j) {
        for (j = i + 1; j < n && m[j].line == m[i].line; j++)
            ;
        PyObject *at = PyUnicode_FromFormat("@%d", m[i].line);
        if (at == NULL) {
            rc = -1;
            break;
        }
        int free_line = 0;
        if (j - i == 1) {
            PyObject *name = PyUnicode_Concat(base, at);
            free_line = name == NULL ? -1 : !PySet_Contains(taken, name);
            Py_XDECREF(name);
            if (free_line < 0)
                rc = -1;
            else if (free_line)
                rc = publish(m[i].e, base, at, by_id, taken, new);
        }
        else {  /* several on one line: in source order */
            for (Py_ssize_t k = i; k < j && rc == 0; k++) {
                PyObject *col = PyObject_CallOneArg(column, PyTuple_GET_ITEM(m[k].e, E_CODE));
                m[k].key = col ? PyLong_AsLong(col) : -1;
                if (col == NULL || (m[k].key == -1 && PyErr_Occurred()))
                    rc = -1;
                Py_XDECREF(col);
            }
            if (rc == 0)
                qsort(m + i, j - i, sizeof(Member), by_key);
        }
        for (Py_ssize_t k = i, num = 1; k < j && rc == 0 && !free_line; k++, num++) {
            PyObject *suffix = NULL, *name = NULL;
            int busy;
            do {  /* the next number whose name is free */
                Py_XDECREF(suffix);
                Py_XDECREF(name);
                suffix = PyUnicode_FromFormat("%U#%zd", at, num);
                name = suffix ? PyUnicode_Concat(base, suffix) : NULL;
                busy = name ? PySet_Contains(taken, name) : -1;
                num += busy == 1;
            } while (busy == 1);
            rc = busy < 0 ? -1 : publish(m[k].e, base, suffix, by_id, taken, new);
            Py_XDECREF(suffix);
            Py_XDECREF(name);
        }
        Py_DECREF(at);
    }
    PyMem_Free(m);
    return rc;
}

static PyObject *
commit(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *entries, *by_id, *taken, *column;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyDict_Type, &entries, &PyDict_Type, &by_id,
                          &PySet_Type, &taken, &column))
        return NULL;
    if (!ready())
        return NULL;
    /* grouped by name without suffix, in the batch's order (dicts keep it): a group of one
     * is its entry itself (the common case: no list made), of more a list of them */
    PyObject *groups = PyDict_New();
    PyObject *new = PyList_New(0);
    if (groups == NULL || new == NULL)
        goto fail;
    Py_ssize_t pos = 0;
    PyObject *key, *e;
    while (PyDict_Next(entries, &pos, &key, &e)) {
        int known = PyDict_Contains(by_id, key);
        if (known < 0)
            goto fail;
        if (known)
            continue;
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != N_ENTRY) {
            PyErr_SetString(PyExc_TypeError, "commit: an entry is not a 6-tuple");
            goto fail;
        }
        PyObject *base = dotted(PyTuple_GET_ITEM(e, E_MODULE), PyTuple_GET_ITEM(e, E_QUALNAME));
        if (base == NULL)
            goto fail;
        const Py_ssize_t ngroups = PyDict_GET_SIZE(groups);
        PyObject *members = PyDict_SetDefault(groups, base, e); /* (borrowed) */
        int rc = members == NULL ? -1 : 0;
        int more = members != NULL && PyDict_GET_SIZE(groups) == ngroups; /* (not a new one) */
        if (more && PyList_CheckExact(members))
            rc = PyList_Append(members, e); /* a group of several: one more */
        else if (more) { /* a second member: the group becomes a list */
            PyObject *list = PyList_New(2);
            rc = list == NULL ? -1 : 0;
            if (list != NULL) {
                PyList_SET_ITEM(list, 0, Py_NewRef(members)); /* (entries holds it too) */
                PyList_SET_ITEM(list, 1, Py_NewRef(e));
                rc = PyDict_SetItem(groups, base, list);
                Py_DECREF(list);
            }
        }
        Py_DECREF(base);
        if (rc < 0)
            goto fail;
    }
    /* each info is published as soon as it is named (readers use dict.get without the lock) */
    pos = 0;
    PyObject *base, *members;
    while (PyDict_Next(groups, &pos, &base, &members)) {
        if (!PyList_CheckExact(members)) {
            int in_taken = PySet_Contains(taken, base);
            if (in_taken < 0)
                goto fail;
            PyObject *m = members;
            PyObject *q = PyTuple_GET_ITEM(m, E_QUALNAME);
            int anon = in_taken ? 0 : is_anonymous(q);
            if (anon < 0)
                goto fail;
            if (!in_taken && !anon) {  /* the common case: a name of its own, no suffix */
                if (PySet_Add(taken, base) < 0)
                    goto fail;
                PyObject *info = new_info(PyTuple_GET_ITEM(m, E_CODE), base,
                                          PyTuple_GET_ITEM(m, E_MODULE), q,
                                          PyTuple_GET_ITEM(m, E_KIND), s_empty);
                if (info == NULL)
                    goto fail;
                int rc = PyDict_SetItem(by_id, PyTuple_GET_ITEM(m, E_KEY), info);
                if (rc == 0)
                    rc = PyList_Append(new, info);
                Py_DECREF(info);
                if (rc < 0)
                    goto fail;
                continue;
            }
        }
        PyObject *list = PyList_CheckExact(members) ? Py_NewRef(members)
                                                    : PyList_New(1); /* (a group of one) */
        if (list != NULL && list != members)
            PyList_SET_ITEM(list, 0, Py_NewRef(members));
        int rc = list == NULL ? -1 : name_apart(base, list, by_id, taken, column, new);
        Py_XDECREF(list);
        if (rc < 0)
            goto fail;
    }
    Py_DECREF(groups);
    return new;
fail:
    Py_XDECREF(groups);
    Py_XDECREF(new);
    return NULL;
}

/* --- the namespace walk ------------------------------------------------------------------ */

typedef struct {
    PyObject *known, *owners, *out, *seen, *modname;
} Walk;

/* A function whose code is unknown: into out (and owners, if found in a class). */
static int
found(Walk *w, PyObject *f, PyObject *klass, PyObject *value)
{
    PyObject *k = PyLong_FromVoidPtr(PyFunction_GET_CODE(f));
    if (k == NULL)
        return -1;
    int known = PyDict_Contains(w->known, k);
    Py_DECREF(k);
    if (known)
        return known < 0 ? -1 : 0;
    if (PyList_Append(w->out, f) < 0)
        return -1;
    if (klass == NULL)
        return 0;
    PyObject *fid = PyLong_FromVoidPtr(f);
    PyObject *pair = fid ? PyTuple_Pack(2, klass, value) : NULL;
    int rc = pair ? PyDict_SetItem(w->owners, fid, pair) : -1;
    Py_XDECREF(fid);
    Py_XDECREF(pair);
    return rc;
}

/* registry._functions_of: value and what it wraps, each through found(). */
static int
functions_of(Walk *w, PyObject *value, int depth, PyObject *klass, PyObject *held)
{
    PyTypeObject *t = Py_TYPE(value);
    if (t == &PyFunction_Type) {
        if (found(w, value, klass, held) < 0)
            return -1;
        PyObject *wrapped;
        if (PyObject_GetOptionalAttr(value, s_wrapped, &wrapped) < 0)
            return -1;
        int rc = 0;
        if (wrapped != NULL && wrapped != Py_None && depth < MAX_DEPTH)
            rc = functions_of(w, wrapped, depth + 1, klass, held);
        Py_XDECREF(wrapped);
        return rc;
    }
    PyObject *names[3] = {NULL, NULL, NULL};
    if (t == &PyStaticMethod_Type || t == &PyClassMethod_Type)
        names[0] = s_func;
    else if (t == &PyProperty_Type) {
        names[0] = s_fget;
        names[1] = s_fset;
        names[2] = s_fdel;
    }
    for (int i = 0; i < 3 && names[i] != NULL; i++) {
        PyObject *inner = PyObject_GetAttr(value, names[i]);
        if (inner == NULL)
            return -1;
        int rc = functions_of(w, inner, depth, klass, held);
        Py_DECREF(inner);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* One namespace's values (a module's, or a class's own dict at depth > 0). */
static int
walk(Walk *w, PyObject *ns, int depth, PyObject *klass)
{
    PyObject *values = PyDict_Values(ns);  /* a copy: the namespace may change under us */
    if (values == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values) && rc == 0; i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        PyTypeObject *t = Py_TYPE(value);
        if (t == &PyFunction_Type) {
            /* most functions wrap nothing and were named from the module's code already */
            PyObject *wrapped;
            if (PyObject_GetOptionalAttr(value, s_wrapped, &wrapped) < 0) {
                rc = -1;
                break;
            }
            int plain = wrapped == NULL || wrapped == Py_None;
            Py_XDECREF(wrapped);
            if (plain) {
                rc = found(w, value, klass, value);
                continue;
            }
            rc = functions_of(w, value, 0, klass, value);
        }
        else if (t == &PyStaticMethod_Type || t == &PyClassMethod_Type ||
                 t == &PyProperty_Type) {
            rc = functions_of(w, value, 0, klass, value);
        }
        else if (PyType_IsSubtype(t, &PyType_Type) && depth < MAX_DEPTH) {
            /* the module's own classes, each once */
            PyObject *cns = PyType_GetDict((PyTypeObject *)value);
            if (cns == NULL) {
                rc = -1;
                break;
            }
            PyObject *mod = PyDict_GetItemWithError(cns, s_module);
            int mine = mod != NULL && PyUnicode_Check(mod) && PyUnicode_Check(w->modname) &&
                       PyUnicode_Compare(mod, w->modname) == 0;
            if (mod == NULL && PyErr_Occurred())
                rc = -1;
            else if (mine) {
                PyObject *id = PyLong_FromVoidPtr(value);
                int seen = id ? PySet_Contains(w->seen, id) : -1;
                if (seen == 0)
                    seen = PySet_Add(w->seen, id) < 0 ? -1 : 0;
                Py_XDECREF(id);
                if (seen < 0)
                    rc = -1;
                else if (!seen)
                    rc = walk(w, cns, depth + 1, value);
            }
            Py_DECREF(cns);
        }
    }
    Py_DECREF(values);
    return rc;
}

static PyObject *
namespace_functions(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mod, *known, *owners;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyModule_Type, &mod, &PyDict_Type, &known,
                          &PyDict_Type, &owners))
        return NULL;
    PyObject *ns = PyModule_GetDict(mod);  /* borrowed */
    if (ns == NULL)
        return NULL;
    PyObject *modname = PyDict_GetItemWithError(ns, s_name);
    if (modname == NULL && PyErr_Occurred())
        return NULL;
    Walk w = {known, owners, PyList_New(0), PySet_New(NULL), modname ? modname : Py_None};
    Py_INCREF(w.modname);
    int rc = w.out && w.seen ? walk(&w, ns, 0, NULL) : -1;
    Py_XDECREF(w.seen);
    Py_DECREF(w.modname);
    if (rc < 0) {
        Py_XDECREF(w.out);
        return NULL;
    }
    return w.out;
}

/* --- tops -------------------------------------------------------------------------------- */

/* registry._is_synthetic: a file name like "<string>" (code made from a string), not frozen. */
static int
is_synthetic(PyObject *filename)
{
    return PyUnicode_Check(filename) && PyUnicode_GET_LENGTH(filename) > 0 &&
           PyUnicode_READ_CHAR(filename, 0) == '<' &&
           PyUnicode_Tailmatch(filename, s_frozen, 0, PY_SSIZE_T_MAX, -1) != 1;
}

/* core.is_own_module: own itself or a module under it. */
static int
is_own(PyObject *module, PyObject *own)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(own);
    if (PyUnicode_Tailmatch(module, own, 0, n, -1) != 1)
        return 0;
    return PyUnicode_GET_LENGTH(module) == n || PyUnicode_READ_CHAR(module, n) == '.';
}

/* registry._tops, in C where nothing needs Python's judgment (see the header). */
static PyObject *
tops(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *funcs, *by_id, *own;
    if (!PyArg_ParseTuple(args, "O!O!U", &PyList_Type, &funcs, &PyDict_Type, &by_id, &own))
        return NULL;
    PyObject *out = PyList_New(0), *rest = PyList_New(0), *seen = PySet_New(NULL);
    if (out == NULL || rest == NULL || seen == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(funcs); i++) {
        PyObject *f = PyList_GET_ITEM(funcs, i);
        if (!PyFunction_Check(f)) {
            PyErr_SetString(PyExc_TypeError, "tops: a list of functions");
            goto fail;
        }
        PyCodeObject *code = (PyCodeObject *)PyFunction_GET_CODE(f);
        if (!(code->co_flags & CO_NEWLOCALS_))
            continue; /* a module or class body running now (registry._tops says why) */
        PyObject *key = PyLong_FromVoidPtr(code);
        int skip = key == NULL ? -1 : PyDict_Contains(by_id, key);
        if (skip == 0)
            skip = PySet_Contains(seen, key);
        if (skip == 0)
            skip = PySet_Add(seen, key);
        Py_XDECREF(key);
        if (skip < 0)
            goto fail;
        if (skip)
            continue;
        PyObject *module = PyDict_GetItemWithError(PyFunction_GET_GLOBALS(f), s_name);
        if (module == NULL && PyErr_Occurred())
            goto fail;
        if (module == NULL || !PyUnicode_CheckExact(module) || PyUnicode_GET_LENGTH(module) == 0 ||
            is_synthetic(code->co_filename)) {
            if (PyList_Append(rest, f) < 0) /* registry._top_of decides */
                goto fail;
            continue;
        }
        if (is_own(module, own))
            continue;
        PyObject *t = PyTuple_Pack(3, (PyObject *)code, module, code->co_qualname);
        int rc = t == NULL ? -1 : PyList_Append(out, t);
        Py_XDECREF(t);
        if (rc < 0)
            goto fail;
    }
    Py_DECREF(seen);
    PyObject *r = PyTuple_Pack(2, out, rest);
    Py_DECREF(out);
    Py_DECREF(rest);
    return r;
fail:
    Py_XDECREF(out);
    Py_XDECREF(rest);
    Py_XDECREF(seen);
    return NULL;
}

/* --- codes_by_id ------------------------------------------------------------------------- */

/* registry.codes_by_id: id(info.code) -> info.code of each info, into each dict given. */
static PyObject *
codes_by_id(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *infos, *into;
    if (!PyArg_ParseTuple(args, "OO!", &infos, &PyTuple_Type, &into) || !ready())
        return NULL;
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(into); d++)
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(into, d))) {
            PyErr_SetString(PyExc_TypeError, "codes_by_id: dicts to add to");
            return NULL;
        }
    PyObject *seq = PySequence_Fast(infos, "codes_by_id: a sequence of FunctionInfo");
    if (seq == NULL)
        return NULL;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *info = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *code = Py_TYPE(info) == info_type
                             ? Py_TYPE(fields[F_CODE])->tp_descr_get(fields[F_CODE], info,
                                                                     (PyObject *)info_type)
                             : PyObject_GetAttr(info, s_code);
        PyObject *key = code == NULL ? NULL : PyLong_FromVoidPtr(code);
        rc = key == NULL ? -1 : 0;
        for (Py_ssize_t d = 0; rc == 0 && d < PyTuple_GET_SIZE(into); d++)
            rc = PyDict_SetItem(PyTuple_GET_ITEM(into, d), key, code);
        Py_XDECREF(key);
        Py_XDECREF(code);
    }
    Py_DECREF(seq);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "Hand over the registry's kinds, types and fields."},
    {"collect", collect, METH_VARARGS, "registry._collect: a code tree into a batch."},
    {"collect_tops", collect_tops, METH_VARARGS,
     "registry._register_tops' loops: functions and their nested code into a batch."},
    {"commit", commit, METH_VARARGS, "registry._commit's loop: name a batch."},
    {"codes_by_id", codes_by_id, METH_VARARGS,
     "registry.codes_by_id: id(info.code) -> info.code, into each dict."},
    {"namespace_functions", namespace_functions, METH_VARARGS,
     "registry._namespace_functions: unknown functions of a module's namespace."},
    {"tops", tops, METH_VARARGS,
     "registry._tops' common case: (code, module, qualname) of functions with new code."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rethook.engine._cregistry",
    .m_doc = "The function registry's per-function work, in C (see registry.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__cregistry(void)
{
    PyObject **strs[] = {&s_code, &s_wrapped, &s_func, &s_fget, &s_fset, &s_fdel, &s_module,
                         &s_name, &s_dot, &s_lambda, &s_genexpr, &s_listcomp, &s_setcomp,
                         &s_dictcomp, &s_generic, &s_module_body, &s_empty, &s_frozen};
    const char *text[] = {"code", "__wrapped__", "__func__", "fget", "fset", "fdel", "__module__",
                          "__name__", ".", "<lambda>", "<genexpr>", "<listcomp>", "<setcomp>",
                          "<dictcomp>", "<generic parameters of ", "<module>", "", "<frozen "};
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) {
        if (*strs[i] == NULL && (*strs[i] = PyUnicode_InternFromString(text[i])) == NULL)
            return NULL;
    }
    PyObject *m = PyModule_Create(&moduledef);
#ifdef Py_GIL_DISABLED
    if (m != NULL)
        PyUnstable_Module_SetGIL(m, Py_MOD_GIL_USED);
#endif
    return m;
}
