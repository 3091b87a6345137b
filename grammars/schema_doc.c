/* A JSON Schema document's canonical copy and its structure numbers in C, with
 * `json_schema_resolve.canonical_schema` and `SchemaResolver.key` as the Python twins they stand
 * for: the same copy (the same objects shared where the document shares them) and the same
 * numbers, asked for in the same order (`json_schema_resolve.schema_doc` loads this module).
 *
 * Both recurse, where the twins keep a stack of their own: `canonical` at most `max_depth`
 * containers deep (the document's limit), `key` at most KEY_DEPTH. Past either, `TooDeep` is
 * raised and the caller runs the twin, which names the limit or goes on where C stops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define KEY_DEPTH 1000 /* nested containers `key` follows before leaving the rest to the twin */

enum kind { SCHEMA = 0, MAP = 1, DATA = 2 }; /* as canonical_schema's "schema", "map", "data" */

static PyObject *TooDeep;

typedef struct {
    PyObject *done;      /* (id << 2 | kind) -> the node's copy */
    PyObject *name_maps; /* keywords whose value maps names to schemas */
    PyObject *data;      /* keywords whose value is data, left as written */
    long max_depth;
} Canon;

static int is_container(PyObject *obj) { return PyDict_Check(obj) || PyList_Check(obj); }

/* The kind of a schema object's member named `name`, or -1 with an exception. */
static int member_kind(Canon *c, PyObject *name) {
    int in = PySet_Contains(c->name_maps, name);
    if (in != 0)
        return in < 0 ? -1 : MAP;
    in = PySet_Contains(c->data, name);
    if (in != 0)
        return in < 0 ? -1 : DATA;
    return SCHEMA;
}

static PyObject *canon(Canon *c, PyObject *node, int kind, long depth);

/* A schema object's copy: its members sorted by name, each copied by its kind. */
static PyObject *canon_schema_object(Canon *c, PyObject *node, long depth) {
    PyObject *items = PyList_New(0), *out = NULL, *name, *value;
    Py_ssize_t pos = 0;
    if (items == NULL)
        return NULL;
    while (PyDict_Next(node, &pos, &name, &value)) {
        int kind = member_kind(c, name);
        if (kind < 0)
            goto done;
        PyObject *copy = kind == DATA ? Py_NewRef(value) : canon(c, value, kind, depth + 1);
        if (copy == NULL)
            goto done;
        PyObject *pair = PyTuple_Pack(2, name, copy);
        Py_DECREF(copy);
        if (pair == NULL || PyList_Append(items, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
    }
    if (PyList_Sort(items) < 0) /* as sorted() of the pairs: names are unique */
        goto done;
    out = PyDict_New();
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *pair = PyList_GET_ITEM(items, i);
        if (PyDict_SetItem(out, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    Py_DECREF(items);
    return out;
}

/* A name map's copy: its names in order, each value a schema. */
static PyObject *canon_map(Canon *c, PyObject *node, long depth) {
    PyObject *out = PyDict_New(), *name, *value;
    Py_ssize_t pos = 0;
    if (out == NULL)
        return NULL;
    while (PyDict_Next(node, &pos, &name, &value)) {
        PyObject *copy = canon(c, value, SCHEMA, depth + 1);
        if (copy == NULL || PyDict_SetItem(out, name, copy) < 0) {
            Py_XDECREF(copy);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(copy);
    }
    return out;
}

/* `node`'s canonical copy (a new reference), made once per (node, kind). */
static PyObject *canon(Canon *c, PyObject *node, int kind, long depth) {
    if (!is_container(node))
        return Py_NewRef(node);
    PyObject *key = PyLong_FromUnsignedLongLong(((unsigned long long)(uintptr_t)node << 2) | kind);
    if (key == NULL)
        return NULL;
    PyObject *out = PyDict_GetItemWithError(c->done, key);
    if (out != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        return Py_XNewRef(out);
    }
    if (depth > c->max_depth) {
        Py_DECREF(key);
        PyErr_SetNone(TooDeep);
        return NULL;
    }
    if (PyList_Check(node)) {
        Py_ssize_t n = PyList_GET_SIZE(node);
        out = PyList_New(n);
        for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
            PyObject *copy = canon(c, PyList_GET_ITEM(node, i), kind, depth + 1);
            if (copy == NULL)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, i, copy);
        }
    } else {
        out = kind == MAP ? canon_map(c, node, depth) : canon_schema_object(c, node, depth);
    }
    if (out != NULL && PyDict_SetItem(c->done, key, out) < 0)
        Py_CLEAR(out);
    Py_DECREF(key);
    return out;
}

static PyObject *canonical(PyObject *self, PyObject *args) {
    Canon c;
    PyObject *schema;
    if (!PyArg_ParseTuple(args, "OO!O!l", &schema, &PyFrozenSet_Type, &c.name_maps,
                          &PyFrozenSet_Type, &c.data, &c.max_depth))
        return NULL;
    c.done = PyDict_New();
    if (c.done == NULL)
        return NULL;
    PyObject *out = canon(&c, schema, SCHEMA, 0);
    Py_DECREF(c.done);
    return out;
}

/* The values of a dict or list as a new list, read as the twin reads them (`item.values()`,
 * iteration), and a dict's names as a tuple (`tuple(item)`; NULL for a list). */
static PyObject *values_of(PyObject *item, PyObject **names) {
    *names = NULL;
    if (PyList_CheckExact(item))
        return PyList_GetSlice(item, 0, PyList_GET_SIZE(item));
    if (PyList_Check(item))
        return PySequence_List(item);
    *names = PySequence_Tuple(item);
    if (*names == NULL)
        return NULL;
    PyObject *values = PyDict_CheckExact(item) ? PyDict_Values(item)
                                               : PyObject_CallMethod(item, "values", NULL);
    PyObject *out = values == NULL ? NULL : PySequence_List(values);
    Py_XDECREF(values);
    if (out == NULL)
        Py_CLEAR(*names);
    return out;
}

/* The number of `item` (a dict or list) as a new reference, numbering what it holds first,
 * last value first, as the twin's stack does. */
static PyObject *key_of(PyObject *item, PyObject *keys, PyObject *number, int depth) {
    PyObject *id = PyLong_FromVoidPtr(item);
    if (id == NULL)
        return NULL;
    PyObject *got = PyDict_GetItemWithError(keys, id);
    if (got != NULL || PyErr_Occurred()) {
        Py_DECREF(id);
        return got == NULL ? NULL : Py_NewRef(PyTuple_GET_ITEM(got, 1));
    }
    if (depth > KEY_DEPTH) {
        Py_DECREF(id);
        PyErr_SetNone(TooDeep);
        return NULL;
    }
    PyObject *names, *parts = NULL, *shape = NULL, *out = NULL;
    PyObject *values = values_of(item, &names);
    if (values == NULL)
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(values);
    parts = PyTuple_New(n);
    if (parts == NULL)
        goto done;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        PyObject *value = PyList_GET_ITEM(values, i), *part;
        if (is_container(value)) {
            part = key_of(value, keys, number, depth + 1);
        } else {
            part = PyTuple_Pack(2, (PyObject *)Py_TYPE(value), value);
        }
        if (part == NULL)
            goto done;
        PyTuple_SET_ITEM(parts, i, part);
    }
    shape = PyTuple_Pack(2, names == NULL ? Py_None : names, parts);
    if (shape == NULL)
        goto done;
    out = PyObject_CallOneArg(number, shape);
    if (out == NULL)
        goto done;
    PyObject *entry = PyTuple_Pack(2, item, out);
    if (entry == NULL || PyDict_SetItem(keys, id, entry) < 0)
        Py_CLEAR(out);
    Py_XDECREF(entry);
done:
    Py_DECREF(id);
    Py_XDECREF(names);
    Py_XDECREF(values);
    Py_XDECREF(parts);
    Py_XDECREF(shape);
    return out;
}

static PyObject *key(PyObject *self, PyObject *args) {
    PyObject *node, *keys, *number;
    if (!PyArg_ParseTuple(args, "OO!O", &node, &PyDict_Type, &keys, &number))
        return NULL;
    if (!is_container(node)) {
        PyErr_SetString(PyExc_TypeError, "key: a dict or a list");
        return NULL;
    }
    return key_of(node, keys, number, 0);
}

static PyMethodDef methods[] = {
    {"canonical", canonical, METH_VARARGS,
     "canonical(schema, name_maps, data, max_depth): the canonical copy (TooDeep past the depth)."},
    {"key", key, METH_VARARGS,
     "key(node, keys, number): node's structure number, recording every container's in keys."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "schema_doc", NULL, -1, methods};

PyMODINIT_FUNC PyInit_schema_doc(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    TooDeep = PyErr_NewException("schema_doc.TooDeep", NULL, NULL);
    if (TooDeep == NULL || PyModule_AddObjectRef(m, "TooDeep", TooDeep) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
