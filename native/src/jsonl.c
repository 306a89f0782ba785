/* JSON-lines scanner: one pass over a block of whole lines, validating the full syntax of each
 * line as Python's json.loads would, and reducing the needed columns into the group table.
 * Anything not answered exactly as the Python exact path would is AGG_FALLBACK. */
#include "scan.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define JSON_MAX_DEPTH 64
#define KEY_MEMO 64

typedef const unsigned char *cup;

/* Bytes that stop the plain run of a string: '"', '\\', control bytes, non-ASCII. */
static const unsigned char str_stop[256] = {
    ['"'] = 1, ['\\'] = 1,
#define C1(x) [x] = 1
    C1(0),    C1(1),    C1(2),    C1(3),    C1(4),    C1(5),    C1(6),    C1(7),    C1(8),    C1(9),
    C1(10),   C1(11),   C1(12),   C1(13),   C1(14),   C1(15),   C1(16),   C1(17),   C1(18),   C1(19),
    C1(20),   C1(21),   C1(22),   C1(23),   C1(24),   C1(25),   C1(26),   C1(27),   C1(28),   C1(29),
    C1(30),   C1(31),   [0x80 ... 0xFF] = 1,
#undef C1
};

static inline cup skip_ws(cup p, cup e) {
    while (p < e && *p <= ' ' && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    return p;
}

static inline int hexval(unsigned c) {
    if (c - '0' < 10) return (int)(c - '0');
    c |= 0x20;
    if (c - 'a' < 6) return (int)(c - 'a' + 10);
    return -1;
}

/* One UTF-8 sequence at p (p[0] >= 0x80): its end, or NULL when invalid (as agg_utf8_valid:
 * no overlongs, no surrogates, nothing above U+10FFFF). */
static inline cup utf8_step(cup p, cup e) {
    unsigned c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        if (e - p < 2 || (p[1] & 0xC0) != 0x80) return NULL;
        return p + 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (e - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return NULL;
        if (c == 0xE0 && p[1] < 0xA0) return NULL; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return NULL; /* surrogate */
        return p + 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (e - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return NULL;
        if (c == 0xF0 && p[1] < 0x90) return NULL; /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return NULL; /* above U+10FFFF */
        return p + 4;
    }
    return NULL;
}

/* A string's body from p (just after the opening quote): the position after the closing
 * quote, or NULL when invalid. *esc is set when it holds a backslash escape. */
static inline __attribute__((always_inline)) cup scan_string(cup p, cup e, int *esc) {
    for (;;) {
#if defined(__SSE2__)
        /* plain ASCII run, 16 bytes at a time: '"', '\\' and every byte below 0x20 or from 0x80
         * (negative as a signed byte) stop it */
        while (e - p >= 16) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
            const __m128i hit = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
            const unsigned bits = (unsigned)_mm_movemask_epi8(hit);
            if (bits) {
                p += __builtin_ctz(bits);
                goto stop;
            }
            p += 16;
        }
#endif
        /* plain ASCII run, 8 bytes at a time; the lowest flagged byte is always a stop byte */
        while (e - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
            uint64_t quote = w ^ (ones * '"'), bslash = w ^ (ones * '\\');
            uint64_t hit = (((quote - ones) & ~quote) | ((bslash - ones) & ~bslash) | (w - ones * 0x20) | w) & highs;
            if (hit) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                p += __builtin_ctzll(hit) >> 3;
#endif
                break;
            }
            p += 8;
        }
        while (p < e && !str_stop[*p]) p++;
        if (p >= e) return NULL;
#if defined(__SSE2__)
    stop:;
#endif
        unsigned c = *p;
        if (c == '"') return p + 1;
        if (c == '\\') {
            *esc = 1;
            if (e - p < 2) return NULL;
            c = p[1];
            if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
                p += 2;
            } else if (c == 'u') {
                if (e - p < 6 || hexval(p[2]) < 0 || hexval(p[3]) < 0 || hexval(p[4]) < 0 || hexval(p[5]) < 0)
                    return NULL;
                p += 6;
            } else {
                return NULL;
            }
            continue;
        }
        if (c < 0x20) return NULL; /* a raw control byte: Python's strict mode rejects it */
        if (!(p = utf8_step(p, e))) return NULL;
    }
}

/* A JSON number from p: its end, or NULL when not one (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?). */
/* The end of a run of ASCII digits from p (8 bytes at a time where there are 8). */
static inline cup skip_digits(cup p, cup e) {
    while (e - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t x = w - 0x3030303030303030ULL; /* a digit's byte becomes 0-9 */
        /* a byte of x from 10 (or wrapped) sets its high bit here; a carry only reaches bytes
         * above a flagged one, so the lowest flag is the first non-digit */
        uint64_t non = ((x + 0x7676767676767676ULL) | x) & 0x8080808080808080ULL;
        if (non) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            return p + (__builtin_ctzll(non) >> 3);
#else
            break;
#endif
        }
        p += 8;
    }
    while (p < e && (unsigned)(*p - '0') < 10) p++;
    return p;
}

static inline cup scan_json_number(cup p, cup e) {
    if (p < e && *p == '-') p++;
    if (p >= e) return NULL;
    if (*p == '0') {
        p++;
    } else if ((unsigned)(*p - '1') < 9) {
        p = skip_digits(p + 1, e);
    } else {
        return NULL;
    }
    if (p < e && *p == '.') {
        p++;
        if (p >= e || (unsigned)(*p - '0') >= 10) return NULL;
        p = skip_digits(p + 1, e);
    }
    if (p < e && (*p | 0x20) == 'e') {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || (unsigned)(*p - '0') >= 10) return NULL;
        while (p < e && (unsigned)(*p - '0') < 10) p++;
    }
    return p;
}

static inline cup scan_literal(cup p, cup e, const char *lit, size_t n) {
    if ((size_t)(e - p) < n) return NULL;
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)lit[i]) return NULL;
    return p + n;
}

/* Any JSON value at p (not whitespace): its end, or NULL when invalid or too deep. */
static cup skip_value(cup p, cup e, int depth) {
    int esc = 0;
    switch (*p) {
    case '"':
        return scan_string(p + 1, e, &esc);
    case 't':
        return scan_literal(p, e, "true", 4);
    case 'f':
        return scan_literal(p, e, "false", 5);
    case 'n':
        return scan_literal(p, e, "null", 4);
    case '{':
    case '[': {
        int obj = *p == '{';
        if (depth >= JSON_MAX_DEPTH) return NULL;
        p = skip_ws(p + 1, e);
        if (p < e && *p == (obj ? '}' : ']')) return p + 1;
        for (;;) {
            if (p >= e) return NULL;
            if (obj) {
                if (*p != '"' || !(p = scan_string(p + 1, e, &esc))) return NULL;
                p = skip_ws(p, e);
                if (p >= e || *p != ':') return NULL;
                p = skip_ws(p + 1, e);
                if (p >= e) return NULL;
            }
            if (!(p = skip_value(p, e, depth + 1))) return NULL;
            p = skip_ws(p, e);
            if (p >= e) return NULL;
            if (*p == ',') {
                p = skip_ws(p + 1, e);
                continue;
            }
            if (*p == (obj ? '}' : ']')) return p + 1;
            return NULL;
        }
    }
    default:
        return scan_json_number(p, e);
    }
}

/* Writes the unescaped body of a valid string s[0:n] (no quotes) to out; its length, or -1 for
 * a lone surrogate \u escape (left to the Python path). out has room for n bytes. */
static long unescape(cup s, size_t n, char *out) {
    cup e = s + n;
    char *w = out;
    while (s < e) {
        if (*s != '\\') {
            *w++ = (char)*s++;
            continue;
        }
        unsigned c = s[1];
        s += 2;
        switch (c) {
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            uint32_t cp = (uint32_t)(hexval(s[0]) << 12 | hexval(s[1]) << 8 | hexval(s[2]) << 4 | hexval(s[3]));
            s += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (e - s < 6 || s[0] != '\\' || s[1] != 'u') return -1;
                uint32_t lo =
                    (uint32_t)(hexval(s[2]) << 12 | hexval(s[3]) << 8 | hexval(s[4]) << 4 | hexval(s[5]));
                if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                s += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp < 0x80) {
                *w++ = (char)cp;
            } else if (cp < 0x800) {
                *w++ = (char)(0xC0 | cp >> 6);
                *w++ = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                *w++ = (char)(0xE0 | cp >> 12);
                *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *w++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *w++ = (char)(0xF0 | cp >> 18);
                *w++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *w++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: *w++ = (char)c; break; /* " \ / */
        }
    }
    return (long)(w - out);
}

/* A needed column's value in the current line. */
typedef struct {
    const char *ptr;
    size_t len;
    int kind; /* 0 missing / null, 1 string or number (nulls apply), 2 true / false */
} Value;

int jsonl_scan(const char *data, size_t n, const ScanPlan *plan, AggTable *t, int64_t *rows, uint64_t *seen,
               int64_t *breaks) {
    const int ncol = plan->ncolumns;
    Value vals[SCAN_MAX_COLUMNS];
    AggField keys[SCAN_MAX_COLUMNS];
    char *scratch = NULL; /* unescaped strings of the current line (malloc'd on first need) */
    int status = AGG_OK;
    int64_t nrows = 0, nbreaks = 0; /* records, and line breaks (blank lines' too) */
    uint64_t seen_all = 0;
    cup p = (cup)data, end = p + n;
    /* Per place in a line (the j-th key), the bytes of the key last seen there, from after its
     * opening quote through its ':' (valid, no escape), and its needed column or -1: lines of one
     * producer repeat their keys in the same order, so a key is then one comparison. */
    const char *memo_at[KEY_MEMO];
    size_t memo_len[KEY_MEMO] = {0};
    int memo_col[KEY_MEMO];
    uint64_t name_lengths = 0; /* bit k: a needed name is k bytes long (k < 64); bit 63: one is longer */
    for (int i = 0; i < ncol; i++) name_lengths |= 1ULL << (plan->name_lens[i] < 63 ? plan->name_lens[i] : 63);

#define FAIL(s)                                                                                                       \
    do {                                                                                                              \
        status = (s);                                                                                                 \
        goto done;                                                                                                    \
    } while (0)

    /* A line is parsed up to the block's end, not its own: a line break inside the object
     * stops the parse as the end of the line would (a raw one in a string is a control byte). */
    const cup e = end;
    while (p < end) {
        p = skip_ws(p, e);
        if (p == e) break; /* a blank last line */
        if (*p == '\n') { /* blank line */
            p++;
            nbreaks++;
            continue;
        }
        if (*p != '{') FAIL(AGG_FALLBACK);
        size_t used = 0; /* of scratch, in this line */
        uint64_t here = 0;
        p = skip_ws(p + 1, e);
        if (p < e && *p == '}') {
            p++;
        } else {
            for (int j = 0;; j++) {
                if (p >= e || *p != '"') FAIL(AGG_FALLBACK);
                cup ks = p + 1;
                int esc = 0, col;
                if (j < KEY_MEMO && memo_len[j] && (size_t)(e - ks) >= memo_len[j] &&
                    agg_eq((const char *)ks, memo_at[j], memo_len[j])) {
                    /* the same bytes as the key at this place in an earlier line of the block,
                     * through its ':': the same valid key */
                    col = memo_col[j];
                    p = ks + memo_len[j];
                } else {
                    if (!(p = scan_string(ks, e, &esc)) || esc) FAIL(AGG_FALLBACK);
                    size_t klen = (size_t)(p - 1 - ks);
                    col = -1;
                    for (int i = name_lengths >> (klen < 63 ? klen : 63) & 1 ? 0 : ncol; i < ncol; i++) {
                        if (plan->name_lens[i] == klen && agg_eq(plan->names[i], (const char *)ks, klen)) {
                            col = i;
                            break;
                        }
                    }
                    p = skip_ws(p, e);
                    if (p >= e || *p != ':') FAIL(AGG_FALLBACK);
                    p++;
                    if (j < KEY_MEMO) {
                        memo_at[j] = (const char *)ks;
                        memo_len[j] = (size_t)(p - ks);
                        memo_col[j] = col;
                    }
                }
                p = skip_ws(p, e);
                if (p >= e) FAIL(AGG_FALLBACK);
                if (col < 0) { /* validated only; scalars inline */
                    if (*p == '"') {
                        if (!(p = scan_string(p + 1, e, &esc))) FAIL(AGG_FALLBACK);
                    } else if (*p == '-' || (unsigned)(*p - '0') < 10) {
                        if (!(p = scan_json_number(p, e))) FAIL(AGG_FALLBACK);
                    } else if (!(p = skip_value(p, e, 1))) {
                        FAIL(AGG_FALLBACK);
                    }
                } else {
                    uint64_t bit = 1ULL << col;
                    if (here & bit) FAIL(AGG_FALLBACK); /* repeated: Python keeps the last one */
                    here |= bit;
                    Value *v = &vals[col];
                    cup s = p;
                    switch (*p) {
                    case '"':
                        esc = 0;
                        if (!(p = scan_string(s + 1, e, &esc))) FAIL(AGG_FALLBACK);
                        v->kind = 1;
                        v->ptr = (const char *)s + 1;
                        v->len = (size_t)(p - 1 - (s + 1));
                        if (esc) {
                            if (!scratch && !(scratch = (char *)malloc(n))) FAIL(AGG_NOMEM);
                            long len = unescape(s + 1, v->len, scratch + used);
                            if (len < 0) FAIL(AGG_FALLBACK);
                            v->ptr = scratch + used;
                            v->len = (size_t)len;
                            used += (size_t)len;
                        }
                        break;
                    case 't':
                    case 'f':
                        if (!(p = skip_value(s, e, 1))) FAIL(AGG_FALLBACK);
                        v->kind = 2;
                        v->ptr = (const char *)s;
                        v->len = (size_t)(p - s);
                        break;
                    case 'n':
                        if (!(p = scan_literal(s, e, "null", 4))) FAIL(AGG_FALLBACK);
                        v->kind = 0;
                        break;
                    default: /* a number; objects, arrays, NaN, Infinity fall back */
                        if (!(p = scan_json_number(s, e))) FAIL(AGG_FALLBACK);
                        v->kind = 1;
                        v->ptr = (const char *)s;
                        v->len = (size_t)(p - s);
                        break;
                    }
                    if (v->kind == 1 && scan_is_null(plan, v->ptr, v->len)) v->kind = 0;
                }
                p = skip_ws(p, e);
                if (p >= e) FAIL(AGG_FALLBACK);
                if (*p == ',') {
                    p = skip_ws(p + 1, e);
                    continue;
                }
                if (*p == '}') {
                    p++;
                    break;
                }
                FAIL(AGG_FALLBACK);
            }
        }
        p = skip_ws(p, e);
        if (p < e) {
            if (*p != '\n') FAIL(AGG_FALLBACK); /* extra data after the object */
            p++;
            nbreaks++;
        }
        nrows++;
        seen_all |= here;

        /* reduce the record */
        for (int c = 0; c < ncol; c++)
            if (!(here >> c & 1)) vals[c].kind = 0;
        for (int k = 0; k < plan->nkeys; k++) {
            const Value *v = &vals[plan->key_cols[k]];
            keys[k].is_null = v->kind == 0;
            keys[k].ptr = v->kind ? v->ptr : NULL;
            keys[k].len = v->kind ? v->len : 0;
        }
        int64_t g = agg_group(t, keys);
        if (g == -2) FAIL(AGG_FALLBACK);
        if (g < 0) FAIL(AGG_NOMEM);
        t->rows[g]++;
        for (int j = 0; j < plan->nvalues; j++) {
            const Value *v = &vals[plan->value_cols[j]];
            if (v->kind == 0) continue;
            if (plan->value_numeric[j]) {
                double x;
                if (!scan_field_number(v->ptr, v->len, data, data + n, &x)) FAIL(AGG_FALLBACK);
                agg_add_number(t, (size_t)g, j, x);
            } else {
                agg_add_present(t, (size_t)g, j);
            }
        }
    }
    if (nrows == 0) status = AGG_FALLBACK; /* no record: the Python path gives the empty partial */
#undef FAIL
done:
    free(scratch);
    *rows = nrows;
    *breaks = nbreaks;
    *seen = seen_all;
    return status;
}
