/*
 * conformance/chi2.c — see chi2.h.
 */
#include "chi2.h"

#include <math.h>

double loom_chi2_critical(int df, double z) {
    if (df < 1) df = 1;
    double a = 2.0 / (9.0 * df);
    return df * pow(1.0 - a + z * sqrt(a), 3.0);
}

double loom_chi2_statistic(const long *counts, const double *p, int n, long N, int *df) {
    double s = 0;
    int cats = 0;
    for (int i = 0; i < n; i++) {
        if (!(p[i] > 0)) {
            if (counts[i]) return INFINITY;
            continue;
        }
        double e = p[i] * (double)N;
        s += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
        cats++;
    }
    *df = cats > 1 ? cats - 1 : 0;
    return s;
}
