/* What a scanner is asked for, and the number parser both scanners share. */
#ifndef AGGKERNEL_SCAN_H
#define AGGKERNEL_SCAN_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtod_l */
#endif

#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agg.h"

#define SCAN_MAX_COLUMNS 64

/* Whether csv_v2.c, jsonl_v2.c and csv_v3.c build the scans again for newer x86-64 CPUs (GCC on
 * x86-64). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SCAN_V2_BUILD 1
#else
#define SCAN_V2_BUILD 0
#endif

typedef struct {
    int ncolumns; /* needed columns, each once */
    const char *const *names; /* JSON lines: their names (UTF-8); CSV: unused */
    const size_t *name_lens;
    int nkeys;
    const int *key_cols; /* group columns: indexes into the needed columns */
    int nvalues;
    const int *value_cols; /* value columns: indexes into the needed columns */
    const int *value_numeric; /* per value column: 1 sum/min/max over numbers, 0 only counted */
    int nnulls;
    const char *const *nulls; /* texts that are null */
    const size_t *null_lens;
    uint64_t null_lengths; /* bit k: a null text is k bytes long (k < 63); bit 63: one is longer */
} ScanPlan;

static inline int scan_is_null(const ScanPlan *plan, const char *p, size_t n) {
    if (!(plan->null_lengths >> (n < 63 ? n : 63) & 1)) return 0; /* no null text is that long */
    for (int i = 0; i < plan->nnulls; i++) {
        if (plan->null_lens[i] == n && agg_eq(plan->nulls[i], p, n)) return 1;
    }
    return 0;
}

static const double scan_pow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                      1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                      1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static inline int scan_slow_number(const char *p, size_t n, int nonzero, double *out) {
    static locale_t c_locale = (locale_t)0;
    char buf[128];
    if (n >= sizeof(buf)) return 0;
    if (c_locale == (locale_t)0) {
        locale_t made = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
        if (made == (locale_t)0) return 0;
        c_locale = made; /* a benign race: at worst one copy is leaked */
    }
    memcpy(buf, p, n);
    buf[n] = 0;
    char *end = NULL;
    *out = strtod_l(buf, &end, c_locale);
    /* out of range (infinite, or a non-zero written as 0): left to the Python path */
    return end == buf + n && isfinite(*out) && (*out != 0.0 || nonzero == 0);
}

/* `p[0:n]` as a double, correctly rounded, when it is `-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?`
 * (spaces and tabs around it allowed when `trim`). Returns 1, or 0 for anything else (the
 * Python path then decides whether it is a number at all). */
static inline int scan_number(const char *p, size_t n, int trim, double *out) {
    if (trim) {
        while (n && (*p == ' ' || *p == '\t')) p++, n--;
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    }
    const char *s = p, *e = p + n;
    int neg = 0;
    if (s < e && *s == '-') neg = 1, s++;
    {
        /* the common case first: up to 15 digits with an optional fraction, no exponent (every
         * digit accumulated, leading zeros included: exact below 2^53) */
        const char *q = s;
        uint64_t v = 0;
        while (q < e && (unsigned)(*q - '0') < 10) v = v * 10 + (uint64_t)(*q++ - '0');
        size_t whole = (size_t)(q - s), frac = 0;
        if (whole && q < e && *q == '.') {
            const char *f = ++q;
            while (q < e && (unsigned)(*q - '0') < 10) v = v * 10 + (uint64_t)(*q++ - '0');
            frac = (size_t)(q - f);
            if (!frac) return 0;
        }
        if (q == e && whole && whole + frac <= 15) {
            double d = frac ? (double)v / scan_pow10[frac] : (double)v;
            *out = neg ? -d : d;
            return 1;
        }
    }
    uint64_t w = 0;
    int digits = 0, exp10 = 0, any = 0;
    const char *start_int = s;
    while (s < e && (unsigned)(*s - '0') < 10) {
        if (w || *s != '0') {
            if (digits < 19) w = w * 10 + (uint64_t)(*s - '0');
            else exp10++;
            digits++;
        }
        s++;
    }
    if (s == start_int) return 0;
    any = 1;
    if (s < e && *s == '.') {
        s++;
        const char *start_frac = s;
        while (s < e && (unsigned)(*s - '0') < 10) {
            if (w || *s != '0') {
                if (digits < 19) {
                    w = w * 10 + (uint64_t)(*s - '0');
                    exp10--;
                }
                digits++;
            } else {
                exp10--;
            }
            s++;
        }
        if (s == start_frac) return 0;
    }
    if (s < e && (*s == 'e' || *s == 'E')) {
        s++;
        int eneg = 0;
        if (s < e && (*s == '+' || *s == '-')) eneg = (*s == '-'), s++;
        const char *start_exp = s;
        int x = 0;
        while (s < e && (unsigned)(*s - '0') < 10) {
            if (x < 100000) x = x * 10 + (*s - '0');
            s++;
        }
        if (s == start_exp) return 0;
        exp10 += eneg ? -x : x;
    }
    if (s != e || !any) return 0;
    if (digits <= 19 && w <= (1ULL << 53) && exp10 >= -22 && exp10 <= 22) {
        double d = (double)w;
        d = exp10 < 0 ? d / scan_pow10[-exp10] : d * scan_pow10[exp10];
        *out = neg ? -d : d;
        return 1;
    }
    if (w == 0 && digits == 0) {
        *out = neg ? -0.0 : 0.0;
        return 1;
    }
    return scan_slow_number(p, n, w != 0, out);
}

#if defined(__SSE4_1__)
#include <smmintrin.h>

/* A field of 1-16 bytes that is -?[0-9]+(\.[0-9]+)? with at most 15 digits, read 16 bytes at a
 * time without a branch per digit (the 16 bytes that end with it must be readable). Built where
 * SSE4.1 is on: the x86-64-v2 builds (csv_v2.c, jsonl_v2.c).
 * Returns 1 with *out as scan_number gives it (the digits as an integer, over 10^fraction digits:
 * correctly rounded), or 0: scan_number decides. */
static inline int short_number(const char *p, size_t n, double *out) {
    int neg = n && p[0] == '-';
    size_t m = n - (size_t)neg;
    if (m == 0 || m > 16) return 0;
    const __m128i iota = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + n - 16)); /* right-aligned */
    __m128i field = _mm_cmpgt_epi8(iota, _mm_set1_epi8((char)(15 - m))); /* its lanes */
    __m128i d = _mm_sub_epi8(v, _mm_set1_epi8('0'));
    __m128i digit = _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d);
    __m128i dot = _mm_and_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('.')), field);
    unsigned fmask = (unsigned)_mm_movemask_epi8(field), dmask = (unsigned)_mm_movemask_epi8(dot);
    unsigned ok = (unsigned)_mm_movemask_epi8(_mm_or_si128(digit, dot)) & fmask;
    if (ok != fmask || (dmask & (dmask - 1))) return 0; /* not digits and one dot at most */
    int frac = 0;
    __m128i idx = iota;
    if (dmask) {
        int at = __builtin_ctz(dmask); /* the dot's lane: a digit must be on each side */
        if (at == 15 || at == 16 - (int)m) return 0;
        frac = 15 - at;
        /* lanes up to the dot take the lane before them: the dot is left out */
        idx = _mm_add_epi8(iota, _mm_cmpgt_epi8(_mm_set1_epi8((char)(at + 1)), iota));
    } else if (m > 15) {
        return 0;
    }
    d = _mm_and_si128(d, _mm_andnot_si128(dot, field)); /* other lanes 0 */
    d = _mm_shuffle_epi8(d, idx);
    __m128i t = _mm_maddubs_epi16(d, _mm_setr_epi8(10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1));
    t = _mm_madd_epi16(t, _mm_setr_epi16(100, 1, 100, 1, 100, 1, 100, 1));
    t = _mm_packus_epi32(t, t);
    t = _mm_madd_epi16(t, _mm_setr_epi16(10000, 1, 10000, 1, 10000, 1, 10000, 1));
    uint64_t value = (uint64_t)(uint32_t)_mm_cvtsi128_si32(t) * 100000000ULL +
                     (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(t, 4));
    double x = frac ? (double)value / scan_pow10[frac] : (double)value;
    *out = neg ? -x : x;
    return 1;
}
#endif


/* A field's text as a number: scan_number's grammar and answers (spaces and tabs around it
 * allowed). lo, hi: the block it is in (a field unescaped into scratch memory is outside it). */
static inline int scan_field_number(const char *p, size_t n, const char *lo, const char *hi, double *out) {
#if defined(__SSE4_1__)
    if (p >= lo && p + n <= hi && p + n >= lo + 16 && short_number(p, n, out)) return 1;
#else
    (void)lo;
    (void)hi;
#endif
    return scan_number(p, n, 1, out);
}

int csv_scan(const char *data, size_t n, int nfields, const int *field_col, const ScanPlan *plan,
             AggTable *t, int64_t *rows);
int jsonl_scan(const char *data, size_t n, const ScanPlan *plan, AggTable *t, int64_t *rows,
               uint64_t *seen, int64_t *breaks);
#if SCAN_V2_BUILD
/* The same scans built for x86-64-v2 CPUs (csv_v2.c, jsonl_v2.c); module.c chooses at import. */
int csv_scan_v2(const char *data, size_t n, int nfields, const int *field_col, const ScanPlan *plan,
                AggTable *t, int64_t *rows);
int jsonl_scan_v2(const char *data, size_t n, const ScanPlan *plan, AggTable *t, int64_t *rows,
                  uint64_t *seen, int64_t *breaks);
/* The CSV scan built for x86-64-v3 CPUs (csv_v3.c). */
int csv_scan_v3(const char *data, size_t n, int nfields, const int *field_col, const ScanPlan *plan,
                AggTable *t, int64_t *rows);
#endif

#endif
