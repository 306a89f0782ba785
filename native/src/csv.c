/* CSV: one pass over a block of whole records (RFC 4180 quoting, `,` between fields, records
 * ended by \n, \r\n or \r, empty lines skipped), as pyarrow's read_csv with the engine's options
 * would read it. Falls back on anything else: a wrong number of fields, a quote inside an
 * unquoted field or text after a closing quote, a number outside the fast grammar, a key that
 * is not UTF-8. */
#include "scan.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__BMI2__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* Commas (`*commas`) and record ends or quotes (`*breaks`: `\n` `\r` `"`) in the 64 bytes at p
 * (32 at a time in the x86-64-v3 build, 16 in the others). */
static inline void word_split(const char *p, uint64_t *commas, uint64_t *breaks) {
#if defined(__AVX2__)
    const __m256i comma = _mm256_set1_epi8(','), lf = _mm256_set1_epi8('\n'), cr = _mm256_set1_epi8('\r'),
                  quote = _mm256_set1_epi8('"');
    uint64_t c = 0, b = 0;
    for (int i = 0; i < 2; i++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i));
        __m256i brk = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(v, lf), _mm256_cmpeq_epi8(v, cr)),
                                      _mm256_cmpeq_epi8(v, quote));
        c |= (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, comma)) << (32 * i);
        b |= (uint64_t)(uint32_t)_mm256_movemask_epi8(brk) << (32 * i);
    }
    *commas = c;
    *breaks = b;
#elif defined(__SSE2__)
    const __m128i comma = _mm_set1_epi8(','), lf = _mm_set1_epi8('\n'), cr = _mm_set1_epi8('\r'),
                  quote = _mm_set1_epi8('"');
    uint64_t c = 0, b = 0;
    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
        __m128i brk = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, lf), _mm_cmpeq_epi8(v, cr)), _mm_cmpeq_epi8(v, quote));
        c |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, comma)) << (16 * i);
        b |= (uint64_t)(uint16_t)_mm_movemask_epi8(brk) << (16 * i);
    }
    *commas = c;
    *breaks = b;
#else
    uint64_t c = 0, b = 0;
    for (int i = 0; i < 64; i++) {
        char x = p[i];
        c |= (uint64_t)(x == ',') << i;
        b |= (uint64_t)(x == '\n' || x == '\r' || x == '"') << i;
    }
    *commas = c;
    *breaks = b;
#endif
}

/* The scan's view of the block: one word's commas and breaks, kept while the records in it are
 * read. */
typedef struct {
    const char *base, *end;
    size_t nwords, idx; /* idx: the word cached, or nwords when none */
    uint64_t commas, breaks;
} Words;

static inline void words_load(Words *w, size_t idx) {
    const char *p = w->base + (idx << 6);
    w->idx = idx;
    if (w->end - p >= 64) {
        word_split(p, &w->commas, &w->breaks);
        return;
    }
    char tail[64];
    memset(tail, 0, sizeof(tail));
    memcpy(tail, p, (size_t)(w->end - p));
    word_split(tail, &w->commas, &w->breaks);
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

/* The separators a record's needed fields start or end at: `need[0:nneed]`, sorted indexes
 * into the record's commas (field f lies between commas f-1 and f). */
typedef struct {
    const int *need;
    int nneed;
} Needed;

/* Commas `m` (in the word at `base`) are the record's next ones, after `*found` of them: note
 * where the needed ones are (sep[i] for each needed comma i) and where the last one is. */
static inline void take_commas(uint64_t m, const char *base, const Needed *nd, int *found, int *ni,
                               const char **sep, const char **last) {
    if (!m) return;
    int f = *found, past = f + __builtin_popcountll(m); /* commas before this mask, and with it */
#if defined(__BMI2__) /* the x86-64-v3 build: pdep puts a bit on the (i - f)th comma of m */
    while (*ni < nd->nneed && nd->need[*ni] < past) {
        int i = nd->need[*ni];
        sep[i] = base + __builtin_ctzll(_pdep_u64(1ULL << (i - f), m));
        (*ni)++;
    }
#else
    uint64_t rest = m;
    while (*ni < nd->nneed && nd->need[*ni] < past) {
        int i = nd->need[*ni];
        for (int k = i - f; k > 0; k--) rest &= rest - 1; /* the commas before comma i */
        f = i;
        sep[i] = base + __builtin_ctzll(rest);
        (*ni)++;
    }
#endif
    *last = base + 63 - __builtin_clzll(m);
    *found = past;
}

/* One record at p (not an empty line): its fields unquoted, or quoted whole (commas, line breaks
 * and "" inside). Sets *stop to where it ends (its line break, or the block's end) and sep[i] to
 * the needed commas i between its fields. Returns 1, or 2 when a field of it is quoted; 0 when
 * the Python path must read the block
 * (a quote inside an unquoted field, text after a closing quote, a quoted field the block ends
 * in); -1 when it has more or fewer fields than nfields. */
static inline int fast_record(Words *w, const char *p, int nfields, const Needed *nd, const char **sep,
                              const char **stop) {
    size_t off = (size_t)(p - w->base), idx = off >> 6;
    if (idx != w->idx) words_load(w, idx);
    const char *base = w->base + (idx << 6);
    uint64_t keep = ~0ULL << (off & 63);
    uint64_t commas = w->commas & keep, breaks = w->breaks & keep;
    int found = 0, ni = 0, most = nfields - 1, quoted = 0;
    const char *last = NULL;
    for (;;) {
        if (!breaks) { /* the word's commas, then the next word */
            take_commas(commas, base, nd, &found, &ni, sep, &last);
            if (found > most) return -1;
            if (++idx >= w->nwords) {
                *stop = w->end;
                break;
            }
            words_load(w, idx);
            base += 64;
            commas = w->commas;
            breaks = w->breaks;
            continue;
        }
        /* the commas before the first break */
        take_commas(commas & ((breaks & -breaks) - 1), base, nd, &found, &ni, sep, &last);
        if (found > most) return -1;
        const char *at = base + __builtin_ctzll(breaks);
        if (*at != '"') { /* the record's line break */
            *stop = at;
            break;
        }
        if (at != (found ? last + 1 : p)) return 0; /* a quote inside an unquoted field */
        quoted = 1;
        breaks &= breaks - 1; /* the opening quote; on to the closing one (line breaks are text) */
        for (;;) {
            while (!breaks) {
                if (++idx >= w->nwords) return 0; /* the block ends inside the quotes */
                words_load(w, idx);
                base += 64;
                breaks = w->breaks;
            }
            const char *q = base + __builtin_ctzll(breaks);
            breaks &= breaks - 1;
            if (*q != '"') continue;
            if (q + 1 < w->end && q[1] == '"') { /* "" is a quote in the text: step over the second */
                if (q - base == 63) {
                    words_load(w, ++idx);
                    base += 64;
                    breaks = w->breaks & ~1ULL;
                } else {
                    breaks &= breaks - 1;
                }
                continue;
            }
            /* the closing quote: a comma, a line break or the block's end must follow */
            if (q + 1 < w->end && q[1] != ',' && q[1] != '\n' && q[1] != '\r') return 0;
            commas = w->commas & ~((2ULL << (q - base)) - 1); /* the commas after it */
            break;
        }
    }
    return found == most ? 1 + quoted : -1;
}

int csv_scan(const char *data, size_t n, int nfields, const int *field_col, const ScanPlan *plan, AggTable *t,
             int64_t *rows) {
    const char *p = data, *end = data + n;
    size_t nwords = (n + 63) / 64;
    Words words = {data, end, nwords, nwords, 0, 0};
    int ncol = plan->ncolumns;
    Raw raw[SCAN_MAX_COLUMNS];
    AggField keys[SCAN_MAX_COLUMNS];
    AggField cols[SCAN_MAX_COLUMNS];
    const char *sep_here[256], **sep = sep_here; /* the needed commas' places, by comma index */
    int need[2 * SCAN_MAX_COLUMNS], nneed = 0;
    int needed_field[SCAN_MAX_COLUMNS]; /* per needed column, its field in the record */
    int first_use[SCAN_MAX_COLUMNS]; /* per value: the first value reading the same column */
    double number[SCAN_MAX_COLUMNS];
    /* per column: read as a number before any null check (below) */
    int parse_first[SCAN_MAX_COLUMNS];
    double column_number[SCAN_MAX_COLUMNS];
    char *scratch = NULL;
    int64_t count = 0;

    for (int c = 0; c < ncol; c++) needed_field[c] = -1;
    for (int f = 0; f < nfields; f++) {
        if (field_col[f] >= 0) needed_field[field_col[f]] = f;
    }
    for (int c = 0; c < ncol; c++) {
        if (needed_field[c] < 0) return AGG_FALLBACK; /* a needed column not in the header */
    }
    /* A column a numeric value reads is parsed first where no null text reads as a number: a
     * number is then not null, and only a field that is not one is compared with the nulls. */
    int nulls_numeric = 0;
    for (int i = 0; i < plan->nnulls; i++) {
        double x;
        nulls_numeric |= scan_number(plan->nulls[i], plan->null_lens[i], 1, &x);
    }
    for (int c = 0; c < ncol; c++) parse_first[c] = 0;
    for (int v = 0; v < plan->nvalues; v++) {
        if (plan->value_numeric[v] && !nulls_numeric) parse_first[plan->value_cols[v]] = 1;
    }
    for (int v = 0; v < plan->nvalues; v++) {
        first_use[v] = v;
        for (int u = 0; u < v; u++) {
            if (plan->value_cols[u] == plan->value_cols[v] && plan->value_numeric[u] == plan->value_numeric[v]) {
                first_use[v] = u;
                break;
            }
        }
    }

    for (int i = 0; i < nfields - 1; i++) { /* the commas before and after each needed field */
        if (field_col[i] < 0 && field_col[i + 1] < 0) continue;
        if (nneed == 2 * SCAN_MAX_COLUMNS) return AGG_FALLBACK; /* a column named twice: Python decides */
        need[nneed++] = i;
    }
    const Needed needed = {need, nneed};
    if (nfields - 1 > 256 && !(sep = (const char **)malloc((size_t)(nfields - 1) * sizeof(*sep)))) return AGG_NOMEM;
    while (p < end) {
        if (*p == '\n' || *p == '\r') { /* an empty line */
            p++;
            continue;
        }
        const char *stop;
        int fast = fast_record(&words, p, nfields, &needed, sep, &stop);
        if (fast <= 0) goto fallback; /* a quote out of place, or a wrong number of fields */
        for (int c = 0; c < ncol; c++) {
            int f = needed_field[c];
            const char *s = f ? sep[f - 1] + 1 : p, *e = f < nfields - 1 ? sep[f] : stop;
            if (fast == 2 && s < e && *s == '"') { /* quoted whole: its text, "" a quote in it */
                raw[c].ptr = s + 1;
                raw[c].len = (size_t)(e - s - 2);
                raw[c].escaped = memchr(s + 1, '"', raw[c].len) != NULL;
            } else {
                raw[c].ptr = s;
                raw[c].len = (size_t)(e - s);
                raw[c].escaped = 0;
            }
        }
        p = stop;
        if (p < end) {
            if (*p == '\r' && p + 1 < end && p[1] == '\n') p++;
            p++;
        }
        count++;
        /* the record's needed columns */
        size_t used = 0;
        for (int c = 0; c < ncol; c++) {
            const char *s = raw[c].ptr;
            size_t len = raw[c].len;
            if (raw[c].escaped) {
                if (!scratch && !(scratch = (char *)malloc(n + 1))) {
                    if (sep != sep_here) free(sep);
                    return AGG_NOMEM;
                }
                len = unescape(s, len, scratch + used);
                s = scratch + used;
                used += len;
            }
            cols[c].ptr = s;
            cols[c].len = len;
            if (!parse_first[c]) {
                cols[c].is_null = scan_is_null(plan, s, len);
            } else if (scan_field_number(s, len, data, end, &column_number[c])) {
                cols[c].is_null = 0;
            } else if (!(cols[c].is_null = scan_is_null(plan, s, len))) {
                goto fallback; /* neither a number nor null: the Python path names it */
            }
        }
        int64_t g = 0;
        if (plan->nkeys) {
            if (plan->nkeys == 1) {
                g = agg_group1(t, &cols[plan->key_cols[0]]);
            } else {
                for (int k = 0; k < plan->nkeys; k++) keys[k] = cols[plan->key_cols[k]];
                g = agg_group(t, keys);
            }
            if (g == -2) goto fallback;
            if (g < 0) goto nomem;
        } else if (t->ngroups == 0) {
            g = agg_group(t, keys);
            if (g < 0) goto nomem;
        }
        t->rows[g]++;
        for (int v = 0; v < plan->nvalues; v++) {
            const AggField *f = &cols[plan->value_cols[v]];
            if (f->is_null) continue;
            if (plan->value_numeric[v]) {
                double x;
                if (parse_first[plan->value_cols[v]]) {
                    x = column_number[plan->value_cols[v]];
                } else if (first_use[v] != v) {
                    x = number[first_use[v]];
                } else if (!scan_field_number(f->ptr, f->len, data, end, &x)) {
                    goto fallback;
                }
                number[v] = x;
                agg_add_number(t, (size_t)g, v, x);
            } else {
                agg_add_present(t, (size_t)g, v);
            }
        }
    }
    free(scratch);
    if (sep != sep_here) free(sep);
    if (count == 0) return AGG_FALLBACK; /* no record: the Python path gives the empty partial */
    *rows = count;
    return AGG_OK;
nomem:
    free(scratch);
    if (sep != sep_here) free(sep);
    return AGG_NOMEM;
fallback:
    free(scratch);
    if (sep != sep_here) free(sep);
    return AGG_FALLBACK;
}
