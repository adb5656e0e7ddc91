/*
 * tests/quant/qt_util.h — helpers of the quantizer tests (suite 'quant'):
 * dlopen a quantizer plugin by the path meson puts in the environment, fill
 * its config from its own parameter table ("key=value" overrides on top of
 * the declared defaults, as the host would), a fake model view over test
 * tensors, and float64 references. Seeded random numbers come from
 * tests/common/rng.h (fresh seed per test, LOOM_TEST_SEED replays).
 * Every helper fails the current Criterion test on error.
 */
#ifndef LOOM_TEST_QT_UTIL_H
#define LOOM_TEST_QT_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/model.h"
#include "loom/plugin.h"
#include "loom/quant.h"

/* The quantizer component of the plugin whose path is in env var `env`
 * (LOOM_QUANT_INT8_SO, ...). The handle stays open for the process. */
const loom_component *qt_component(const char *env);

/* A config for comp: declared defaults, then each "key=value" of the
 * NULL-terminated list. calloc'd; caller frees. */
void *qt_config(const loom_component *comp, const char *const *sets);

/* Create an instance through the fake host; returns the status and fills
 * *self / err. */
loom_status qt_create(const loom_component *comp, const char *const *sets, void **self,
                      loom_error *err);

/* ---- fake model ---------------------------------------------------------- */

#define QT_MAX_TENSORS 64

typedef struct qt_model {
    loom_model_config cfg;
    loom_tensor t[QT_MAX_TENSORS];
    char names[QT_MAX_TENSORS][96];
    void *owned[QT_MAX_TENSORS];   /* buffers this model frees */
    int n;
    loom_model_view view;
} qt_model;

void qt_model_init(qt_model *m);
void qt_model_free(qt_model *m);
/* Add a tensor; `data` is taken over (freed by qt_model_free) when own. */
loom_tensor *qt_model_add(qt_model *m, const char *name, loom_dtype dt, int ndim, int64_t d0,
                          int64_t d1, void *data, size_t nbytes, bool own);
/* Add a float32 (rows, cols) tensor of N(0, scale^2) values (plus a few
 * outliers when `outliers`); returns it. */
loom_tensor *qt_model_add_f32(qt_model *m, const char *name, int64_t rows, int64_t cols,
                              double scale, bool outliers, void *rng);

/* ---- float64 math -------------------------------------------------------- */

/* ||a - b||_F / ||b||_F over n floats. */
double qt_rel_err(const float *a, const float *b, int64_t n);

#endif
