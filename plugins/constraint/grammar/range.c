/*
 * plugins/constraint/grammar/range.c — JSON numbers inside bounds, as GBNF:
 * the schema keywords minimum, maximum, exclusiveMinimum and
 * exclusiveMaximum. Integers lo..hi become digit-range alternatives per
 * digit count (no leading zeros; the negative side is "-" and a range of
 * magnitudes). A number is an integer part and a fraction: the integer
 * part ranges over the bounds, and the fraction is narrowed only where the
 * integer part sits at a bound (at an inclusive upper bound it must be
 * zero, above an exclusive lower bound it must not be). Exponents are not
 * written. Only integer bounds are handled (the caller refuses others).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

/* Decimal digits of v (0 <= v <= GRAM_MAX_INT) into d, NUL-terminated;
 * their count. */
static int digits_of(int64_t v, char d[24]) { return snprintf(d, 24, "%lld", (long long)v); }

/* The n-digit strings from lo to hi (lo <= hi as strings of equal length;
 * zeros allowed in front: they are positions inside a longer number). */
static void same_length(gbuf *b, const char *lo, const char *hi, int n) {
    if (n == 0) {
        gbuf_put(b, "\"\"");
        return;
    }
    if (lo[0] == hi[0]) {
        gbuf_printf(b, "\"%c\" (", lo[0]);
        same_length(b, lo + 1, hi + 1, n - 1);
        gbuf_put(b, ")");
        return;
    }
    bool lo_zeros = strspn(lo + 1, "0") == (size_t)(n - 1), hi_nines = strspn(hi + 1, "9") == (size_t)(n - 1);
    char first = lo[0], last = hi[0], nines[24], zeros[24];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    int alts = 0;
    gbuf_put(b, "(");
    if (!lo_zeros) { /* lo[0] followed by lo's rest .. 99..9 */
        gbuf_printf(b, "\"%c\" (", first++);
        same_length(b, lo + 1, nines, n - 1);
        gbuf_put(b, ")");
        alts++;
    }
    if (first <= last - (hi_nines ? 0 : 1)) {
        char top = hi_nines ? last : (char)(last - 1);
        gbuf_printf(b, "%s[%c-%c]", alts++ ? " | " : "", first, top);
        if (n > 1) gbuf_printf(b, " [0-9]{%d}", n - 1);
    }
    if (!hi_nines) { /* hi[0] followed by 00..0 .. hi's rest */
        gbuf_printf(b, "%s\"%c\" (", alts++ ? " | " : "", last);
        same_length(b, zeros, hi + 1, n - 1);
        gbuf_put(b, ")");
    }
    gbuf_put(b, ")");
}

/* Non-negative integers lo..hi written without leading zeros, as
 * alternatives (a leading " | " before each but the first when *alts). */
static void nonneg_range(gbuf *b, int64_t lo, int64_t hi, int *alts) {
    int64_t p = 1; /* 10^(len-1); 10^16 still fits an int64 */
    for (int len = 1; len <= GRAM_MAX_DIGITS && (len == 1 || p <= hi); len++, p *= 10) {
        int64_t bottom = len == 1 ? 0 : p, top = 10 * p - 1;
        int64_t a = lo > bottom ? lo : bottom, z = hi < top ? hi : top;
        if (a > z) continue;
        char da[24], dz[24];
        digits_of(a, da);
        digits_of(z, dz);
        gbuf_put(b, (*alts)++ ? " | " : "");
        same_length(b, da, dz, len);
    }
}

void gram_int_range(gbuf *b, int64_t lo, int64_t hi) {
    int alts = 0;
    gbuf_put(b, "(");
    if (lo < 0) {
        int sub = 0;
        gbuf_put(b, "\"-\" (");
        nonneg_range(b, hi < 0 ? -hi : 1, -lo, &sub);
        gbuf_put(b, ")");
        alts++;
    }
    if (hi >= 0) nonneg_range(b, lo > 0 ? lo : 0, hi, &alts);
    gbuf_put(b, ")");
}

/* Fractions (with their '.') as GBNF. */
enum frac { FRAC_ANY, FRAC_ZERO, FRAC_POSITIVE };

/* A fraction of kind k with at most `digits` digits (none when 0; a
 * positive one ends in a nonzero digit). */
static void put_frac(gbuf *b, enum frac k, int digits) {
    if (digits <= 0) return;
    if (k == FRAC_ANY) gbuf_printf(b, " (\".\" [0-9]{1,%d})?", digits);
    else if (k == FRAC_ZERO) gbuf_printf(b, " (\".\" \"0\"{1,%d})?", digits);
    else gbuf_printf(b, " \".\" [0-9]{0,%d} [1-9]", digits - 1);
}

/* Digits a fraction may have beside integer part i so that the whole
 * number keeps 15 significant digits and so parses to a double distinct
 * from any other such number (an exclusive bound among them). */
static int frac_digits_distinct(int64_t i) {
    char d[24];
    return i == 0 ? 15 : 15 - digits_of(i, d);
}

/* Integer parts lo..hi (as magnitudes), each followed by a fraction. */
static void mag_part(gbuf *b, int64_t lo, int64_t hi, enum frac k, int digits, int *alts) {
    if (lo > hi || (digits <= 0 && k == FRAC_POSITIVE)) return;
    gbuf_put(b, (*alts)++ ? " | (" : "(");
    int sub = 0;
    nonneg_range(b, lo, hi, &sub);
    gbuf_put(b, ")");
    put_frac(b, k, digits);
}

/* Magnitudes m with a < m < b (ends inclusive by their flags; hi.has false
 * = up to the largest integer part), 0 <= a <= b. */
static void magnitudes(gbuf *b, gram_bound lo, gram_bound hi, int *alts) {
    int64_t a = lo.v, z = hi.has ? hi.v : GRAM_MAX_INT;
    bool top_open = hi.has && !hi.incl; /* the part just below z must stay below it */
    if (a > z) return;
    if (hi.has && a == z) {
        if (lo.incl && hi.incl) mag_part(b, a, a, FRAC_ZERO, GRAM_MAX_DIGITS, alts);
        return;
    }
    int near_top = top_open && a + 1 == z ? frac_digits_distinct(a) : GRAM_MAX_DIGITS;
    if (lo.incl) mag_part(b, a, a, FRAC_ANY, near_top, alts);
    else {
        int d = a == 0 ? GRAM_MAX_DIGITS : frac_digits_distinct(a);
        mag_part(b, a, a, FRAC_POSITIVE, d < near_top ? d : near_top, alts);
    }
    if (!hi.has) {
        mag_part(b, a + 1, z, FRAC_ANY, GRAM_MAX_DIGITS, alts);
        return;
    }
    if (top_open) {
        mag_part(b, a + 1, z - 2, FRAC_ANY, GRAM_MAX_DIGITS, alts);
        if (z - 1 > a) mag_part(b, z - 1, z - 1, FRAC_ANY, frac_digits_distinct(z - 1), alts);
    } else {
        mag_part(b, a + 1, z - 1, FRAC_ANY, GRAM_MAX_DIGITS, alts);
        mag_part(b, z, z, FRAC_ZERO, GRAM_MAX_DIGITS, alts);
    }
}

bool gram_number_range(gbuf *b, gram_bound lo, gram_bound hi) {
    gbuf tmp = {0};
    int alts = 0;
    if (!lo.has || lo.v < 0) { /* x < 0: magnitudes from max(-hi, 0) (exclusive at 0) to -lo */
        gram_bound mlo = {true, false, 0}, mhi = {lo.has, lo.incl, lo.has ? -lo.v : 0};
        if (hi.has && hi.v < 0) mlo = (gram_bound){true, hi.incl, -hi.v};
        int sub = 0;
        gbuf neg = {0};
        magnitudes(&neg, mlo, mhi, &sub);
        if (sub && !neg.oom) {
            gbuf_printf(&tmp, "\"-\" (%s)", neg.s);
            alts++;
        }
        if (neg.oom) tmp.oom = true;
        free(neg.s);
    }
    if (!hi.has || hi.v >= 0) { /* x >= 0 */
        gram_bound plo = lo.has && lo.v >= 0 ? lo : (gram_bound){true, true, 0};
        magnitudes(&tmp, plo, hi, &alts);
    }
    if (tmp.oom) b->oom = true;
    else if (alts) gbuf_printf(b, "(%s)", tmp.s);
    free(tmp.s);
    return alts > 0;
}
