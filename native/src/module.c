/* aggkernel: one-pass CSV / JSON-lines group-by of a block of whole records, off the GIL.
 *
 * Each function returns None when the block holds anything its fast path does not answer
 * exactly as the Python path would (the caller then parses the block there, which also names
 * what is wrong), or the block's partial aggregates:
 *
 *   (rows, groups, count_all, keys, values[, seen, line_breaks])
 *
 * count_all: int64 per group (bytes); keys: per group column (offsets int32 [groups + 1],
 * UTF-8 data, validity bitmap or None, null count); values: per value column (count int64,
 * sum, min, max float64, validity bitmap or None, null count), the validity being count > 0;
 * seen (JSON lines): bit i set when needed column i occurs as a key in the block; line_breaks
 * (JSON lines): the block's \n, blank lines' included. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "scan.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static PyObject *bytes_of(const void *p, size_t n) {
    return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
}

static PyObject *validity(const unsigned char *valid, size_t n, size_t nulls) {
    if (!nulls) Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((n + 7) / 8));
    if (!out) return NULL;
    unsigned char *bits = (unsigned char *)PyBytes_AS_STRING(out);
    memset(bits, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++)
        if (valid[i]) bits[i / 8] |= (unsigned char)(1u << (i % 8));
    return out;
}

static PyObject *key_column(const AggTable *t, int k) {
    size_t g = t->ngroups, total = 0, nulls = 0;
    int32_t *offsets = (int32_t *)malloc((g + 1) * sizeof(int32_t));
    unsigned char *valid = (unsigned char *)malloc(g ? g : 1);
    char *data = (char *)malloc(t->arena_used ? t->arena_used : 1);
    PyObject *out = NULL;
    if (!offsets || !valid || !data) {
        PyErr_NoMemory();
        goto done;
    }
    offsets[0] = 0;
    for (size_t i = 0; i < g; i++) {
        const char *p = t->arena + t->key_off[i];
        for (int j = 0;; j++) {
            uint32_t len;
            memcpy(&len, p + 1, 4);
            if (j == k) {
                valid[i] = (unsigned char)(p[0] != 0);
                nulls += !p[0];
                memcpy(data + total, p + 5, len);
                total += len;
                break;
            }
            p += 5 + len;
        }
        offsets[i + 1] = (int32_t)total;
    }
    out = Py_BuildValue("(NNNn)", bytes_of(offsets, (g + 1) * sizeof(int32_t)), bytes_of(data, total),
                        validity(valid, g, nulls), (Py_ssize_t)nulls);
done:
    free(offsets);
    free(valid);
    free(data);
    return out;
}

static PyObject *value_column(const AggTable *t, int v) {
    size_t g = t->ngroups, nulls = 0;
    int64_t *count = (int64_t *)malloc((g ? g : 1) * sizeof(int64_t));
    double *sum = (double *)malloc((g ? g : 1) * sizeof(double));
    double *min = (double *)malloc((g ? g : 1) * sizeof(double));
    double *max = (double *)malloc((g ? g : 1) * sizeof(double));
    unsigned char *valid = (unsigned char *)malloc(g ? g : 1);
    PyObject *out = NULL;
    if (!count || !sum || !min || !max || !valid) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < g; i++) {
        const AggStat *st = &t->stats[i * (size_t)t->nvalues + (size_t)v];
        count[i] = st->count;
        sum[i] = st->sum;
        min[i] = st->count ? st->min : 0.0;
        max[i] = st->count ? st->max : 0.0;
        valid[i] = (unsigned char)(st->count > 0);
        nulls += st->count == 0;
    }
    out = Py_BuildValue("(NNNNNn)", bytes_of(count, g * 8), bytes_of(sum, g * 8), bytes_of(min, g * 8),
                        bytes_of(max, g * 8), validity(valid, g, nulls), (Py_ssize_t)nulls);
done:
    free(count);
    free(sum);
    free(min);
    free(max);
    free(valid);
    return out;
}

static PyObject *result(const AggTable *t, int64_t rows) {
    PyObject *keys = PyList_New(t->nkeys), *values = PyList_New(t->nvalues);
    if (!keys || !values) goto fail;
    for (int k = 0; k < t->nkeys; k++) {
        PyObject *col = key_column(t, k);
        if (!col) goto fail;
        PyList_SET_ITEM(keys, k, col);
    }
    for (int v = 0; v < t->nvalues; v++) {
        PyObject *col = value_column(t, v);
        if (!col) goto fail;
        PyList_SET_ITEM(values, v, col);
    }
    return Py_BuildValue("(LnNNN)", (long long)rows, (Py_ssize_t)t->ngroups,
                         bytes_of(t->rows, t->ngroups * 8), keys, values);
fail:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    return NULL;
}

/* Arguments shared by both functions, held while the scan runs. */
typedef struct {
    Py_buffer data;
    int keys[SCAN_MAX_COLUMNS], values[SCAN_MAX_COLUMNS], numeric[SCAN_MAX_COLUMNS];
    const char *names[SCAN_MAX_COLUMNS];
    size_t name_lens[SCAN_MAX_COLUMNS];
    const char **nulls;
    size_t *null_lens;
    ScanPlan plan;
} Args;

static int int_tuple(PyObject *tuple, int *out, int limit, const char *what) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > limit) {
        PyErr_Format(PyExc_ValueError, "%s: a tuple of at most %d ints", what, limit);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        long x = PyLong_AsLong(PyTuple_GET_ITEM(tuple, i));
        if (x == -1 && PyErr_Occurred()) return -1;
        out[i] = (int)x;
    }
    return (int)PyTuple_GET_SIZE(tuple);
}

static int bytes_tuple(PyObject *tuple, const char **out, size_t *lens, int limit, const char *what) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > limit) {
        PyErr_Format(PyExc_ValueError, "%s: a tuple of at most %d bytes", what, limit);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (!PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s: bytes expected", what);
            return -1;
        }
        out[i] = PyBytes_AS_STRING(item);
        lens[i] = (size_t)PyBytes_GET_SIZE(item);
    }
    return (int)PyTuple_GET_SIZE(tuple);
}

static int args_parse(Args *a, PyObject *ncolumns_or_names, PyObject *keys, PyObject *values,
                      PyObject *numeric, PyObject *nulls, int ncolumns) {
    memset(&a->plan, 0, sizeof(a->plan));
    a->nulls = NULL;
    a->null_lens = NULL;
    if (ncolumns_or_names) {
        ncolumns = bytes_tuple(ncolumns_or_names, a->names, a->name_lens, SCAN_MAX_COLUMNS, "names");
        if (ncolumns < 0) return -1;
        a->plan.names = a->names;
        a->plan.name_lens = a->name_lens;
    }
    a->plan.ncolumns = ncolumns;
    if ((a->plan.nkeys = int_tuple(keys, a->keys, SCAN_MAX_COLUMNS, "keys")) < 0) return -1;
    if ((a->plan.nvalues = int_tuple(values, a->values, SCAN_MAX_COLUMNS, "values")) < 0) return -1;
    if (int_tuple(numeric, a->numeric, SCAN_MAX_COLUMNS, "numeric") != a->plan.nvalues) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "numeric: one flag per value column");
        return -1;
    }
    for (int i = 0; i < a->plan.nkeys; i++)
        if (a->keys[i] < 0 || a->keys[i] >= ncolumns) return PyErr_SetString(PyExc_ValueError, "bad key index"), -1;
    for (int i = 0; i < a->plan.nvalues; i++)
        if (a->values[i] < 0 || a->values[i] >= ncolumns)
            return PyErr_SetString(PyExc_ValueError, "bad value index"), -1;
    a->plan.key_cols = a->keys;
    a->plan.value_cols = a->values;
    a->plan.value_numeric = a->numeric;
    Py_ssize_t n = PyTuple_Check(nulls) ? PyTuple_GET_SIZE(nulls) : 0;
    a->nulls = (const char **)PyMem_Malloc((size_t)(n ? n : 1) * sizeof(char *));
    a->null_lens = (size_t *)PyMem_Malloc((size_t)(n ? n : 1) * sizeof(size_t));
    if (!a->nulls || !a->null_lens) return PyErr_NoMemory(), -1;
    if ((a->plan.nnulls = bytes_tuple(nulls, a->nulls, a->null_lens, 1 << 20, "nulls")) < 0) return -1;
    a->plan.nulls = a->nulls;
    a->plan.null_lens = a->null_lens;
    a->plan.null_lengths = 0;
    for (int i = 0; i < a->plan.nnulls; i++)
        a->plan.null_lengths |= 1ULL << (a->null_lens[i] < 63 ? a->null_lens[i] : 63);
    return 0;
}

static void args_free(Args *a) {
    PyMem_Free(a->nulls);
    PyMem_Free(a->null_lens);
}

static PyObject *finish(int status, AggTable *t, int64_t rows) {
    PyObject *out;
    if (status == AGG_NOMEM)
        out = PyErr_NoMemory();
    else if (status == AGG_FALLBACK)
        out = Py_NewRef(Py_None);
    else
        out = result(t, rows);
    agg_free(t);
    return out;
}

typedef int (*CsvScan)(const char *, size_t, int, const int *, const ScanPlan *, AggTable *, int64_t *);
typedef int (*JsonlScan)(const char *, size_t, const ScanPlan *, AggTable *, int64_t *, uint64_t *, int64_t *);

/* The scans this CPU runs: the newest build it has the instructions for (csv_v3.c where it also
 * runs pdep in hardware; csv_v2.c, jsonl_v2.c), else the portable ones. AGGKERNEL_BUILD in the
 * environment at import caps the choice ("portable", "x86-64-v2"); AGGKERNEL_PORTABLE=1 is
 * "portable". */
static CsvScan csv_scan_chosen = csv_scan;
static JsonlScan jsonl_scan_chosen = jsonl_scan;
static const char *scan_build = "portable";

#if SCAN_V2_BUILD
#include <cpuid.h>

/* Whether pdep runs in hardware: Intel's BMI2 CPUs, AMD's (and Hygon's) from family 19h. */
static int pdep_in_hardware(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    if (b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e) return 1; /* GenuineIntel */
    int amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163; /* AuthenticAMD */
    int hygon = b == 0x6f677948 && d == 0x6e65476e && c == 0x656e6975; /* HygonGenuine */
    if (!(amd || hygon) || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
    unsigned family = (a >> 8) & 0xF;
    if (family == 0xF) family += (a >> 20) & 0xFF;
    return family >= 0x19;
}
#endif

static void choose_scans(void) {
#if SCAN_V2_BUILD
    const char *cap = getenv("AGGKERNEL_BUILD"), *portable = getenv("AGGKERNEL_PORTABLE");
    if ((portable && strcmp(portable, "1") == 0) || (cap && strcmp(cap, "portable") == 0)) return;
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("popcnt") && __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse4.1")))
        return;
    csv_scan_chosen = csv_scan_v2;
    jsonl_scan_chosen = jsonl_scan_v2;
    scan_build = "x86-64-v2";
    if (cap && strcmp(cap, "x86-64-v2") == 0) return;
    if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
        __builtin_cpu_supports("bmi2") && pdep_in_hardware()) {
        csv_scan_chosen = csv_scan_v3;
        scan_build = "x86-64-v3";
    }
#endif
}

PyDoc_STRVAR(csv_reduce_doc,
             "csv_reduce(data, field_cols, keys, values, numeric, nulls) -> tuple | None\n\n"
             "Partial aggregates of a block of whole CSV records (no header). field_cols: per\n"
             "field of a record, the needed column it is, or -1; keys / values: needed-column\n"
             "indexes; numeric: per value column, 1 for numbers; nulls: texts that are null.");

static PyObject *csv_reduce(PyObject *self, PyObject *args) {
    (void)self;
    Args a;
    PyObject *field_cols, *keys, *values, *numeric, *nulls;
    if (!PyArg_ParseTuple(args, "y*O!O!O!O!O!", &a.data, &PyTuple_Type, &field_cols, &PyTuple_Type, &keys,
                          &PyTuple_Type, &values, &PyTuple_Type, &numeric, &PyTuple_Type, &nulls))
        return NULL;
    Py_ssize_t nfields = PyTuple_GET_SIZE(field_cols);
    int *cols = (int *)PyMem_Malloc((size_t)(nfields ? nfields : 1) * sizeof(int));
    int ncolumns = 0;
    PyObject *out = NULL;
    if (!cols) {
        PyErr_NoMemory();
        goto release;
    }
    for (Py_ssize_t i = 0; i < nfields; i++) {
        long x = PyLong_AsLong(PyTuple_GET_ITEM(field_cols, i));
        if (x == -1 && PyErr_Occurred()) goto release;
        if (x < -1 || x >= SCAN_MAX_COLUMNS) {
            PyErr_SetString(PyExc_ValueError, "field_cols: -1 or a needed-column index");
            goto release;
        }
        cols[i] = (int)x;
        if (x + 1 > ncolumns) ncolumns = (int)x + 1;
    }
    if (args_parse(&a, NULL, keys, values, numeric, nulls, ncolumns) == 0) {
        AggTable t;
        int64_t rows = 0;
        int status = agg_init(&t, a.plan.nkeys, a.plan.nvalues);
        if (status == AGG_OK) {
            Py_BEGIN_ALLOW_THREADS status =
                csv_scan_chosen((const char *)a.data.buf, (size_t)a.data.len, (int)nfields, cols, &a.plan, &t, &rows);
            Py_END_ALLOW_THREADS
        }
        out = finish(status, &t, rows);
    }
    args_free(&a);
release:
    PyMem_Free(cols);
    PyBuffer_Release(&a.data);
    return out;
}

PyDoc_STRVAR(jsonl_reduce_doc,
             "jsonl_reduce(data, names, keys, values, numeric, nulls) -> tuple | None\n\n"
             "Partial aggregates of a block of whole JSON lines. names: the needed columns (UTF-8);\n"
             "keys / values: indexes into names; numeric: per value column, 1 for numbers; nulls:\n"
             "texts that are null. The tuple has two more items: the bit mask of names seen, and the\n"
             "block's line breaks (\\n, blank lines' included).");

static PyObject *jsonl_reduce(PyObject *self, PyObject *args) {
    (void)self;
    Args a;
    PyObject *names, *keys, *values, *numeric, *nulls, *out = NULL;
    if (!PyArg_ParseTuple(args, "y*O!O!O!O!O!", &a.data, &PyTuple_Type, &names, &PyTuple_Type, &keys,
                          &PyTuple_Type, &values, &PyTuple_Type, &numeric, &PyTuple_Type, &nulls))
        return NULL;
    if (args_parse(&a, names, keys, values, numeric, nulls, 0) == 0) {
        AggTable t;
        int64_t rows = 0, breaks = 0;
        uint64_t seen = 0;
        int status = agg_init(&t, a.plan.nkeys, a.plan.nvalues);
        if (status == AGG_OK) {
            Py_BEGIN_ALLOW_THREADS status =
                jsonl_scan_chosen((const char *)a.data.buf, (size_t)a.data.len, &a.plan, &t, &rows, &seen, &breaks);
            Py_END_ALLOW_THREADS
        }
        out = finish(status, &t, rows);
        if (out && out != Py_None) {
            PyObject *with_seen = Py_BuildValue("(OOOOOKL)", PyTuple_GET_ITEM(out, 0), PyTuple_GET_ITEM(out, 1),
                                                PyTuple_GET_ITEM(out, 2), PyTuple_GET_ITEM(out, 3),
                                                PyTuple_GET_ITEM(out, 4), (unsigned long long)seen,
                                                (long long)breaks);
            Py_DECREF(out);
            out = with_seen;
        }
    }
    args_free(&a);
    PyBuffer_Release(&a.data);
    return out;
}

static size_t count_byte_in(const unsigned char *p, size_t n, unsigned char byte) {
    size_t count = 0, i = 0;
#if defined(__SSE2__)
    /* per-byte counters (at most 255 steps), then summed by psadbw */
    const __m128i b = _mm_set1_epi8((char)byte), zero = _mm_setzero_si128();
    while (n - i >= 16) {
        size_t steps = (n - i) / 16;
        if (steps > 255) steps = 255;
        __m128i acc = zero;
        for (size_t k = 0; k < steps; k++, i += 16)
            acc = _mm_sub_epi8(acc, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + i)), b));
        __m128i sums = _mm_sad_epu8(acc, zero);
        count += (size_t)_mm_cvtsi128_si64(sums) + (size_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(sums, sums));
    }
#endif
    for (; i < n; i++) count += p[i] == byte;
    return count;
}

PyDoc_STRVAR(count_byte_doc, "count_byte(data, byte, start, end) -> int\n\nHow many times `byte` occurs in data[start:end].");

static PyObject *count_byte(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    int byte;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "y*inn", &data, &byte, &start, &end)) return NULL;
    if (start < 0 || end > data.len || start > end || byte < 0 || byte > 255) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "count_byte: bad range or byte");
        return NULL;
    }
    size_t count;
    Py_BEGIN_ALLOW_THREADS count = count_byte_in((const unsigned char *)data.buf + start, (size_t)(end - start), (unsigned char)byte);
    Py_END_ALLOW_THREADS PyBuffer_Release(&data);
    return PyLong_FromSize_t(count);
}

PyObject *dict_reduce(PyObject *self, PyObject *args); /* dict.c */
static const char dict_reduce_doc[] =
    "dict_reduce(indices, indices_valid, offset, length, ndict, columns): a block grouped by its "
    "dictionary-encoded key's indices (see dict.c); None where Arrow must decide.";

PyObject *pq_byte_arrays(PyObject *self, PyObject *args); /* pq.c */
PyObject *pq_key_page(PyObject *self, PyObject *args);
PyObject *pq_fold_page(PyObject *self, PyObject *args);
PyObject *pq_pages(PyObject *self, PyObject *args);
static const char pq_doc[] = "Parquet pages decoded and folded (see pq.c): parquet_native.py's kernels.";

static PyMethodDef methods[] = {
    {"count_byte", count_byte, METH_VARARGS, count_byte_doc},
    {"csv_reduce", csv_reduce, METH_VARARGS, csv_reduce_doc},
    {"jsonl_reduce", jsonl_reduce, METH_VARARGS, jsonl_reduce_doc},
    {"dict_reduce", dict_reduce, METH_VARARGS, dict_reduce_doc},
    {"pq_byte_arrays", pq_byte_arrays, METH_VARARGS, pq_doc},
    {"pq_key_page", pq_key_page, METH_VARARGS, pq_doc},
    {"pq_fold_page", pq_fold_page, METH_VARARGS, pq_doc},
    {"pq_pages", pq_pages, METH_VARARGS, pq_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "aggkernel", "One-pass group-by of CSV / JSON-lines blocks, off the GIL.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_aggkernel(void) {
    choose_scans();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "MAX_COLUMNS", SCAN_MAX_COLUMNS) < 0 ||
              PyModule_AddStringConstant(m, "BUILD", scan_build) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
