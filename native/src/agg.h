/* Group table shared by the CSV and JSON-lines scanners: open addressing over encoded keys,
 * per group the row count and, per value column, non-null count, sum, min and max.
 *
 * A key is encoded as, per group column: one tag byte (0 null, 1 value), the length as 4 bytes,
 * the bytes. Keys are checked as UTF-8 when first inserted (every distinct key is inserted once).
 * No Python API here: the scanners run without the GIL. */
#ifndef AGGKERNEL_AGG_H
#define AGGKERNEL_AGG_H

#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define AGG_OK 0
#define AGG_FALLBACK 1 /* the block must be parsed by the Python path (it decides, or says why) */
#define AGG_NOMEM (-1)

typedef struct {
    const char *ptr; /* bytes as written (unescaped); ignored when is_null */
    size_t len;
    int is_null;
} AggField;

typedef struct {
    int64_t count; /* non-null values */
    double sum, min, max;
} AggStat;

/* A one-column key of 1 to 16 bytes as agg_words reads it, and its length (0: another key). */
typedef struct {
    uint64_t a, b;
    uint64_t len;
} AggWords;

typedef struct {
    int nkeys, nvalues;
    /* hash slots: group index + 1, 0 when empty */
    uint32_t *slots;
    uint64_t *slot_hash;
    size_t mask; /* capacity - 1 (a power of two) */
    /* groups */
    size_t ngroups, gcap;
    size_t *key_off; /* start of each group's encoded key in arena; key_off[ngroups] = used */
    int64_t *rows;
    AggStat *stats; /* ngroups * nvalues, group-major */
    AggWords *words; /* one-column tables: per group, its key when short (compared without the arena) */
    char *arena;
    size_t arena_used, arena_cap;
    /* scratch for encoding the probed key */
    char *scratch;
    size_t scratch_cap;
} AggTable;

/* The bytes of a key's tail, 1 to 7 of them, as one word: overlapping loads within the key (no
 * call to memcpy for a variable length, no read past its end). Distinct for distinct tails of the
 * same length. */
static inline uint64_t agg_tail(const char *p, size_t n) {
    if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        return (uint64_t)a | ((uint64_t)b << 32);
    }
    return (uint64_t)(unsigned char)p[0] | ((uint64_t)(unsigned char)p[n >> 1] << 8) |
           ((uint64_t)(unsigned char)p[n - 1] << 16);
}

/* Whether p[0:n] and q[0:n] hold the same bytes (memcmp's answer, inlined for short keys). */
static inline int agg_eq(const char *p, const char *q, size_t n) {
    while (n >= 8) {
        uint64_t a, b;
        memcpy(&a, p, 8);
        memcpy(&b, q, 8);
        if (a != b) return 0;
        p += 8;
        q += 8;
        n -= 8;
    }
    return n == 0 || agg_tail(p, n) == agg_tail(q, n);
}

/* A key of 1 to 16 bytes as two words (overlapping when over 8 bytes): with its length, they
 * tell it from any other key. */
static inline void agg_words(const char *p, size_t n, uint64_t *a, uint64_t *b) {
    if (n >= 8) {
        memcpy(a, p, 8);
        memcpy(b, p + n - 8, 8);
    } else {
        *a = agg_tail(p, n);
        *b = 0;
    }
}

/* The hash of a key of 1 to 16 bytes, from its words and length. */
static inline uint64_t agg_hash_words(uint64_t a, uint64_t b, size_t n) {
    uint64_t h = (a ^ 0x9E3779B97F4A7C15ULL) * 0xFF51AFD7ED558CCDULL;
    h ^= ((b ^ n) + 0xC2B2AE3D27D4EB4FULL) * 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 32;
    h *= 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 29);
}

static inline uint64_t agg_hash(const char *p, size_t n) {
    if (n - 1 < 16) { /* 1 to 16 bytes: two words (overlapping), multiplied side by side */
        uint64_t a, b;
        agg_words(p, n, &a, &b);
        return agg_hash_words(a, b, n);
    }
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, p, 8);
        h = (h ^ k) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    if (n) h = (h ^ agg_tail(p, n)) * 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    return h;
}

static inline int agg_utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t extra;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            extra = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            extra = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            extra = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        for (size_t j = 1; j <= extra; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((extra == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += extra + 1;
    }
    return 1;
}

static inline int agg_init(AggTable *t, int nkeys, int nvalues) {
    memset(t, 0, sizeof(*t));
    t->nkeys = nkeys;
    t->nvalues = nvalues;
    size_t cap = 1024;
    t->mask = cap - 1;
    t->slots = (uint32_t *)calloc(cap, sizeof(uint32_t));
    t->slot_hash = (uint64_t *)malloc(cap * sizeof(uint64_t));
    t->gcap = 256;
    t->key_off = (size_t *)malloc((t->gcap + 1) * sizeof(size_t));
    t->rows = (int64_t *)malloc(t->gcap * sizeof(int64_t));
    t->stats = (AggStat *)malloc(t->gcap * (size_t)(nvalues ? nvalues : 1) * sizeof(AggStat));
    if (nkeys == 1 && !(t->words = (AggWords *)malloc(t->gcap * sizeof(AggWords)))) return AGG_NOMEM;
    t->arena_cap = 4096;
    t->arena = (char *)malloc(t->arena_cap);
    t->scratch_cap = 256;
    t->scratch = (char *)malloc(t->scratch_cap);
    if (!t->slots || !t->slot_hash || !t->key_off || !t->rows || !t->stats || !t->arena || !t->scratch)
        return AGG_NOMEM;
    t->key_off[0] = 0;
    return AGG_OK;
}

static inline void agg_free(AggTable *t) {
    free(t->slots);
    free(t->slot_hash);
    free(t->key_off);
    free(t->rows);
    free(t->stats);
    free(t->words);
    free(t->arena);
    free(t->scratch);
    memset(t, 0, sizeof(*t));
}

static inline int agg_grow_slots(AggTable *t) {
    size_t cap = (t->mask + 1) * 2;
    uint32_t *slots = (uint32_t *)calloc(cap, sizeof(uint32_t));
    uint64_t *hashes = (uint64_t *)malloc(cap * sizeof(uint64_t));
    if (!slots || !hashes) {
        free(slots);
        free(hashes);
        return AGG_NOMEM;
    }
    for (size_t i = 0; i <= t->mask; i++) {
        if (!t->slots[i]) continue;
        uint64_t h = t->slot_hash[i];
        size_t j = (size_t)h & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
        hashes[j] = h;
    }
    free(t->slots);
    free(t->slot_hash);
    t->slots = slots;
    t->slot_hash = hashes;
    t->mask = cap - 1;
    return AGG_OK;
}

static inline int agg_grow_groups(AggTable *t) {
    size_t cap = t->gcap * 2;
    size_t nv = (size_t)(t->nvalues ? t->nvalues : 1);
    size_t *key_off = (size_t *)realloc(t->key_off, (cap + 1) * sizeof(size_t));
    if (!key_off) return AGG_NOMEM;
    t->key_off = key_off;
    int64_t *rows = (int64_t *)realloc(t->rows, cap * sizeof(int64_t));
    if (!rows) return AGG_NOMEM;
    t->rows = rows;
    AggStat *stats = (AggStat *)realloc(t->stats, cap * nv * sizeof(AggStat));
    if (!stats) return AGG_NOMEM;
    t->stats = stats;
    if (t->words) {
        AggWords *words = (AggWords *)realloc(t->words, cap * sizeof(AggWords));
        if (!words) return AGG_NOMEM;
        t->words = words;
    }
    t->gcap = cap;
    return AGG_OK;
}

static inline int64_t agg_insert(AggTable *t, const AggField *keys, size_t need, uint64_t h, size_t j);

/* Writes `keys` encoded (see the top of this file) at w; returns the end. */
static inline char *agg_encode(const AggField *keys, int nkeys, char *w) {
    for (int i = 0; i < nkeys; i++) {
        uint32_t len = keys[i].is_null ? 0 : (uint32_t)keys[i].len;
        *w++ = (char)!keys[i].is_null;
        memcpy(w, &len, 4);
        w += 4;
        if (len) memcpy(w, keys[i].ptr, len);
        w += len;
    }
    return w;
}

/* agg_group for one group column: the key is hashed and compared where it is, not copied. */
static inline int64_t agg_group1_long(AggTable *t, const AggField *key);

/* agg_group for one group column: the key is hashed and compared where it is, not copied; a key
 * of up to 16 bytes is compared with its group's words. */
static inline __attribute__((always_inline)) int64_t agg_group1(AggTable *t, const AggField *key) {
    size_t n = key->len;
    if (key->is_null || n - 1 >= 16) return agg_group1_long(t, key);
    uint64_t a, b;
    agg_words(key->ptr, n, &a, &b);
    uint64_t h = agg_hash_words(a, b, n);
    size_t j = (size_t)h & t->mask;
    for (;;) {
        uint32_t s = t->slots[j];
        if (!s) break;
        if (t->slot_hash[j] == h) {
            const AggWords *w = &t->words[s - 1];
            if (w->len == n && w->a == a && w->b == b) return (int64_t)s - 1;
        }
        j = (j + 1) & t->mask;
    }
    int64_t g = agg_insert(t, key, 5 + n, h, j);
    if (g >= 0) t->words[g] = (AggWords){a, b, n};
    return g;
}

/* agg_group1 for a null key or one of 0 or over 16 bytes: compared in the arena. */
static inline int64_t agg_group1_long(AggTable *t, const AggField *key) {
    uint64_t h = key->is_null ? 0x5bd1e995ULL : agg_hash(key->ptr, key->len);
    size_t need = 5 + (key->is_null ? 0 : key->len);
    size_t j = (size_t)h & t->mask;
    for (;;) {
        uint32_t s = t->slots[j];
        if (!s) break;
        if (t->slot_hash[j] == h) {
            size_t g = s - 1;
            const char *stored = t->arena + t->key_off[g];
            if (t->key_off[g + 1] - t->key_off[g] == need && stored[0] == (char)!key->is_null &&
                (key->is_null || agg_eq(stored + 5, key->ptr, key->len)))
                return (int64_t)g;
        }
        j = (j + 1) & t->mask;
    }
    return agg_insert(t, key, need, h, j);
}

/* Group index of `keys` (t->nkeys fields), inserted if new. Returns the index, or
 * -AGG_FALLBACK - 1 (= -2) when a new key is not valid UTF-8, or -1 when out of memory. */
static inline int64_t agg_group(AggTable *t, const AggField *keys) {
    if (t->nkeys == 1) return agg_group1(t, keys);
    size_t need = 0;
    for (int i = 0; i < t->nkeys; i++) need += 5 + (keys[i].is_null ? 0 : keys[i].len);
    if (need > t->scratch_cap) {
        size_t cap = t->scratch_cap;
        while (cap < need) cap *= 2;
        char *s = (char *)realloc(t->scratch, cap);
        if (!s) return -1;
        t->scratch = s;
        t->scratch_cap = cap;
    }
    agg_encode(keys, t->nkeys, t->scratch);
    uint64_t h = agg_hash(t->scratch, need);
    size_t j = (size_t)h & t->mask;
    for (;;) {
        uint32_t s = t->slots[j];
        if (!s) break;
        if (t->slot_hash[j] == h) {
            size_t g = s - 1;
            size_t off = t->key_off[g], len = t->key_off[g + 1] - off;
            if (len == need && agg_eq(t->arena + off, t->scratch, need)) return (int64_t)g;
        }
        j = (j + 1) & t->mask;
    }
    return agg_insert(t, keys, need, h, j);
}

/* Insert a new group of `need` encoded bytes at empty slot j (hash h). */
static inline int64_t agg_insert(AggTable *t, const AggField *keys, size_t need, uint64_t h, size_t j) {
    for (int i = 0; i < t->nkeys; i++) {
        if (!keys[i].is_null && !agg_utf8_valid((const unsigned char *)keys[i].ptr, keys[i].len))
            return -2;
    }
    if (t->ngroups >= 0xFFFFFFF0u) return -1;
    if (t->ngroups == t->gcap && agg_grow_groups(t) != AGG_OK) return -1;
    if (t->arena_used + need > t->arena_cap) {
        size_t cap = t->arena_cap;
        while (cap < t->arena_used + need) cap *= 2;
        char *a = (char *)realloc(t->arena, cap);
        if (!a) return -1;
        t->arena = a;
        t->arena_cap = cap;
    }
    size_t g = t->ngroups++;
    agg_encode(keys, t->nkeys, t->arena + t->arena_used);
    t->arena_used += need;
    t->key_off[g + 1] = t->arena_used;
    t->rows[g] = 0;
    if (t->words) t->words[g].len = 0; /* until agg_group1 sets a short key's */
    for (int v = 0; v < t->nvalues; v++) {
        AggStat *st = &t->stats[g * (size_t)t->nvalues + (size_t)v];
        st->count = 0;
        st->sum = 0.0;
        st->min = INFINITY; /* until its first value (a group without one answers 0.0) */
        st->max = -INFINITY;
    }
    t->slots[j] = (uint32_t)(g + 1);
    t->slot_hash[j] = h;
    if (t->ngroups * 2 > t->mask + 1 && agg_grow_slots(t) != AGG_OK) return -1;
    return (int64_t)g;
}

static inline void agg_add_number(AggTable *t, size_t g, int v, double x) {
    AggStat *st = &t->stats[g * (size_t)t->nvalues + (size_t)v];
    st->min = x < st->min ? x : st->min; /* no branch: the first of equal values stays */
    st->max = x > st->max ? x : st->max;
    st->sum += x;
    st->count++;
}

static inline void agg_add_present(AggTable *t, size_t g, int v) {
    t->stats[g * (size_t)t->nvalues + (size_t)v].count++;
}

#endif
