/* Parquet pages decoded and folded in one pass (shared/aggregation/parquet_native.py drives them):
 * a row group keyed by one dictionary-encoded column, its value columns flat numbers. The key
 * column's pages become group ids (its dictionary index, ndict for a null); each value page's
 * defined values are folded straight into their group's count, sum, min and max: no Arrow array
 * is built. Every length is checked against its buffer: a malformed page answers -1 (the caller
 * then decodes the row group with pyarrow, which names what is wrong), never a read past it.
 *
 *   pq_pages(chunk, num_values) -> [(type, offset, compressed, uncompressed, num_values, encoding,
 *             def level encoding, num_nulls, def levels' bytes, rep levels' bytes, is_compressed)] | None
 *   pq_byte_arrays(data, count) -> (offsets int32 bytes, values bytes) | None
 *   pq_key_page(levels | None, indices, num_values, ndict, ids, row, count_all) -> rows | -1
 *   pq_fold_page(levels | None, values, num_values, encoding, phys, dictionary | None, ids, row,
 *                slots, want) -> 1 | 0 (a NaN: Arrow decides) | -1
 *
 * levels: a page's definition levels (RLE / bit-packed hybrid, bit width 1: max level 1), None
 * when every value is defined. indices / values with encoding 1: a bit width byte, then the hybrid
 * stream of dictionary indices; encoding 0: PLAIN values of `phys` (0 double, 1 float, 2 int32,
 * 3 int64, 4 int8 and 5 int16 stored as INT32, narrowed as pyarrow narrows them). slots: (count int64, sum, min, max float64) per group, folded into. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "fold.h"

#define PQ_TILE 4096


/* The RLE / bit-packed hybrid decoder of Parquet's levels and dictionary indices. */
typedef struct {
    const uint8_t *p, *end;
    int bw;
    uint32_t left; /* values left in the current run */
    int rle;
    uint32_t value;         /* an RLE run's value */
    const uint8_t *packed;  /* a bit-packed run's bytes */
    const uint8_t *pend;    /* and where they end */
    uint64_t pos;           /* the next value's index in it */
} Rle;

static int rle_init(Rle *r, const uint8_t *p, const uint8_t *end, int bw) {
    memset(r, 0, sizeof(*r));
    if (bw < 0 || bw > 32) return 0;
    r->p = p, r->end = end, r->bw = bw;
    return 1;
}

static int rle_next_run(Rle *r) {
    uint64_t h = 0;
    for (int shift = 0;; shift += 7) {
        if (r->p >= r->end || shift > 28) return 0;
        uint8_t b = *r->p++;
        h |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
    }
    if ((h >> 1) == 0) return 0; /* a run of no values: malformed (pyarrow decides) */
    /* runs pyarrow's decoder refuses, refused: more than INT32_MAX values, a bit-packed run whose
     * bytes stop short of its groups */
    if (h & 1) {
        uint64_t values = (h >> 1) * 8;
        uint64_t bytes = (h >> 1) * (uint64_t)r->bw;
        if (values > INT32_MAX || bytes > (uint64_t)(r->end - r->p)) return 0;
        r->rle = 0, r->packed = r->p, r->pend = r->p + bytes, r->pos = 0, r->left = (uint32_t)values;
        r->p += bytes;
    } else {
        int nb = (r->bw + 7) / 8;
        if (nb > r->end - r->p || (h >> 1) > INT32_MAX) return 0;
        uint32_t v = 0;
        for (int i = 0; i < nb; i++) v |= (uint32_t)r->p[i] << (8 * i);
        if (r->bw < 32 && (v >> r->bw)) return 0;
        r->p += nb;
        r->rle = 1, r->value = v, r->left = (uint32_t)(h >> 1);
    }
    return 1;
}

/* Eight values of a constant bit width from a group's bytes (8-byte loads; the caller checks
 * that they stay inside the run's bytes). */
static inline __attribute__((always_inline)) void unpack8(const uint8_t *in, uint32_t *out, const int bw) {
    const uint64_t mask = bw == 32 ? 0xffffffffu : ((uint64_t)1 << bw) - 1;
    for (int j = 0; j < 8; j++) {
        uint64_t word;
        memcpy(&word, in + ((j * bw) >> 3), 8);
        out[j] = (uint32_t)((word >> ((j * bw) & 7)) & mask);
    }
}

#define UNPACK_CASE(w) \
    case w:            \
        for (uint64_t g = 0; g < groups; g++) unpack8(in + g * w, out + g * 8, w); \
        break;

/* `groups` whole groups of 8 values of width bw (1..32). */
static void unpack_groups(const uint8_t *in, uint32_t *out, uint64_t groups, int bw) {
    switch (bw) {
        UNPACK_CASE(1) UNPACK_CASE(2) UNPACK_CASE(3) UNPACK_CASE(4) UNPACK_CASE(5) UNPACK_CASE(6)
        UNPACK_CASE(7) UNPACK_CASE(8) UNPACK_CASE(9) UNPACK_CASE(10) UNPACK_CASE(11) UNPACK_CASE(12)
        UNPACK_CASE(13) UNPACK_CASE(14) UNPACK_CASE(15) UNPACK_CASE(16) UNPACK_CASE(17) UNPACK_CASE(18)
        UNPACK_CASE(19) UNPACK_CASE(20) UNPACK_CASE(21) UNPACK_CASE(22) UNPACK_CASE(23) UNPACK_CASE(24)
        UNPACK_CASE(25) UNPACK_CASE(26) UNPACK_CASE(27) UNPACK_CASE(28) UNPACK_CASE(29) UNPACK_CASE(30)
        UNPACK_CASE(31) UNPACK_CASE(32)
    default: break;
    }
}

/* One value of a bit-packed run, its bytes read one at a time up to the run's end. */
static inline uint32_t packed_at(const Rle *r, uint64_t index, uint64_t mask) {
    uint64_t bit = index * (uint64_t)r->bw, at = bit >> 3, avail = (uint64_t)(r->pend - r->packed), word = 0;
    for (uint64_t j = 0; j < 8 && at + j < avail; j++) word |= (uint64_t)r->packed[at + j] << (8 * j);
    return (uint32_t)((word >> (bit & 7)) & mask);
}

/* n values into out; 0 when the stream ends first (a malformed page). */
static int rle_get(Rle *r, uint32_t *out, uint32_t n) {
    const uint64_t mask = r->bw == 32 ? 0xffffffffu : ((uint64_t)1 << r->bw) - 1;
    uint32_t done = 0;
    while (done < n) {
        if (r->left == 0) {
            if (!rle_next_run(r)) return 0;
            continue;
        }
        uint32_t k = n - done < r->left ? n - done : r->left;
        if (r->rle) {
            const uint32_t v = r->value; /* a local: `out` might alias it, and the loop would read it each time */
            for (uint32_t i = 0; i < k; i++) out[done + i] = v;
        } else if (r->bw == 0) {
            memset(out + done, 0, (size_t)k * 4);
        } else {
            uint64_t avail = (uint64_t)(r->pend - r->packed), bw = (uint64_t)r->bw;
            uint32_t i = 0;
            for (; i < k && ((r->pos + i) & 7); i++) out[done + i] = packed_at(r, r->pos + i, mask);
            /* whole groups whose 8-byte loads stay inside the run's bytes */
            uint64_t first = (r->pos + i) / 8, groups = (k - i) / 8;
            while (groups && (first + groups) * bw + 8 > avail) groups--;
            unpack_groups(r->packed + first * bw, out + done + i, groups, r->bw);
            i += (uint32_t)(groups * 8);
            for (; i < k; i++) out[done + i] = packed_at(r, r->pos + i, mask);
            r->pos += k;
        }
        r->left -= k, done += k;
    }
    return 1;
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable) {
    return PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE);
}

/* --- page headers: Thrift compact structs ------------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
    int bad;
} Tr;

static uint64_t tr_varint(Tr *t) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (t->p >= t->end) break;
        uint8_t b = *t->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    t->bad = 1;
    return 0;
}

static int64_t tr_zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

/* An i32 (or i16) as Thrift's C++ compact reader takes it, which pyarrow uses: the varint cut
 * to its low 32 bits, then zigzag-decoded (a header field of 2^32 + 27 is 27 to pyarrow). */
static int64_t tr_i32(Tr *t) {
    uint32_t v = (uint32_t)tr_varint(t);
    return (int32_t)((v >> 1) ^ (0u - (v & 1)));
}

static void tr_bytes(Tr *t, uint64_t n) {
    if (n > (uint64_t)(t->end - t->p)) t->bad = 1;
    else t->p += n;
}

#define TR_FIELDS 16
typedef struct {
    int64_t v[TR_FIELDS];
    uint8_t seen[TR_FIELDS]; /* the field's compact type (1 / 2 a bool, 5 an i32, 12 a struct), 0 if absent */
} Fields;

static void tr_struct(Tr *t, int depth, Fields *f, Fields *nested); /* nested: fields 5, 7, 8 */

static void tr_skip(Tr *t, int type, int depth) {
    if (depth > 8) {
        t->bad = 1;
        return;
    }
    switch (type) {
    case 1: case 2: case 3: tr_bytes(t, 1); break; /* a bool in a list, a byte */
    case 4: case 5: case 6: tr_varint(t); break;
    case 7: tr_bytes(t, 8); break;
    case 8: tr_bytes(t, tr_varint(t)); break;
    case 9: case 10: {
        if (t->p >= t->end) {
            t->bad = 1;
            return;
        }
        uint8_t head = *t->p++;
        uint64_t size = head >> 4;
        if (size == 15) size = tr_varint(t);
        for (uint64_t i = 0; i < size && !t->bad; i++) tr_skip(t, head & 0x0f, depth + 1);
        break;
    }
    case 11: {
        uint64_t size = tr_varint(t);
        if (!size || t->bad) break;
        if (t->p >= t->end) {
            t->bad = 1;
            return;
        }
        uint8_t types = *t->p++;
        for (uint64_t i = 0; i < size && !t->bad; i++) tr_skip(t, types >> 4, depth + 1), tr_skip(t, types & 0x0f, depth + 1);
        break;
    }
    case 12: tr_struct(t, depth + 1, NULL, NULL); break;
    default: t->bad = 1;
    }
}

static void tr_struct(Tr *t, int depth, Fields *f, Fields *nested) {
    if (depth > 8) {
        t->bad = 1;
        return;
    }
    int64_t last = 0;
    while (!t->bad) {
        if (t->p >= t->end) {
            t->bad = 1;
            return;
        }
        uint8_t b = *t->p++;
        if (b == 0) return;
        int type = b & 0x0f;
        /* a field id is an i16, as Thrift's reader keeps it (a delta past it wraps there too) */
        int64_t id = (int16_t)(uint16_t)((b >> 4) ? (uint64_t)last + (uint64_t)(b >> 4) : (uint64_t)tr_i32(t));
        last = id;
        int keep = f && id >= 0 && id < TR_FIELDS;
        if (type == 1 || type == 2) {
            if (keep) f->v[id] = type == 1, f->seen[id] = 1; /* Thrift's bool: either type */
        } else if (type >= 4 && type <= 6) {
            int64_t v = type == 6 ? tr_zigzag(tr_varint(t)) : type == 5 ? tr_i32(t) : (int16_t)tr_i32(t);
            if (keep) f->v[id] = v, f->seen[id] = (uint8_t)type;
        } else if (type == 12 && nested && (id == 5 || id == 7 || id == 8)) {
            Fields *sub = &nested[id == 5 ? 0 : id == 7 ? 1 : 2];
            tr_struct(t, depth + 1, sub, NULL);
            if (keep) f->seen[id] = 12;
        } else {
            tr_skip(t, type, depth);
        }
    }
}

/* Each page of a column chunk: (type, offset of its bytes, compressed size, uncompressed size,
 * num_values, encoding, definition level encoding, num_nulls, definition levels' bytes,
 * repetition levels' bytes, is_compressed), until `values` values of data pages are seen; None
 * when a header is malformed or a page lies past the chunk. */
PyObject *pq_pages(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer chunk;
    long long values;
    if (!PyArg_ParseTuple(args, "y*L", &chunk, &values)) return NULL;
    PyObject *out = PyList_New(0);
    const uint8_t *base = (const uint8_t *)chunk.buf, *end = base + chunk.len, *p = base;
    long long seen = 0;
    while (out && seen < values) {
        Tr t = {p, end, 0};
        Fields top, nested[3];
        memset(&top, 0, sizeof(top));
        memset(nested, 0, sizeof(nested));
        tr_struct(&t, 0, &top, nested);
        /* a field of another type than its own is skipped by Thrift's reader: as if absent */
#define I32(f, i) ((f)->seen[i] == 5)
        if (t.bad || !I32(&top, 1) || !I32(&top, 2) || !I32(&top, 3)) goto none;
        /* every field below is an i32 (tr_i32): their sums stay far inside int64 */
        int64_t type = top.v[1], usize = top.v[2], csize = top.v[3];
        if (usize < 0 || csize < 0 || csize > end - t.p) goto none;
        int64_t num = 0, enc = 0, def_enc = 0, nulls = -1, def_len = 0, rep_len = 0, compressed = 1;
        if (type == 0) { /* DATA_PAGE */
            Fields *d = &nested[0];
            if (top.seen[5] != 12 || !I32(d, 1) || !I32(d, 2) || !I32(d, 3) || !I32(d, 4)) goto none;
            num = d->v[1], enc = d->v[2], def_enc = d->v[3];
        } else if (type == 2) { /* DICTIONARY_PAGE */
            Fields *d = &nested[1];
            if (top.seen[7] != 12 || !I32(d, 1) || !I32(d, 2)) goto none;
            num = d->v[1], enc = d->v[2];
        } else if (type == 3) { /* DATA_PAGE_V2 */
            Fields *d = &nested[2];
            if (top.seen[8] != 12 || !I32(d, 1) || !I32(d, 2) || !I32(d, 3) || !I32(d, 4) || !I32(d, 5) || !I32(d, 6))
                goto none;
            num = d->v[1], nulls = d->v[2], enc = d->v[4], def_len = d->v[5], rep_len = d->v[6];
            compressed = d->seen[7] == 1 || d->seen[7] == 2 ? d->v[7] : 1;
            if (def_len < 0 || rep_len < 0 || def_len + rep_len > csize) goto none;
        }
        if (num < 0) goto none;
        PyObject *page = Py_BuildValue("(LnLLLLLLLLL)", (long long)type, (Py_ssize_t)(t.p - base), (long long)csize,
                                       (long long)usize, (long long)num, (long long)enc, (long long)def_enc,
                                       (long long)nulls, (long long)def_len, (long long)rep_len, (long long)compressed);
        if (!page || PyList_Append(out, page) < 0) {
            Py_XDECREF(page);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(page);
        if (type == 0 || type == 3) seen = num < values - seen ? seen + num : values;
        p = t.p + csize;
    }
    PyBuffer_Release(&chunk);
    return out;
none:
    Py_DECREF(out);
    PyBuffer_Release(&chunk);
    Py_RETURN_NONE;
}

PyObject *pq_byte_arrays(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &data, &count)) return NULL;
    PyObject *result = NULL;
    const uint8_t *p = (const uint8_t *)data.buf, *end = p + data.len;
    if (count < 0 || count > data.len / 4 + 1) goto none;
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * 4);
    PyObject *values = offsets ? PyBytes_FromStringAndSize(NULL, data.len) : NULL;
    if (!values) {
        Py_XDECREF(offsets);
        PyBuffer_Release(&data);
        return NULL;
    }
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(values);
    int64_t total = 0;
    off[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t len;
        if (end - p < 4) goto bad;
        memcpy(&len, p, 4);
        p += 4;
        if ((uint64_t)len > (uint64_t)(end - p) || total + len > INT32_MAX) goto bad;
        memcpy(out + total, p, len);
        p += len, total += len;
        off[i + 1] = (int32_t)total;
    }
    if (_PyBytes_Resize(&values, (Py_ssize_t)total) < 0) {
        Py_DECREF(offsets);
        PyBuffer_Release(&data);
        return NULL;
    }
    result = Py_BuildValue("(NN)", offsets, values);
    PyBuffer_Release(&data);
    return result;
bad:
    Py_DECREF(offsets);
    Py_DECREF(values);
none:
    PyBuffer_Release(&data);
    Py_RETURN_NONE;
}

/* Levels of a tile (0 / 1); the count defined, or -1 when malformed. */
static Py_ssize_t tile_levels(Rle *lv, int has_levels, uint32_t *lev, uint32_t n) {
    if (!has_levels) return n;
    if (!rle_get(lv, lev, n)) return -1;
    Py_ssize_t defined = 0;
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) defined += lev[i], bad |= lev[i];
    return bad > 1 ? -1 : defined;
}

PyObject *pq_key_page(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *levels_obj, *ids_obj, *count_obj;
    Py_buffer levels = {0}, indices = {0}, ids = {0}, counts = {0};
    Py_ssize_t num_values, row, ndict, rows = -1;
    if (!PyArg_ParseTuple(args, "Oy*nnOnO", &levels_obj, &indices, &num_values, &ndict, &ids_obj, &row, &count_obj))
        return NULL;
    PyObject *result = NULL; /* the buffers are released at done: a zeroed one as nothing */
    int has_levels = levels_obj != Py_None;
    if ((has_levels && get_buffer(levels_obj, &levels, 0) < 0) || get_buffer(ids_obj, &ids, 1) < 0 ||
        get_buffer(count_obj, &counts, 1) < 0)
        goto done;
    if (num_values < 0 || row < 0 || ndict < 0 || ndict >= INT32_MAX || row + num_values > ids.len / 4 ||
        (ndict + 1) * 8 > counts.len) {
        PyErr_SetString(PyExc_ValueError, "pq_key_page: bad arguments");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    int32_t *out = (int32_t *)ids.buf + row;
    int64_t *count_all = (int64_t *)counts.buf;
    const uint8_t *ip = (const uint8_t *)indices.buf;
    Rle lv, ix;
    uint32_t lev[PQ_TILE], idx[PQ_TILE];
    int ok = indices.len >= 1 && rle_init(&ix, ip + 1, ip + indices.len, ip[0]);
    if (has_levels) ok = ok && rle_init(&lv, (const uint8_t *)levels.buf, (const uint8_t *)levels.buf + levels.len, 1);
    for (Py_ssize_t start = 0; ok && start < num_values; start += PQ_TILE) {
        uint32_t n = (uint32_t)(num_values - start < PQ_TILE ? num_values - start : PQ_TILE);
        Py_ssize_t defined = tile_levels(&lv, has_levels, lev, n);
        if (defined < 0 || !rle_get(&ix, idx, (uint32_t)defined)) {
            ok = 0;
            break;
        }
        uint32_t k = 0, top = 0;
        if (!has_levels || defined == (Py_ssize_t)n) { /* every key defined: its index is its group */
            for (uint32_t i = 0; i < n; i++) {
                uint32_t g = idx[i];
                top |= g >= (uint32_t)ndict;
                out[start + i] = (int32_t)(g < (uint32_t)ndict ? g : 0);
                count_all[g < (uint32_t)ndict ? g : 0]++;
            }
        } else {
            for (uint32_t i = 0; i < n; i++) {
                uint32_t g = lev[i] ? idx[k++] : (uint32_t)ndict;
                top |= lev[i] && g >= (uint32_t)ndict;
                g = g <= (uint32_t)ndict ? g : 0;
                out[start + i] = (int32_t)g;
                count_all[g]++;
            }
        }
        if (top) { /* an index out of the dictionary */
            ok = 0;
            break;
        }
    }
    rows = ok ? num_values : -1;
    Py_END_ALLOW_THREADS;
    result = PyLong_FromSsize_t(rows);
done:
    PyBuffer_Release(&indices);
    PyBuffer_Release(&levels);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&counts);
    return result;
}

static inline __attribute__((always_inline)) int fold_tile(const double *x, const uint32_t *lev, int has_levels,
                                                           const int32_t *ids, uint32_t n, Fold *slots,
                                                           uint32_t groups, const int want, int *bad) {
    int nan = 0;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (has_levels && !lev[i]) continue;
        uint32_t g = (uint32_t)ids[i];
        double v = x[k++];
        if (g >= groups) {
            *bad = 1;
            return 0;
        }
        nan |= fold_value(&slots[g], v, want);
    }
    return nan;
}

PyObject *pq_fold_page(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *levels_obj, *dict_obj, *ids_obj, *slots_obj;
    Py_buffer levels = {0}, values = {0}, dict = {0}, ids = {0}, slots = {0};
    Py_ssize_t num_values, row;
    int encoding, phys, want, answer = -1;
    if (!PyArg_ParseTuple(args, "Oy*niiOOnOi", &levels_obj, &values, &num_values, &encoding, &phys, &dict_obj,
                          &ids_obj, &row, &slots_obj, &want))
        return NULL;
    PyObject *result = NULL; /* the buffers are released at done: a zeroed one as nothing */
    int has_levels = levels_obj != Py_None, has_dict = dict_obj != Py_None;
    if ((has_levels && get_buffer(levels_obj, &levels, 0) < 0) || (has_dict && get_buffer(dict_obj, &dict, 0) < 0) ||
        get_buffer(ids_obj, &ids, 0) < 0 || get_buffer(slots_obj, &slots, 1) < 0)
        goto done;
    static const int sizes[] = {8, 4, 4, 8, 4, 4};
    if (num_values < 0 || row < 0 || row + num_values > ids.len / 4 || phys < 0 || phys > 5 || encoding < 0 ||
        encoding > 1 || (encoding == 1 && !has_dict) || slots.len / (Py_ssize_t)sizeof(Fold) > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "pq_fold_page: bad arguments");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    const uint8_t *vp = (const uint8_t *)values.buf, *vend = vp + values.len;
    const double *dv = has_dict ? (const double *)dict.buf : NULL;
    uint32_t ndictv = has_dict ? (uint32_t)(dict.len / 8) : 0;
    uint32_t groups = (uint32_t)(slots.len / (Py_ssize_t)sizeof(Fold));
    Fold *fold = (Fold *)slots.buf;
    const int32_t *gid = (const int32_t *)ids.buf + row;
    Rle lv, ix;
    uint32_t lev[PQ_TILE], idx[PQ_TILE];
    double x[PQ_TILE];
    int ok = 1, nan = 0, bad = 0;
    if (has_levels) ok = rle_init(&lv, (const uint8_t *)levels.buf, (const uint8_t *)levels.buf + levels.len, 1);
    if (ok && encoding == 1) ok = values.len >= 1 && rle_init(&ix, vp + 1, vend, vp[0]);
    for (Py_ssize_t start = 0; ok && start < num_values; start += PQ_TILE) {
        uint32_t n = (uint32_t)(num_values - start < PQ_TILE ? num_values - start : PQ_TILE);
        Py_ssize_t defined = tile_levels(&lv, has_levels, lev, n);
        if (defined < 0) {
            ok = 0;
            break;
        }
        if (encoding == 1) {
            if (!rle_get(&ix, idx, (uint32_t)defined)) {
                ok = 0;
                break;
            }
            for (Py_ssize_t i = 0; i < defined; i++) {
                if (idx[i] >= ndictv) {
                    ok = 0;
                    break;
                }
                x[i] = dv[idx[i]];
            }
            if (!ok) break;
        } else {
            Py_ssize_t need = defined * sizes[phys];
            if (need > vend - vp) {
                ok = 0;
                break;
            }
            if (phys == 0) memcpy(x, vp, (size_t)need);
            else if (phys == 1)
                for (Py_ssize_t i = 0; i < defined; i++) {
                    float f;
                    memcpy(&f, vp + i * 4, 4);
                    x[i] = f;
                }
            else if (phys == 2)
                for (Py_ssize_t i = 0; i < defined; i++) {
                    int32_t v;
                    memcpy(&v, vp + i * 4, 4);
                    x[i] = v;
                }
            else if (phys >= 4) /* int8 / int16 stored as INT32: narrowed as pyarrow does (the low bits) */
                for (Py_ssize_t i = 0; i < defined; i++) {
                    uint32_t v;
                    memcpy(&v, vp + i * 4, 4);
                    x[i] = phys == 4 ? (double)(int8_t)(uint8_t)v : (double)(int16_t)(uint16_t)v;
                }
            else
                for (Py_ssize_t i = 0; i < defined; i++) {
                    int64_t v;
                    memcpy(&v, vp + i * 8, 8);
                    x[i] = (double)v;
                }
            vp += need;
        }
        const int32_t *g = gid + start;
        int holes = has_levels && defined < (Py_ssize_t)n; /* a tile with every value defined: no test a row */
        switch (want) {
        case WANT_SUM: nan |= fold_tile(x, lev, holes, g, n, fold, groups, WANT_SUM, &bad); break;
        case WANT_MIN: nan |= fold_tile(x, lev, holes, g, n, fold, groups, WANT_MIN, &bad); break;
        case WANT_MAX: nan |= fold_tile(x, lev, holes, g, n, fold, groups, WANT_MAX, &bad); break;
        case WANT_SUM | WANT_MIN: nan |= fold_tile(x, lev, holes, g, n, fold, groups, WANT_SUM | WANT_MIN, &bad); break;
        case WANT_SUM | WANT_MAX: nan |= fold_tile(x, lev, holes, g, n, fold, groups, WANT_SUM | WANT_MAX, &bad); break;
        case WANT_MIN | WANT_MAX: nan |= fold_tile(x, lev, holes, g, n, fold, groups, WANT_MIN | WANT_MAX, &bad); break;
        default: nan |= fold_tile(x, lev, holes, g, n, fold, groups, WANT_SUM | WANT_MIN | WANT_MAX, &bad); break;
        }
        if (bad) ok = 0;
    }
    answer = !ok ? -1 : nan ? 0 : 1;
    Py_END_ALLOW_THREADS;
    result = PyLong_FromLong(answer);
done:
    PyBuffer_Release(&values);
    PyBuffer_Release(&levels);
    PyBuffer_Release(&dict);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&slots);
    return result;
}
