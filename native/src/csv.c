/* CSV: one pass over a block of whole records (RFC 4180 quoting, `,` between fields, records
 * ended by \n, \r\n or \r, empty lines skipped), as pyarrow's read_csv with the engine's options
 * would read it. Falls back on anything else: a wrong number of fields, a quote inside an
 * unquoted field or text after a closing quote, a number outside the fast grammar, a key that
 * is not UTF-8. */
#include "scan.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Where the structural bytes are (`,` `\n` `\r` `"`): one bit per byte, 64 bytes at a time,
 * computed as the walk reaches them (SSE2 where there is one). Invariant of the walk: the lowest
 * set bit of `mask` is the first structural byte at or after the current position. */
typedef struct {
    const char *base, *end;
    size_t idx, nwords;
    uint64_t mask;
} Stops;

static inline uint64_t word_bits(const char *p) {
#if defined(__SSE2__)
    const __m128i comma = _mm_set1_epi8(','), lf = _mm_set1_epi8('\n'), cr = _mm_set1_epi8('\r'),
                  quote = _mm_set1_epi8('"');
    uint64_t bits = 0;
    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, comma), _mm_cmpeq_epi8(v, lf)),
                                   _mm_or_si128(_mm_cmpeq_epi8(v, cr), _mm_cmpeq_epi8(v, quote)));
        bits |= (uint64_t)(uint16_t)_mm_movemask_epi8(hit) << (16 * i);
    }
    return bits;
#else
    uint64_t bits = 0;
    for (int i = 0; i < 64; i++) {
        char c = p[i];
        bits |= (uint64_t)(c == ',' || c == '\n' || c == '\r' || c == '"') << i;
    }
    return bits;
#endif
}

static inline uint64_t stops_word(const Stops *s, size_t idx) {
    const char *p = s->base + (idx << 6);
    if (s->end - p >= 64) return word_bits(p);
    char tail[64];
    memset(tail, 0, sizeof(tail));
    memcpy(tail, p, (size_t)(s->end - p));
    return word_bits(tail);
}

/* Start the walk at `p`. */
static inline void stops_seek(Stops *s, const char *p) {
    size_t off = (size_t)(p - s->base);
    s->idx = off >> 6;
    s->mask = s->idx < s->nwords ? stops_word(s, s->idx) & (~0ULL << (off & 63)) : 0;
}

/* The first structural byte at or after the current position, or `end`. */
static inline const char *stops_next(Stops *s) {
    while (!s->mask) {
        if (++s->idx >= s->nwords) {
            s->idx = s->nwords;
            return s->end;
        }
        s->mask = stops_word(s, s->idx);
    }
    return s->base + (s->idx << 6) + __builtin_ctzll(s->mask);
}

/* Step over the structural byte at the current position. */
static inline void stops_pop(Stops *s) {
    stops_next(s);
    s->mask &= s->mask - 1;
}

typedef struct {
    const char *ptr;
    size_t len;
    int escaped; /* quoted with doubled quotes inside: unescape before use */
} Raw;

/* Copy a quoted field's text with each "" made ", into `out`; returns the length. */
static size_t unescape(const char *p, size_t n, char *out) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        out[w++] = p[i];
        if (p[i] == '"') i++;
    }
    return w;
}

int csv_scan(const char *data, size_t n, int nfields, const int *field_col, const ScanPlan *plan, AggTable *t,
             int64_t *rows) {
    const char *p = data, *end = data + n;
    Stops stops = {data, end, 0, (n + 63) / 64, 0};
    stops_seek(&stops, data);
    int ncol = plan->ncolumns;
    Raw raw[SCAN_MAX_COLUMNS];
    AggField keys[SCAN_MAX_COLUMNS];
    AggField cols[SCAN_MAX_COLUMNS];
    char *scratch = NULL;
    int64_t count = 0;

    while (p < end) {
        if (*p == '\n' || *p == '\r') { /* an empty line */
            stops_pop(&stops);
            p++;
            continue;
        }
        int i = 0;
        for (;;) {
            const char *start;
            size_t len;
            int escaped = 0;
            if (p < end && *p == '"') {
                /* quoted: walk the structural bytes to the closing quote (commas and line
                 * breaks inside are text); "" is a quote in the text */
                stops_pop(&stops); /* the opening quote */
                start = ++p;
                for (;;) {
                    const char *q = stops_next(&stops);
                    if (q >= end) goto fallback; /* unterminated */
                    stops.mask &= stops.mask - 1;
                    if (*q != '"') continue;
                    if (q + 1 < end && q[1] == '"') {
                        escaped = 1;
                        stops_pop(&stops); /* the second quote of the pair */
                        continue;
                    }
                    len = (size_t)(q - start);
                    p = q + 1;
                    break;
                }
                if (p < end && *p != ',' && *p != '\n' && *p != '\r') goto fallback;
                stops_next(&stops); /* the lowest bit is p again */
            } else {
                start = p;
                p = stops_next(&stops);
                if (p < end && *p == '"') goto fallback;
                len = (size_t)(p - start);
            }
            if (i >= nfields) goto fallback; /* too many fields */
            int c = field_col[i];
            if (c >= 0) {
                raw[c].ptr = start;
                raw[c].len = len;
                raw[c].escaped = escaped;
            }
            i++;
            if (p < end && *p == ',') {
                stops.mask &= stops.mask - 1; /* the lowest bit is p: just found, or just sought */
                p++;
                continue;
            }
            /* end of the record */
            if (p < end) {
                if (*p == '\r' && p + 1 < end && p[1] == '\n') {
                    stops_pop(&stops);
                    p++;
                }
                stops_pop(&stops);
                p++;
            }
            break;
        }
        if (i != nfields) goto fallback;
        count++;
        /* the record's needed columns */
        size_t used = 0;
        for (int c = 0; c < ncol; c++) {
            const char *s = raw[c].ptr;
            size_t len = raw[c].len;
            if (raw[c].escaped) {
                if (!scratch && !(scratch = (char *)malloc(n + 1))) return AGG_NOMEM;
                len = unescape(s, len, scratch + used);
                s = scratch + used;
                used += len;
            }
            cols[c].ptr = s;
            cols[c].len = len;
            cols[c].is_null = scan_is_null(plan, s, len);
        }
        int64_t g = 0;
        if (plan->nkeys) {
            for (int k = 0; k < plan->nkeys; k++) keys[k] = cols[plan->key_cols[k]];
            g = agg_group(t, keys);
            if (g == -2) goto fallback;
            if (g < 0) {
                free(scratch);
                return AGG_NOMEM;
            }
        } else if (t->ngroups == 0) {
            g = agg_group(t, keys);
            if (g < 0) {
                free(scratch);
                return AGG_NOMEM;
            }
        }
        t->rows[g]++;
        for (int v = 0; v < plan->nvalues; v++) {
            const AggField *f = &cols[plan->value_cols[v]];
            if (f->is_null) continue;
            if (plan->value_numeric[v]) {
                double x;
                if (!scan_number(f->ptr, f->len, 1, &x)) goto fallback;
                agg_add_number(t, (size_t)g, v, x);
            } else {
                agg_add_present(t, (size_t)g, v);
            }
        }
    }
    free(scratch);
    if (count == 0) return AGG_FALLBACK; /* no record: the Python path gives the empty partial */
    *rows = count;
    return AGG_OK;
fallback:
    free(scratch);
    return AGG_FALLBACK;
}
