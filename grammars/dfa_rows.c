/* The lazy DFA's rows in C: `nfa.LazyDFA`'s closures, rows, target sets and interned states,
 * and the NFA's lazily made states (`nfa.NFA`'s moves, edges, literal runs, character, tail and
 * lifted states), over the NFA's and the DFA's own Python lists and dicts (`_parts`), with the
 * same results in the same order as the Python code they stand for (`native_rows` loads this
 * module; the Python code is its twin); and a grammar automaton's parser rows
 * (`cfg.GrammarAutomaton._compute_row`, `cfg_row`), over its parser states' lists and dicts, the
 * Earley parser's steps called back (`_successors`).
 *
 * What needs the IR's deeper facts stays in Python and is called back: a node's facts when it
 * carries none (`nfa.facts.dead`, `nfa.facts.counted`), a Dfa's spelled character class
 * (`nfa._body_ir`), a narrow length window (`DfaTable.live`), a node of no kind C knows
 * (`nfa.add`). So does every error: a state limit, a budget or the pointer array's growth is
 * left to the Python method that owns it, called when C finds it would be reached. The bytes a
 * call builds are counted and charged at its end and at each clock check (every CHECK_EVERY
 * closure steps), not per state. Any Python exception is passed on. The trie walk's row
 * callback (`walk_fill`, see `native_walk`) is here too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK_EVERY 256 /* closure steps between clock checks, as nfa._CHECK_EVERY */
#define ERR (-2)        /* a state-returning function's error (-1 is "matches nothing") */

/* Set once by `configure`: the IR classes, `nfa._sequences` and `nfa._spelled`, the byte costs
 * and the limit. */
static PyObject *chars_type, *seq_type, *alt_type, *repeat_type, *dfa_type, *ref_type,
    *sequences_fn, *spelled_fn;
static long max_nfa_states, state_bytes, edge_bytes, entry_bytes, row_bytes;
static long tuple_base, tuple_item; /* sys.getsizeof of a tuple: base + item * length */
static PyObject *empty, *zero; /* b"" (no moves or edges) and 0 */
static PyObject *perf_counter; /* time.perf_counter, the budget's clock */
static PyObject *s_items, *s_item, *s_ranges, *s_facts, *s_tail, *s_parts, *s_charge, *s_nbytes,
    *s_new_state, *s_add, *s_check, *s_dead, *s_intern, *s_counted, *s_spell, *s_live, *s_hi,
    *s_lo, *s_table, *s_start, *s_accepting, *s_moves, *s_shortest, *s_longest, *s_row,
    *s_row_pointers, *s_limits, *s_max_states, *s_max_state_size, *s_pointers, *s_states, *s_nfa,
    *s_block, *s_next, *s_new_block, *s_check_time, *s_end, *s_cap, *s_groups, *s_lexer,
    *s_successors, *s_tags_kept, *s_reads_any_text, *s_any_text;

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

/* Sorts `n` items of `size` bytes by `cmp`: by insertion for the few items most calls have
 * (qsort's comparator call per comparison cost more than the sorting; inlined here, the
 * comparator is too), qsort past `SMALL_SORT`. */
#define SMALL_SORT 32

static inline void sort_items(void *v, Py_ssize_t n, size_t size,
                              int (*cmp)(const void *, const void *)) {
    if (n > SMALL_SORT) {
        qsort(v, n, size, cmp);
        return;
    }
    char *a = v, x[sizeof(Edge)]; /* the largest item sorted */
    for (Py_ssize_t i = 1; i < n; i++) {
        memcpy(x, a + i * size, size);
        Py_ssize_t j = i;
        for (; j > 0 && cmp(a + (j - 1) * size, x) > 0; j--) memcpy(a + j * size, a + (j - 1) * size, size);
        memcpy(a + j * size, x, size);
    }
}

/* The int object of state `s`, a new reference: one per state number, kept in `ints` (the
 * NFA's or the DFA's `_ints`), so that the tuples and keys naming a state share one object
 * instead of each holding an int of its own (fewer objects to make, and to free with the
 * grammar). A negative `s` (-1: no state) is a new int. */
static PyObject *state_int(PyObject *ints, long s) {
    Py_ssize_t n = PyList_GET_SIZE(ints);
    if (s < 0 || s > n + 4096) return PyLong_FromLong(s); /* states are numbered in order */
    for (; n <= s; n++) {
        PyObject *x = PyLong_FromSsize_t(n);
        int r = x == NULL ? -1 : PyList_Append(ints, x);
        Py_XDECREF(x);
        if (r < 0) return NULL;
    }
    return Py_NewRef(PyList_GET_ITEM(ints, s));
}

/* A tuple of ints from longs: states' shared ints from `ints`, or new ints (`ints` NULL). */
static PyObject *tuple_of(PyObject *ints, const long *v, Py_ssize_t n) {
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = ints == NULL ? PyLong_FromLong(v[i]) : state_int(ints, v[i]);
        if (x == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, x);
    }
    return out;
}

/* A state's moves or edges as the NFA keeps them: a bytes object of C ints (what the Python
 * code reads as `array('i')`), a move per target, three per edge (lo, hi, target); one object
 * with no references per list, quick to make, read and free. A new reference. */
static PyObject *packed(const long *v, Py_ssize_t n) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int));
    if (b == NULL) return NULL;
    int *w = (int *)PyBytes_AS_STRING(b);
    for (Py_ssize_t i = 0; i < n; i++) w[i] = (int)v[i];
    return b;
}

/* The ints of a packed list (borrowed from `b`, a bytes object) and their number. */
static const int *ints_in(PyObject *b) { return (const int *)PyBytes_AS_STRING(b); }

static Py_ssize_t count_in(PyObject *b) { return PyBytes_GET_SIZE(b) / (Py_ssize_t)sizeof(int); }

/* (a, b, state n): a new tuple */
static PyObject *triple(PyObject *ints, PyObject *a, PyObject *b, long n) {
    PyObject *x = state_int(ints, n), *t = x == NULL ? NULL : PyTuple_New(3);
    if (t == NULL) {
        Py_XDECREF(x);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, Py_NewRef(a));
    PyTuple_SET_ITEM(t, 1, Py_NewRef(b));
    PyTuple_SET_ITEM(t, 2, x);
    return t;
}

/* obj.name(*args) for a method of the NFA or the budget (`args[0]` is obj) */
static PyObject *call(PyObject *name, PyObject *const *args, size_t n) {
    return PyObject_VectorcallMethod(name, args, n, NULL);
}

/* obj.name(n) */
static PyObject *call_long(PyObject *obj, PyObject *name, long n) {
    PyObject *x = PyLong_FromLong(n);
    if (x == NULL) return NULL;
    PyObject *args[] = {obj, x}, *r = call(name, args, 2);
    Py_DECREF(x);
    return r;
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

/* dict[state] -> borrowed value or NULL (no error set when absent) */
static PyObject *get_int_key(PyObject *ints, PyObject *dict, long key) {
    PyObject *k = state_int(ints, key);
    if (k == NULL) return NULL;
    PyObject *got = PyDict_GetItemWithError(dict, k);
    Py_DECREF(k);
    return got;
}

/* dict[key] as a state: the state, -1 when absent (-1 may also be a stored value: `found`
 * tells), ERR on error */
static long get_state(PyObject *dict, PyObject *key, int *found) {
    PyObject *got = PyDict_GetItemWithError(dict, key);
    *found = got != NULL;
    if (got == NULL) return PyErr_Occurred() ? ERR : -1;
    long s = PyLong_AsLong(got);
    return s == -1 && PyErr_Occurred() ? ERR : s;
}

/* Whether `x` is a regex IR node (of the classes `configure` was given). */
static int is_ir(PyObject *x) {
    PyObject *t = (PyObject *)Py_TYPE(x);
    return chars_type != NULL && (t == chars_type || t == seq_type || t == alt_type ||
                                  t == repeat_type || t == dfa_type || t == ref_type);
}

/* Takes tuple `t` out of the cyclic collector's sight when nothing in it can be in a reference
 * cycle: ints, None, strings, bytes, IR nodes already out of its sight (`untrack_graph`; an
 * instance is never tracked again) and tuples of such. Python does this for a tuple of atoms at
 * the first collection that sees it; done at once, a dict keyed by such tuples is not tracked
 * again by each key C adds to it (and walked by the collections after). */
static void untrack_atoms(PyObject *t) {
    if (!PyObject_GC_IsTracked(t)) return;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        PyObject *x = PyTuple_GET_ITEM(t, i);
        if (PyTuple_CheckExact(x)) {
            untrack_atoms(x);
            if (PyObject_GC_IsTracked(x)) return;
        } else if (PyObject_IS_GC(x) && (!is_ir(x) || PyObject_GC_IsTracked(x))) {
            return;
        }
    }
    PyObject_GC_UnTrack(t);
}

/* Takes the regex IR graph from `node` (its nodes, slotted, their item tuples and ranges)
 * out of the cyclic collector's sight, stopping at nodes already out of it (IR shared
 * with an earlier grammar is walked once): 0, or -1 on error. IR is immutable and built from
 * its leaves up, so no reference cycle can run through it (a `Ref` names a rule, it does not
 * hold it); a cached grammar keeps its IR for the lazy NFA, the sub-schema memo keeps it for
 * later compiles, and each full collection would otherwise walk all of it. */
static int untrack_graph(PyObject *node) {
    if (!is_ir(node) || !PyObject_GC_IsTracked(node)) return 0;
    Py_ssize_t n = 0, cap = 64;
    PyObject **stack = malloc(cap * sizeof(PyObject *)); /* borrowed: the graph holds them */
    if (stack == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    stack[n++] = node;
    int ok = 0;
    while (n) {
        PyObject *x = stack[--n];
        if (!is_ir(x) || !PyObject_GC_IsTracked(x)) continue;
        PyObject *t = (PyObject *)Py_TYPE(x);
        PyObject *name = t == seq_type || t == alt_type ? s_items
                         : t == repeat_type              ? s_item
                         : t == chars_type               ? s_ranges
                                                         : NULL;
        PyObject_GC_UnTrack(x);
        if (name == NULL) continue; /* a Ref; a Dfa: its table and spelling stay as they are */
        PyObject *kids = PyObject_GetAttr(x, name);
        if (kids == NULL) goto done;
        Py_DECREF(kids); /* the node holds it */
        if (t == chars_type) {
            if (PyTuple_CheckExact(kids)) untrack_atoms(kids);
            continue;
        }
        Py_ssize_t k = t == repeat_type ? 1 : PyTuple_CheckExact(kids) ? PyTuple_GET_SIZE(kids) : 0;
        if (n + k > cap) {
            cap = 2 * (n + k);
            PyObject **grown = realloc(stack, cap * sizeof(PyObject *));
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            stack = grown;
        }
        if (t == repeat_type) {
            stack[n++] = kids;
            continue;
        }
        int all_ir = 1; /* then every item is out of sight by the end of this walk */
        for (Py_ssize_t i = 0; i < k; i++) {
            all_ir &= is_ir(PyTuple_GET_ITEM(kids, i));
            stack[n++] = PyTuple_GET_ITEM(kids, i);
        }
        if (k && all_ir && PyObject_GC_IsTracked(kids)) PyObject_GC_UnTrack(kids);
    }
    ok = 1;
done:
    free(stack);
    return ok ? 0 : -1;
}

/* 1 where IR node `x` does not know its facts (None, or no `facts` at all: a Ref), else 0; -1 on
 * error. A node knows them only when every node below it does, and a Ref never does. */
static int facts_unknown(PyObject *x) {
    if ((PyObject *)Py_TYPE(x) == ref_type) return 1;
    PyObject *facts = PyObject_GetAttr(x, s_facts);
    if (facts == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 1;
    }
    int unknown = facts == Py_None;
    Py_DECREF(facts);
    return unknown;
}

/* The items of a Seq or Alt, the item of a Repeat as `*one`, or none (n = 0); borrowed (the
 * node holds them): 0, or -1 on error. */
static int ir_kids(PyObject *x, PyObject **one, PyObject *const **kids, Py_ssize_t *n) {
    PyObject *t = (PyObject *)Py_TYPE(x);
    *n = 0;
    if (t != seq_type && t != alt_type && t != repeat_type) return 0;
    PyObject *got = PyObject_GetAttr(x, t == repeat_type ? s_item : s_items);
    if (got == NULL) return -1;
    Py_DECREF(got);
    if (t == repeat_type) {
        *one = got;
        *kids = one;
        *n = 1;
    } else if (PyTuple_CheckExact(got)) {
        *kids = &PyTuple_GET_ITEM(got, 0);
        *n = PyTuple_GET_SIZE(got);
    }
    return 0;
}

/* holds_ref(node, memo): whether IR `node` holds a `Ref` (`cfg._has_ref`'s fold): `memo` maps
 * id(node) -> bool for the nodes visited, which are those without known facts (one with facts
 * holds no Ref), computed bottom-up with a stack of their own (deep schemas nest IR hundreds of
 * levels). */
static PyObject *holds_ref(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "holds_ref(node, memo: dict)");
        return NULL;
    }
    if (seq_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "holds_ref: the IR classes are not configured");
        return NULL;
    }
    PyObject *memo = args[1], *result = NULL;
    int unknown = facts_unknown(args[0]);
    if (unknown <= 0) return unknown < 0 ? NULL : Py_NewRef(Py_False);
    Py_ssize_t n = 0, cap = 64;
    PyObject **stack = malloc(cap * sizeof(PyObject *)); /* borrowed: the graph holds them */
    if (stack == NULL) return PyErr_NoMemory();
    stack[n++] = args[0];
    while (n) {
        PyObject *x = stack[n - 1], *key = PyLong_FromVoidPtr(x), *one = NULL, *const *kids;
        Py_ssize_t k;
        if (key == NULL) goto done;
        PyObject *got = PyDict_GetItemWithError(memo, key);
        if (got != NULL || PyErr_Occurred() || (PyObject *)Py_TYPE(x) == ref_type ||
            ir_kids(x, &one, &kids, &k) < 0) {
            int failed = got == NULL && PyErr_Occurred();
            if (!failed && got == NULL) failed = PyDict_SetItem(memo, key, Py_True) < 0; /* a Ref */
            Py_DECREF(key);
            if (failed) goto done;
            n--;
            continue;
        }
        if (n + k > cap) {
            cap = 2 * (n + k);
            PyObject **grown = realloc(stack, cap * sizeof(PyObject *));
            if (grown == NULL) {
                Py_DECREF(key);
                PyErr_NoMemory();
                goto done;
            }
            stack = grown;
        }
        int pushed = 0, holds = 0;
        for (Py_ssize_t i = 0; i < k; i++) {
            int u = facts_unknown(kids[i]);
            PyObject *kid_key = u > 0 ? PyLong_FromVoidPtr(kids[i]) : NULL;
            PyObject *kid = kid_key == NULL ? NULL : PyDict_GetItemWithError(memo, kid_key);
            Py_XDECREF(kid_key);
            if (u < 0 || (u > 0 && kid == NULL && PyErr_Occurred())) {
                Py_DECREF(key);
                goto done;
            }
            if (u > 0 && kid == NULL) {
                stack[n++] = kids[i];
                pushed = 1;
            } else if (kid == Py_True) {
                holds = 1;
            }
        }
        if (!pushed) {
            int failed = PyDict_SetItem(memo, key, holds ? Py_True : Py_False) < 0;
            n--;
            if (failed) {
                Py_DECREF(key);
                goto done;
            }
        }
        Py_DECREF(key);
    }
    PyObject *key = PyLong_FromVoidPtr(args[0]);
    if (key != NULL) {
        result = PyDict_GetItemWithError(memo, key);
        Py_XINCREF(result);
        Py_DECREF(key);
        if (result == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "holds_ref: the node was not reached");
    }
done:
    free(stack);
    return result;
}

/* untrack_ir(node): `untrack_graph` from Python (`LazyDFA.untrack_ir`). */
static PyObject *untrack_ir(PyObject *self, PyObject *node) {
    return untrack_graph(node) < 0 ? NULL : Py_NewRef(Py_None);
}

/* dict[key] = state; 0, or -1 on error */
static int set_state(PyObject *ints, PyObject *dict, PyObject *key, long state) {
    if (PyTuple_CheckExact(key)) untrack_atoms(key);
    PyObject *v = state_int(ints, state);
    int r = v == NULL ? -1 : PyDict_SetItem(dict, key, v);
    Py_XDECREF(v);
    return r;
}

/* Take `list` out of the cyclic collector's sight. For the lists that hold only ints, tuples of
 * ints, None and numpy rows (an NFA's moves and edges, a DFA's states and rows, the shared
 * ints), which can be in no reference cycle: a cached grammar's lists hold hundreds of
 * thousands of items, and each full collection would walk them all. */
static void untrack(PyObject *list) {
    if (PyObject_GC_IsTracked(list)) PyObject_GC_UnTrack(list);
}

/* Take `dict` out of the cyclic collector's sight when it holds only ints, None and tuples of
 * them (tuples untracked on the way): the NFA's and DFA's dicts of state numbers. C untracks
 * each key it adds (`set_state`), so a dict stays untracked unless Python code adds a key it
 * made (the states made while compiling); Python itself untracks such a dict only at a full
 * collection, after walking it, and every full collection meets the dicts of the grammars
 * built since the last one. A dict holding anything else stays tracked. With `every`, every
 * entry is looked at, each tuple untracked where it can be even past one that keeps the dict
 * tracked: for a dict swept once, not at every call. */
static void untrack_dict(PyObject *dict, int every) {
    if (!every && !PyObject_GC_IsTracked(dict)) return;
    int atoms = 1;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        PyObject *kv[] = {key, value};
        for (int i = 0; i < 2; i++) {
            if (PyTuple_CheckExact(kv[i])) untrack_atoms(kv[i]);
            if (PyObject_IS_GC(kv[i]) && (!PyTuple_CheckExact(kv[i]) || PyObject_GC_IsTracked(kv[i]))) {
                if (!every) return;
                atoms = 0;
            }
        }
    }
    if (atoms && PyObject_GC_IsTracked(dict)) PyObject_GC_UnTrack(dict);
}

/* What one call reads and writes: the NFA's containers (`NFA._parts`, borrowed from the
 * `parts` tuple it holds) and the bytes built but not yet charged. */
typedef struct {
    PyObject *nfa, *parts;
    PyObject *eps, *edges, *runs, *ids, *shared, *lifts, *lifted, *order, *tags;
    PyObject *ends, *bodies, *body_irs, *counted; /* `counted`: the NFA's facts' memo */
    PyObject *ints; /* the NFA states' shared ints (`state_int`) */
    PyObject *any_text; /* the states of Dfas that read any text (`NFA.any_text`, a set) */
    /* the last Dfa node `c_dfa_moves` read and what it read of it (new references): the
     * states of one explicit DFA follow one another, each asking for the same attributes */
    PyObject *dfa_node, *dfa_hi, *dfa_table, *dfa_accepting, *dfa_moves;
    long dfa_lo;
    long steps;       /* closure steps in this call, for the clock checks */
    long nfa_bytes;   /* NFA states, moves, edges: counted on the NFA and its budget */
    long table_bytes; /* target sets: `budget.charge` */
} Ctx;

/* Forgets the last Dfa node `c` read (`dfa_node_load`). */
static void ctx_forget_dfa(Ctx *c) {
    Py_CLEAR(c->dfa_node);
    Py_CLEAR(c->dfa_hi);
    Py_CLEAR(c->dfa_table);
    Py_CLEAR(c->dfa_accepting);
    Py_CLEAR(c->dfa_moves);
}

/* Lets go of what `c` holds: the NFA's parts and the last Dfa node read. */
static void ctx_release(Ctx *c) {
    Py_CLEAR(c->parts);
    ctx_forget_dfa(c);
}

static int ctx_load(Ctx *c, PyObject *nfa) {
    memset(c, 0, sizeof(*c));
    c->nfa = nfa;
    c->parts = PyObject_GetAttr(nfa, s_parts);
    if (c->parts == NULL) return -1;
    if (!PyTuple_Check(c->parts) || PyTuple_GET_SIZE(c->parts) != 15 ||
        !PySet_Check(PyTuple_GET_ITEM(c->parts, 14))) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: unexpected NFA layout");
        Py_CLEAR(c->parts);
        return -1;
    }
    PyObject **p[] = {&c->eps,    &c->edges,  &c->runs,  &c->ids,    &c->shared,
                      &c->lifts,  &c->lifted, &c->order, &c->tags,   &c->ends,
                      &c->bodies, &c->body_irs, &c->counted, &c->ints};
    c->any_text = PyTuple_GET_ITEM(c->parts, 14);
    for (int i = 0; i < 14; i++) {
        *p[i] = PyTuple_GET_ITEM(c->parts, i);
        if (i < 2 || i == 13 ? !PyList_Check(*p[i]) : !PyDict_Check(*p[i])) {
            PyErr_SetString(PyExc_TypeError, "dfa_rows: unexpected NFA layout");
            Py_CLEAR(c->parts);
            return -1;
        }
    }
    untrack(c->eps);
    untrack(c->edges);
    untrack(c->ints);
    PyObject *numbers[] = {c->runs, c->ids, c->shared, c->lifts, c->lifted, c->order,
                           c->tags, c->ends, c->bodies};
    for (size_t i = 0; i < sizeof(numbers) / sizeof(*numbers); i++) untrack_dict(numbers[i], 0);
    return 0;
}

/* untrack_made(nfa): takes what the Python code made while the grammar compiled out of the
 * collector's sight, once its IR is (`untrack_ir`): the keys of its waiting states (node, arg,
 * next), in their dicts and in the lists where they wait to be made, and its facts' entries for
 * counted nodes, and their dicts where nothing else in them can be in a reference cycle. C
 * untracks the keys it makes itself. */
static PyObject *untrack_made(PyObject *self, PyObject *nfa) {
    Ctx c;
    if (ctx_load(&c, nfa) < 0) return NULL;
    untrack_dict(c.ids, 1);
    untrack_dict(c.runs, 1);
    untrack_dict(c.counted, 1);
    ctx_release(&c);
    Py_RETURN_NONE;
}

/* untracked(key) -> key, taken out of the collector's sight when it is a tuple of atoms
 * (`untrack_atoms`), so that a dict keyed (or valued) by such tuples stays out of it too. */
static PyObject *untracked(PyObject *self, PyObject *key) {
    if (PyTuple_CheckExact(key)) untrack_atoms(key);
    return Py_NewRef(key);
}

/* untrack_lists(*lists): takes lists that hold only ints, tuples of ints, None, numpy rows and
 * dicts of ints and such tuples (an Earley chart's; and, for a subclass, attributes of such)
 * out of the collector's sight (`untrack`); a TypeError for anything but a list. */
static PyObject *untrack_lists(PyObject *self, PyObject *args) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++)
        if (!PyList_Check(PyTuple_GET_ITEM(args, i))) {
            PyErr_SetString(PyExc_TypeError, "untrack_lists takes lists");
            return NULL;
        }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) untrack(PyTuple_GET_ITEM(args, i));
    Py_RETURN_NONE;
}

/* derivable(rules, num_terminals, by_terminals): `cfg._derivable` (its twin): the left-hand
 * sides with a rule whose every symbol is one of them or, where `by_terminals`, a terminal (a
 * symbol below `num_terminals`), by a worklist over each rule's count of missing symbols.
 * `rules`: a list of (lhs, rhs) with rhs a tuple of symbols, ints from -1 up. */
static PyObject *derivable(PyObject *self, PyObject *args) {
    PyObject *rules;
    long terminals;
    int by_terminals;
    if (!PyArg_ParseTuple(args, "O!lp", &PyList_Type, &rules, &terminals, &by_terminals))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rules), total = 0;
    long top = 0; /* symbols are -1 .. top */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rule = PyList_GET_ITEM(rules, i);
        if (!PyTuple_CheckExact(rule) || PyTuple_GET_SIZE(rule) != 2 ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(rule, 1))) {
            PyErr_SetString(PyExc_TypeError, "derivable: rules are (lhs, tuple of symbols)");
            return NULL;
        }
        total += PyTuple_GET_SIZE(PyTuple_GET_ITEM(rule, 1)) + 1;
    }
    long *syms = malloc((total + 1) * sizeof(long)); /* per rule: lhs, then its rhs */
    Py_ssize_t *start = malloc((n + 1) * sizeof(Py_ssize_t));
    long *missing = malloc((n + 1) * sizeof(long));
    long *ready = malloc((n + 1) * sizeof(long));
    Py_ssize_t *first = NULL, *users = NULL;
    char *done = NULL;
    PyObject *out = NULL;
    if (!syms || !start || !missing || !ready) {
        PyErr_NoMemory();
        goto end;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rule = PyList_GET_ITEM(rules, i), *rhs = PyTuple_GET_ITEM(rule, 1);
        start[i] = k;
        for (Py_ssize_t j = -1; j < PyTuple_GET_SIZE(rhs); j++) {
            long s = PyLong_AsLong(j < 0 ? PyTuple_GET_ITEM(rule, 0) : PyTuple_GET_ITEM(rhs, j));
            if (s == -1 && PyErr_Occurred()) goto end;
            if (s < -1 || s >= LONG_MAX - 2) {
                PyErr_Format(PyExc_ValueError, "derivable: symbol %ld out of range", s);
                goto end;
            }
            if (s > top) top = s;
            syms[k++] = s;
        }
    }
    start[n] = k;
    /* users of each symbol (index s + 1), as offsets into one array: counted, then placed */
    first = calloc(top + 3, sizeof(Py_ssize_t));
    done = calloc(top + 2, 1);
    if (!first || !done) {
        PyErr_NoMemory();
        goto end;
    }
    Py_ssize_t r = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long need = 0;
        int never = 0;
        for (Py_ssize_t j = start[i] + 1; j < start[i + 1]; j++) {
            if (syms[j] < terminals) {
                never |= !by_terminals; /* a terminal: no empty word from this rule */
                continue;
            }
            need++;
        }
        if (never) need = -1;
        missing[i] = need;
        if (need == 0) ready[r++] = syms[start[i]];
        if (need > 0)
            for (Py_ssize_t j = start[i] + 1; j < start[i + 1]; j++)
                if (syms[j] >= terminals) first[syms[j] + 2]++;
    }
    for (long s = 0; s <= top + 1; s++) first[s + 1] += first[s];
    users = malloc((first[top + 2] + 1) * sizeof(Py_ssize_t));
    if (users == NULL) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (missing[i] > 0)
            for (Py_ssize_t j = start[i] + 1; j < start[i + 1]; j++)
                if (syms[j] >= terminals) users[first[syms[j] + 1]++] = i;
    /* first[s + 1] is now where symbol s's users end; they start where symbol s - 1's end */
    if ((out = PySet_New(NULL)) == NULL) goto end;
    while (r) {
        long lhs = ready[--r];
        if (done[lhs + 1]) continue;
        done[lhs + 1] = 1;
        PyObject *x = PyLong_FromLong(lhs);
        if (x == NULL || PySet_Add(out, x) < 0) {
            Py_XDECREF(x);
            Py_CLEAR(out);
            goto end;
        }
        Py_DECREF(x);
        for (Py_ssize_t u = lhs < 0 ? 0 : first[lhs], e = first[lhs + 1]; u < e; u++)
            if (--missing[users[u]] == 0) ready[r++] = syms[start[users[u]]];
    }
end:
    free(syms);
    free(start);
    free(missing);
    free(ready);
    free(first);
    free(users);
    free(done);
    return out;
}

/* An open-addressed set of (a, b, c) triples of longs (an Earley item, or (lhs, origin, 0)). */
typedef struct {
    long *keys; /* 3 per slot */
    char *used;
    Py_ssize_t n, cap; /* cap: a power of two */
} Triples;

static int triples_init(Triples *t, Py_ssize_t hint) {
    t->cap = 64;
    while (t->cap < 2 * hint) t->cap *= 2;
    t->n = 0;
    t->keys = malloc(3 * t->cap * sizeof(long));
    t->used = calloc(t->cap, 1);
    if (t->keys == NULL || t->used == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void triples_free(Triples *t) {
    free(t->keys);
    free(t->used);
}

static Py_ssize_t triples_slot(const Triples *t, long a, long b, long c) {
    uint64_t h = (uint64_t)a * 0x9E3779B97F4A7C15ull ^ (uint64_t)b * 0xC2B2AE3D27D4EB4Full ^
                 (uint64_t)c * 0x165667B19E3779F9ull;
    Py_ssize_t i = (Py_ssize_t)((h ^ (h >> 29)) & (uint64_t)(t->cap - 1));
    while (t->used[i]) {
        const long *k = t->keys + 3 * i;
        if (k[0] == a && k[1] == b && k[2] == c) return i;
        i = (i + 1) & (t->cap - 1);
    }
    return i;
}

/* Adds (a, b, c): 1 when it is new, 0 when it was there, -1 on error. */
static int triples_add(Triples *t, long a, long b, long c) {
    if (2 * (t->n + 1) > t->cap) {
        Triples big;
        if (triples_init(&big, t->cap) < 0) return -1;
        for (Py_ssize_t i = 0; i < t->cap; i++)
            if (t->used[i]) {
                const long *k = t->keys + 3 * i;
                Py_ssize_t j = triples_slot(&big, k[0], k[1], k[2]);
                big.used[j] = 1;
                memcpy(big.keys + 3 * j, k, 3 * sizeof(long));
            }
        big.n = t->n;
        triples_free(t);
        *t = big;
    }
    Py_ssize_t i = triples_slot(t, a, b, c);
    if (t->used[i]) return 0;
    t->used[i] = 1;
    long *k = t->keys + 3 * i;
    k[0] = a, k[1] = b, k[2] = c;
    t->n++;
    return 1;
}

/* Pushes the items of tuple `items` ((rule, dot, origin) tuples) on `agenda`; -1 on error. */
static int push_items(Longs *agenda, PyObject *items) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "earley_closure: items are (rule, dot, origin)");
            return -1;
        }
        for (int k = 0; k < 3; k++) {
            long x = PyLong_AsLong(PyTuple_GET_ITEM(item, k));
            if (x == -1 && PyErr_Occurred()) return -1;
            if (longs_push(agenda, x) < 0) return -1;
        }
    }
    return 0;
}

/* An item tuple (r, d, origin), out of the collector's sight; a new reference. */
static PyObject *item_tuple(long r, long d, long origin) {
    PyObject *t = Py_BuildValue("(lll)", r, d, origin);
    if (t != NULL) PyObject_GC_UnTrack(t);
    return t;
}

/* earley_closure(seeds, me, rules, by_lhs, nullable, num_terminals, waiting, max_items, budget)
 * -> (waiting, expected, accepting): `cfg.EarleyParser._closure`'s set (its twin, the same
 * items in the same order) before it is kept: the items waiting for each symbol (a dict of
 * untracked tuples), the terminals expected (a sorted tuple) and whether the set accepts.
 * `seeds`: sorted (rule, dot, origin) tuples, origin -1 for set `me` itself; `rules`: a tuple
 * of (lhs, rhs tuple), rule 0 the start rule; `by_lhs`: nonterminal -> tuple of rule numbers;
 * `nullable`: a set of nonterminals; `waiting`: the chart's list of kept sets' dicts. Past
 * `max_items` items `budget.check("max_earley_items", ...)` raises; `budget.check_time()` is
 * called every CLOSURE_CHECK_EVERY items taken. */
#define CLOSURE_CHECK_EVERY 4096 /* as cfg._CHECK_EVERY */
static PyObject *earley_closure(PyObject *self, PyObject *args) {
    PyObject *seeds, *rules, *by_lhs, *nullable, *chart, *budget;
    long me, terminals, max_items;
    if (!PyArg_ParseTuple(args, "O!lO!O!O!lO!lO", &PyTuple_Type, &seeds, &me, &PyTuple_Type,
                          &rules, &PyDict_Type, &by_lhs, &PySet_Type, &nullable, &terminals,
                          &PyList_Type, &chart, &max_items, &budget))
        return NULL;
    Longs agenda = {0}, expected = {0};
    Triples seen = {0}, completed = {0};
    PyObject *waiting = PyDict_New(), *kept = NULL, *out = NULL;
    int accepting = 0;
    long popped = 0;
    if (waiting == NULL || triples_init(&seen, 64) < 0 || triples_init(&completed, 16) < 0 ||
        push_items(&agenda, seeds) < 0)
        goto end;
    for (Py_ssize_t i = 2; i < agenda.n; i += 3)
        if (agenda.v[i] == -1) agenda.v[i] = me;
    const Py_ssize_t num_rules = PyTuple_GET_SIZE(rules);
    while (agenda.n) {
        agenda.n -= 3;
        const long r = agenda.v[agenda.n], d = agenda.v[agenda.n + 1], origin = agenda.v[agenda.n + 2];
        if (++popped % CLOSURE_CHECK_EVERY == 0) {
            PyObject *ok = PyObject_CallMethodNoArgs(budget, s_check_time);
            if (ok == NULL) goto end;
            Py_DECREF(ok);
        }
        const int added = triples_add(&seen, r, d, origin);
        if (added < 0) goto end;
        if (!added) continue;
        if (seen.n > max_items) {
            PyObject *ok = PyObject_CallMethod(budget, "check", "sns", "max_earley_items",
                                               seen.n, "items in one Earley set");
            if (ok == NULL) goto end;
            Py_DECREF(ok);
        }
        if (r < 0 || r >= num_rules) {
            PyErr_Format(PyExc_ValueError, "earley_closure: rule %ld out of range", r);
            goto end;
        }
        PyObject *rule = PyTuple_GET_ITEM(rules, r);
        if (!PyTuple_CheckExact(rule) || PyTuple_GET_SIZE(rule) != 2 ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(rule, 1))) {
            PyErr_SetString(PyExc_TypeError, "earley_closure: rules are (lhs, tuple of symbols)");
            goto end;
        }
        PyObject *rhs = PyTuple_GET_ITEM(rule, 1);
        if (d < PyTuple_GET_SIZE(rhs)) {
            PyObject *sym_obj = PyTuple_GET_ITEM(rhs, d);
            const long sym = PyLong_AsLong(sym_obj);
            if (sym == -1 && PyErr_Occurred()) goto end;
            PyObject *list = PyDict_GetItemWithError(waiting, sym_obj), *item;
            if (list == NULL) {
                if (PyErr_Occurred() || (list = PyList_New(0)) == NULL) goto end;
                int r2 = PyDict_SetItem(waiting, sym_obj, list);
                Py_DECREF(list); /* the dict holds it */
                if (r2 < 0) goto end;
            }
            if ((item = item_tuple(r, d + 1, origin)) == NULL) goto end;
            int r3 = PyList_Append(list, item);
            Py_DECREF(item);
            if (r3 < 0) goto end;
            if (sym < terminals) {
                if (longs_push(&expected, sym) < 0) goto end;
                continue;
            }
            PyObject *alts = PyDict_GetItemWithError(by_lhs, sym_obj);
            if (alts == NULL && PyErr_Occurred()) goto end;
            if (alts != NULL) {
                if (!PyTuple_CheckExact(alts)) {
                    PyErr_SetString(PyExc_TypeError, "earley_closure: by_lhs holds tuples");
                    goto end;
                }
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(alts); i++) {
                    long r2 = PyLong_AsLong(PyTuple_GET_ITEM(alts, i));
                    if ((r2 == -1 && PyErr_Occurred()) || longs_push(&agenda, r2) < 0 ||
                        longs_push(&agenda, 0) < 0 || longs_push(&agenda, me) < 0)
                        goto end;
                }
            }
            const int null = PySet_Contains(nullable, sym_obj);
            if (null < 0) goto end;
            if (null && (longs_push(&agenda, r) < 0 || longs_push(&agenda, d + 1) < 0 ||
                         longs_push(&agenda, origin) < 0))
                goto end;
        } else if (r == 0) {
            accepting = 1;
        } else if (origin != me) {
            /* Every rule of lhs completed from `origin` advances the same items there. */
            PyObject *lhs = PyTuple_GET_ITEM(rule, 0);
            const long lhs_num = PyLong_AsLong(lhs);
            if (lhs_num == -1 && PyErr_Occurred()) goto end;
            const int fresh = triples_add(&completed, lhs_num, origin, 0);
            if (fresh < 0) goto end;
            if (!fresh) continue;
            if (origin < 0 || origin >= PyList_GET_SIZE(chart)) {
                PyErr_Format(PyExc_ValueError, "earley_closure: origin %ld out of range", origin);
                goto end;
            }
            PyObject *there = PyList_GET_ITEM(chart, origin);
            PyObject *items = PyDict_Check(there) ? PyDict_GetItemWithError(there, lhs) : NULL;
            if (items == NULL && PyErr_Occurred()) goto end;
            if (items != NULL && (!PyTuple_CheckExact(items) || push_items(&agenda, items) < 0)) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "earley_closure: waiting holds tuples");
                goto end;
            }
        }
    }
    /* The lists become untracked tuples in a new dict, which holding only those stays out of
     * the collector's sight (a dict that ever held a list stays in it); the expected
     * terminals a sorted tuple. */
    if ((kept = PyDict_New()) == NULL) goto end;
    Py_ssize_t pos = 0;
    PyObject *sym, *list;
    while (PyDict_Next(waiting, &pos, &sym, &list)) {
        PyObject *t = PyList_AsTuple(list);
        if (t == NULL) goto end;
        PyObject_GC_UnTrack(t);
        const int r4 = PyDict_SetItem(kept, sym, t);
        Py_DECREF(t);
        if (r4 < 0) goto end;
    }
    qsort(expected.v, expected.n, sizeof(long), cmp_long);
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < expected.n; i++)
        if (m == 0 || expected.v[m - 1] != expected.v[i]) expected.v[m++] = expected.v[i];
    PyObject *exp = tuple_of(NULL, expected.v, m);
    if (exp == NULL) goto end;
    PyObject_GC_UnTrack(exp);
    out = Py_BuildValue("(ONO)", kept, exp, accepting ? Py_True : Py_False);
end:
    Py_XDECREF(waiting);
    Py_XDECREF(kept);
    free(agenda.v);
    free(expected.v);
    triples_free(&seen);
    triples_free(&completed);
    return out;
}

/* obj.nbytes += n; 0, or -1 on error */
static int add_bytes(PyObject *obj, long n) {
    PyObject *had = PyObject_GetAttr(obj, s_nbytes), *x = PyLong_FromLong(n), *now = NULL;
    int r = had == NULL || x == NULL || (now = PyNumber_Add(had, x)) == NULL
                ? -1
                : PyObject_SetAttr(obj, s_nbytes, now);
    Py_XDECREF(had);
    Py_XDECREF(x);
    Py_XDECREF(now);
    return r;
}

/* Count what was built (the NFA's bytes on the NFA and its budget, the target sets' on the
 * budget), since it is kept whatever happens next: 0, or -1 on error. */
static int ctx_count(Ctx *c, PyObject *budget) {
    long nfa_bytes = c->nfa_bytes, all = c->nfa_bytes + c->table_bytes;
    c->nfa_bytes = c->table_bytes = 0;
    if (nfa_bytes && add_bytes(c->nfa, nfa_bytes) < 0) return -1;
    return all ? add_bytes(budget, all) : 0;
}

/* `obj.name` as a double; -1 with an error set (a value of -1.0 is told apart by the error) */
static int double_attr(PyObject *obj, PyObject *name, double *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    *out = v == NULL ? -1.0 : PyFloat_AsDouble(v);
    Py_XDECREF(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* Count what was built, then raise the budget's error if that passed its bytes (the Python
 * code charges before it builds; C builds a call's states, then charges them). */
static int ctx_flush(Ctx *c, PyObject *budget) {
    if (c->nfa_bytes == 0 && c->table_bytes == 0) return 0;
    if (ctx_count(c, budget) < 0) return -1;
    double held, cap;
    if (double_attr(budget, s_nbytes, &held) < 0 || double_attr(budget, s_cap, &cap) < 0) return -1;
    if (held <= cap) return 0; /* within its bytes: no error to raise */
    PyObject *r = call_long(budget, s_charge, 0);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* Ends a step: what was built is counted and charged; a failed step's error stands. */
static PyObject *ctx_settle(Ctx *c, PyObject *budget, PyObject *out) {
    if (out != NULL) {
        if (ctx_flush(c, budget) < 0) Py_CLEAR(out);
    } else {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (ctx_count(c, budget) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    return out;
}

/* Ends a call: `ctx_settle`, and the NFA's parts let go. */
static PyObject *ctx_done(Ctx *c, PyObject *budget, PyObject *out) {
    out = ctx_settle(c, budget, out);
    ctx_release(c);
    return out;
}

/* ---- the NFA's lazily made states (`NFA` methods of the same names) ---- */

static PyObject *c_moves(Ctx *c, long s);
static PyObject *c_edges(Ctx *c, long s);
static long c_add(Ctx *c, PyObject *node, long nxt);

/* `NFA.new_state`; past MAX_NFA_STATES the Python method raises the limit's error */
static long c_new_state(Ctx *c, PyObject *moves, PyObject *edges) {
    Py_ssize_t n = PyList_GET_SIZE(c->eps);
    if (n >= max_nfa_states) {
        PyObject *args[] = {c->nfa, moves, edges}, *r = call(s_new_state, args, 3);
        long s = r == NULL ? ERR : PyLong_AsLong(r);
        Py_XDECREF(r);
        return s == -1 && PyErr_Occurred() ? ERR : s;
    }
    c->nfa_bytes += state_bytes;
    if (PyList_Append(c->eps, moves) < 0) return ERR;
    if (PyList_Append(c->edges, edges) < 0) {
        PyList_SetSlice(c->eps, n, n + 1, NULL);
        return ERR;
    }
    return n;
}

/* The state of `node` at `arg` then `nxt`, found in `known` by its key (node, arg, nxt), else
 * new, its key kept where its moves (`run` 0) or its edges (`run` 1, a literal run) wait to be
 * made from it. */
static long c_waiting(Ctx *c, PyObject *node, PyObject *arg, long nxt, PyObject *known, int run) {
    PyObject *key = triple(c->ints, node, arg, nxt);
    if (key == NULL) return ERR;
    int found;
    long got = get_state(known, key, &found);
    if (!found && got != ERR) {
        untrack_atoms(key);
        got = run ? c_new_state(c, empty, key) : c_new_state(c, key, empty);
        if (got != ERR && set_state(c->ints, known, key, got) < 0) got = ERR;
    }
    Py_DECREF(key);
    return got;
}

/* `NFA._state`: the state that waits to make `node`'s moves at `arg` */
static long c_state(Ctx *c, PyObject *node, PyObject *arg, long nxt) {
    return c_waiting(c, node, arg, nxt, c->ids, 0);
}

static PyObject *sequences_of(PyObject *ranges) {
    return PyObject_CallOneArg(sequences_fn, ranges);
}

/* `NFA._tail`: reads the byte ranges `seq[from:]` of a multi-byte sequence, then `nxt` */
static long c_tail(Ctx *c, PyObject *seq, Py_ssize_t from, long nxt) {
    PyObject *rest = PyTuple_GetSlice(seq, from, PyTuple_GET_SIZE(seq));
    if (rest == NULL) return ERR;
    PyObject *key = triple(c->ints, s_tail, rest, nxt);
    Py_DECREF(rest);
    if (key == NULL) return ERR;
    int found;
    long got = get_state(c->shared, key, &found);
    if (!found && got != ERR) {
        long target = from + 1 == PyTuple_GET_SIZE(seq) ? nxt : c_tail(c, seq, from + 1, nxt);
        PyObject *first = PyTuple_GET_ITEM(seq, from), *edges = NULL;
        long edge[] = {PyLong_AsLong(PyTuple_GET_ITEM(first, 0)),
                       PyLong_AsLong(PyTuple_GET_ITEM(first, 1)), target};
        if (target != ERR && !PyErr_Occurred()) edges = packed(edge, 3);
        got = edges == NULL ? ERR : c_new_state(c, empty, edges);
        Py_XDECREF(edges);
        if (got != ERR && set_state(c->ints, c->shared, key, got) < 0) got = ERR;
        c->nfa_bytes += edge_bytes + entry_bytes;
    }
    Py_DECREF(key);
    return got;
}

/* `NFA._char_edges`: the packed (lo, hi, target) edges reading one code point of `ranges` (its
 * UTF-8 sequences `seqs`), then going to `nxt`; a new reference */
static PyObject *c_char_edges(Ctx *c, PyObject *seqs, long nxt) {
    Py_ssize_t n = PyTuple_GET_SIZE(seqs);
    long *v = malloc((3 * n + 1) * sizeof(long));
    if (v == NULL) return PyErr_NoMemory();
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *seq = PyTuple_GET_ITEM(seqs, i), *first = PyTuple_GET_ITEM(seq, 0);
        v[3 * i] = PyLong_AsLong(PyTuple_GET_ITEM(first, 0));
        v[3 * i + 1] = PyLong_AsLong(PyTuple_GET_ITEM(first, 1));
        v[3 * i + 2] = PyTuple_GET_SIZE(seq) == 1 ? nxt : c_tail(c, seq, 1, nxt);
        if (v[3 * i + 2] == ERR || PyErr_Occurred()) goto done;
    }
    out = packed(v, 3 * n);
done:
    free(v);
    return out;
}

/* `NFA._chars`: reads one code point of `ranges`, then `nxt`; -1 when none has UTF-8 */
static long c_chars(Ctx *c, PyObject *ranges, long nxt) {
    PyObject *x = state_int(c->ints, nxt), *key = x == NULL ? NULL : PyTuple_Pack(2, ranges, x);
    Py_XDECREF(x);
    if (key == NULL) return ERR;
    int found;
    long got = get_state(c->shared, key, &found);
    if (!found && got != ERR) {
        PyObject *seqs = sequences_of(ranges), *edges = NULL;
        if (seqs == NULL) {
            got = ERR;
        } else if (PyTuple_GET_SIZE(seqs) == 0) {
            got = set_state(c->ints, c->shared, key, -1) < 0 ? ERR : -1;
        } else {
            edges = c_char_edges(c, seqs, nxt);
            got = edges == NULL ? ERR : c_new_state(c, empty, edges);
            if (got != ERR && set_state(c->ints, c->shared, key, got) < 0) got = ERR;
            if (got != ERR) c->nfa_bytes += count_in(edges) / 3 * edge_bytes + entry_bytes;
        }
        Py_XDECREF(seqs);
        Py_XDECREF(edges);
    }
    Py_DECREF(key);
    return got;
}

static int is_chars(PyObject *node) { return PyObject_TypeCheck(node, (PyTypeObject *)chars_type); }

/* node.items (a new reference; a tuple) */
static PyObject *items_of(PyObject *node) {
    PyObject *items = PyObject_GetAttr(node, s_items);
    if (items != NULL && !PyTuple_Check(items)) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_TypeError, "dfa_rows: a sequence's items are not a tuple");
        return NULL;
    }
    return items;
}

/* `NFA._rest`: reads `items[i:]` of sequence `node`, then `nxt` */
static long c_rest(Ctx *c, PyObject *node, PyObject *items, Py_ssize_t i, long nxt) {
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    int here = i < n && is_chars(PyTuple_GET_ITEM(items, i));
    PyObject *arg = NULL;
    long got;
    if (here && i + 1 < n && is_chars(PyTuple_GET_ITEM(items, i + 1))) { /* a literal run */
        if ((arg = PyLong_FromSsize_t(i)) == NULL) return ERR;
        got = c_waiting(c, node, arg, nxt, c->runs, 1);
        Py_DECREF(arg);
        return got;
    }
    if (here) {
        long target = nxt;
        if (i + 1 < n) {
            if ((arg = PyLong_FromSsize_t(i + 1)) == NULL) return ERR;
            target = c_state(c, node, arg, nxt);
            Py_DECREF(arg);
            if (target == ERR) return ERR;
        }
        PyObject *ranges = PyObject_GetAttr(PyTuple_GET_ITEM(items, i), s_ranges);
        if (ranges == NULL) return ERR;
        got = c_chars(c, ranges, target);
        Py_DECREF(ranges);
        return got;
    }
    if (i == n) return nxt;
    if ((arg = PyLong_FromSsize_t(i)) == NULL) return ERR;
    got = c_state(c, node, arg, nxt);
    Py_DECREF(arg);
    return got;
}

/* `NFA._run_edges`: the edges of literal run state `s` = (node, i, nxt) */
static PyObject *c_run_edges(Ctx *c, long s, PyObject *run) {
    PyObject *node = PyTuple_GET_ITEM(run, 0);
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(run, 1));
    long nxt = PyLong_AsLong(PyTuple_GET_ITEM(run, 2));
    if (PyErr_Occurred()) return NULL;
    PyObject *items = items_of(node);
    if (items == NULL) return NULL;
    PyObject *edges = NULL, *ranges = NULL, *seqs = NULL;
    long target = c_rest(c, node, items, i + 1, nxt);
    if (target != ERR && (ranges = PyObject_GetAttr(PyTuple_GET_ITEM(items, i), s_ranges)) &&
        (seqs = sequences_of(ranges)) && (edges = c_char_edges(c, seqs, target))) {
        if (PyList_SetItem(c->edges, s, Py_NewRef(edges)) < 0) Py_CLEAR(edges);
        else c->nfa_bytes += count_in(edges) / 3 * edge_bytes;
    }
    Py_XDECREF(seqs);
    Py_XDECREF(ranges);
    Py_DECREF(items);
    return edges;
}

/* `NFA._lift`: `state` of a counted body ending in `end`, going on to `target` instead */
static long c_lift(Ctx *c, long state, long end, long target) {
    if (state == end) return target;
    long v[] = {state, end, target};
    PyObject *key = tuple_of(c->ints, v, 3);
    if (key == NULL) return ERR;
    int found;
    long got = get_state(c->lifts, key, &found);
    if (!found && got != ERR) {
        got = c_new_state(c, Py_None, Py_None);
        if (got != ERR && set_state(c->ints, c->lifts, key, got) < 0) got = ERR;
        if (got != ERR) {
            PyObject *k = state_int(c->ints, got);
            if (k == NULL || PyDict_SetItem(c->lifted, k, key) < 0) got = ERR;
            Py_XDECREF(k);
        }
    }
    Py_DECREF(key);
    return got;
}

/* `NFA._unwrap`: the moves (or edges) of lifted state `s`, lifted level by level from the
 * first state down its lifts whose list is made (or waits as its key) */
static PyObject *c_unwrap(Ctx *c, long s, int moves) {
    PyObject *lists = moves ? c->eps : c->edges;
    Longs chain = {0};
    PyObject *inner = NULL;
    for (;;) {
        PyObject *list = item(lists, s), *lift;
        if (list == NULL) goto done;
        if (list != Py_None || (lift = get_int_key(c->ints, c->lifted, s)) == NULL) break;
        if (longs_push(&chain, s) < 0) goto done;
        s = PyLong_AsLong(PyTuple_GET_ITEM(lift, 0));
    }
    if (PyErr_Occurred()) goto done;
    if (chain.n == 0) { /* neither lifted nor waiting to be made: the NFA is inconsistent */
        PyErr_Format(PyExc_RuntimeError, "dfa_rows: NFA state %ld has no way to make its %s", s,
                     moves ? "moves" : "edges");
        goto done;
    }
    inner = moves ? c_moves(c, s) : c_edges(c, s);
    for (Py_ssize_t k = chain.n - 1; k >= 0 && inner != NULL; k--) {
        PyObject *lift = get_int_key(c->ints, c->lifted, chain.v[k]);
        if (lift == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "dfa_rows: lift lost");
            Py_CLEAR(inner);
            break;
        }
        long end = PyLong_AsLong(PyTuple_GET_ITEM(lift, 1));
        long target = PyLong_AsLong(PyTuple_GET_ITEM(lift, 2));
        Py_ssize_t n = count_in(inner), step = moves ? 1 : 3; /* a target every `step` ints */
        long *v = malloc((n + 1) * sizeof(long));
        PyObject *up = NULL;
        if (v == NULL) PyErr_NoMemory();
        for (Py_ssize_t j = 0; v != NULL && j < n; j++) {
            long t = ints_in(inner)[j];
            v[j] = j % step != step - 1 ? t : t == end ? target : c_lift(c, t, end, target);
            if (v[j] == ERR) break;
        }
        if (v != NULL && !PyErr_Occurred()) up = packed(v, n);
        free(v);
        Py_DECREF(inner);
        inner = up;
        if (inner != NULL && PyList_SetItem(lists, chain.v[k], Py_NewRef(inner)) < 0)
            Py_CLEAR(inner);
        if (inner != NULL) c->nfa_bytes += moves ? (long)sizeof(int) * n : edge_bytes * (n / 3);
    }
done:
    free(chain.v);
    return inner;
}

/* `facts.dead(node)`: 1, 0, or -1 on error; from the node's own facts where it has them */
static int is_dead(Ctx *c, PyObject *node) {
    PyObject *facts = PyObject_GetAttr(node, s_facts);
    if (facts == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
    } else if (PyTuple_Check(facts) && PyTuple_GET_SIZE(facts) == 2) {
        int dead = PyObject_IsTrue(PyTuple_GET_ITEM(facts, 0));
        Py_DECREF(facts);
        return dead;
    } else {
        Py_DECREF(facts);
    }
    PyObject *known = PyObject_GetAttr(c->nfa, s_facts);
    PyObject *args[] = {known, node}, *r = known == NULL ? NULL : call(s_dead, args, 2);
    Py_XDECREF(known);
    if (r == NULL) return -1;
    int dead = PyObject_IsTrue(r);
    Py_DECREF(r);
    return dead;
}

/* a state from a Python method's result */
static long state_from(PyObject *r) {
    long s = r == NULL ? ERR : PyLong_AsLong(r);
    Py_XDECREF(r);
    return s == -1 && PyErr_Occurred() ? ERR : s;
}

/* ---- counted nodes: repeats and explicit DFAs (`NFA` methods of the same names) ---- */

/* `facts.counted(node)`'s memo entry (node, body, lo, hi), a new reference; the Python method
 * makes it the first time */
static PyObject *c_counted(Ctx *c, PyObject *node) {
    PyObject *id = PyLong_FromVoidPtr(node);
    if (id == NULL) return NULL;
    PyObject *got = PyDict_GetItemWithError(c->counted, id);
    if (got == NULL && !PyErr_Occurred()) {
        PyObject *facts = PyObject_GetAttr(c->nfa, s_facts), *args[] = {facts, node};
        PyObject *r = facts == NULL ? NULL : call(s_counted, args, 2);
        Py_XDECREF(facts);
        if (r != NULL) {
            Py_DECREF(r);
            got = PyDict_GetItemWithError(c->counted, id);
            if (got == NULL && !PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "dfa_rows: facts.counted kept no entry");
        }
    }
    Py_DECREF(id);
    return Py_XNewRef(got);
}

/* a long from an attribute that may be None (`*none` set then) */
static int long_attr(PyObject *obj, PyObject *name, long *out, int *none) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    *none = v == Py_None;
    *out = *none ? 0 : PyLong_AsLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* `NFA._counter`: the state of counted `node` at `arg` (a Repeat's count, a Dfa's (table
 * state, count)), marked for `prune` past the node's minimum count */
static long c_counter(Ctx *c, PyObject *node, PyObject *arg, long nxt) {
    Py_ssize_t made = PyList_GET_SIZE(c->eps);
    long got = c_state(c, node, arg, nxt);
    if (got == ERR || got < made) return got; /* found: marked when it was made */
    PyObject *id = PyLong_FromVoidPtr(node), *counter = NULL, *count = NULL;
    int past;
    if (id == NULL) return ERR;
    if (PyObject_TypeCheck(node, (PyTypeObject *)repeat_type)) {
        PyObject *memo = c_counted(c, node);
        past = memo == NULL ? -1 : PyObject_RichCompareBool(arg, PyTuple_GET_ITEM(memo, 2), Py_GE);
        Py_XDECREF(memo);
        if (past > 0) {
            PyObject *x = state_int(c->ints, nxt);
            counter = x == NULL ? NULL : PyTuple_Pack(2, id, x);
            Py_XDECREF(x);
            count = Py_NewRef(arg);
        }
    } else {
        PyObject *any = PyObject_GetAttr(node, s_reads_any_text), *k = NULL;
        past = any == NULL ? -1 : PyObject_IsTrue(any);
        Py_XDECREF(any);
        if (past > 0) { /* `NFA.any_text` */
            k = state_int(c->ints, got);
            past = k == NULL || PySet_Add(c->any_text, k) < 0 ? -1 : 0;
            Py_XDECREF(k);
        }
        PyObject *lo = past < 0 ? NULL : PyObject_GetAttr(node, s_lo);
        past = lo == NULL ? -1 : PyObject_RichCompareBool(PyTuple_GET_ITEM(arg, 1), lo, Py_GE);
        Py_XDECREF(lo);
        if (past > 0) {
            counter = triple(c->ints, id, PyTuple_GET_ITEM(arg, 0), nxt);
            count = Py_NewRef(PyTuple_GET_ITEM(arg, 1));
        }
    }
    Py_DECREF(id);
    if (past < 0) return ERR;
    if (past) {
        PyObject *k = state_int(c->ints, got), *order = counter ? PyTuple_Pack(2, counter, count) : NULL;
        if (order != NULL) untrack_atoms(order);
        if (k == NULL || order == NULL || PyDict_SetItem(c->order, k, order) < 0) got = ERR;
        Py_XDECREF(k);
        Py_XDECREF(order);
    }
    Py_XDECREF(counter);
    Py_XDECREF(count);
    return got;
}

/* `NFA._end`: the end state of counted `node`'s body */
static long c_end(Ctx *c, PyObject *node) {
    PyObject *id = PyLong_FromVoidPtr(node);
    if (id == NULL) return ERR;
    int found;
    long got = get_state(c->ends, id, &found);
    if (!found && got != ERR) {
        got = c_new_state(c, empty, empty);
        if (got != ERR && set_state(c->ints, c->ends, id, got) < 0) got = ERR;
    }
    Py_DECREF(id);
    return got;
}

/* `NFA._body_ir`: the IR `node` reads for one count (`ranges` None: a Repeat's body), a new
 * reference; a Dfa's from `nfa._spelled` the first time */
static PyObject *c_body_ir(Ctx *c, PyObject *node, PyObject *ranges) {
    PyObject *id = PyLong_FromVoidPtr(node);
    PyObject *key = id == NULL ? NULL : PyTuple_Pack(2, id, ranges);
    Py_XDECREF(id);
    if (key == NULL) return NULL;
    PyObject *got = PyDict_GetItemWithError(c->body_irs, key);
    if (got != NULL) {
        got = Py_NewRef(got);
    } else if (!PyErr_Occurred()) {
        if (ranges == Py_None) {
            PyObject *memo = c_counted(c, node);
            if (memo != NULL) {
                got = Py_NewRef(PyTuple_GET_ITEM(memo, 1));
                Py_DECREF(memo);
            }
        } else {
            PyObject *spell = PyObject_GetAttr(node, s_spell);
            PyObject *args[] = {spell, ranges};
            got = spell == NULL ? NULL : PyObject_Vectorcall(spelled_fn, args, 2, NULL);
            Py_XDECREF(spell);
        }
        if (got != NULL && PyDict_SetItem(c->body_irs, key, got) < 0) Py_CLEAR(got);
        if (got != NULL && untrack_graph(got) < 0) Py_CLEAR(got); /* IR made since */
    }
    Py_DECREF(key);
    return got;
}

/* `NFA._copy`: reads one count of `node` (see `c_body_ir`), then `target`; -1 if nothing */
static long c_copy(Ctx *c, PyObject *node, PyObject *ranges, long target) {
    long hi;
    int unbounded;
    if (long_attr(node, s_hi, &hi, &unbounded) < 0) return ERR;
    if (unbounded || hi <= 1) {
        PyObject *body = c_body_ir(c, node, ranges);
        long got = body == NULL ? ERR : c_add(c, body, target);
        Py_XDECREF(body);
        return got;
    }
    PyObject *id = PyLong_FromVoidPtr(node);
    PyObject *key = id == NULL ? NULL : PyTuple_Pack(2, id, ranges);
    Py_XDECREF(id);
    if (key == NULL) return ERR;
    int found;
    long start = get_state(c->bodies, key, &found);
    if (!found && start != ERR) {
        PyObject *body = c_body_ir(c, node, ranges);
        long end = body == NULL ? ERR : c_end(c, node);
        start = end == ERR ? ERR : c_add(c, body, end);
        Py_XDECREF(body);
        if (start != ERR && set_state(c->ints, c->bodies, key, start) < 0) start = ERR;
    }
    Py_DECREF(key);
    if (start < 0) return start; /* ERR, or -1: matches nothing */
    long end = c_end(c, node);
    return end == ERR ? ERR : c_lift(c, start, end, target);
}

/* `NFA._repeat_moves` into `out`: out when `k` copies are enough, into one more when allowed */
static int c_repeat_moves(Ctx *c, PyObject *node, long k, long nxt, Longs *out) {
    PyObject *memo = c_counted(c, node);
    if (memo == NULL) return -1;
    PyObject *body = PyTuple_GET_ITEM(memo, 1), *hi_obj = PyTuple_GET_ITEM(memo, 3);
    long lo = PyLong_AsLong(PyTuple_GET_ITEM(memo, 2));
    long hi = hi_obj == Py_None ? 0 : PyLong_AsLong(hi_obj);
    int ok = PyErr_Occurred() ? -1 : 0;
    if (ok == 0 && k >= lo) ok = longs_push(out, nxt);
    if (ok == 0 && body != Py_None && (hi_obj == Py_None || k < hi)) {
        long more = hi_obj != Py_None || k < lo ? k + 1 : k; /* unbounded: count only to lo */
        PyObject *arg = PyLong_FromLong(more);
        long counter = arg == NULL ? ERR : c_counter(c, node, arg, nxt);
        Py_XDECREF(arg);
        long start = counter == ERR ? ERR : c_copy(c, node, Py_None, counter);
        if (start == ERR) ok = -1;
        else if (start >= 0) ok = longs_push(out, start);
    }
    Py_DECREF(memo);
    return ok;
}

/* `DfaTable.live(t, count, lo, hi)`: 1, 0, -1 on error; `known_live`'s tests here, the rest
 * (a narrow length window's suffix lengths) by the Python method */
static int c_live(Ctx *c, PyObject *table, long t, long count, long lo, PyObject *hi_obj) {
    if (hi_obj == Py_None && count >= lo) return 1; /* no bound left to miss */
    PyObject *shortest = PyObject_GetAttr(table, s_shortest);
    PyObject *longest = shortest == NULL ? NULL : PyObject_GetAttr(table, s_longest);
    PyObject *a = longest == NULL ? NULL : PySequence_GetItem(shortest, t);
    PyObject *b = a == NULL ? NULL : PySequence_GetItem(longest, t);
    double lo_len = a == NULL ? 0 : PyFloat_AsDouble(a);
    double hi_len = b == NULL ? 0 : PyFloat_AsDouble(b);
    Py_XDECREF(shortest);
    Py_XDECREF(longest);
    Py_XDECREF(a);
    Py_XDECREF(b);
    if (b == NULL || PyErr_Occurred()) return -1;
    long hi = hi_obj == Py_None ? 0 : PyLong_AsLong(hi_obj);
    if (hi == -1 && PyErr_Occurred()) return -1;
    if (hi_obj != Py_None && count + lo_len > hi) return 0;
    if (count >= lo) return 1;
    long need = lo - count;
    if (hi_len < need) return 0;
    if (hi_obj == Py_None) return 1;
    Py_ssize_t size = PyObject_Length(table); /* a Python __len__: read only when needed */
    if (size < 0) return -1;
    if (hi - count >= need + size) return 1;
    PyObject *check = PyObject_GetAttr(c->nfa, s_check);
    PyObject *tt = PyLong_FromLong(t), *cc = PyLong_FromLong(count), *ll = PyLong_FromLong(lo);
    PyObject *args[] = {table, tt, cc, ll, hi_obj, check}, *r = NULL;
    if (check && tt && cc && ll) r = call(s_live, args, 6);
    Py_XDECREF(check);
    Py_XDECREF(tt);
    Py_XDECREF(cc);
    Py_XDECREF(ll);
    int live = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    return live;
}

/* `c`'s last Dfa node read, `node` (its lo, hi, table and the table's accepting and moves):
 * 0, or -1 with the error set and nothing kept */
static int dfa_node_load(Ctx *c, PyObject *node) {
    ctx_forget_dfa(c);
    int no_lo;
    if (long_attr(node, s_lo, &c->dfa_lo, &no_lo) < 0 || (c->dfa_hi = PyObject_GetAttr(node, s_hi)) == NULL ||
        (c->dfa_table = PyObject_GetAttr(node, s_table)) == NULL ||
        (c->dfa_accepting = PyObject_GetAttr(c->dfa_table, s_accepting)) == NULL ||
        (c->dfa_moves = PyObject_GetAttr(c->dfa_table, s_moves)) == NULL) {
        ctx_forget_dfa(c);
        return -1;
    }
    c->dfa_node = Py_NewRef(node);
    return 0;
}

/* `NFA._dfa_moves` into `out`: the moves of Dfa `node` at `arg` = (table state, count) */
static int c_dfa_moves(Ctx *c, PyObject *node, PyObject *arg, long nxt, Longs *out) {
    if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 2) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: a Dfa state is not (table state, count)");
        return -1;
    }
    long s = PyLong_AsLong(PyTuple_GET_ITEM(arg, 0)), count = PyLong_AsLong(PyTuple_GET_ITEM(arg, 1));
    if (PyErr_Occurred() || (c->dfa_node != node && dfa_node_load(c, node) < 0)) return -1;
    long lo = c->dfa_lo;
    PyObject *hi_obj = c->dfa_hi, *table = c->dfa_table, *moves = c->dfa_moves;
    PyObject *row = NULL, *fast = NULL;
    int ok = -1;
    PyObject *acc = PySequence_GetItem(c->dfa_accepting, s);
    int accepts = acc == NULL ? -1 : PyObject_IsTrue(acc);
    Py_XDECREF(acc);
    if (accepts < 0 || (accepts && count >= lo && longs_push(out, nxt) < 0)) goto done;
    long more = hi_obj != Py_None || count < lo ? count + 1 : count;
    /* a list's row read in place where made (a lazily made table's rows, `_AllButRows`, are
     * a list whose subclass makes a missing one) */
    row = PyList_Check(moves) && s >= 0 && s < PyList_GET_SIZE(moves) &&
                  PyList_GET_ITEM(moves, s) != Py_None
              ? Py_NewRef(PyList_GET_ITEM(moves, s))
              : PySequence_GetItem(moves, s);
    if (row == NULL || (fast = PySequence_Fast(row, "dfa_rows: a table row is not a sequence")) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *move = PySequence_Fast_GET_ITEM(fast, i); /* (ranges, target) */
        if (!PyTuple_Check(move) || PyTuple_GET_SIZE(move) != 2) {
            PyErr_SetString(PyExc_TypeError, "dfa_rows: a table move is not (ranges, target)");
            goto done;
        }
        long t = PyLong_AsLong(PyTuple_GET_ITEM(move, 1));
        if (t == -1 && PyErr_Occurred()) goto done;
        int live = c_live(c, table, t, more, lo, hi_obj);
        if (live < 0) goto done;
        if (!live) continue;
        long pair[] = {t, more};
        PyObject *at = tuple_of(NULL, pair, 2);
        long counter = at == NULL ? ERR : c_counter(c, node, at, nxt);
        Py_XDECREF(at);
        long start = counter == ERR ? ERR : c_copy(c, node, PyTuple_GET_ITEM(move, 0), counter);
        if (start == ERR || (start >= 0 && longs_push(out, start) < 0)) goto done;
    }
    ok = 0;
done:
    Py_XDECREF(row);
    Py_XDECREF(fast);
    return ok;
}

/* nfa.add(node, nxt) by the Python method: a node of no kind C makes (it raises, as for a
 * rule reference inside a regular expression) */
static long python_add(Ctx *c, PyObject *node, long nxt) {
    PyObject *x = state_int(c->ints, nxt);
    if (x == NULL) return ERR;
    PyObject *args[] = {c->nfa, node, x};
    long s = state_from(call(s_add, args, 3));
    Py_DECREF(x);
    return s;
}

/* `NFA.add`: reads `node`, then `nxt`; -1 if `node` matches nothing */
static long c_add(Ctx *c, PyObject *node, long nxt) {
    int dead = is_dead(c, node);
    if (dead) return dead < 0 ? ERR : -1;
    if (is_chars(node)) {
        PyObject *ranges = PyObject_GetAttr(node, s_ranges);
        if (ranges == NULL) return ERR;
        long got = c_chars(c, ranges, nxt);
        Py_DECREF(ranges);
        return got;
    }
    if (PyObject_TypeCheck(node, (PyTypeObject *)seq_type)) {
        /* no state waits before a sequence's first item (a loop over nested sequences);
         * `node` stays alive through the outermost one's items */
        PyObject *items = items_of(node);
        if (items == NULL) return ERR;
        while (PyTuple_GET_SIZE(items) &&
               PyObject_TypeCheck(PyTuple_GET_ITEM(items, 0), (PyTypeObject *)seq_type)) {
            nxt = c_rest(c, node, items, 1, nxt);
            node = PyTuple_GET_ITEM(items, 0);
            Py_DECREF(items);
            if (nxt == ERR || (items = items_of(node)) == NULL) return ERR;
        }
        long got;
        if (PyTuple_GET_SIZE(items) == 0 || is_chars(PyTuple_GET_ITEM(items, 0))) {
            got = c_rest(c, node, items, 0, nxt);
        } else {
            got = c_rest(c, node, items, 1, nxt);
            if (got != ERR) got = c_add(c, PyTuple_GET_ITEM(items, 0), got);
        }
        Py_DECREF(items);
        return got;
    }
    if (PyObject_TypeCheck(node, (PyTypeObject *)repeat_type)) return c_counter(c, node, zero, nxt);
    if (PyObject_TypeCheck(node, (PyTypeObject *)alt_type)) return c_state(c, node, zero, nxt);
    if (!PyObject_TypeCheck(node, (PyTypeObject *)dfa_type)) return python_add(c, node, nxt);
    PyObject *start = PyObject_GetAttr(node, s_start);
    PyObject *arg = start == NULL ? NULL : PyTuple_Pack(2, start, zero);
    Py_XDECREF(start);
    long got = arg == NULL ? ERR : c_counter(c, node, arg, nxt);
    Py_XDECREF(arg);
    return got;
}

/* `NFA._node_moves` of state `s` from its key (node, arg, nxt) */
static PyObject *c_node_moves(Ctx *c, long s, PyObject *key) {
    PyObject *node = PyTuple_GET_ITEM(key, 0), *arg = PyTuple_GET_ITEM(key, 1);
    long nxt = PyLong_AsLong(PyTuple_GET_ITEM(key, 2));
    if (nxt == -1 && PyErr_Occurred()) return NULL;
    Longs out = {0};
    PyObject *live = NULL, *items = NULL;
    if (PyObject_TypeCheck(node, (PyTypeObject *)seq_type)) {
        Py_ssize_t i = PyLong_AsSsize_t(arg);
        if ((i == -1 && PyErr_Occurred()) || (items = items_of(node)) == NULL) goto done;
        long rest = c_rest(c, node, items, i + 1, nxt);
        long first = rest == ERR ? ERR : c_add(c, PyTuple_GET_ITEM(items, i), rest);
        if (first == ERR || longs_push(&out, first) < 0) goto done;
    } else if (PyObject_TypeCheck(node, (PyTypeObject *)alt_type)) {
        if ((items = items_of(node)) == NULL) goto done;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); i++) {
            long t = c_add(c, PyTuple_GET_ITEM(items, i), nxt);
            if (t == ERR || longs_push(&out, t) < 0) goto done;
        }
    } else if (PyObject_TypeCheck(node, (PyTypeObject *)repeat_type)) {
        long k = PyLong_AsLong(arg);
        if ((k == -1 && PyErr_Occurred()) || c_repeat_moves(c, node, k, nxt, &out) < 0) goto done;
    } else if (c_dfa_moves(c, node, arg, nxt, &out) < 0) {
        goto done;
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < out.n; i++)
        if (out.v[i] >= 0) out.v[n++] = out.v[i];
    live = packed(out.v, n);
    if (live != NULL && PyList_SetItem(c->eps, s, Py_NewRef(live)) < 0) Py_CLEAR(live);
    if (live != NULL) c->nfa_bytes += (long)sizeof(int) * n;
done:
    Py_XDECREF(items);
    free(out.v);
    return live;
}

/* `NFA.moves` (`moves` 1) or `NFA.edges` (0): a new reference to the epsilon moves or the
 * byte edges of `s`, made now if they were not yet */
static PyObject *c_made(Ctx *c, long s, int moves) {
    PyObject *list = item(moves ? c->eps : c->edges, s);
    if (list == NULL) return NULL;
    if (PyBytes_Check(list)) return Py_NewRef(list);
    if (list == Py_None) return c_unwrap(c, s, moves);
    if (!PyTuple_Check(list) || PyTuple_GET_SIZE(list) != 3) {
        PyErr_Format(PyExc_TypeError, "dfa_rows: NFA state %ld's %s are not packed ints", s,
                     moves ? "moves" : "edges");
        return NULL;
    }
    /* its key, a node's (node, arg, nxt) or a literal run's (node, i, nxt): held while the
     * list it sits in gets the made moves or edges in its place */
    PyObject *key = Py_NewRef(list);
    PyObject *out = moves ? c_node_moves(c, s, key) : c_run_edges(c, s, key);
    Py_DECREF(key);
    return out;
}

static PyObject *c_moves(Ctx *c, long s) { return c_made(c, s, 1); }

static PyObject *c_edges(Ctx *c, long s) { return c_made(c, s, 0); }

/* ---- the lazy DFA (`LazyDFA` methods of the same names) ---- */

/* `NFA.has_edges`: 1, 0, or -1 on error. */
static int has_edges(Ctx *c, long s) {
    while (PyDict_GET_SIZE(c->lifted)) {
        PyObject *lift = get_int_key(c->ints, c->lifted, s);
        if (lift == NULL) {
            if (PyErr_Occurred()) return -1;
            break;
        }
        s = PyLong_AsLong(PyTuple_GET_ITEM(lift, 0));
        if (s == -1 && PyErr_Occurred()) return -1;
    }
    PyObject *e = item(c->edges, s);
    if (e == NULL) return -1;
    return PyTuple_Check(e) || (PyBytes_Check(e) && PyBytes_GET_SIZE(e) > 0); /* a key: a run's */
}

/* `NFA.prune` over `v[0:n]` (in place; returns the new length, -1 on error): the lifted
 * states that another one subsumes are dropped, the rest kept. */
static Py_ssize_t prune(Ctx *c, long *v, Py_ssize_t n) {
    if (PyDict_GET_SIZE(c->lifted) == 0 || PyDict_GET_SIZE(c->order) == 0) return n; /* none */
    PyObject *best = PyDict_New(); /* (state, end, counter) -> (state, count) */
    if (best == NULL) return -1;
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *lift = get_int_key(c->ints, c->lifted, v[i]);
        PyObject *order = NULL;
        if (lift == NULL && PyErr_Occurred()) goto fail;
        if (lift != NULL) {
            order = PyDict_GetItemWithError(c->order, PyTuple_GET_ITEM(lift, 2));
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
            better = PyObject_RichCompareBool(PyTuple_GET_ITEM(order, 1),
                                              PyTuple_GET_ITEM(got, 1), Py_LT);
            if (better < 0) {
                Py_DECREF(key);
                goto fail;
            }
        }
        if (better) {
            PyObject *x = state_int(c->ints, v[i]);
            PyObject *pair = x == NULL ? NULL : PyTuple_Pack(2, x, PyTuple_GET_ITEM(order, 1));
            Py_XDECREF(x);
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
    while (PyDict_Next(best, &pos, &key, &pair)) v[kept++] = PyLong_AsLong(PyTuple_GET_ITEM(pair, 0));
    Py_DECREF(best);
    return kept;
fail:
    Py_DECREF(best);
    return -1;
}

/* `nfa.check()` (the compile deadline or the budget's clock), after charging what was built */
static int check_clock(Ctx *c, PyObject *budget) {
    if (ctx_flush(c, budget) < 0) return -1;
    PyObject *r = call(s_check, &c->nfa, 1);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The closure of `states` (a tuple), and in `*any_text` whether it passes through a state of
 * `NFA.any_text`: `LazyDFA._closure` without its clock check. */
static PyObject *c_closure(Ctx *c, PyObject *budget, PyObject *states, int *any_text) {
    PyObject *out = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(states);
    Longs stack = {0}, found = {0};
    LongSet seen = {0};
    *any_text = 0;
    if (n == 1) { /* a state with no moves is its own closure */
        long s = PyLong_AsLong(PyTuple_GET_ITEM(states, 0));
        if (s == -1 && PyErr_Occurred()) return NULL;
        PyObject *m = item(c->eps, s);
        if (m == NULL) return NULL;
        if (PyBytes_Check(m) && PyBytes_GET_SIZE(m) == 0) {
            int e = has_edges(c, s);
            if (e == 0) e = PyDict_Contains(c->tags, PyTuple_GET_ITEM(states, 0));
            if (e < 0) return NULL;
            return e ? Py_NewRef(states) : PyTuple_New(0);
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
    while (stack.n) {
        if (++c->steps % CHECK_EVERY == 0 && check_clock(c, budget) < 0) goto done;
        long s = stack.v[--stack.n];
        PyObject *m = c_moves(c, s);
        if (m == NULL) goto done;
        for (Py_ssize_t i = 0; i < count_in(m); i++) {
            long t = ints_in(m)[i];
            int added = set_add(&seen, t);
            if (added < 0 || (added && (longs_push(&found, t) < 0 || longs_push(&stack, t) < 0))) {
                Py_DECREF(m);
                goto done;
            }
        }
        Py_DECREF(m);
    }
    for (Py_ssize_t i = 0; i < found.n && !*any_text && PySet_GET_SIZE(c->any_text); i++) {
        PyObject *key = state_int(c->ints, found.v[i]);
        *any_text = key == NULL ? -1 : PySet_Contains(c->any_text, key);
        Py_XDECREF(key);
        if (*any_text < 0) goto done;
    }
    Py_ssize_t kept = 0; /* with edges or a tag, in the order first seen */
    for (Py_ssize_t i = 0; i < found.n; i++) {
        int e = has_edges(c, found.v[i]);
        if (e == 0) {
            PyObject *key = state_int(c->ints, found.v[i]);
            if (key == NULL) goto done;
            e = PyDict_Contains(c->tags, key);
            Py_DECREF(key);
        }
        if (e < 0) goto done;
        if (e) found.v[kept++] = found.v[i];
    }
    kept = prune(c, found.v, kept);
    if (kept < 0) goto done;
    sort_items(found.v, kept, sizeof(long), cmp_long);
    out = tuple_of(c->ints, found.v, kept);
done:
    free(stack.v);
    free(found.v);
    free(seen.slot);
    return out;
}

/* closure(nfa, budget, states, with_any_text=False) -> tuple, or (tuple, bool) with whether
 * it passes through a state that reads any text: `LazyDFA._closure` without its clock check. */
static PyObject *closure(PyObject *self, PyObject *args) {
    PyObject *nfa, *budget, *states;
    int with_any_text = 0, any_text;
    if (!PyArg_ParseTuple(args, "OOO!|p", &nfa, &budget, &PyTuple_Type, &states, &with_any_text))
        return NULL;
    Ctx c;
    if (ctx_load(&c, nfa) < 0) return NULL;
    PyObject *out = c_closure(&c, budget, states, &any_text);
    if (out != NULL && with_any_text) Py_SETREF(out, Py_BuildValue("(OO)", out, any_text ? Py_True : Py_False));
    return ctx_done(&c, budget, out);
}

/* What a row reads of the DFA (`LazyDFA._parts`), or of a grammar automaton's parser states
 * (`GrammarAutomaton._parts`: None for target sets), and of its budget's limits. */
typedef struct {
    PyObject *by_targets, *ids, *sets, *rows, *states, *budget; /* by_targets: NULL if none */
    PyObject *ints; /* the states' shared ints (`state_int`) */
    long max_states, max_state_size; /* LONG_MAX before the budget is bound */
} Table;

static int table_load(Table *d, PyObject *owner) {
    PyObject *parts = PyObject_GetAttr(owner, s_parts), *limits = NULL;
    if (parts == NULL) return -1;
    int ok = PyArg_ParseTuple(parts, "OO!O!O!OOO!", &d->by_targets, &PyDict_Type, &d->ids,
                              &PyList_Type, &d->sets, &PyList_Type, &d->rows, &d->states,
                              &d->budget, &PyList_Type, &d->ints);
    Py_DECREF(parts); /* the owner holds its parts */
    if (ok && d->by_targets == Py_None) {
        d->by_targets = NULL;
    } else if (ok && !PyDict_Check(d->by_targets)) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: target sets are not a dict");
        return -1;
    }
    if (!ok || (limits = PyObject_GetAttr(d->budget, s_limits)) == NULL) return -1;
    untrack(d->ints);
    if (d->by_targets != NULL) untrack_dict(d->by_targets, 0);
    untrack_dict(d->ids, 0);
    d->max_states = d->max_state_size = LONG_MAX;
    if (limits != Py_None) {
        PyObject *a = PyObject_GetAttr(limits, s_max_states);
        PyObject *b = a == NULL ? NULL : PyObject_GetAttr(limits, s_max_state_size);
        if (b != NULL) {
            d->max_states = PyLong_AsLong(a);
            d->max_state_size = PyLong_AsLong(b);
        }
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    Py_DECREF(limits);
    return PyErr_Occurred() ? -1 : 0;
}

/* `StateRows.intern` of closure `key` (`any_text`: it reads any text); a new state within the
 * limits is added here, one that would pass a limit or grow the rows' addresses or the
 * `any_text` flags goes to the Python method. */
static long c_intern(Ctx *c, Table *d, PyObject *key, int any_text) {
    untrack_atoms(key); /* before the Python method may key its dict with it */
    int found;
    long got = get_state(d->ids, key, &found);
    if (found || got == ERR) return got;
    Py_ssize_t n = PyList_GET_SIZE(d->sets);
    PyObject *pointers = PyObject_GetAttr(d->states, s_pointers);
    Py_ssize_t room = pointers == NULL ? -1 : PyObject_Length(pointers);
    Py_XDECREF(pointers);
    if (room < 0) return ERR;
    Py_buffer flags = {0};
    if (any_text) {
        PyObject *array = PyObject_GetAttr(d->states, s_any_text);
        int bad = array == NULL || PyObject_GetBuffer(array, &flags, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0;
        Py_XDECREF(array); /* the buffer holds it */
        if (bad) return ERR;
    }
    if (PyTuple_GET_SIZE(key) > d->max_state_size || n + 1 > d->max_states || n == room ||
        (any_text && n >= flags.len)) {
        if (any_text) PyBuffer_Release(&flags);
        PyObject *args[] = {d->states, key, any_text ? Py_True : Py_False};
        return state_from(call(s_intern, args, 3));
    }
    if (any_text) {
        ((uint8_t *)flags.buf)[n] = 1;
        PyBuffer_Release(&flags);
    }
    if (set_state(d->ints, d->ids, key, n) < 0 || PyList_Append(d->sets, key) < 0 ||
        PyList_Append(d->rows, Py_None) < 0)
        return ERR;
    c->table_bytes += tuple_base + tuple_item * PyTuple_GET_SIZE(key) + 2 * entry_bytes;
    return n;
}

/* `LazyDFA._target_id` of the target set `v[0:n]` (sorted): its DFA id, -1 when its closure is
 * empty, ERR on error. One target is keyed by its int, several by their tuple. */
static long c_target_id(Ctx *c, Table *d, const long *v, Py_ssize_t n) {
    PyObject *key = n == 1 ? state_int(c->ints, v[0]) : tuple_of(c->ints, v, n);
    PyObject *targets = NULL, *ck;
    if (key == NULL) return ERR;
    int found;
    long got = get_state(d->by_targets, key, &found);
    if (found || got == ERR) goto done;
    targets = n == 1 ? tuple_of(c->ints, v, 1) : Py_NewRef(key);
    int any_text;
    if (targets == NULL || (ck = c_closure(c, d->budget, targets, &any_text)) == NULL) {
        got = ERR;
        goto done;
    }
    if (PyTuple_GET_SIZE(ck) > 0) got = c_intern(c, d, ck, any_text);
    Py_DECREF(ck);
    if (got != ERR && set_state(d->ints, d->by_targets, key, got) < 0) got = ERR;
    if (got != ERR) c->table_bytes += entry_bytes + (n == 1 ? 0 : tuple_base + tuple_item * n);
done:
    Py_XDECREF(targets);
    Py_DECREF(key);
    return got;
}

static void fill(int32_t *row, long a, long b, long id) {
    for (long i = a; i < b; i++) row[i] = (int32_t)id;
}

/* The row of the DFA state whose NFA set is `states` into `row` (all -1): 0, or -1 on error. */
static int c_fill_row(Ctx *c, Table *d, PyObject *states, int32_t *row) {
    int ok = -1;
    Edge *e = NULL;
    Py_ssize_t ne = 0, cap = 0;
    long *points = NULL, *active_t = NULL, *active_n = NULL, *key = NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(states); i++) {
        long s = PyLong_AsLong(PyTuple_GET_ITEM(states, i));
        if (s == -1 && PyErr_Occurred()) goto done;
        PyObject *list = c_edges(c, s);
        if (list == NULL) goto done;
        const int *v = ints_in(list);
        for (Py_ssize_t j = 0; j < count_in(list) / 3; j++) {
            if (ne == cap) {
                cap = cap ? 2 * cap : 32;
                Edge *grown = realloc(e, cap * sizeof(Edge));
                if (grown == NULL) {
                    Py_DECREF(list);
                    PyErr_NoMemory();
                    goto done;
                }
                e = grown;
            }
            e[ne].lo = v[3 * j];
            e[ne].hi = v[3 * j + 1];
            e[ne].t = v[3 * j + 2];
            ne++;
        }
        Py_DECREF(list);
    }
    if (PyErr_Occurred()) goto done;
    sort_items(e, ne, sizeof(Edge), cmp_edge);
    int overlap = 0;
    for (Py_ssize_t i = 1; i < ne && !overlap; i++) overlap = e[i - 1].hi >= e[i].lo;
    if (!overlap) { /* no two edges share a byte: one target each */
        for (Py_ssize_t i = 0; i < ne; i++) {
            long id = c_target_id(c, d, &e[i].t, 1);
            if (id == ERR) goto done;
            fill(row, e[i].lo, e[i].hi + 1, id);
        }
        ok = 0;
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
    sort_items(points, 2 * ne, sizeof(long), cmp_long);
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
        sort_items(key, na, sizeof(long), cmp_long);
        long id = c_target_id(c, d, key, na);
        if (id == ERR) goto done;
        fill(row, a, points[p + 1], id);
    }
    ok = 0;
done:
    free(e);
    free(points);
    free(active_t);
    free(active_n);
    free(key);
    return ok;
}

/* fill_row(dfa, nfa, states, row): `LazyDFA._compute_row` of the state whose NFA set is
 * `states`, into `row` (an int32[256] buffer, all -1). */
static PyObject *fill_row(PyObject *self, PyObject *args) {
    PyObject *dfa, *nfa, *states;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "OOO!w*", &dfa, &nfa, &PyTuple_Type, &states, &buf)) return NULL;
    if (buf.len != 256 * (Py_ssize_t)sizeof(int32_t)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "fill_row: the row must be an int32[256] buffer");
        return NULL;
    }
    Table d;
    if (table_load(&d, dfa) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Ctx c;
    PyObject *out = NULL;
    if (ctx_load(&c, nfa) == 0) {
        if (c_fill_row(&c, &d, states, buf.buf) == 0) out = Py_NewRef(Py_None);
        out = ctx_done(&c, d.budget, out);
    }
    PyBuffer_Release(&buf);
    return out;
}

/* The targets of row `r` other than its least when that is dead (negative), in increasing
 * order, into `sorted` (their number returned); each byte's index among them into `inv` (-1
 * for the dead target). Rows have few targets, in runs of equal bytes: the distinct ones in
 * the order met, then sorted by insertion with their ranks; no comparator calls. */
static int row_groups(const int32_t *r, int32_t *inv, long *sorted) {
    long values[256];
    int met[256], rank[256], order[256], n = 0;
    for (int b = 0; b < 256; b++) {
        if (b > 0 && r[b] == r[b - 1]) {
            met[b] = met[b - 1];
            continue;
        }
        int j = 0;
        while (j < n && values[j] != r[b]) j++;
        if (j == n) values[n++] = r[b];
        met[b] = j;
    }
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && values[order[j - 1]] > values[i]; j--) order[j] = order[j - 1];
        order[j] = i;
    }
    for (int i = 0; i < n; i++) {
        rank[order[i]] = i;
        sorted[i] = values[order[i]];
    }
    int first = sorted[0] < 0; /* the dead target is not a group */
    for (int b = 0; b < 256; b++) inv[b] = rank[met[b]] - first;
    if (first) memmove(sorted, sorted + 1, (n - 1) * sizeof(long));
    return n - first;
}

/* ---- a context-free grammar's parser rows (`cfg.GrammarAutomaton._compute_row`) ---- */

/* Lexicographic order of two columns of `n` codes (-1, dead, first). */
static int cmp_codes(const int32_t *a, const int32_t *b, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

/* The union of the successor sets `succ[code]` (sorted tuples of parser elements) of the codes
 * in column `col` that are not -1, sorted, as a new tuple: one set is itself; none, (). */
static PyObject *union_of(PyObject *succ, const int32_t *col, Py_ssize_t n) {
    PyObject *only = NULL, *set = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (col[i] < 0) continue;
        PyObject *t = PyList_GET_ITEM(succ, col[i]);
        if (!PyTuple_Check(t)) {
            PyErr_SetString(PyExc_TypeError, "dfa_rows: a successor set is not a tuple");
            Py_XDECREF(set);
            return NULL;
        }
        if (only == NULL) {
            only = t;
            continue;
        }
        if (set == NULL && (set = PySet_New(only)) == NULL) return NULL;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(t); j++)
            if (PySet_Add(set, PyTuple_GET_ITEM(t, j)) < 0) {
                Py_DECREF(set);
                return NULL;
            }
    }
    if (set == NULL) return only == NULL ? PyTuple_New(0) : Py_NewRef(only);
    PyObject *list = PySequence_List(set), *out = NULL;
    Py_DECREF(set);
    if (list != NULL && PyList_Sort(list) == 0) out = PyList_AsTuple(list);
    Py_XDECREF(list);
    return out;
}

/* Whether parser state `elems` reads any text (`GrammarAutomaton._intern`): one of its (node,
 * lex, fresh) elements' lexer states has the lexer's `any_text` flag (`flags`, the lexer's
 * array when the row began: states made since count as not flagged). 1, 0, or -1 on error. */
static int elems_any_text(const Py_buffer *flags, PyObject *elems) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(elems); k++) {
        PyObject *elem = PyTuple_GET_ITEM(elems, k);
        if (!PyTuple_Check(elem) || PyTuple_GET_SIZE(elem) != 3) {
            PyErr_SetString(PyExc_TypeError, "dfa_rows: a parser element is not (node, lex, fresh)");
            return -1;
        }
        long lex = PyLong_AsLong(PyTuple_GET_ITEM(elem, 1));
        if (lex == -1 && PyErr_Occurred()) return -1;
        if (lex >= 0 && lex < flags->len && ((const uint8_t *)flags->buf)[lex]) return 1;
    }
    return 0;
}

/* `c_intern` of parser state `elems`, with its `elems_any_text` */
static long c_intern_elems(Ctx *c, Table *d, PyObject *elems, const Py_buffer *flags) {
    int any_text = elems_any_text(flags, elems);
    return any_text < 0 ? ERR : c_intern(c, d, elems, any_text);
}

/* Writes into `row` (int32[256]) the parser row whose elements' lexer rows give, per byte, the
 * codes `cols[b * n + k]` (element k's live target's index plus its offset into `succ`; -1:
 * dead): each distinct column of codes, in increasing order as the Python code interns them,
 * becomes the state of the union of the successor sets it names (a column of dead codes, -1),
 * flagged from the lexer's `any_text` (`flags`). 0, or -1 on error. */
static int c_columns_row(Ctx *c, Table *d, const int32_t *cols, Py_ssize_t n, PyObject *succ,
                         const Py_buffer *flags, int32_t *row) {
    if (n == 1) { /* one element (most rows): its codes are the columns, each code's set a state */
        Py_ssize_t k = PyList_GET_SIZE(succ);
        long *ids = malloc((k ? k : 1) * sizeof(long));
        if (ids == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            int32_t code = (int32_t)i;
            PyObject *key = union_of(succ, &code, 1);
            ids[i] = key == NULL ? ERR : PyTuple_GET_SIZE(key) == 0 ? -1 : c_intern_elems(c, d, key, flags);
            Py_XDECREF(key);
            if (ids[i] == ERR) {
                free(ids);
                return -1;
            }
        }
        for (int b = 0; b < 256; b++) row[b] = cols[b] < 0 ? -1 : (int32_t)ids[cols[b]];
        free(ids);
        return 0;
    }
    int group[256], reps[256], order[256], ng = 0;
    for (int b = 0; b < 256; b++) { /* the distinct columns in the order met; runs are common */
        if (b > 0 && cmp_codes(cols + b * n, cols + (b - 1) * n, n) == 0) {
            group[b] = group[b - 1];
            continue;
        }
        int g = 0;
        while (g < ng && cmp_codes(cols + b * n, cols + reps[g] * n, n) != 0) g++;
        if (g == ng) reps[ng++] = b;
        group[b] = g;
    }
    for (int i = 0; i < ng; i++) {
        int j = i;
        for (; j > 0 && cmp_codes(cols + reps[order[j - 1]] * n, cols + reps[i] * n, n) > 0; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    long ids[256];
    for (int i = 0; i < ng; i++) {
        int g = order[i];
        PyObject *key = union_of(succ, cols + reps[g] * n, n);
        if (key == NULL) return -1;
        ids[g] = PyTuple_GET_SIZE(key) == 0 ? -1 : c_intern_elems(c, d, key, flags);
        Py_DECREF(key);
        if (ids[g] == ERR) return -1;
    }
    for (int b = 0; b < 256; b++) row[b] = (int32_t)ids[group[b]];
    return 0;
}

/* ((node, v, False),): the successors of lexer target `v` inside a lexeme of Earley set `node`
 * (a new tuple) */
static PyObject *inside_successors(PyObject *ints, PyObject *node, long v) {
    PyObject *x = state_int(ints, v), *elem = x == NULL ? NULL : PyTuple_Pack(3, node, x, Py_False);
    PyObject *out = elem == NULL ? NULL : PyTuple_Pack(1, elem);
    Py_XDECREF(x);
    Py_XDECREF(elem);
    return out;
}

#define DEAD_GROUP 255 /* a uint8 inverse's byte for the dead target (`c_lex_groups`) */

/* Byte `b`'s index among the `num_live` live targets of a uint8 inverse, -1 for the dead one:
 * with all 256 bytes live and apart no byte is dead, and DEAD_GROUP is the last index. */
static int32_t group_of(const uint8_t *inverse, int b, Py_ssize_t num_live) {
    return inverse[b] == DEAD_GROUP && num_live < 256 ? -1 : inverse[b];
}

typedef struct Loaded Loaded;
static int dfa_row(PyObject *dfa, long state, PyObject **pointers_out, Loaded *l);

/* What `dfa_row` reads of an automaton before a row: its table (`_parts`), and the NFA's parts
 * for a regex DFA (`nfa` NULL for a grammar automaton's parser states); for a grammar
 * automaton also its lexer groups (`_groups`), its lexer and what the lexer's rows load (made
 * on first use): a walk's rows load each once, not once per row. */
struct Loaded {
    PyObject *dfa, *nfa; /* new references; `dfa` NULL: nothing loaded */
    Table d;             /* borrowed from `dfa`'s parts */
    Ctx c;               /* its `parts` held */
    PyObject *groups, *lexer; /* new references; NULL for a regex DFA */
    Loaded *lexer_rows;       /* NULL until the lexer makes a row */
};

static void loaded_clear(Loaded *l) {
    ctx_release(&l->c);
    Py_XDECREF(l->nfa);
    Py_XDECREF(l->dfa);
    Py_XDECREF(l->groups);
    Py_XDECREF(l->lexer);
    if (l->lexer_rows != NULL) {
        loaded_clear(l->lexer_rows);
        free(l->lexer_rows);
    }
    memset(l, 0, sizeof(*l));
}

/* `l` loaded from `dfa` (what it held let go): 0, or -1 with the error set and `l` empty */
static int loaded_set(Loaded *l, PyObject *dfa) {
    loaded_clear(l);
    int ok = table_load(&l->d, dfa);
    if (ok == 0 && l->d.by_targets != NULL) {
        ok = (l->nfa = PyObject_GetAttr(dfa, s_nfa)) == NULL ? -1 : ctx_load(&l->c, l->nfa);
    } else if (ok == 0) {
        ok = (l->groups = PyObject_GetAttr(dfa, s_groups)) == NULL ||
             (l->lexer = PyObject_GetAttr(dfa, s_lexer)) == NULL ? -1 : 0;
        if (ok == 0 && !PyDict_Check(l->groups)) {
            PyErr_SetString(PyExc_TypeError, "dfa_rows: _groups is not a dict");
            ok = -1;
        }
    }
    if (ok < 0) {
        loaded_clear(l);
        return -1;
    }
    l->dfa = Py_NewRef(dfa);
    return 0;
}

/* `LazyDFA.tags(v)` of the lexer loaded in `lx`, kept in its `_tags` (`kept`, a dict) as the
 * Python method keeps them and charged to `c`: the tags of lexer state v's accepting NFA
 * states, a borrowed tuple (the dict holds it), NULL on error. */
static PyObject *lex_tags(Ctx *c, Loaded *lx, PyObject *kept, long v) {
    PyObject *key = state_int(lx->d.ints, v), *got = NULL;
    if (key == NULL) return NULL;
    got = PyDict_GetItemWithError(kept, key);
    if (got == NULL && !PyErr_Occurred()) {
        PyObject *set = PyList_GetItem(lx->d.sets, v), *found = PyList_New(0), *t = NULL;
        for (Py_ssize_t j = 0; set != NULL && found != NULL && j < PyTuple_GET_SIZE(set); j++) {
            PyObject *tag = PyDict_GetItemWithError(lx->c.tags, PyTuple_GET_ITEM(set, j));
            if (tag != NULL ? PyList_Append(found, tag) < 0 : PyErr_Occurred() != NULL) Py_CLEAR(found);
        }
        if (set != NULL && found != NULL && (t = PyList_AsTuple(found)) != NULL) {
            untrack_atoms(t);
            if (PyDict_SetItem(kept, key, t) == 0) {
                got = t; /* the dict holds it */
                c->table_bytes += tuple_base + tuple_item * PyTuple_GET_SIZE(t) + entry_bytes;
            }
        }
        Py_XDECREF(found);
        Py_XDECREF(t);
    }
    Py_DECREF(key);
    return got;
}

/* The grammar automaton's lexer loaded in `l->lexer_rows` (made on first use); NULL on error. */
static Loaded *lexer_loaded(Loaded *l) {
    if (l->lexer_rows == NULL && (l->lexer_rows = calloc(1, sizeof(Loaded))) == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    Loaded *lx = l->lexer_rows;
    return lx->dfa != l->lexer && loaded_set(lx, l->lexer) < 0 ? NULL : lx;
}

/* `GrammarAutomaton._lex_groups(lex)`'s entry, made in C: the lexer's row (`dfa_row` when not
 * made yet), its byte groups (`row_groups`) and whether none of its live targets ends a
 * terminal, each target's tags read until one does and kept in the lexer's `_tags` as
 * `LazyDFA.tags` keeps them; the bytes charged to `c` as the Python methods charge them. A new
 * (live, inverse, inside) tuple, NULL on error. The inverse is the bytes of a uint8[256]
 * (`group_of` reads it), not the Python method's int32[256]: Python's small-object allocator
 * makes it, where 1 KB goes to malloc and new pages. Charged as the Python method charges it. */
static PyObject *c_lex_groups(Ctx *c, Loaded *l, long lex) {
    PyObject *lexer = l->lexer, *pointers = NULL, *kept = NULL, *live = NULL;
    PyObject *inverse = NULL, *out = NULL;
    Py_buffer at = {0};
    Loaded *lx = lexer_loaded(l);
    if (lx == NULL) return NULL;
    Table d = lx->d;
    PyObject *made = PyList_GetItem(d.rows, lex); /* borrowed */
    if (made == NULL || (made == Py_None && dfa_row(lexer, lex, NULL, lx) < 0) ||
        (pointers = PyObject_GetAttr(d.states, s_pointers)) == NULL ||
        PyObject_GetBuffer(pointers, &at, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (at.len < (Py_ssize_t)((lex + 1) * sizeof(int64_t)) || ((int64_t *)at.buf)[lex] == 0) {
        PyErr_SetString(PyExc_IndexError, "dfa_rows: a lexer row without an address");
        goto done;
    }
    const int32_t *row = (const int32_t *)(intptr_t)((int64_t *)at.buf)[lex];
    int32_t inv[256];
    long sorted[256];
    int n = row_groups(row, inv, sorted), inside = 1;
    if ((kept = PyObject_GetAttr(lexer, s_tags_kept)) == NULL || !PyDict_Check(kept)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "dfa_rows: a lexer's tags are not dicts");
        goto done;
    }
    for (int i = 0; i < n && inside; i++) {
        PyObject *got = lex_tags(c, lx, kept, sorted[i]);
        if (got == NULL) goto done;
        inside = PyTuple_GET_SIZE(got) == 0;
    }
    uint8_t small[256];
    for (int b = 0; b < 256; b++) small[b] = inv[b] < 0 ? DEAD_GROUP : (uint8_t)inv[b];
    if ((live = tuple_of(d.ints, sorted, n)) == NULL ||
        (inverse = PyBytes_FromStringAndSize((const char *)small, sizeof(small))) == NULL)
        goto done;
    untrack_atoms(live);
    out = PyTuple_Pack(3, live, inverse, inside ? Py_True : Py_False);
    if (out != NULL) {
        untrack_atoms(out);
        c->table_bytes += (long)sizeof(inv) + 8 * n + entry_bytes;
    }
done:
    if (at.obj != NULL) PyBuffer_Release(&at);
    Py_XDECREF(pointers);
    Py_XDECREF(kept);
    Py_XDECREF(live);
    Py_XDECREF(inverse);
    return out;
}

/* `GrammarAutomaton._compute_row` of parser state `state` into `row`: per element (Earley set
 * `node`, lexer state `lex`, ...), its lexer row's byte groups (`_groups`, `c_lex_groups` when
 * missing) and each live target's successors (the same Earley set
 * reading on where no target ends a terminal, else the Python method `_successors`), then one
 * state per distinct column of codes (`c_columns_row`). 0, or -1 on error. */
static int c_parser_fill(Loaded *l, long state, int32_t *row) {
    Ctx *c = &l->c;
    Table *d = &l->d;
    PyObject *automaton = l->dfa, *groups = l->groups, *succ = NULL;
    PyObject *elems = PyList_GetItem(d->sets, state);
    Py_buffer *bufs = NULL;
    int32_t *cols = NULL;
    Py_ssize_t n = 0, have = 0;
    int ok = -1;
    if (elems == NULL || !PyTuple_Check(elems)) {
        if (elems != NULL) PyErr_SetString(PyExc_TypeError, "dfa_rows: a parser state is not a tuple");
        return -1;
    }
    Py_ssize_t size = PyTuple_GET_SIZE(elems);
    if ((succ = PyList_New(0)) == NULL || (bufs = calloc(size ? size : 1, sizeof(Py_buffer))) == NULL ||
        (cols = malloc(256 * (size ? size : 1) * sizeof(int32_t))) == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < size; k++) {
        PyObject *elem = PyTuple_GET_ITEM(elems, k);
        if (!PyTuple_Check(elem) || PyTuple_GET_SIZE(elem) != 3) {
            PyErr_SetString(PyExc_TypeError, "dfa_rows: a parser element is not (node, lex, fresh)");
            goto done;
        }
        PyObject *node = PyTuple_GET_ITEM(elem, 0), *lex = PyTuple_GET_ITEM(elem, 1);
        long lex_n = PyLong_AsLong(lex);
        if (lex_n == -1 && PyErr_Occurred()) goto done;
        if (lex_n < 0) continue;
        /* held while the parser is called back (`_successors`), whatever it does to `_groups` */
        PyObject *made = Py_XNewRef(PyDict_GetItemWithError(groups, lex)), *g = made;
        if (g == NULL) {
            if (PyErr_Occurred() || (made = c_lex_groups(c, l, lex_n)) == NULL ||
                PyDict_SetItem(groups, lex, made) < 0) {
                Py_XDECREF(made);
                goto done;
            }
            g = made;
        }
        PyObject *live = PyTuple_Check(g) && PyTuple_GET_SIZE(g) == 3 ? PyTuple_GET_ITEM(g, 0) : NULL;
        int inside = live == NULL ? -1 : PyObject_IsTrue(PyTuple_GET_ITEM(g, 2));
        if (live == NULL || !PyTuple_Check(live) || inside < 0 ||
            PyObject_GetBuffer(PyTuple_GET_ITEM(g, 1), &bufs[n], PyBUF_C_CONTIGUOUS) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "dfa_rows: a lexer row's groups are not (live, inverse, inside)");
            Py_XDECREF(made);
            goto done;
        }
        have = n + 1;
        long offset = PyList_GET_SIZE(succ);
        int bad = bufs[n].len != 256;
        for (int b = 0; !bad && b < 256; b++) {
            const int32_t g = group_of(bufs[n].buf, b, PyTuple_GET_SIZE(live));
            bad = g >= PyTuple_GET_SIZE(live);
            cols[b * size + n] = g < 0 ? -1 : (int32_t)(g + offset);
        }
        for (Py_ssize_t i = 0; !bad && i < PyTuple_GET_SIZE(live); i++) {
            long v = PyLong_AsLong(PyTuple_GET_ITEM(live, i));
            PyObject *out = NULL;
            if (v == -1 && PyErr_Occurred()) {
                bad = 1;
            } else if (inside) {
                out = inside_successors(d->ints, node, v);
            } else {
                PyObject *args[] = {automaton, node, PyTuple_GET_ITEM(live, i)};
                out = call(s_successors, args, 3);
            }
            if (!bad && (out == NULL || PyList_Append(succ, out) < 0)) bad = 1;
            Py_XDECREF(out);
        }
        Py_XDECREF(made);
        if (bad) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "dfa_rows: a lexer row's groups do not fit");
            goto done;
        }
        n++;
    }
    if (n == 0) {
        ok = 0; /* all dead, as the row starts */
    } else {
        if (n < size) /* the columns are `size` wide: narrow them to the `n` elements read */
            for (int b = 0; b < 256; b++) memmove(cols + b * n, cols + b * size, n * sizeof(int32_t));
        PyObject *lex_states = PyObject_GetAttr(l->lexer, s_states);
        PyObject *array = lex_states == NULL ? NULL : PyObject_GetAttr(lex_states, s_any_text);
        Py_buffer flags = {0};
        if (array != NULL && PyObject_GetBuffer(array, &flags, PyBUF_C_CONTIGUOUS) == 0) {
            ok = c_columns_row(c, d, cols, n, succ, &flags, row);
            PyBuffer_Release(&flags);
        }
        Py_XDECREF(array);
        Py_XDECREF(lex_states);
    }
done:
    for (Py_ssize_t k = 0; k < have; k++) PyBuffer_Release(&bufs[k]);
    free(bufs);
    free(cols);
    Py_XDECREF(succ);
    return ok;
}

/* cfg_row(automaton, state, row): `GrammarAutomaton._compute_row` (`c_parser_fill`) into `row`
 * (an int32[256] buffer of -1s). */
static PyObject *cfg_row(PyObject *self, PyObject *args) {
    PyObject *automaton, *out = NULL;
    long state;
    Py_buffer row;
    if (!PyArg_ParseTuple(args, "Olw*", &automaton, &state, &row)) return NULL;
    Loaded l = {0};
    if (row.len != 256 * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "cfg_row: the row must be an int32[256] buffer");
    } else if (loaded_set(&l, automaton) == 0) {
        if (l.d.by_targets != NULL) PyErr_SetString(PyExc_TypeError, "cfg_row: not a grammar automaton");
        else if (c_parser_fill(&l, state, row.buf) == 0) out = Py_NewRef(Py_None);
        out = ctx_settle(&l.c, l.d.budget, out);
    }
    loaded_clear(&l);
    PyBuffer_Release(&row);
    return out;
}

/* byte_groups(row, inverse): the targets of `row` (an int32[256] buffer) other than its least
 * when that is dead (negative), in increasing order, as a tuple; each byte's index among them
 * written to `inverse` (int32[256]; -1 for the dead target). `LazyDFA.byte_groups`'s twin of
 * numpy's `unique(row, return_inverse=True)`, which costs ten times more on 256 values. */
static PyObject *byte_groups(PyObject *self, PyObject *args) {
    Py_buffer row, inverse;
    if (!PyArg_ParseTuple(args, "y*w*", &row, &inverse)) return NULL;
    PyObject *out = NULL;
    if (row.len != 256 * (Py_ssize_t)sizeof(int32_t) || inverse.len != row.len) {
        PyErr_SetString(PyExc_ValueError, "byte_groups: rows must be int32[256] buffers");
    } else {
        long sorted[256];
        int n = row_groups(row.buf, inverse.buf, sorted);
        out = tuple_of(NULL, sorted, n);
    }
    PyBuffer_Release(&row);
    PyBuffer_Release(&inverse);
    return out;
}

/* configure(Chars, Seq, Alt, Repeat, Dfa, Ref, sequences, spelled, max_nfa_states,
 * state_bytes, edge_bytes, entry_bytes, tuple_base, tuple_item, row_bytes): what the module
 * reads of `regex_ir`, `nfa`, `states` and `sys.getsizeof`. */
static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *t[8];
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!OOlllllll", &PyType_Type, &t[0], &PyType_Type,
                          &t[1], &PyType_Type, &t[2], &PyType_Type, &t[3], &PyType_Type, &t[4],
                          &PyType_Type, &t[5], &t[6], &t[7], &max_nfa_states, &state_bytes,
                          &edge_bytes, &entry_bytes, &tuple_base, &tuple_item, &row_bytes))
        return NULL;
    PyObject **slot[] = {&chars_type, &seq_type, &alt_type,     &repeat_type,
                         &dfa_type,   &ref_type, &sequences_fn, &spelled_fn};
    for (int i = 0; i < 8; i++) Py_XSETREF(*slot[i], Py_NewRef(t[i]));
    Py_RETURN_NONE;
}

/* ---- the trie walk's row callback (`native_walk`) ---- */

/* `budget.check_time()`, its Python method called only when the clock is past the running
 * call's end (to raise its error): 0, or -1 with the error set. */
static int check_time(PyObject *budget) {
    double end, now;
    if (double_attr(budget, s_end, &end) < 0) return -1;
    if (isinf(end)) return 0; /* no call is timed */
    PyObject *t = PyObject_CallNoArgs(perf_counter);
    now = t == NULL ? -1.0 : PyFloat_AsDouble(t);
    Py_XDECREF(t);
    if (now == -1.0 && PyErr_Occurred()) return -1;
    if (now <= end) return 0;
    PyObject *r = PyObject_CallMethodNoArgs(budget, s_check_time);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* `StateRows.row` of `state` with `LazyDFA._compute_row` (`fill_row`) of `dfa`, or with a
 * grammar automaton's `_compute_row` (`c_parser_fill`) where `dfa` is one, the steps of both
 * without their Python frames, for the trie walk: the clock checked,
 * the row written into the next free row of the states' block (a new block from
 * `StateRows._new_block` when it is full; the row is taken before it is written, as there), the
 * row's bytes charged, (block, index) kept in `_rows` for `StateRows.row` to view, and its
 * address put in `pointers` (the array handed to `*pointers_out` when that is not NULL). What it
 * loads of `dfa` is kept in `l` (a walk's rows of one automaton load it once). 0, or -1 with
 * the error set. */
static int dfa_row(PyObject *dfa, long state, PyObject **pointers_out, Loaded *l) {
    PyObject *block = NULL, *r = NULL;
    Py_buffer rows = {0}, pointers = {0};
    int ok = -1;
    if (l->dfa != dfa && loaded_set(l, dfa) < 0) goto done;
    Table d = l->d;
    Ctx *c = &l->c;
    PyObject *states = d.states;
    int parser = d.by_targets == NULL; /* a grammar automaton's parser states */
    c->steps = c->nfa_bytes = c->table_bytes = 0;
    PyObject *set = PyList_GetItem(d.sets, state); /* borrowed */
    if (set == NULL || !PyTuple_Check(set)) {
        if (set != NULL) PyErr_SetString(PyExc_TypeError, "dfa_rows: a DFA state is not a tuple");
        goto done;
    }
    if (check_time(d.budget) < 0) goto done;
    long next;
    int none;
    if (long_attr(states, s_next, &next, &none) < 0 || (block = PyObject_GetAttr(states, s_block)) == NULL ||
        PyObject_GetBuffer(block, &rows, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (next == rows.len / (Py_ssize_t)(256 * sizeof(int32_t))) { /* full: the next block */
        PyBuffer_Release(&rows);
        Py_CLEAR(block);
        if ((r = PyObject_CallMethodNoArgs(states, s_new_block)) == NULL ||
            (block = PyObject_GetAttr(states, s_block)) == NULL ||
            PyObject_GetBuffer(block, &rows, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        next = 0;
    }
    if ((r = PyLong_FromLong(next + 1)) == NULL || PyObject_SetAttr(states, s_next, r) < 0) goto done;
    Py_CLEAR(r);
    int32_t *row = (int32_t *)rows.buf + 256 * next;
    memset(row, 0xff, 256 * sizeof(int32_t)); /* -1s: blocks are left as allocated */
    int made = parser ? c_parser_fill(l, state, row) : c_fill_row(c, &d, set, row);
    PyObject *filled = made == 0 ? Py_NewRef(Py_None) : NULL;
    if (filled != NULL) c->table_bytes += row_bytes;
    if ((filled = ctx_settle(c, d.budget, filled)) == NULL) goto done;
    Py_DECREF(filled);
    PyObject *where = Py_BuildValue("(Ol)", block, next), *p = NULL;
    if (where == NULL) goto done;
    untrack_atoms(where); /* an array and an int: no reference cycle runs through it */
    if (PyList_SetItem(d.rows, state, where) < 0 || (p = PyObject_GetAttr(states, s_pointers)) == NULL ||
        PyObject_GetBuffer(p, &pointers, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_XDECREF(p);
        goto done;
    }
    if (pointers_out != NULL) *pointers_out = Py_NewRef(p);
    Py_DECREF(p); /* the states hold it */
    if (pointers.len < (Py_ssize_t)((state + 1) * sizeof(int64_t))) {
        PyErr_SetString(PyExc_IndexError, "dfa_rows: a state past the rows' addresses");
        goto done;
    }
    ((int64_t *)pointers.buf)[state] = (int64_t)(intptr_t)row;
    ok = 0;
done:
    if (rows.obj != NULL) PyBuffer_Release(&rows);
    if (pointers.obj != NULL) PyBuffer_Release(&pointers);
    Py_XDECREF(r);
    Py_XDECREF(block);
    return ok;
}

/* The running walk's automaton (and what holds its rows when the walk makes them here, `dfa_row`), its
 * rows' addresses (held while the walk reads them) and the first error of a callback; per
 * thread: each thread's walk has its own. */
static _Thread_local PyObject *walk_automaton, *walk_dfa, *walk_rows, *walk_error;
static _Thread_local Loaded walk_loaded; /* what the walk's rows loaded of `walk_dfa` */
/* begun, not ended, on any thread: changed with the GIL held, read without it too (`wait_idle`),
 * hence atomically */
static long walks_running;

/* Keeps the raised error (if any) as the walk's first (`end_walk` returns it). */
static void keep_walk_error(void) {
    if (!PyErr_Occurred()) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
    if (walk_error == NULL && value != NULL) walk_error = Py_NewRef(value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* trie_walk.c's `fill`: computes `state`'s row (`dfa_row`, else `automaton.row(state)`) and
 * returns the rows' addresses as they are now (`automaton.row_pointers()`) with their number
 * in `*num_rows`, or 0 with the error kept for `end_walk`. `native_walk` calls the walk with the
 * GIL held (PyDLL); the callback takes it all the same, so that any caller's walk is right. */
static int64_t walk_fill(int32_t state, int64_t *num_rows) {
    PyGILState_STATE gil = PyGILState_Ensure();
    int64_t out = 0;
    PyObject *rows = NULL;
    if (walk_dfa != NULL) {
        if (dfa_row(walk_dfa, state, &rows, &walk_loaded) < 0) Py_CLEAR(rows);
    } else {
        PyObject *s = PyLong_FromLong(state), *r = NULL;
        if (s != NULL) r = PyObject_CallMethodOneArg(walk_automaton, s_row, s);
        if (r != NULL) rows = PyObject_CallMethodNoArgs(walk_automaton, s_row_pointers);
        Py_XDECREF(s);
        Py_XDECREF(r);
    }
    Py_buffer buf;
    if (rows != NULL && PyObject_GetBuffer(rows, &buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
        if (buf.itemsize == 8 && buf.format != NULL && (buf.format[0] == 'q' || buf.format[0] == 'l')) {
            *num_rows = buf.len / 8;
            out = (int64_t)(intptr_t)buf.buf;
            Py_XSETREF(walk_rows, Py_NewRef(rows)); /* the address stays valid while held */
        } else {
            PyErr_SetString(PyExc_TypeError, "row_pointers() must be a contiguous int64 array");
        }
        PyBuffer_Release(&buf);
    }
    Py_XDECREF(rows);
    if (out == 0) keep_walk_error();
    PyGILState_Release(gil);
    return out;
}

/* ---- the walk's pairs (trie_walk.c's `lexer_side`): a grammar automaton's lexer rows ---- */

static _Thread_local PyObject *walk_lex_rows; /* the lexer rows' addresses the walk reads, held */

/* The running walk's grammar automaton, loaded (`walk_loaded`); NULL with an error if the walk's
 * automaton is not one whose rows C makes. */
static Loaded *walk_grammar(void) {
    if (walk_dfa == NULL || (walk_loaded.dfa != walk_dfa && loaded_set(&walk_loaded, walk_dfa) < 0))
        return NULL;
    if (walk_loaded.lexer == NULL) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: a walk's pairs need a grammar automaton");
        return NULL;
    }
    return &walk_loaded;
}

/* `lexer_side.single`: the lexer state of parser state `state` when it has one element (its
 * Earley set in `*node`), -1 when not, -2 on error. */
static int32_t side_single(int32_t state, int32_t *node) {
    PyGILState_STATE gil = PyGILState_Ensure();
    int32_t out = -2;
    Loaded *l = walk_grammar();
    PyObject *elems = l == NULL ? NULL : PyList_GetItem(l->d.sets, state), *elem;
    if (elems != NULL && !PyTuple_Check(elems)) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: a parser state is not a tuple");
    } else if (elems != NULL && PyTuple_GET_SIZE(elems) != 1) {
        out = -1;
    } else if (elems != NULL) {
        elem = PyTuple_GET_ITEM(elems, 0);
        long set = -1, lex = -1;
        if (!PyTuple_Check(elem) || PyTuple_GET_SIZE(elem) != 3) {
            PyErr_SetString(PyExc_TypeError, "dfa_rows: a parser element is not (node, lex, fresh)");
        } else if (((set = PyLong_AsLong(PyTuple_GET_ITEM(elem, 0))) != -1 || !PyErr_Occurred()) &&
                   ((lex = PyLong_AsLong(PyTuple_GET_ITEM(elem, 1))) != -1 || !PyErr_Occurred())) {
            *node = (int32_t)set;
            out = lex < 0 || set < 0 || lex > INT32_MAX || set > INT32_MAX ? -1 : (int32_t)lex;
        }
    }
    if (out == -2) keep_walk_error();
    PyGILState_Release(gil);
    return out;
}

/* `lexer_side.lex_fill`: makes lexer state `lex`'s row where it is not made, then returns the
 * lexer rows' addresses and their number (`*num_rows`); 0 on error. */
static int64_t side_lex_fill(int32_t lex, int64_t *num_rows) {
    PyGILState_STATE gil = PyGILState_Ensure();
    int64_t out = 0;
    Loaded *l = walk_grammar(), *lx = l == NULL ? NULL : lexer_loaded(l);
    PyObject *made = lx == NULL ? NULL : PyList_GetItem(lx->d.rows, lex), *rows = NULL;
    if (made == Py_None) {
        if (dfa_row(l->lexer, lex, &rows, lx) < 0) Py_CLEAR(rows);
    } else if (made != NULL) {
        rows = PyObject_GetAttr(lx->d.states, s_pointers);
    }
    Py_buffer buf;
    if (rows != NULL && PyObject_GetBuffer(rows, &buf, PyBUF_C_CONTIGUOUS) == 0) {
        *num_rows = buf.len / 8;
        out = (int64_t)(intptr_t)buf.buf;
        Py_XSETREF(walk_lex_rows, Py_NewRef(rows)); /* the address stays valid while held */
        PyBuffer_Release(&buf);
    }
    Py_XDECREF(rows);
    if (out == 0) keep_walk_error();
    PyGILState_Release(gil);
    return out;
}

/* Whether lexer state `lex` ends a terminal (`LazyDFA.tags`): 1, 0, or -1 on error. */
static int lexer_ends(Loaded *l, long lex) {
    Loaded *lx = lexer_loaded(l);
    PyObject *kept = lx == NULL ? NULL : PyObject_GetAttr(l->lexer, s_tags_kept), *tags = NULL;
    if (kept != NULL && PyDict_Check(kept)) {
        l->c.nfa_bytes = l->c.table_bytes = 0;
        tags = ctx_settle(&l->c, l->d.budget, Py_XNewRef(lex_tags(&l->c, lx, kept, lex)));
    } else if (kept != NULL) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: a lexer's tags are not dicts");
    }
    Py_XDECREF(kept);
    const int out = tags == NULL ? -1 : PyTuple_GET_SIZE(tags) > 0;
    Py_XDECREF(tags);
    return out;
}

/* `lexer_side.ends` */
static int side_ends(int32_t lex) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Loaded *l = walk_grammar();
    const int out = l == NULL ? -1 : lexer_ends(l, lex);
    if (out < 0) keep_walk_error();
    PyGILState_Release(gil);
    return out;
}

/* `lexer_side.state_of`: the parser state of the pair (Earley set `node`, lexer state `lex`),
 * as a parser row would make it from the element (node, lex'): the successors of `lex` there
 * (`GrammarAutomaton._successors` where it ends a terminal, else the element itself) interned;
 * -1 for none, -2 on error. */
static int32_t side_state_of(int32_t node, int32_t lex) {
    PyGILState_STATE gil = PyGILState_Ensure();
    long out = ERR;
    Loaded *l = walk_grammar();
    const int ends = l == NULL ? -1 : lexer_ends(l, lex);
    PyObject *set = ends < 0 ? NULL : PyLong_FromLong(node), *key = NULL;
    PyObject *lex_states = NULL, *array = NULL;
    Py_buffer flags = {0};
    if (set != NULL && !ends) {
        key = inside_successors(l->d.ints, set, lex);
    } else if (set != NULL) {
        PyObject *v = PyLong_FromLong(lex);
        PyObject *args[] = {l->dfa, set, v};
        key = v == NULL ? NULL : call(s_successors, args, 3);
        Py_XDECREF(v);
    }
    if (key != NULL && !PyTuple_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "dfa_rows: successors are not a tuple");
    } else if (key != NULL && PyTuple_GET_SIZE(key) == 0) {
        out = -1;
    } else if (key != NULL && (lex_states = PyObject_GetAttr(l->lexer, s_states)) != NULL &&
               (array = PyObject_GetAttr(lex_states, s_any_text)) != NULL &&
               PyObject_GetBuffer(array, &flags, PyBUF_C_CONTIGUOUS) == 0) {
        l->c.nfa_bytes = l->c.table_bytes = 0;
        out = c_intern_elems(&l->c, &l->d, key, &flags);
        PyBuffer_Release(&flags);
        if (ctx_flush(&l->c, l->d.budget) < 0) out = ERR;
    }
    Py_XDECREF(set);
    Py_XDECREF(key);
    Py_XDECREF(lex_states);
    Py_XDECREF(array);
    if (out > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "dfa_rows: a parser state past int32");
        out = ERR;
    }
    if (out == ERR) keep_walk_error();
    PyGILState_Release(gil);
    return out == ERR ? -2 : (int32_t)out;
}

/* `lexer_side.any_text`: whether every string of text can be read from lexer state `lex` (the
 * lexer's `any_text` flags): 1, 0, or -1 on error. */
static int side_any_text(int32_t lex) {
    PyGILState_STATE gil = PyGILState_Ensure();
    int out = -1;
    Loaded *l = walk_grammar(), *lx = l == NULL ? NULL : lexer_loaded(l);
    PyObject *array = lx == NULL ? NULL : PyObject_GetAttr(lx->d.states, s_any_text);
    Py_buffer flags;
    if (array != NULL && PyObject_GetBuffer(array, &flags, PyBUF_C_CONTIGUOUS) == 0) {
        out = lex < flags.len && ((const uint8_t *)flags.buf)[lex];
        PyBuffer_Release(&flags);
    }
    Py_XDECREF(array);
    if (out < 0) keep_walk_error();
    PyGILState_Release(gil);
    return out;
}

struct lexer_side { /* trie_walk.c's */
    int32_t (*single)(int32_t state, int32_t *node);
    int64_t (*lex_fill)(int32_t lex, int64_t *num_rows);
    int (*ends)(int32_t lex);
    int32_t (*state_of)(int32_t node, int32_t lex);
    int (*any_text)(int32_t lex);
};
static const struct lexer_side walk_side = {side_single, side_lex_fill, side_ends, side_state_of,
                                            side_any_text};

/* begin_walk(automaton, rows, dfa) -> (the address of `walk_fill`, of `walk_side` or 0): the
 * walk about to run on this thread reads `rows` (automaton.row_pointers()) and calls back for
 * the rows it lacks, which `dfa_row` makes when `dfa` (`automaton.native_rows`: a regex
 * automaton's LazyDFA, a grammar automaton itself) is not None; for a grammar automaton the
 * walk steps through its lexer's rows as pairs (`walk_side`, trie_walk.c's `lexer_side`). */
static PyObject *begin_walk(PyObject *self, PyObject *args) {
    PyObject *automaton, *rows, *dfa;
    if (!PyArg_ParseTuple(args, "OOO", &automaton, &rows, &dfa)) return NULL;
    Py_XSETREF(walk_automaton, Py_NewRef(automaton));
    Py_XSETREF(walk_dfa, dfa == Py_None ? NULL : Py_NewRef(dfa));
    Py_XSETREF(walk_rows, Py_NewRef(rows));
    Py_CLEAR(walk_error);
    loaded_clear(&walk_loaded);
    __atomic_add_fetch(&walks_running, 1, __ATOMIC_RELAXED);
    const int grammar = dfa != Py_None && PyObject_HasAttr(dfa, s_lexer);
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)walk_fill),
                         PyLong_FromVoidPtr(grammar ? (void *)&walk_side : NULL));
}

/* end_walk() -> the first error a callback of this thread's walk met, or None; lets go of the
 * walk's automaton and rows. */
static PyObject *end_walk(PyObject *self, PyObject *unused) {
    if (walk_automaton != NULL) __atomic_sub_fetch(&walks_running, 1, __ATOMIC_RELAXED);
    Py_CLEAR(walk_automaton);
    Py_CLEAR(walk_dfa);
    Py_CLEAR(walk_rows);
    Py_CLEAR(walk_lex_rows);
    loaded_clear(&walk_loaded);
    PyObject *error = walk_error;
    walk_error = NULL;
    return error != NULL ? error : Py_NewRef(Py_None);
}

/* walks_running() -> the number of trie walks begun and not yet ended, on all threads, and of
 * mask fills and compiles held (`hold_busy`). */
static PyObject *walks(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(__atomic_load_n(&walks_running, __ATOMIC_RELAXED));
}

/* hold_busy() / release_busy(): a mask fill or a compile begins / ends (`reaper.busy`), counted
 * with the walks, so that the reaper takes no slice in its Python parts either (a fill's copy
 * into the caller's row, a compile's numpy parts let go of the GIL). */
static PyObject *hold_busy(PyObject *self, PyObject *unused) {
    __atomic_add_fetch(&walks_running, 1, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

static PyObject *release_busy(PyObject *self, PyObject *unused) {
    __atomic_sub_fetch(&walks_running, 1, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

/* forget_running(): counts none, in a child after a fork (its only thread was not in any). */
static PyObject *forget_running(PyObject *self, PyObject *unused) {
    __atomic_store_n(&walks_running, 0, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

/* wait_idle(pause_s): returns once no walk, fill or compile runs, looking every `pause_s`
 * seconds without the GIL. A thread that looked with it (the reaper) would be waiting for the
 * GIL whenever the busy thread let go of it, and take it from that thread each time. */
static PyObject *wait_idle(PyObject *self, PyObject *arg) {
    double pause = PyFloat_AsDouble(arg);
    if (pause == -1.0 && PyErr_Occurred()) return NULL;
    if (!(pause > 0.0 && pause < 1.0)) {
        PyErr_SetString(PyExc_ValueError, "wait_idle: the pause must be between 0 and 1 second");
        return NULL;
    }
    struct timespec step = {0, (long)(pause * 1e9)};
    Py_BEGIN_ALLOW_THREADS
    while (__atomic_load_n(&walks_running, __ATOMIC_RELAXED) > 0) nanosleep(&step, NULL);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "The IR classes, helpers and costs the rows use."},
    {"begin_walk", begin_walk, METH_VARARGS, "Set up the row callback of a trie walk."},
    {"untrack_ir", untrack_ir, METH_O, "Take a regex IR graph out of the collector's sight."},
    {"holds_ref", (PyCFunction)(void (*)(void))holds_ref, METH_FASTCALL,
     "Whether a regex IR node holds a Ref (cfg._has_ref)."},
    {"untrack_made", untrack_made, METH_O, "Take an NFA's compile-time entries out of it."},
    {"untrack_lists", untrack_lists, METH_VARARGS, "Take lists of atoms out of it."},
    {"derivable", derivable, METH_VARARGS, "cfg._derivable: productive or nullable nonterminals."},
    {"earley_closure", earley_closure, METH_VARARGS, "cfg.EarleyParser._closure's new set."},
    {"untracked", untracked, METH_O, "A tuple of atoms, out of the collector's sight."},
    {"end_walk", end_walk, METH_NOARGS, "End a trie walk: its callback's error or None."},
    {"walks_running", walks, METH_NOARGS, "Trie walks running, and fills and compiles held."},
    {"hold_busy", hold_busy, METH_NOARGS, "A mask fill or compile begins: the reaper waits."},
    {"release_busy", release_busy, METH_NOARGS, "A mask fill or compile ends."},
    {"wait_idle", wait_idle, METH_O, "Wait without the GIL until no walk, fill or compile runs."},
    {"forget_running", forget_running, METH_NOARGS, "Count no walk, fill or compile (after fork)."},
    {"closure", closure, METH_VARARGS, "LazyDFA.closure of a tuple of NFA states."},
    {"fill_row", fill_row, METH_VARARGS, "LazyDFA._compute_row into an int32[256] buffer."},
    {"byte_groups", byte_groups, METH_VARARGS, "LazyDFA.byte_groups of an int32[256] row."},
    {"cfg_row", cfg_row, METH_VARARGS, "GrammarAutomaton._compute_row into an int32[256] buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dfa_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit_dfa_rows(void) {
    const char *names[] = {"items", "item", "ranges", "facts", "tail", "_parts", "charge", "nbytes",
                           "new_state", "add",
                           "check", "dead", "intern", "counted", "spell", "live", "hi",
                           "lo", "table", "start", "accepting", "moves", "shortest", "longest",
                           "row", "row_pointers", "limits", "max_states", "max_state_size",
                           "pointers", "states", "nfa", "_block", "_next", "_new_block",
                           "check_time", "_end", "_cap", "_groups", "lexer", "_successors", "_tags",
                           "reads_any_text", "any_text"};
    PyObject **slots[] = {&s_items, &s_item, &s_ranges, &s_facts, &s_tail, &s_parts,
                          &s_charge, &s_nbytes, &s_new_state, &s_add, &s_check, &s_dead, &s_intern, &s_counted,
                          &s_spell, &s_live, &s_hi, &s_lo, &s_table, &s_start,
                          &s_accepting, &s_moves, &s_shortest, &s_longest, &s_row,
                          &s_row_pointers, &s_limits, &s_max_states, &s_max_state_size,
                          &s_pointers, &s_states, &s_nfa, &s_block, &s_next, &s_new_block,
                          &s_check_time, &s_end, &s_cap, &s_groups, &s_lexer, &s_successors, &s_tags_kept,
                          &s_reads_any_text, &s_any_text};
    for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    if (!(empty = PyBytes_FromStringAndSize(NULL, 0)) || !(zero = PyLong_FromLong(0))) return NULL;
    PyObject *time = PyImport_ImportModule("time");
    perf_counter = time == NULL ? NULL : PyObject_GetAttrString(time, "perf_counter");
    Py_XDECREF(time);
    if (perf_counter == NULL) return NULL;
    return PyModule_Create(&module);
}
