/* CSV: one pass over a block of whole records (RFC 4180 quoting, `,` between fields, records
 * ended by \n, \r\n or \r, empty lines skipped), as pyarrow's read_csv with the engine's options
 * would read it. Falls back on anything else: a wrong number of fields, a quote inside an
 * unquoted field or text after a closing quote, a number outside the fast grammar, a key that
 * is not UTF-8. */
#include "scan.h"

enum { STOP_NONE = 0, STOP_COMMA, STOP_LF, STOP_CR, STOP_QUOTE };

static unsigned char stops[256];
static int stops_ready = 0;

static void init_stops(void) {
    if (stops_ready) return;
    stops[(unsigned char)','] = STOP_COMMA;
    stops[(unsigned char)'\n'] = STOP_LF;
    stops[(unsigned char)'\r'] = STOP_CR;
    stops[(unsigned char)'"'] = STOP_QUOTE;
    stops_ready = 1;
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
    init_stops();
    const char *p = data, *end = data + n;
    int ncol = plan->ncolumns;
    Raw raw[SCAN_MAX_COLUMNS];
    AggField keys[SCAN_MAX_COLUMNS];
    AggField cols[SCAN_MAX_COLUMNS];
    char *scratch = NULL;
    int64_t count = 0;

    while (p < end) {
        if (*p == '\n' || *p == '\r') { /* an empty line */
            p++;
            continue;
        }
        int i = 0;
        for (;;) {
            const char *start;
            size_t len;
            int escaped = 0;
            if (p < end && *p == '"') {
                start = ++p;
                for (;;) {
                    const char *q = memchr(p, '"', (size_t)(end - p));
                    if (!q) goto fallback; /* unterminated */
                    if (q + 1 < end && q[1] == '"') {
                        escaped = 1;
                        p = q + 2;
                        continue;
                    }
                    len = (size_t)(q - start);
                    p = q + 1;
                    break;
                }
                if (p < end && stops[(unsigned char)*p] != STOP_COMMA && stops[(unsigned char)*p] != STOP_LF &&
                    stops[(unsigned char)*p] != STOP_CR)
                    goto fallback;
            } else {
                start = p;
                while (p < end && !stops[(unsigned char)*p]) p++;
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
                p++;
                continue;
            }
            /* end of the record */
            if (p < end) {
                if (*p == '\r' && p + 1 < end && p[1] == '\n') p++;
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
