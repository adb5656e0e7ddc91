/*
 * conformance/chi2.h — Pearson's chi-square goodness of fit, as the kit's
 * sampler checks and the sampler tests use it: the statistic of observed
 * counts against a distribution, and the critical value for a significance
 * level given by its upper normal quantile (Wilson-Hilferty). A check that
 * uses them should also show that the statistic REJECTS a plausible wrong
 * distribution, so a pass means something.
 */
#ifndef LOOM_CONFORMANCE_CHI2_H
#define LOOM_CONFORMANCE_CHI2_H

#include <stdint.h>

/* Upper normal quantiles: alpha = 1e-3 (the plugin tests, fixed seeds) and
 * alpha = 1e-6 (the kit, whose seeds change every run: about one spurious
 * failure in a million comparisons). */
#define LOOM_CHI2_Z_1E3 3.0902
#define LOOM_CHI2_Z_1E6 4.7534

/* Critical value of chi-square with `df` degrees of freedom (>= 1) at the
 * level whose upper normal quantile is z. */
double loom_chi2_critical(int df, double z);

/* Statistic of counts (n categories, total N draws) against p (n, sums to
 * 1). Categories with p == 0 are left out, but a draw in one gives +inf.
 * *df = categories with p > 0, minus one (0 when fewer than two). */
double loom_chi2_statistic(const long *counts, const double *p, int n, long N, int *df);

#endif
