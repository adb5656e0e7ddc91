/*
 * tests/cache/test_plugin.c — the built shared objects as the loader sees
 * them: dlopen loom-cache-paged.so / loom-cache-contiguous.so by the paths
 * meson passes (LOOM_CACHE_PAGED_SO, LOOM_CACHE_CONTIGUOUS_SO), check the
 * descriptor (ABI, signature, one cache component), that every declared
 * default parses within its bounds and fits the config struct, and drive
 * the .so's own ops once (RTLD_NOW: no undefined symbols, no libloom).
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "cache_util.h"
#include "fake_host.h"

static void check_so(const char *env, const char *component) {
    const char *path = getenv(env);
    if (!path || !*path) cr_skip_test("%s is not set (run through meson test)", env);
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(so, "dlopen %s: %s", path, dlerror());
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(so, LOOM_PLUGIN_ENTRY_SYMBOL);
    cr_assert_not_null(entry, "%s does not export %s", path, LOOM_PLUGIN_ENTRY_SYMBOL);
    const loom_plugin_desc *d = entry();
    cr_assert_eq(d->struct_size, sizeof *d);
    cr_assert_eq(d->abi_major, LOOM_ABI_MAJOR);
    cr_assert_leq(d->abi_minor, LOOM_ABI_MINOR);
    cr_assert_eq(d->build_signature, LOOM_BUILD_SIGNATURE);
    cr_assert_eq(d->num_components, 1);
    const loom_component *c = &d->components[0];
    cr_assert_eq(c->kind, LOOM_KIND_CACHE);
    cr_assert_str_eq(c->name, component);
    const loom_cache_ops *ops = c->ops;
    cr_assert_eq(ops->struct_size, sizeof *ops);
    cr_assert(ops->create && ops->destroy && ops->init && ops->acquire_prefix && ops->allocate &&
              ops->truncate && ops->free && ops->fork && ops->swap_out && ops->swap_in &&
              ops->block_table && ops->take_block_ops && ops->num_free_blocks && ops->stats);
    /* Only the entry symbol is exported. */
    cr_assert_null(dlsym(so, "loom_paged_ops"));
    cr_assert_null(dlsym(so, "loom_contiguous_ops"));

    void *cfg = calloc(1, c->config_size);
    cr_assert(tc_apply_defaults(c->params, cfg, c->config_size));
    for (const loom_param *p = c->params; p->key; p++) cr_assert_not_null(p->doc, "%s", p->key);
    /* block_size and num_blocks are the first fields in both configs. */
    int64_t bs = 4, nblocks = 32;
    memcpy(cfg, &bs, sizeof bs);
    for (const loom_param *p = c->params; p->key; p++)
        if (!strcmp(p->key, "num_blocks")) memcpy((char *)cfg + p->offset, &nblocks, sizeof nblocks);
    tc_cache cc;
    loom_error err = {0};
    loom_cache_init in = tc_init_desc((size_t)1 << 30, 64, false);
    cr_assert_eq(tc_open(&cc, ops, cfg, &in, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(cc.layout.num_blocks, 32);
    int32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    loom_seq_info s = tc_seq(1, toks, 10, 0);
    cr_assert_eq(ops->allocate(cc.self, &s, 10, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(ops->block_table(cc.self, 1, NULL, 0), 3);
    ops->free(cc.self, 1);
    tc_close(&cc);
    cr_assert_eq(fake_host_live_allocs(), 0);
    free(cfg);
    dlclose(so);
}

Test(cache, plugin_paged_so) { check_so("LOOM_CACHE_PAGED_SO", "paged"); }
Test(cache, plugin_contiguous_so) { check_so("LOOM_CACHE_CONTIGUOUS_SO", "contiguous"); }
