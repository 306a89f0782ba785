/* One group's figures of one value column, and how a value is folded into them: the rule both
 * the dictionary group-by (dict.c) and the Parquet page fold (pq.c) apply. */
#ifndef AGGKERNEL_FOLD_H
#define AGGKERNEL_FOLD_H

#include <stdint.h>

typedef struct {
    int64_t count;
    double sum, min, max;
} Fold; /* one cache line holds two groups' */

enum { WANT_SUM = 1, WANT_MIN = 2, WANT_MAX = 4 };

/* `x` counted and folded into the figures `want` names (a constant where it is called, so a figure
 * not wanted costs nothing); 1 when x is NaN (the caller leaves the block to Arrow). */
static inline __attribute__((always_inline)) int fold_value(Fold *a, double x, const int want) {
    int nan = x != x;
    a->count++;
    if (want & WANT_SUM) a->sum += x;
    if (want & WANT_MIN) a->min = x < a->min ? x : a->min;
    if (want & WANT_MAX) a->max = x > a->max ? x : a->max;
    return nan;
}

#endif
