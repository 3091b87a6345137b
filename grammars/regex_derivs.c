/* Brzozowski derivatives of interned regex terms in C: `regex_terms.Terms.deriv`, `step` and
 * `nullable` over a `Terms` object's own list and dicts (its nodes, their ids, the nullable and
 * derivative memos), making the same terms with the same ids in the same order as the Python
 * methods they stand for (`regex_terms.regex_derivs` loads this module; the Python code is its
 * twin). A term is a tuple: ("e",), ("n",), ("c", ranges), ("s", a, b), ("a", frozenset),
 * ("r", x, lo, hi) or ("d", table, state); ids 0 and 1 are the empty word and the empty
 * language. A Dfa table's rows and accepting flags are read through Python's item access (a
 * table may make a row when it is first read). Nesting deeper than Python's recursion limit
 * raises RecursionError, as the Python code would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define EMPTY 0L /* the empty word's id */
#define NEVER 1L /* the empty language's id */
#define ERR (-1L)

typedef struct {
    PyObject *nodes, *ids, *nullable, *derivs; /* borrowed from the parts tuple */
} Terms;

static PyObject *s_e, *s_s, *s_a, *s_r, *s_d; /* the kinds, as the tuples' first items */

static int parts_load(Terms *t, PyObject *parts) {
    if (!PyTuple_Check(parts) || PyTuple_GET_SIZE(parts) != 4 ||
        !PyList_Check(PyTuple_GET_ITEM(parts, 0)) || !PyDict_Check(PyTuple_GET_ITEM(parts, 1)) ||
        !PyDict_Check(PyTuple_GET_ITEM(parts, 2)) || !PyDict_Check(PyTuple_GET_ITEM(parts, 3))) {
        PyErr_SetString(PyExc_TypeError,
                        "regex_derivs: parts are (nodes, ids, nullable memo, derivative memo)");
        return -1;
    }
    t->nodes = PyTuple_GET_ITEM(parts, 0);
    t->ids = PyTuple_GET_ITEM(parts, 1);
    t->nullable = PyTuple_GET_ITEM(parts, 2);
    t->derivs = PyTuple_GET_ITEM(parts, 3);
    return 0;
}

/* Term `id`'s tuple (borrowed), checked. */
static PyObject *node_of(Terms *t, long id) {
    if (id < 0 || id >= PyList_GET_SIZE(t->nodes)) {
        PyErr_Format(PyExc_IndexError, "regex_derivs: no term %ld", id);
        return NULL;
    }
    PyObject *node = PyList_GET_ITEM(t->nodes, id);
    if (!PyTuple_Check(node) || PyTuple_GET_SIZE(node) < 1) {
        PyErr_SetString(PyExc_TypeError, "regex_derivs: a term is not a tuple");
        return NULL;
    }
    return node;
}

/* Whether a node is of `kind` (the kinds are one-character strings, compared by value). */
static int is_kind(PyObject *node, PyObject *kind) {
    PyObject *k = PyTuple_GET_ITEM(node, 0);
    return k == kind || (PyUnicode_Check(k) && PyUnicode_Compare(k, kind) == 0);
}

static long as_id(PyObject *obj) { return obj == NULL ? ERR : PyLong_AsLong(obj); }

/* ERR, with the error of a term tuple shorter than its kind needs. */
static long lacks_field(void) {
    PyErr_SetString(PyExc_TypeError, "regex_derivs: a term lacks a field");
    return ERR;
}

/* Item `i` of a term tuple (borrowed), NULL with `lacks_field`'s error past its end. */
static PyObject *item_of(PyObject *node, Py_ssize_t i) {
    return PyTuple_GET_SIZE(node) <= i ? (lacks_field(), NULL) : PyTuple_GET_ITEM(node, i);
}

static long field(PyObject *node, Py_ssize_t i) {
    return PyTuple_GET_SIZE(node) <= i ? lacks_field() : as_id(PyTuple_GET_ITEM(node, i));
}

/* The id of `node` (a new tuple, stolen), interned when new: `Terms._intern`. */
static long intern(Terms *t, PyObject *node) {
    if (node == NULL)
        return ERR;
    PyObject *got = PyDict_GetItemWithError(t->ids, node);
    long out = ERR;
    if (got != NULL) {
        out = PyLong_AsLong(got);
    } else if (!PyErr_Occurred()) {
        Py_ssize_t n = PyList_GET_SIZE(t->nodes);
        PyObject *id = PyLong_FromSsize_t(n);
        if (id != NULL && PyDict_SetItem(t->ids, node, id) == 0 && PyList_Append(t->nodes, node) == 0)
            out = (long)n;
        Py_XDECREF(id);
    }
    Py_DECREF(node);
    return out;
}

static PyObject *id_obj(long id) { return PyLong_FromLong(id); }

/* `Terms.seq`. */
static long seq(Terms *t, long a, long b) {
    if (a == NEVER || b == NEVER)
        return NEVER;
    if (a == EMPTY)
        return b;
    if (b == EMPTY)
        return a;
    PyObject *node = node_of(t, a);
    if (node == NULL)
        return ERR;
    if (is_kind(node, s_s)) {
        long first = field(node, 1), second = field(node, 2);
        if (first == ERR || second == ERR)
            return ERR;
        if (Py_EnterRecursiveCall(" in a regex term"))
            return ERR;
        long rest = seq(t, second, b);
        long out = rest == ERR ? ERR : seq(t, first, rest);
        Py_LeaveRecursiveCall();
        return out;
    }
    PyObject *pa = id_obj(a), *pb = id_obj(b);
    PyObject *made = pa && pb ? PyTuple_Pack(3, s_s, pa, pb) : NULL;
    Py_XDECREF(pa);
    Py_XDECREF(pb);
    return intern(t, made);
}

/* `Terms.alt` of the `n` terms in `items`. */
static long alt(Terms *t, const long *items, Py_ssize_t n) {
    PyObject *flat = PySet_New(NULL);
    long out = ERR;
    if (flat == NULL)
        return ERR;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *node = node_of(t, items[i]);
        if (node == NULL)
            goto done;
        if (is_kind(node, s_a)) {
            PyObject *set = item_of(node, 1);
            PyObject *merged = set == NULL ? NULL : PyNumber_InPlaceOr(flat, set);
            if (merged == NULL)
                goto done;
            Py_DECREF(merged); /* flat itself */
        } else if (items[i] != NEVER) {
            PyObject *id = id_obj(items[i]);
            int bad = id == NULL || PySet_Add(flat, id) < 0;
            Py_XDECREF(id);
            if (bad)
                goto done;
        }
    }
    Py_ssize_t size = PySet_GET_SIZE(flat);
    if (size == 0) {
        out = NEVER;
    } else if (size == 1) {
        PyObject *it = PyObject_GetIter(flat);
        PyObject *only = it == NULL ? NULL : PyIter_Next(it);
        Py_XDECREF(it);
        out = as_id(only);
        Py_XDECREF(only);
    } else {
        PyObject *frozen = PyFrozenSet_New(flat);
        PyObject *made = frozen == NULL ? NULL : PyTuple_Pack(2, s_a, frozen);
        Py_XDECREF(frozen);
        out = intern(t, made);
    }
done:
    Py_DECREF(flat);
    return out;
}

/* `Terms.rep`: x repeated lo to hi times (hi NULL: unbounded). */
static long rep(Terms *t, long x, long lo, const long *hi) {
    if ((hi != NULL && *hi == 0) || x == EMPTY)
        return EMPTY;
    if (x == NEVER)
        return lo == 0 ? EMPTY : NEVER;
    if (lo == 1 && hi != NULL && *hi == 1)
        return x;
    PyObject *px = id_obj(x), *plo = PyLong_FromLong(lo);
    PyObject *phi = hi == NULL ? Py_NewRef(Py_None) : PyLong_FromLong(*hi);
    PyObject *made = px && plo && phi ? PyTuple_Pack(4, s_r, px, plo, phi) : NULL;
    Py_XDECREF(px);
    Py_XDECREF(plo);
    Py_XDECREF(phi);
    return intern(t, made);
}

/* Whether code point `cp` is in `ranges` (sorted (lo, hi) pairs): `regex_terms._contains`. */
static int contains(PyObject *ranges, long cp) {
    PyObject *fast = PySequence_Fast(ranges, "regex_derivs: ranges are not a sequence");
    if (fast == NULL)
        return -1;
    Py_ssize_t lo = 0, hi = PySequence_Fast_GET_SIZE(fast);
    int out = 0;
    while (lo < hi) { /* the first range whose start is past cp */
        Py_ssize_t mid = (lo + hi) / 2;
        PyObject *r = PySequence_Fast_GET_ITEM(fast, mid);
        long start = PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 ? PyLong_AsLong(PyTuple_GET_ITEM(r, 0)) : -2;
        if (start == -2 || (start == -1 && PyErr_Occurred())) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "regex_derivs: a range is not (lo, hi)");
            out = -1;
            goto done;
        }
        if (start <= cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0) {
        PyObject *r = PySequence_Fast_GET_ITEM(fast, lo - 1);
        long end = PyLong_AsLong(PyTuple_GET_ITEM(r, 1));
        if (end == -1 && PyErr_Occurred())
            out = -1;
        else
            out = end >= cp;
    }
done:
    Py_DECREF(fast);
    return out;
}

/* `Terms.nullable`: 1, 0, or -1 with an exception. */
static int nullable(Terms *t, long id) {
    PyObject *key = id_obj(id);
    if (key == NULL)
        return -1;
    PyObject *got = PyDict_GetItemWithError(t->nullable, key);
    if (got != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        return got == NULL ? -1 : PyObject_IsTrue(got);
    }
    int out = -1;
    PyObject *node = node_of(t, id);
    if (node == NULL || Py_EnterRecursiveCall(" in a regex term"))
        goto done;
    PyObject *k = PyTuple_GET_ITEM(node, 0);
    if (is_kind(node, s_e)) {
        out = 1;
    } else if (is_kind(node, s_s)) {
        long a = field(node, 1), b = field(node, 2);
        out = a == ERR || b == ERR ? -1 : nullable(t, a);
        if (out == 1)
            out = nullable(t, b);
    } else if (is_kind(node, s_a)) {
        PyObject *items = item_of(node, 1);
        PyObject *it = items == NULL ? NULL : PyObject_GetIter(items);
        out = it == NULL ? -1 : 0;
        PyObject *item;
        while (out == 0 && it != NULL && (item = PyIter_Next(it)) != NULL) {
            long i = as_id(item);
            Py_DECREF(item);
            out = i == ERR ? -1 : nullable(t, i);
        }
        if (out == 0 && PyErr_Occurred())
            out = -1;
        Py_XDECREF(it);
    } else if (is_kind(node, s_d)) {
        PyObject *start = item_of(node, 2);
        PyObject *acc = start == NULL ? NULL : PyObject_GetAttrString(PyTuple_GET_ITEM(node, 1), "accepting");
        PyObject *flag = acc == NULL ? NULL : PyObject_GetItem(acc, start);
        out = flag == NULL ? -1 : PyObject_IsTrue(flag);
        Py_XDECREF(acc);
        Py_XDECREF(flag);
    } else if (is_kind(node, s_r)) {
        long lo = PyTuple_GET_SIZE(node) < 4 ? lacks_field() : field(node, 2);
        long x = lo == ERR ? ERR : field(node, 1);
        out = x == ERR ? -1 : lo == 0 ? 1 : nullable(t, x);
    } else if (PyUnicode_Check(k)) {
        out = 0; /* "n" and "c" */
    } else {
        PyErr_SetString(PyExc_TypeError, "regex_derivs: a term's kind is not a string");
    }
    Py_LeaveRecursiveCall();
    if (out >= 0 && PyDict_SetItem(t->nullable, key, out ? Py_True : Py_False) < 0)
        out = -1;
done:
    Py_DECREF(key);
    return out;
}

static long deriv(Terms *t, long id, long cp);

/* The derivative of a term whose kind is not memoised in its own right. */
static long deriv_node(Terms *t, PyObject *node, long cp) {
    if (is_kind(node, s_s)) {
        long a = field(node, 1), b = field(node, 2);
        if (a == ERR || b == ERR)
            return ERR;
        long da = deriv(t, a, cp);
        long got = da == ERR ? ERR : seq(t, da, b);
        if (got == ERR)
            return ERR;
        int skip = nullable(t, a);
        if (skip <= 0)
            return skip < 0 ? ERR : got;
        long db = deriv(t, b, cp);
        if (db == ERR)
            return ERR;
        long both[2] = {got, db};
        return alt(t, both, 2);
    }
    if (is_kind(node, s_a)) {
        PyObject *set = item_of(node, 1);
        PyObject *items = set == NULL ? NULL : PySequence_List(set);
        if (items == NULL)
            return ERR;
        Py_ssize_t n = PyList_GET_SIZE(items);
        long *ds = PyMem_Malloc((n + 1) * sizeof(long)), out = ERR;
        if (ds == NULL) {
            Py_DECREF(items);
            PyErr_NoMemory();
            return ERR;
        }
        Py_ssize_t i = 0;
        for (; i < n; i++) {
            long item = as_id(PyList_GET_ITEM(items, i));
            if (item == ERR || (ds[i] = deriv(t, item, cp)) == ERR)
                break;
        }
        if (i == n)
            out = alt(t, ds, n);
        PyMem_Free(ds);
        Py_DECREF(items);
        return out;
    }
    if (is_kind(node, s_d)) {
        if (PyTuple_GET_SIZE(node) < 3)
            return lacks_field();
        PyObject *table = PyTuple_GET_ITEM(node, 1);
        PyObject *moves = PyObject_GetAttrString(table, "moves");
        PyObject *row = moves == NULL ? NULL : PyObject_GetItem(moves, PyTuple_GET_ITEM(node, 2));
        Py_XDECREF(moves);
        PyObject *it = row == NULL ? NULL : PyObject_GetIter(row);
        Py_XDECREF(row);
        if (it == NULL)
            return ERR;
        long out = NEVER;
        PyObject *move;
        while ((move = PyIter_Next(it)) != NULL) {
            int hit = -1;
            if (PyTuple_Check(move) && PyTuple_GET_SIZE(move) == 2)
                hit = contains(PyTuple_GET_ITEM(move, 0), cp);
            else
                PyErr_SetString(PyExc_TypeError, "regex_derivs: a Dfa move is not (ranges, target)");
            if (hit == 1)
                out = intern(t, PyTuple_Pack(3, s_d, table, PyTuple_GET_ITEM(move, 1)));
            Py_DECREF(move);
            if (hit != 0)
                break;
        }
        Py_DECREF(it);
        return PyErr_Occurred() ? ERR : out;
    }
    if (is_kind(node, s_r)) {
        if (PyTuple_GET_SIZE(node) < 4)
            return lacks_field();
        long x = field(node, 1), lo = field(node, 2);
        PyObject *hi_obj = PyTuple_GET_ITEM(node, 3);
        long hi = hi_obj == Py_None ? 0 : as_id(hi_obj);
        if (x == ERR || lo == ERR || hi == ERR)
            return ERR;
        long less = hi - 1;
        long rest = rep(t, x, lo > 1 ? lo - 1 : 0, hi_obj == Py_None ? NULL : &less);
        long dx = rest == ERR ? ERR : deriv(t, x, cp);
        return dx == ERR ? ERR : seq(t, dx, rest);
    }
    if (is_kind(node, s_e) || PyTuple_GET_SIZE(node) < 2)
        return NEVER; /* "e" and "n" */
    /* "c" */
    int hit = contains(PyTuple_GET_ITEM(node, 1), cp);
    return hit < 0 ? ERR : hit ? EMPTY : NEVER;
}

/* `Terms.deriv`: the words w such that chr(cp) + w is a word of term `id`. */
static long deriv(Terms *t, long id, long cp) {
    PyObject *pid = id_obj(id), *pcp = PyLong_FromLong(cp);
    PyObject *key = pid && pcp ? PyTuple_Pack(2, pid, pcp) : NULL;
    Py_XDECREF(pid);
    Py_XDECREF(pcp);
    if (key == NULL)
        return ERR;
    long out = ERR;
    PyObject *got = PyDict_GetItemWithError(t->derivs, key);
    if (got != NULL) {
        out = PyLong_AsLong(got);
    } else if (!PyErr_Occurred()) {
        PyObject *node = node_of(t, id);
        if (node != NULL && !Py_EnterRecursiveCall(" in a regex term")) {
            out = deriv_node(t, node, cp);
            Py_LeaveRecursiveCall();
        }
        PyObject *value = out == ERR ? NULL : id_obj(out);
        if (value == NULL || PyDict_SetItem(t->derivs, key, value) < 0)
            out = ERR;
        Py_XDECREF(value);
    }
    Py_DECREF(key);
    return out;
}

/* What `explore` reads beside the terms: the first-sets memo, the classes memo, `Terms._sweep`
 * and the deadline's check (borrowed from the `more` tuple). */
typedef struct {
    PyObject *firsts, *classes, *sweep, *check;
} More;

static PyObject *empty_frozenset;

/* `set |= other`, as Python writes it (-1 with an exception). */
static int set_update(PyObject *set, PyObject *other) {
    PyObject *same = PyNumber_InPlaceOr(set, other);
    Py_XDECREF(same);
    return same == NULL ? -1 : 0;
}

/* `Terms.firsts` (a new reference): the code point sets a word of term `id` may start with. */
static PyObject *firsts(Terms *t, More *m, long id) {
    PyObject *key = id_obj(id);
    if (key == NULL)
        return NULL;
    PyObject *out = PyDict_GetItemWithError(m->firsts, key);
    if (out != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        return Py_XNewRef(out);
    }
    PyObject *node = node_of(t, id);
    if (node == NULL || Py_EnterRecursiveCall(" in a regex term")) {
        Py_DECREF(key);
        return NULL;
    }
    if (is_kind(node, s_s)) {
        long a = field(node, 1), b = field(node, 2);
        out = a == ERR || b == ERR ? NULL : firsts(t, m, a);
        int more = out == NULL ? -1 : nullable(t, a);
        if (more != 0) {
            PyObject *second = more < 0 ? NULL : firsts(t, m, b);
            PyObject *both = second == NULL ? NULL : PyNumber_Or(out, second);
            Py_XDECREF(second);
            Py_XSETREF(out, both);
        }
    } else if (is_kind(node, s_a) || is_kind(node, s_d)) {
        int dfa = is_kind(node, s_d);
        PyObject *items = NULL;
        if (PyTuple_GET_SIZE(node) < (dfa ? 3 : 2)) {
            lacks_field();
        } else if (dfa) {
            PyObject *moves = PyObject_GetAttrString(PyTuple_GET_ITEM(node, 1), "moves");
            items = moves == NULL ? NULL : PyObject_GetItem(moves, PyTuple_GET_ITEM(node, 2));
            Py_XDECREF(moves);
        } else {
            items = Py_NewRef(PyTuple_GET_ITEM(node, 1));
        }
        PyObject *set = items == NULL ? NULL : PySet_New(NULL);
        PyObject *it = set == NULL ? NULL : PyObject_GetIter(items);
        PyObject *item;
        int bad = it == NULL;
        while (!bad && (item = PyIter_Next(it)) != NULL) {
            PyObject *part = NULL;
            if (!dfa) {
                long i = as_id(item);
                part = i == ERR ? NULL : firsts(t, m, i);
                bad = part == NULL || set_update(set, part) < 0;
            } else if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2) {
                bad = PySet_Add(set, PyTuple_GET_ITEM(item, 0)) < 0;
            } else {
                PyErr_SetString(PyExc_TypeError, "regex_derivs: a Dfa move is not (ranges, target)");
                bad = 1;
            }
            Py_XDECREF(part);
            Py_DECREF(item);
        }
        if (!bad && !PyErr_Occurred())
            out = PyFrozenSet_New(set);
        Py_XDECREF(it);
        Py_XDECREF(set);
        Py_XDECREF(items);
    } else if (is_kind(node, s_r)) {
        long x = field(node, 1);
        out = x == ERR ? NULL : firsts(t, m, x);
    } else if (is_kind(node, s_e) || PyTuple_GET_SIZE(node) < 2) {
        out = Py_NewRef(empty_frozenset); /* "e" and "n" */
    } else {
        PyObject *one = PyTuple_Pack(1, PyTuple_GET_ITEM(node, 1)); /* "c" */
        out = one == NULL ? NULL : PyFrozenSet_New(one);
        Py_XDECREF(one);
    }
    Py_LeaveRecursiveCall();
    if (out != NULL && PyDict_SetItem(m->firsts, key, out) < 0)
        Py_CLEAR(out);
    Py_DECREF(key);
    return out;
}

/* `Terms.classes` of the terms of `state` other than the empty language (a new reference). */
static PyObject *classes(Terms *t, More *m, PyObject *state, PyObject *with_rest) {
    PyObject *set = PySet_New(NULL);
    if (set == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(state); i++) {
        long id = as_id(PyTuple_GET_ITEM(state, i));
        if (id == NEVER)
            continue;
        PyObject *part = id == ERR ? NULL : firsts(t, m, id);
        int bad = part == NULL || set_update(set, part) < 0;
        Py_XDECREF(part);
        if (bad) {
            Py_DECREF(set);
            return NULL;
        }
    }
    PyObject *frozen = PyFrozenSet_New(set);
    Py_DECREF(set);
    PyObject *key = frozen == NULL ? NULL : PyTuple_Pack(2, frozen, with_rest);
    PyObject *out = key == NULL ? NULL : PyDict_GetItemWithError(m->classes, key);
    if (out != NULL) {
        Py_INCREF(out);
    } else if (key != NULL && !PyErr_Occurred()) {
        out = PyObject_CallFunctionObjArgs(m->sweep, frozen, with_rest, NULL);
        if (out != NULL && PyDict_SetItem(m->classes, key, out) < 0)
            Py_CLEAR(out);
    }
    Py_XDECREF(key);
    Py_XDECREF(frozen);
    return out;
}

/* A target's code points, from the class blocks that lead to it: the one block as it is (a
 * class is sorted and merged already), else the blocks joined and `normalize`d. */
static PyObject *target_ranges(PyObject *blocks, PyObject *normalize) {
    if (PyList_GET_SIZE(blocks) == 1)
        return Py_NewRef(PyList_GET_ITEM(blocks, 0));
    PyObject *joined = PyTuple_New(0);
    for (Py_ssize_t i = 0; joined != NULL && i < PyList_GET_SIZE(blocks); i++)
        Py_XSETREF(joined, PySequence_Concat(joined, PyList_GET_ITEM(blocks, i)));
    PyObject *out = joined == NULL ? NULL : PyObject_CallOneArg(normalize, joined);
    Py_XDECREF(joined);
    return out;
}

/* One product automaton being explored: its arguments, read once, and its states so far. */
typedef struct {
    PyObject *dead, *rest, *normalize, *what; /* borrowed: `explore`'s arguments */
    long max_states;
    int any_rest;                           /* `rest` is true: words in no language are accepted */
    PyObject *index, *states, *refused;     /* state -> number, states by number, dead ones */
} Product;

/* One state's row: each class's successor numbered (new ones appended to `states`), refused
 * ones skipped; (ranges, number) per successor in first-met order. */
static PyObject *explore_row(Terms *t, More *m, Product *p, PyObject *state) {
    PyObject *dead = p->dead, *index = p->index, *states = p->states, *refused = p->refused;
    PyObject *blocks = classes(t, m, state, p->rest), *by_target = PyDict_New(), *row = NULL;
    PyObject *fast = blocks == NULL ? NULL : PySequence_Fast(blocks, "classes are not a sequence");
    if (fast == NULL || by_target == NULL)
        goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(state);
    for (Py_ssize_t b = 0; b < PySequence_Fast_GET_SIZE(fast); b++) {
        PyObject *block = PySequence_Fast_GET_ITEM(fast, b);
        PyObject *first = PySequence_GetItem(block, 0);
        PyObject *low = first == NULL ? NULL : PySequence_GetItem(first, 0);
        Py_XDECREF(first);
        long cp = low == NULL ? ERR : PyLong_AsLong(low);
        Py_XDECREF(low);
        if (cp == ERR && PyErr_Occurred())
            goto done;
        PyObject *nxt = PyTuple_New(n);
        int all_never = 1;
        for (Py_ssize_t i = 0; nxt != NULL && i < n; i++) {
            long id = as_id(PyTuple_GET_ITEM(state, i));
            long d = id == ERR ? ERR : deriv(t, id, cp);
            PyObject *obj = d == ERR ? NULL : id_obj(d);
            all_never &= d == NEVER;
            if (obj == NULL)
                Py_CLEAR(nxt);
            else
                PyTuple_SET_ITEM(nxt, i, obj);
        }
        if (nxt == NULL)
            goto done;
        PyObject *j = PyDict_GetItemWithError(index, nxt);
        if (j != NULL) {
            Py_INCREF(j);
        } else if (!PyErr_Occurred()) {
            int skip = PySet_Contains(refused, nxt);
            if (skip == 0 && !p->any_rest && all_never)
                skip = 1 + (PySet_Add(refused, nxt) < 0);
            if (skip == 0 && dead != Py_None) {
                PyObject *verdict = PyObject_CallOneArg(dead, nxt);
                skip = verdict == NULL ? -1 : PyObject_IsTrue(verdict);
                Py_XDECREF(verdict);
                if (skip == 1 && PySet_Add(refused, nxt) < 0)
                    skip = -1;
            }
            if (skip == 0) {
                Py_ssize_t number = PyList_GET_SIZE(states);
                if (number >= p->max_states) {
                    PyErr_Format(PyExc_ValueError,
                                 "%U needs more than %ld states (the default of grammar_max_states)",
                                 p->what, p->max_states);
                } else if ((j = PyLong_FromSsize_t(number)) != NULL &&
                           (PyDict_SetItem(index, nxt, j) < 0 || PyList_Append(states, nxt) < 0)) {
                    Py_CLEAR(j);
                }
            }
            if (skip != 0) {
                Py_DECREF(nxt);
                if (skip < 0 || skip > 1)
                    goto done;
                continue;
            }
        }
        Py_DECREF(nxt);
        if (j == NULL)
            goto done;
        PyObject *list = PyDict_GetItemWithError(by_target, j);
        int bad = 0;
        if (list == NULL) {
            list = PyErr_Occurred() ? NULL : PyList_New(0);
            bad = list == NULL || PyDict_SetItem(by_target, j, list) < 0;
            Py_XDECREF(list); /* by_target holds it */
        }
        bad = bad || PyList_Append(list, block) < 0;
        Py_DECREF(j);
        if (bad)
            goto done;
    }
    row = PyList_New(0);
    PyObject *j, *list;
    Py_ssize_t pos = 0;
    while (row != NULL && PyDict_Next(by_target, &pos, &j, &list)) {
        PyObject *ranges = target_ranges(list, p->normalize);
        PyObject *move = ranges == NULL ? NULL : PyTuple_Pack(2, ranges, j);
        Py_XDECREF(ranges);
        if (move == NULL || PyList_Append(row, move) < 0)
            Py_CLEAR(row);
        Py_XDECREF(move);
    }
done:
    Py_XDECREF(fast);
    Py_XDECREF(blocks);
    Py_XDECREF(by_target);
    return row;
}

/* explore(parts, more, start, accept, dead, rest, normalize, max_states, what):
 * `regex_algebra.explore`'s product DFA before trimming, as (moves, accepting). */
static PyObject *py_explore(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Terms t;
    More m;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "explore takes 9 arguments");
        return NULL;
    }
    PyObject *more = args[1], *start = args[2], *accept = args[3];
    if (parts_load(&t, args[0]) < 0)
        return NULL;
    if (!PyTuple_Check(more) || PyTuple_GET_SIZE(more) != 4 || !PyDict_Check(PyTuple_GET_ITEM(more, 0)) ||
        !PyDict_Check(PyTuple_GET_ITEM(more, 1)) || !PyTuple_Check(start)) {
        PyErr_SetString(PyExc_TypeError,
                        "explore: more is (firsts memo, classes memo, sweep, check); start a tuple");
        return NULL;
    }
    m.firsts = PyTuple_GET_ITEM(more, 0);
    m.classes = PyTuple_GET_ITEM(more, 1);
    m.sweep = PyTuple_GET_ITEM(more, 2);
    m.check = PyTuple_GET_ITEM(more, 3);
    Product p = {args[4], args[5], args[6], args[8], PyLong_AsLong(args[7]), 0, NULL, NULL, NULL};
    /* one call at a time: none runs with an error another left */
    p.any_rest = p.max_states == -1 && PyErr_Occurred() ? -1 : PyObject_IsTrue(args[5]);
    if (p.any_rest >= 0) {
        p.index = PyDict_New();
        p.states = PyList_New(0);
        p.refused = PySet_New(NULL);
    }
    PyObject *index = p.index, *states = p.states, *refused = p.refused;
    PyObject *moves = NULL, *accepting = NULL, *zero = NULL, *out = NULL;
    if (p.any_rest < 0 || !index || !states || !refused || !(moves = PyList_New(0)) ||
        !(accepting = PyList_New(0)) || !(zero = PyLong_FromLong(0)) ||
        PyDict_SetItem(index, start, zero) < 0 || PyList_Append(states, start) < 0)
        goto done;
    while (PyList_GET_SIZE(moves) < PyList_GET_SIZE(states)) {
        PyObject *state = PyList_GET_ITEM(states, PyList_GET_SIZE(moves));
        PyObject *ok = PyObject_CallNoArgs(m.check);
        if (ok == NULL)
            goto done;
        Py_DECREF(ok);
        Py_ssize_t n = PyTuple_GET_SIZE(state);
        PyObject *flags = PyTuple_New(n);
        for (Py_ssize_t i = 0; flags != NULL && i < n; i++) {
            long id = as_id(PyTuple_GET_ITEM(state, i));
            int on = id == ERR ? -1 : nullable(&t, id);
            if (on < 0)
                Py_CLEAR(flags);
            else
                PyTuple_SET_ITEM(flags, i, PyBool_FromLong(on));
        }
        PyObject *verdict = flags == NULL ? NULL : PyObject_CallOneArg(accept, flags);
        Py_XDECREF(flags);
        int bad = verdict == NULL || PyList_Append(accepting, verdict) < 0;
        Py_XDECREF(verdict);
        if (bad)
            goto done;
        Py_INCREF(state); /* states may grow (and move) while its row is made */
        PyObject *row = explore_row(&t, &m, &p, state);
        Py_DECREF(state);
        if (row == NULL || PyList_Append(moves, row) < 0) {
            Py_XDECREF(row);
            goto done;
        }
        Py_DECREF(row);
    }
    out = PyTuple_Pack(2, moves, accepting);
done:
    Py_XDECREF(index);
    Py_XDECREF(states);
    Py_XDECREF(refused);
    Py_XDECREF(moves);
    Py_XDECREF(accepting);
    Py_XDECREF(zero);
    return out;
}

static int args_load(Terms *t, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                     const char *name) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", name, want);
        return -1;
    }
    return parts_load(t, args[0]);
}

static PyObject *py_deriv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Terms t;
    if (args_load(&t, args, nargs, 3, "deriv") < 0)
        return NULL;
    long id = as_id(args[1]), cp = id == ERR ? ERR : PyLong_AsLong(args[2]);
    if (cp == ERR && PyErr_Occurred())
        return NULL;
    long out = deriv(&t, id, cp);
    return out == ERR ? NULL : id_obj(out);
}

static PyObject *py_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Terms t;
    if (args_load(&t, args, nargs, 3, "step") < 0)
        return NULL;
    if (!PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "step: the terms are a tuple");
        return NULL;
    }
    long cp = PyLong_AsLong(args[2]);
    if (cp == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        long id = as_id(PyTuple_GET_ITEM(args[1], i));
        long d = id == ERR ? ERR : deriv(&t, id, cp);
        PyObject *obj = d == ERR ? NULL : id_obj(d);
        if (obj == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, i, obj);
    }
    return out;
}

static PyObject *py_nullable(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Terms t;
    if (args_load(&t, args, nargs, 2, "nullable") < 0)
        return NULL;
    long id = as_id(args[1]);
    int out = id == ERR ? -1 : nullable(&t, id);
    return out < 0 ? NULL : PyBool_FromLong(out);
}

/* trie(words): `regex_algebra._trie` of `words` (a list of str, sorted): per node (0 the
 * root) its (code point, child) pairs in code point order, as a tuple of tuples, and whether a
 * word ends there, as a tuple of bools. Each word starts from the nodes of the word before
 * (`path`); nodes are numbered as made, so each node's children come in the order made, which
 * is code point order for sorted words. */
static PyObject *py_trie(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "trie(words): words is a sorted list of str");
        return NULL;
    }
    PyObject *words = args[0], *before = NULL, *moves = NULL, *ends = NULL, *out = NULL;
    Py_ssize_t total = 1; /* nodes: the root and one per code point at most */
    for (Py_ssize_t w = 0; w < PyList_GET_SIZE(words); w++) {
        PyObject *word = PyList_GET_ITEM(words, w);
        if (!PyUnicode_Check(word)) {
            PyErr_SetString(PyExc_TypeError, "trie(words): a word is not a str");
            return NULL;
        }
        total += PyUnicode_GET_LENGTH(word);
    }
    /* per node: its parent, the code point into it, whether a word ends there, its children's
     * count and where the next one goes; per depth, the node along the current word */
    Py_ssize_t *parent = PyMem_Malloc(total * sizeof(Py_ssize_t));
    Py_ssize_t *count = PyMem_Calloc(total, sizeof(Py_ssize_t));
    Py_ssize_t *path = PyMem_Malloc(total * sizeof(Py_ssize_t));
    Py_UCS4 *cp = PyMem_Malloc(total * sizeof(Py_UCS4));
    char *end = PyMem_Calloc(total, 1);
    Py_ssize_t made = 1;
    if (parent == NULL || count == NULL || path == NULL || cp == NULL || end == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    path[0] = 0;
    for (Py_ssize_t w = 0; w < PyList_GET_SIZE(words); w++) {
        PyObject *word = PyList_GET_ITEM(words, w);
        Py_ssize_t n = PyUnicode_GET_LENGTH(word), common = 0;
        if (before != NULL)
            for (Py_ssize_t m = PyUnicode_GET_LENGTH(before);
                 common < n && common < m &&
                 PyUnicode_READ_CHAR(before, common) == PyUnicode_READ_CHAR(word, common);)
                common++;
        Py_ssize_t node = path[common];
        for (Py_ssize_t i = common; i < n; i++) {
            parent[made] = node;
            cp[made] = PyUnicode_READ_CHAR(word, i);
            count[node]++;
            node = path[i + 1] = made++;
        }
        end[node] = 1;
        before = word;
    }
    if ((moves = PyTuple_New(made)) == NULL || (ends = PyTuple_New(made)) == NULL) goto done;
    for (Py_ssize_t x = 0; x < made; x++) {
        PyObject *row = PyTuple_New(count[x]);
        if (row == NULL) goto done;
        PyTuple_SET_ITEM(moves, x, row);
        PyTuple_SET_ITEM(ends, x, PyBool_FromLong(end[x]));
        count[x] = 0; /* from here on: where the node's next child goes */
    }
    for (Py_ssize_t x = 1; x < made; x++) {
        PyObject *c = PyLong_FromLong((long)cp[x]), *k = c == NULL ? NULL : PyLong_FromSsize_t(x);
        PyObject *pair = k == NULL ? NULL : PyTuple_Pack(2, c, k);
        Py_XDECREF(c);
        Py_XDECREF(k);
        if (pair == NULL) goto done;
        PyTuple_SET_ITEM(PyTuple_GET_ITEM(moves, parent[x]), count[parent[x]]++, pair);
    }
    out = PyTuple_Pack(2, moves, ends);
done:
    PyMem_Free(parent);
    PyMem_Free(count);
    PyMem_Free(path);
    PyMem_Free(cp);
    PyMem_Free(end);
    Py_XDECREF(moves);
    Py_XDECREF(ends);
    return out;
}

static PyMethodDef methods[] = {
    {"deriv", (PyCFunction)(void (*)(void))py_deriv, METH_FASTCALL,
     "deriv(parts, term, cp): the term's derivative by code point cp."},
    {"step", (PyCFunction)(void (*)(void))py_step, METH_FASTCALL,
     "step(parts, terms, cp): each term's derivative by cp, as a tuple."},
    {"nullable", (PyCFunction)(void (*)(void))py_nullable, METH_FASTCALL,
     "nullable(parts, term): whether the term matches the empty word."},
    {"explore", (PyCFunction)(void (*)(void))py_explore, METH_FASTCALL,
     "explore(parts, more, start, accept, dead, rest, normalize, max_states, what): the "
     "product DFA's (moves, accepting) before trimming."},
    {"trie", (PyCFunction)(void (*)(void))py_trie, METH_FASTCALL,
     "trie(words): the trie of sorted words, (per node its (code point, child)s, ends)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "regex_derivs", NULL, -1, methods};

PyMODINIT_FUNC PyInit_regex_derivs(void) {
    if ((s_e = PyUnicode_InternFromString("e")) == NULL ||
        (s_s = PyUnicode_InternFromString("s")) == NULL ||
        (s_a = PyUnicode_InternFromString("a")) == NULL ||
        (s_r = PyUnicode_InternFromString("r")) == NULL ||
        (s_d = PyUnicode_InternFromString("d")) == NULL ||
        (empty_frozenset = PyFrozenSet_New(NULL)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
