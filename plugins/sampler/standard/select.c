/*
 * plugins/sampler/standard/select.c — see select.h. Quickselect for large k,
 * a bounded heap for small k, qsort for the final ordering of the few
 * candidates that survive.
 */
#include "select.h"

#include <math.h>
#include <stdlib.h>

static int std_cand_cmp(const void *pa, const void *pb) {
    const std_cand *a = pa, *b = pb;
    if (std_cand_before(a, b)) return -1;
    if (std_cand_before(b, a)) return 1;
    return 0;
}

void std_cand_sort(std_cand *c, int64_t n) {
    if (n > 1) qsort(c, (size_t)n, sizeof *c, std_cand_cmp);
}

static inline void std_cand_swap(std_cand *a, std_cand *b) {
    std_cand t = *a;
    *a = *b;
    *b = t;
}

void std_cand_select(std_cand *c, int64_t n, int64_t k) {
    if (k <= 0 || k >= n) return;
    /* Hoare-partition quickselect for the boundary index k-1 (the classic
     * nth_element loop). Median of three guards sorted input; the depth
     * budget turns a pathological pivot sequence into one sort instead of
     * O(n^2). */
    int64_t lo = 0, hi = n - 1, target = k - 1;
    int budget = 2 * (int)log2((double)n) + 8;
    while (lo < hi) {
        if (budget-- <= 0) {
            std_cand_sort(c + lo, hi - lo + 1);
            return;
        }
        int64_t mid = lo + (hi - lo) / 2;
        if (std_cand_before(&c[mid], &c[lo])) std_cand_swap(&c[mid], &c[lo]);
        if (std_cand_before(&c[hi], &c[lo])) std_cand_swap(&c[hi], &c[lo]);
        if (std_cand_before(&c[hi], &c[mid])) std_cand_swap(&c[hi], &c[mid]);
        std_cand pivot = c[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (std_cand_before(&c[i], &pivot)) i++;
            while (std_cand_before(&pivot, &c[j])) j--;
            if (i <= j) {
                std_cand_swap(&c[i], &c[j]);
                i++;
                j--;
            }
        }
        /* [lo, j] rank no later than the pivot, [i, hi] no earlier. */
        if (target <= j)
            hi = j;
        else if (target >= i)
            lo = i;
        else
            return;
    }
}

/* Min-heap on rank: h[0] is the WORST kept candidate, so a new one only has
 * to beat the root to get in. */
static void std_heap_sift_down(std_cand *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && std_cand_before(&h[worst], &h[l])) worst = l;
        if (r < n && std_cand_before(&h[worst], &h[r])) worst = r;
        if (worst == i) return;
        std_cand_swap(&h[i], &h[worst]);
        i = worst;
    }
}

static void std_heap_sift_up(std_cand *h, int64_t i) {
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!std_cand_before(&h[parent], &h[i])) return;
        std_cand_swap(&h[parent], &h[i]);
        i = parent;
    }
}

int64_t std_cand_top_k(const float *logits, int32_t vocab, int64_t k, std_cand *out) {
    int64_t n = 0;
    if (k <= 0) return 0;
    for (int32_t id = 0; id < vocab; id++) {
        float v = logits[id];
        if (!(v > -INFINITY)) continue;
        if (n < k) {
            out[n] = (std_cand){.v = v, .id = id, .w = 0.0};
            std_heap_sift_up(out, n);
            n++;
            continue;
        }
        /* Ids rise through the scan, so an equal logit never beats the
         * root (which has a lower id): a plain compare rejects most tokens. */
        if (!(v > out[0].v)) continue;
        out[0] = (std_cand){.v = v, .id = id, .w = 0.0};
        std_heap_sift_down(out, n, 0);
    }
    std_cand_sort(out, n);
    return n;
}
