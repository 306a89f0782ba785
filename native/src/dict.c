/* dict_reduce: the group-by of a block whose one key column is dictionary-encoded (Parquet's
 * string columns, decoded with read_dictionary): rows are grouped by their index into the
 * dictionary, so no key is hashed or compared.
 *
 *   dict_reduce(indices, indices_valid, offset, length, ndict, columns)
 *
 * indices: int32 buffer; indices_valid: its validity bitmap or None; offset: the array's offset
 * (into both); columns: per value column (values float64 buffer or None for a column only
 * counted, validity bitmap or None, offset, the figures wanted: 1 sum, 2 min, 4 max, or'ed; the
 * others are left as they began: 0, +inf, -inf). Groups 0..ndict-1 are the dictionary's entries,
 * group ndict the rows whose key is null. Answers (count_all, ((count, sum, min, max) | (count,),
 * ...)), each an int64 or float64 array of ndict + 1 as bytes; or None when an index is out of
 * range or a value is NaN (the caller then groups the block with Arrow, which decides). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fold.h"

#define DICT_MAX_COLUMNS 64
#define TILE 4096 /* rows whose group ids are held at once */

typedef struct {
    Py_buffer values, valid;
    int has_values, has_valid, want;
    Py_ssize_t offset;
    int64_t *count;
    double *sum, *min, *max;
} DictColumn;

static inline int bit(const unsigned char *bits, Py_ssize_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

/* Group ids (ndict for a null key) and count_all; 0 when an index is out of range. */
static int group_ids(const int32_t *idx, const unsigned char *valid, Py_ssize_t offset, Py_ssize_t n,
                     int32_t ndict, int32_t *ids, int64_t *count_all) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t g = idx[offset + i];
        if (valid && !bit(valid, offset + i)) g = ndict;
        else if ((uint32_t)g >= (uint32_t)ndict) return 0;
        ids[i] = g;
        count_all[g]++;
    }
    return 1;
}

/* Rows [i, end) folded; `want` is a constant where it is called, so each figure not wanted costs
 * nothing (a store a row each otherwise, the loop's bound). */
static inline __attribute__((always_inline)) int fold_rows(const int32_t *ids, const double *v,
                                                           const unsigned char *valid, Py_ssize_t off,
                                                           Py_ssize_t i, Py_ssize_t end, Fold *f, const int want) {
    int nan = 0;
    for (; i < end; i++) {
        if (valid && !bit(valid, off + i)) continue;
        nan |= fold_value(&f[ids[i]], v[i], want);
    }
    return nan;
}

/* Rows 64 at a time by their validity word: a word of valid rows is folded without a test a row. */
static inline __attribute__((always_inline)) int fold_as(const int32_t *ids, const double *v,
                                                         const unsigned char *valid, Py_ssize_t off, Py_ssize_t n,
                                                         Fold *f, const int want) {
    int nan = 0;
    for (Py_ssize_t i = 0; i < n; i += 64) {
        Py_ssize_t end = i + 64 < n ? i + 64 : n;
        int all = !valid;
        if (valid && ((off + i) & 7) == 0 && end - i == 64) {
            uint64_t word;
            memcpy(&word, valid + ((off + i) >> 3), 8);
            all = word == ~(uint64_t)0;
        }
        nan |= all ? fold_rows(ids, v, NULL, off, i, end, f, want) : fold_rows(ids, v, valid, off, i, end, f, want);
    }
    return nan;
}

/* One column's count and its wanted figures per group; 0 when a value is NaN. */
static int fold_column(const int32_t *ids, Py_ssize_t start, Py_ssize_t n, DictColumn *c, Fold *f) {
    const unsigned char *valid = c->has_valid ? (const unsigned char *)c->valid.buf : NULL;
    Py_ssize_t off = c->offset + start;
    if (!c->has_values) {
        for (Py_ssize_t i = 0; i < n; i++)
            if (!valid || bit(valid, off + i)) f[ids[i]].count++;
        return 1;
    }
    const double *v = (const double *)c->values.buf + off;
    int nan;
    switch (c->want) {
    case WANT_SUM: nan = fold_as(ids, v, valid, off, n, f, WANT_SUM); break;
    case WANT_MIN: nan = fold_as(ids, v, valid, off, n, f, WANT_MIN); break;
    case WANT_MAX: nan = fold_as(ids, v, valid, off, n, f, WANT_MAX); break;
    default: nan = fold_as(ids, v, valid, off, n, f, WANT_SUM | WANT_MIN | WANT_MAX); break;
    }
    return !nan;
}

/* The folds written out as the column's count, sum, min and max arrays. */
static void unfold(const Fold *f, Py_ssize_t groups, DictColumn *c) {
    for (Py_ssize_t g = 0; g < groups; g++) {
        c->count[g] = f[g].count;
        if (c->has_values) c->sum[g] = f[g].sum, c->min[g] = f[g].min, c->max[g] = f[g].max;
    }
}

static PyObject *answer(int64_t *count_all, DictColumn *cols, Py_ssize_t ncols, Py_ssize_t groups) {
    PyObject *out_cols = PyTuple_New(ncols), *out = NULL;
    if (!out_cols) return NULL;
    for (Py_ssize_t j = 0; j < ncols; j++) {
        DictColumn *c = &cols[j];
        PyObject *col = c->has_values
                            ? Py_BuildValue("(y#y#y#y#)", (const char *)c->count, groups * 8, (const char *)c->sum,
                                            groups * 8, (const char *)c->min, groups * 8, (const char *)c->max,
                                            groups * 8)
                            : Py_BuildValue("(y#)", (const char *)c->count, groups * 8);
        if (!col) goto done;
        PyTuple_SET_ITEM(out_cols, j, col);
    }
    out = Py_BuildValue("(y#O)", (const char *)count_all, groups * 8, out_cols);
done:
    Py_DECREF(out_cols);
    return out;
}

PyObject *dict_reduce(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer indices = {0}, ivalid = {0};
    PyObject *ivalid_obj, *columns;
    Py_ssize_t offset, length;
    int ndict;
    if (!PyArg_ParseTuple(args, "y*OnniO!", &indices, &ivalid_obj, &offset, &length, &ndict, &PyTuple_Type,
                          &columns))
        return NULL;
    PyObject *result = NULL;
    DictColumn cols[DICT_MAX_COLUMNS];
    Py_ssize_t ncols = PyTuple_GET_SIZE(columns), ready = 0;
    int32_t *ids = NULL;
    int64_t *count_all = NULL;
    Fold *folds = NULL;
    int has_ivalid = ivalid_obj != Py_None;
    memset(cols, 0, sizeof(cols));
    if (ncols > DICT_MAX_COLUMNS || ndict < 0 || offset < 0 || length < 0 ||
        (offset + length) * 4 > indices.len) {
        PyErr_SetString(PyExc_ValueError, "dict_reduce: bad arguments");
        goto done;
    }
    if (has_ivalid && PyObject_GetBuffer(ivalid_obj, &ivalid, PyBUF_SIMPLE) < 0) {
        has_ivalid = 0;
        goto done;
    }
    if (has_ivalid && (offset + length + 7) / 8 > ivalid.len) {
        PyErr_SetString(PyExc_ValueError, "dict_reduce: the keys' validity bitmap is too short");
        goto done;
    }
    Py_ssize_t groups = (Py_ssize_t)ndict + 1;
    while (ready < ncols) {
        PyObject *values, *valid, *spec = PyTuple_GET_ITEM(columns, ready);
        DictColumn *c = &cols[ready++]; /* released at done, whatever it holds */
        if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "OOni", &values, &valid, &c->offset, &c->want)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "dict_reduce: a column is not a tuple");
            goto done;
        }
        if (values != Py_None) {
            if (PyObject_GetBuffer(values, &c->values, PyBUF_SIMPLE) < 0) goto done;
            c->has_values = 1;
        }
        if (valid != Py_None) {
            if (PyObject_GetBuffer(valid, &c->valid, PyBUF_SIMPLE) < 0) goto done;
            c->has_valid = 1;
        }
        if (c->has_valid && (c->offset < 0 || (c->offset + length + 7) / 8 > c->valid.len)) {
            PyErr_SetString(PyExc_ValueError, "dict_reduce: a validity bitmap is too short");
            goto done;
        }
        c->count = (int64_t *)malloc((size_t)groups * 8);
        if (c->has_values) {
            c->sum = (double *)malloc((size_t)groups * 8);
            c->min = (double *)malloc((size_t)groups * 8);
            c->max = (double *)malloc((size_t)groups * 8);
        }
        if (!c->count || (c->has_values && (!c->sum || !c->min || !c->max))) {
            PyErr_NoMemory();
            goto done;
        }
        if (c->has_values) {
            if (c->offset < 0 || (c->offset + length) * 8 > c->values.len) {
                PyErr_SetString(PyExc_ValueError, "dict_reduce: a values buffer is too short");
                goto done;
            }
        }
    }
    ids = (int32_t *)malloc(TILE * 4);
    count_all = (int64_t *)calloc((size_t)groups, 8);
    folds = (Fold *)malloc((size_t)(groups * (ncols ? ncols : 1)) * sizeof(Fold));
    if (!ids || !count_all || !folds) {
        PyErr_NoMemory();
        goto done;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t g = 0; g < groups * ncols; g++) folds[g] = (Fold){0, 0.0, INFINITY, -INFINITY};
    ok = 1;
    /* a tile of rows at a time: its group ids stay in L1 while each column folds them */
    for (Py_ssize_t start = 0; ok && start < length; start += TILE) {
        Py_ssize_t n = length - start < TILE ? length - start : TILE;
        ok = group_ids((const int32_t *)indices.buf, has_ivalid ? (const unsigned char *)ivalid.buf : NULL,
                       offset + start, n, (int32_t)ndict, ids, count_all);
        for (Py_ssize_t j = 0; ok && j < ncols; j++) ok = fold_column(ids, start, n, &cols[j], folds + j * groups);
    }
    for (Py_ssize_t j = 0; ok && j < ncols; j++) unfold(folds + j * groups, groups, &cols[j]);
    Py_END_ALLOW_THREADS;
    if (!ok) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    result = answer(count_all, cols, ncols, groups);
done:
    for (Py_ssize_t j = 0; j < ready && j < DICT_MAX_COLUMNS; j++) {
        DictColumn *c = &cols[j];
        if (c->has_values) PyBuffer_Release(&c->values);
        if (c->has_valid) PyBuffer_Release(&c->valid);
        free(c->count), free(c->sum), free(c->min), free(c->max);
    }
    free(ids), free(count_all), free(folds);
    if (has_ivalid) PyBuffer_Release(&ivalid);
    PyBuffer_Release(&indices);
    return result;
}
