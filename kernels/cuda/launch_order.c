/*
 * kernels/cuda/launch_order.c — the launch-order setting (cuda_kernels.h
 * loom_cuda_set_trigger_first; common.cuh says what it changes).
 *
 * Every translation unit that includes common.cuh has its own copy of the
 * flag its kernels read (a static __constant__: the kernels are not built
 * with relocatable device code, so one symbol cannot serve them all), and
 * registers a setter and a getter for it at load (the getters serve
 * loom_cuda_trigger_first_units, the tests' read-back). Setting the order writes every copy on
 * the current device; the value last written to each device is remembered,
 * so a backend may call it before every step at no cost.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "cuda_kernels.h"

#define LC_PDL_UNITS 64
#define LC_PDL_DEVICES 64

/* zero-initialised before any constructor runs, so registration order does
 * not matter */
static cudaError_t (*lc_pdl_setters[LC_PDL_UNITS])(int);
static cudaError_t (*lc_pdl_getters[LC_PDL_UNITS])(int *);
static atomic_int lc_pdl_units;
static atomic_int lc_pdl_overflow;
/* per device: 0 as loaded (the kernels' default, off), 1 on, 2 off */
static atomic_int lc_pdl_state[LC_PDL_DEVICES];
/* writers: a memo never says a value some unit does not hold */
static pthread_mutex_t lc_pdl_lock = PTHREAD_MUTEX_INITIALIZER;

void lc_pdl_register(cudaError_t (*set)(int), cudaError_t (*get)(int *)) {
    const int i = atomic_fetch_add(&lc_pdl_units, 1);
    if (i < LC_PDL_UNITS) lc_pdl_setters[i] = set, lc_pdl_getters[i] = get;
    else atomic_store(&lc_pdl_overflow, 1);
}

/* every unit's copy on the current device */
static cudaError_t lc_pdl_write(int on) {
    const int n = atomic_load(&lc_pdl_units);
    for (int i = 0; i < n && i < LC_PDL_UNITS; i++) {
        const cudaError_t e = lc_pdl_setters[i](on);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t loom_cuda_set_trigger_first(int on) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    on = on ? 1 : 0;
    atomic_int *st = dev >= 0 && dev < LC_PDL_DEVICES ? &lc_pdl_state[dev] : NULL;
    const int have = st ? atomic_load(st) : -1;
    if (have == (on ? 1 : 2) || (have == 0 && !on)) return cudaSuccess;
    /* a unit without its setter keeps the default: only "on" cannot hold */
    if (on && atomic_load(&lc_pdl_overflow)) return cudaErrorNotSupported;
    pthread_mutex_lock(&lc_pdl_lock);
    e = lc_pdl_write(on);
    if (st) atomic_store(st, e == cudaSuccess ? (on ? 1 : 2) : -1);
    pthread_mutex_unlock(&lc_pdl_lock);
    return e;
}

cudaError_t loom_cuda_trigger_first_units(int *units, int *on) {
    const int n = atomic_load(&lc_pdl_units);
    *units = n, *on = 0;
    for (int i = 0; i < n && i < LC_PDL_UNITS; i++) {
        int v = 0;
        const cudaError_t e = lc_pdl_getters[i](&v);
        if (e != cudaSuccess) return e;
        *on += v != 0;
    }
    return cudaSuccess;
}
