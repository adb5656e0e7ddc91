/*
 * loom/logits_topk.h — the host reference of a logits row's summary that
 * backends return from forward_topk() (loom/backend.h): the k largest
 * logits with their ids and the row's log-sum-exp. Backends whose logits
 * are on the host call it directly; device backends test their kernels
 * against it. Header-only.
 */
#ifndef LOOM_LOGITS_TOPK_H
#define LOOM_LOGITS_TOPK_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The k (<= vocab) largest of row[0..vocab): vals descending, equal values
 * by ascending id, NaN ranked as -inf; *lse = log(sum exp(row)) (NaN terms
 * count as 0, a row of -inf gives -inf, a +inf gives +inf). */
static inline void loom_logits_topk_row(const float *row, int32_t vocab, int32_t k, int32_t *ids,
                                        float *vals, float *lse) {
    int32_t n = 0;
    float mx = -INFINITY;
    for (int32_t v = 0; v < vocab; v++) {
        float x = row[v];
        if (x != x) x = -INFINITY;
        if (x > mx) mx = x;
        /* a later id enters only when strictly greater than the k-th */
        if (n == k && !(x > vals[k - 1])) continue;
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && x > vals[j - 1]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = x;
        ids[j] = v;
    }
    if (!(mx > -INFINITY) || mx == INFINITY) {
        *lse = mx;
        return;
    }
    double z = 0.0;
    for (int32_t v = 0; v < vocab; v++)
        if (row[v] == row[v]) z += exp((double)row[v] - (double)mx);
    *lse = (float)((double)mx + log(z));
}

#ifdef __cplusplus
}
#endif
#endif /* LOOM_LOGITS_TOPK_H */
