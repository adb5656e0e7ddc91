/*
 * tests/gpu/gpu_util.h — helpers shared by the GPU test programs
 * (tests/gpu) and the GPU benchmarks (bench/gpu): find a component in a
 * dlopen'd plugin, fill a config struct from a component's parameter
 * defaults plus "key=value" overrides (the host's job in the engine), and
 * the seeded splitmix64 stream the GPU tests draw their inputs from.
 */
#ifndef LOOM_TEST_GPU_UTIL_H
#define LOOM_TEST_GPU_UTIL_H

#include <stdint.h>

#include "loom/plugin.h"

/* dlopen `path` (RTLD_NOW | RTLD_LOCAL, the handle in *lib) and return its
 * component of `kind` named `name`; NULL, with a message on stderr, when
 * the library does not load or has no such component. */
const loom_component *gpu_plugin_find(void **lib, const char *path, loom_kind kind,
                                      const char *name);

/* The quantizer NAME of DIR/NAME/loom-quantizer-NAME.so (a build tree's
 * plugins/quantizer) or DIR/loom-quantizer-NAME.so, as gpu_plugin_find. */
const loom_component *gpu_quantizer_find(void **lib, const char *dir, const char *name);

/* A calloc'd config struct (config_size + 16 bytes) from c's parameter
 * defaults, each overridden by a "key=value" of the NULL-terminated
 * `overrides` (may be NULL). Booleans take "true" or "1". An override whose
 * key is no parameter of c ends the program (exit 2) naming it. */
void *gpu_config_make(const loom_component *c, const char *const *overrides);

/* The tests' one random stream: seed it, then draw. */
void gpu_rng_seed(uint64_t seed);
uint64_t gpu_rng_next(void);
/* Uniform in [lo, hi) with 24 random bits. */
float gpu_rng_unif(float lo, float hi);

#endif
