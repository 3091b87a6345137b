/* The lazy DFA's closures and rows (`nfa.LazyDFA.closure` and `_compute_row`) in C, over the
 * NFA's own Python lists and dicts, with the same results in the same order as the Python
 * code they stand for (`native_rows` loads this module; the Python code is its twin).
 *
 * What the NFA has not made yet (a `None` in `_eps` or `_edges`) is made by calling back into
 * Python (`nfa.moves(s)`, `nfa.edges(s)`), and a row's target sets that are not interned yet
 * go to `dfa._target_id(key)`: only the loops over made lists run here. Any Python exception
 * raised by a callback (a budget or the clock) is passed on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_EVERY 256 /* closure steps between calls of nfa.check(), as nfa._CHECK_EVERY */

typedef struct {
    long lo, hi, t;
} Edge;

typedef struct { /* a growable array of longs */
    long *v;
    Py_ssize_t n, cap;
} Longs;

static int longs_push(Longs *a, long x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 64;
        long *v = realloc(a->v, cap * sizeof(long));
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct { /* open addressing set of non-negative longs (-1 = empty slot) */
    long *slot;
    Py_ssize_t mask, n;
} LongSet;

static int set_init(LongSet *s, Py_ssize_t hint) {
    Py_ssize_t size = 64;
    while (size < 4 * hint) size *= 2;
    s->slot = malloc(size * sizeof(long));
    if (s->slot == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(s->slot, 0xff, size * sizeof(long));
    s->mask = size - 1;
    s->n = 0;
    return 0;
}

/* 1 if added, 0 if there already, -1 on error */
static int set_add(LongSet *s, long x) {
    if (2 * (s->n + 1) > s->mask + 1) {
        LongSet bigger;
        bigger.slot = malloc(2 * (s->mask + 1) * sizeof(long));
        if (bigger.slot == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(bigger.slot, 0xff, 2 * (s->mask + 1) * sizeof(long));
        bigger.mask = 2 * s->mask + 1;
        bigger.n = 0;
        for (Py_ssize_t i = 0; i <= s->mask; i++)
            if (s->slot[i] >= 0) set_add(&bigger, s->slot[i]);
        free(s->slot);
        *s = bigger;
    }
    Py_ssize_t i = ((size_t)x * 0x9E3779B97F4A7C15ull) >> 7 & s->mask;
    while (s->slot[i] >= 0) {
        if (s->slot[i] == x) return 0;
        i = (i + 1) & s->mask;
    }
    s->slot[i] = x;
    s->n++;
    return 1;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static int cmp_edge(const void *a, const void *b) {
    const Edge *x = a, *y = b;
    if (x->lo != y->lo) return (x->lo > y->lo) - (x->lo < y->lo);
    if (x->hi != y->hi) return (x->hi > y->hi) - (x->hi < y->hi);
    return (x->t > y->t) - (x->t < y->t);
}

/* A tuple of ints from sorted longs. */
static PyObject *tuple_of(const long *v, Py_ssize_t n) {
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLong(v[i]);
        if (x == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, x);
    }
    return out;
}

/* list[i] (borrowed), or NULL with IndexError: a state number the NFA never made is a bug to
 * report, not memory to read */
static PyObject *item(PyObject *list, long i) {
    if (i < 0 || i >= PyList_GET_SIZE(list)) {
        PyErr_Format(PyExc_IndexError, "dfa_rows: NFA state %ld does not exist", i);
        return NULL;
    }
    return PyList_GET_ITEM(list, i);
}

/* dict[int] -> borrowed value or NULL (no error set when absent) */
static PyObject *get_int_key(PyObject *dict, long key) {
    PyObject *k = PyLong_FromLong(key);
    if (k == NULL) return NULL;
    PyObject *got = PyDict_GetItemWithError(dict, k);
    Py_DECREF(k);
    return got;
}

/* `NFA.has_edges`: 1, 0, or -1 on error. */
static int has_edges(PyObject *edges, PyObject *lifted, long s) {
    for (;;) {
        PyObject *lift = get_int_key(lifted, s);
        if (lift == NULL) {
            if (PyErr_Occurred()) return -1;
            break;
        }
        s = PyLong_AsLong(PyTuple_GET_ITEM(lift, 0));
        if (s == -1 && PyErr_Occurred()) return -1;
    }
    PyObject *e = item(edges, s);
    if (e == NULL) return -1;
    return e == Py_None || PyTuple_GET_SIZE(e) > 0;
}

typedef struct {
    PyObject *eps, *edges, *lifted, *order, *tags, *moves, *check;
} Nfa;

static void nfa_clear(Nfa *n) {
    Py_XDECREF(n->eps);
    Py_XDECREF(n->edges);
    Py_XDECREF(n->lifted);
    Py_XDECREF(n->order);
    Py_XDECREF(n->tags);
    Py_XDECREF(n->moves);
    Py_XDECREF(n->check);
}

static int nfa_load(PyObject *nfa, Nfa *n) {
    memset(n, 0, sizeof(*n));
    if (!(n->eps = PyObject_GetAttrString(nfa, "_eps")) ||
        !(n->edges = PyObject_GetAttrString(nfa, "_edges")) ||
        !(n->lifted = PyObject_GetAttrString(nfa, "_lifted")) ||
        !(n->order = PyObject_GetAttrString(nfa, "_order")) ||
        !(n->tags = PyObject_GetAttrString(nfa, "tags")) ||
        !(n->moves = PyObject_GetAttrString(nfa, "moves")) ||
        !(n->check = PyObject_GetAttrString(nfa, "check"))) {
        nfa_clear(n);
        return -1;
    }
    if (!PyList_Check(n->eps) || !PyList_Check(n->edges) || !PyDict_Check(n->lifted) ||
        !PyDict_Check(n->order) || !PyDict_Check(n->tags)) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: unexpected NFA layout");
        nfa_clear(n);
        return -1;
    }
    return 0;
}

/* `NFA.prune` over `v[0:n]` (in place; returns the new length, -1 on error): the lifted
 * states that another one subsumes are dropped, the rest kept. */
static Py_ssize_t prune(Nfa *nfa, long *v, Py_ssize_t n) {
    PyObject *best = PyDict_New(); /* (state, end, counter) -> (state, count) */
    if (best == NULL) return -1;
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *lift = get_int_key(nfa->lifted, v[i]);
        PyObject *order = NULL;
        if (lift == NULL && PyErr_Occurred()) goto fail;
        if (lift != NULL) {
            order = PyDict_GetItemWithError(nfa->order, PyTuple_GET_ITEM(lift, 2));
            if (order == NULL && PyErr_Occurred()) goto fail;
        }
        if (order == NULL) {
            v[kept++] = v[i];
            continue;
        }
        PyObject *key = PyTuple_Pack(3, PyTuple_GET_ITEM(lift, 0), PyTuple_GET_ITEM(lift, 1),
                                     PyTuple_GET_ITEM(order, 0));
        if (key == NULL) goto fail;
        PyObject *got = PyDict_GetItemWithError(best, key);
        if (got == NULL && PyErr_Occurred()) {
            Py_DECREF(key);
            goto fail;
        }
        int better = got == NULL;
        if (!better) {
            better = PyObject_RichCompareBool(PyTuple_GET_ITEM(order, 1), PyTuple_GET_ITEM(got, 1), Py_LT);
            if (better < 0) {
                Py_DECREF(key);
                goto fail;
            }
        }
        if (better) {
            PyObject *s = PyLong_FromLong(v[i]);
            PyObject *pair = s ? PyTuple_Pack(2, s, PyTuple_GET_ITEM(order, 1)) : NULL;
            Py_XDECREF(s);
            if (pair == NULL || PyDict_SetItem(best, key, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(key);
                goto fail;
            }
            Py_DECREF(pair);
        }
        Py_DECREF(key);
    }
    PyObject *key, *pair;
    Py_ssize_t pos = 0;
    while (PyDict_Next(best, &pos, &key, &pair)) {
        v[kept] = PyLong_AsLong(PyTuple_GET_ITEM(pair, 0));
        kept++;
    }
    Py_DECREF(best);
    return kept;
fail:
    Py_DECREF(best);
    return -1;
}

/* closure(nfa, states) -> tuple: `LazyDFA.closure` without its clock check. */
static PyObject *closure(PyObject *self, PyObject *args) {
    PyObject *nfa_obj, *states;
    if (!PyArg_ParseTuple(args, "OO!", &nfa_obj, &PyTuple_Type, &states)) return NULL;
    Nfa nfa;
    if (nfa_load(nfa_obj, &nfa) < 0) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(states);
    Longs stack = {0}, found = {0};
    LongSet seen = {0};
    if (n == 1) { /* a state with no moves is its own closure */
        long s = PyLong_AsLong(PyTuple_GET_ITEM(states, 0));
        if (s == -1 && PyErr_Occurred()) goto done;
        PyObject *m = item(nfa.eps, s);
        if (m == NULL) goto done;
        if (m != Py_None && PyTuple_GET_SIZE(m) == 0) {
            int e = has_edges(nfa.edges, nfa.lifted, s);
            if (e < 0) goto done;
            if (!e) {
                e = PyDict_Contains(nfa.tags, PyTuple_GET_ITEM(states, 0));
                if (e < 0) goto done;
            }
            out = e ? Py_NewRef(states) : PyTuple_New(0);
            goto done;
        }
    }
    if (set_init(&seen, n) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        long s = PyLong_AsLong(PyTuple_GET_ITEM(states, i));
        if (s == -1 && PyErr_Occurred()) goto done;
        int added = set_add(&seen, s);
        if (added < 0 || (added && (longs_push(&found, s) < 0 || longs_push(&stack, s) < 0)))
            goto done;
    }
    long steps = 0;
    while (stack.n) {
        if (++steps % CHECK_EVERY == 0) {
            PyObject *r = PyObject_CallNoArgs(nfa.check);
            if (r == NULL) goto done;
            Py_DECREF(r);
        }
        long s = stack.v[--stack.n];
        PyObject *m = item(nfa.eps, s), *made = NULL;
        if (m == NULL) goto done;
        if (m == Py_None) {
            PyObject *key = PyLong_FromLong(s);
            if (key == NULL) goto done;
            made = m = PyObject_CallOneArg(nfa.moves, key);
            Py_DECREF(key);
            if (m == NULL) goto done;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(m); i++) {
            long t = PyLong_AsLong(PyTuple_GET_ITEM(m, i));
            int added = t == -1 && PyErr_Occurred() ? -1 : set_add(&seen, t);
            if (added < 0 || (added && (longs_push(&found, t) < 0 || longs_push(&stack, t) < 0))) {
                Py_XDECREF(made);
                goto done;
            }
        }
        Py_XDECREF(made);
    }
    Py_ssize_t kept = 0; /* with edges or a tag, in the order first seen */
    for (Py_ssize_t i = 0; i < found.n; i++) {
        int e = has_edges(nfa.edges, nfa.lifted, found.v[i]);
        if (e == 0) {
            PyObject *key = PyLong_FromLong(found.v[i]);
            if (key == NULL) goto done;
            e = PyDict_Contains(nfa.tags, key);
            Py_DECREF(key);
        }
        if (e < 0) goto done;
        if (e) found.v[kept++] = found.v[i];
    }
    kept = prune(&nfa, found.v, kept);
    if (kept < 0) goto done;
    qsort(found.v, kept, sizeof(long), cmp_long);
    out = tuple_of(found.v, kept);
done:
    free(stack.v);
    free(found.v);
    free(seen.slot);
    nfa_clear(&nfa);
    return out;
}

/* The DFA id of target set `v[0:n]` (sorted): `dfa._by_targets`, else `dfa._target_id`. */
static long target_id(PyObject *by_targets, PyObject *target_fn, const long *v, Py_ssize_t n) {
    PyObject *key = tuple_of(v, n);
    if (key == NULL) return -2;
    PyObject *got = PyDict_GetItemWithError(by_targets, key);
    long id;
    if (got != NULL) {
        id = PyLong_AsLong(got);
    } else if (PyErr_Occurred()) {
        id = -2;
    } else {
        PyObject *r = PyObject_CallOneArg(target_fn, key);
        id = r == NULL ? -2 : PyLong_AsLong(r);
        Py_XDECREF(r);
    }
    Py_DECREF(key);
    return id == -1 && PyErr_Occurred() ? -2 : id;
}

static void fill(int32_t *row, long a, long b, long id) {
    for (long i = a; i < b; i++) row[i] = (int32_t)id;
}

/* fill_row(dfa, nfa, states, row): `LazyDFA._compute_row` of the state whose NFA set is
 * `states`, into `row` (an int32[256] buffer, all -1). */
static PyObject *fill_row(PyObject *self, PyObject *args) {
    PyObject *dfa, *nfa_obj, *states;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "OOO!w*", &dfa, &nfa_obj, &PyTuple_Type, &states, &buf)) return NULL;
    PyObject *out = NULL, *edges = NULL, *edges_fn = NULL, *by_targets = NULL, *target_fn = NULL;
    Edge *e = NULL;
    Py_ssize_t ne = 0, cap = 0;
    long *points = NULL, *active_t = NULL, *active_n = NULL, *key = NULL;
    if (buf.len != 256 * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "fill_row: the row must be an int32[256] buffer");
        goto done;
    }
    int32_t *row = buf.buf;
    if (!(edges = PyObject_GetAttrString(nfa_obj, "_edges")) ||
        !(edges_fn = PyObject_GetAttrString(nfa_obj, "edges")) ||
        !(by_targets = PyObject_GetAttrString(dfa, "_by_targets")) ||
        !(target_fn = PyObject_GetAttrString(dfa, "_target_id")))
        goto done;
    if (!PyList_Check(edges) || !PyDict_Check(by_targets)) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: unexpected automaton layout");
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(states); i++) {
        PyObject *s = PyTuple_GET_ITEM(states, i);
        long si = PyLong_AsLong(s);
        if (si == -1 && PyErr_Occurred()) goto done;
        PyObject *list = item(edges, si), *made = NULL;
        if (list == NULL) goto done;
        if (list == Py_None) {
            made = list = PyObject_CallOneArg(edges_fn, s);
            if (list == NULL) goto done;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(list); j++) {
            if (ne == cap) {
                cap = cap ? 2 * cap : 32;
                Edge *grown = realloc(e, cap * sizeof(Edge));
                if (grown == NULL) {
                    Py_XDECREF(made);
                    PyErr_NoMemory();
                    goto done;
                }
                e = grown;
            }
            PyObject *edge = PyTuple_GET_ITEM(list, j);
            e[ne].lo = PyLong_AsLong(PyTuple_GET_ITEM(edge, 0));
            e[ne].hi = PyLong_AsLong(PyTuple_GET_ITEM(edge, 1));
            e[ne].t = PyLong_AsLong(PyTuple_GET_ITEM(edge, 2));
            ne++;
        }
        Py_XDECREF(made);
    }
    if (PyErr_Occurred()) goto done;
    qsort(e, ne, sizeof(Edge), cmp_edge);
    int overlap = 0;
    for (Py_ssize_t i = 1; i < ne && !overlap; i++) overlap = e[i - 1].hi >= e[i].lo;
    if (!overlap) { /* no two edges share a byte: one target each */
        for (Py_ssize_t i = 0; i < ne; i++) {
            long id = target_id(by_targets, target_fn, &e[i].t, 1);
            if (id == -2) goto done;
            fill(row, e[i].lo, e[i].hi + 1, id);
        }
        out = Py_NewRef(Py_None);
        goto done;
    }
    /* Sweep the byte axis: a target enters at its edge's low byte, leaves after its high one. */
    points = malloc(2 * ne * sizeof(long));
    active_t = malloc(ne * sizeof(long));
    active_n = malloc(ne * sizeof(long));
    key = malloc(ne * sizeof(long));
    if (!points || !active_t || !active_n || !key) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < ne; i++) {
        points[2 * i] = e[i].lo;
        points[2 * i + 1] = e[i].hi + 1;
    }
    qsort(points, 2 * ne, sizeof(long), cmp_long);
    Py_ssize_t np = 0;
    for (Py_ssize_t i = 0; i < 2 * ne; i++)
        if (np == 0 || points[np - 1] != points[i]) points[np++] = points[i];
    Py_ssize_t na = 0;
    for (Py_ssize_t p = 0; p + 1 < np; p++) {
        long a = points[p];
        for (Py_ssize_t i = 0; i < ne; i++) { /* the events at a: enter, leave */
            long delta = (e[i].lo == a) - (e[i].hi + 1 == a);
            if (!delta) continue;
            Py_ssize_t k = 0;
            while (k < na && active_t[k] != e[i].t) k++;
            if (k == na) {
                active_t[na] = e[i].t;
                active_n[na++] = 0;
            }
            active_n[k] += delta;
            if (active_n[k] == 0) {
                active_t[k] = active_t[na - 1];
                active_n[k] = active_n[na - 1];
                na--;
            }
        }
        if (na == 0) continue;
        memcpy(key, active_t, na * sizeof(long));
        qsort(key, na, sizeof(long), cmp_long);
        long id = target_id(by_targets, target_fn, key, na);
        if (id == -2) goto done;
        fill(row, a, points[p + 1], id);
    }
    out = Py_NewRef(Py_None);
done:
    free(e);
    free(points);
    free(active_t);
    free(active_n);
    free(key);
    Py_XDECREF(edges);
    Py_XDECREF(edges_fn);
    Py_XDECREF(by_targets);
    Py_XDECREF(target_fn);
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"closure", closure, METH_VARARGS, "LazyDFA.closure of a tuple of NFA states."},
    {"fill_row", fill_row, METH_VARARGS, "LazyDFA._compute_row into an int32[256] buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dfa_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit_dfa_rows(void) { return PyModule_Create(&module); }
