/*
 * tests/plugin/bad/bad_plugin.c — deliberately broken plugins, one per
 * -DBAD_<WHAT> flag, each a sampler named after its defect. The registry
 * must refuse every one with a message naming what is wrong (both versions,
 * both signatures, both sizes) and never crash reading them.
 *
 *   BAD_MAJOR       ABI major host+1               -> "plugin ABI 3.0, host ABI 2.0"
 *   BAD_MINOR       ABI minor host+1               -> "newer than host"
 *   BAD_SIGNATURE   32-bit pointer signature       -> "not binary compatible"
 *   BAD_NOENTRY     exports the wrong symbol       -> "no entry symbol"
 *   BAD_SMALLDESC   descriptor struct_size 16      -> "descriptor struct_size"
 *   BAD_SMALLCOMP   component struct_size 8        -> "component #0 has struct_size"
 *   BAD_SMALLOPS    ops struct_size 8              -> "ops table struct_size"
 *   BAD_PARAM       param offset past config_size  -> "lies outside the config struct"
 *   BAD_NULLMETHOD  a sampler without sample()     -> "has no sample() (NULL)"
 *   BAD_HALFSWAP    a cache with swap_out() but no swap_in() -> "only one of swap_out() and swap_in()"
 *   BAD_HALFKV      a backend with kv_read_blocks() but no kv_write_blocks()
 *                   -> "only one of kv_read_blocks() and kv_write_blocks()"
 *   BAD_LIAR        file says scheduler, component is a cache named "liar"
 *   BAD_NULLSELF    a complete sampler (it loads) whose create() returns
 *                   LOOM_OK without an instance  -> refused by create_instance
 */
#include <stddef.h>
#include <stdint.h>

#include "loom/cache.h"
#include "loom/plugin.h"
#include "loom/sampler.h"

#if defined(BAD_MAJOR)
#define BAD_NAME "badmajor"
#elif defined(BAD_MINOR)
#define BAD_NAME "newminor"
#elif defined(BAD_SIGNATURE)
#define BAD_NAME "badsig"
#elif defined(BAD_NOENTRY)
#define BAD_NAME "noentry"
#elif defined(BAD_SMALLDESC)
#define BAD_NAME "smalldesc"
#elif defined(BAD_SMALLCOMP)
#define BAD_NAME "smallcomp"
#elif defined(BAD_SMALLOPS)
#define BAD_NAME "smallops"
#elif defined(BAD_PARAM)
#define BAD_NAME "badparam"
#elif defined(BAD_NULLMETHOD)
#define BAD_NAME "nullsample"
#elif defined(BAD_HALFSWAP)
#define BAD_NAME "halfswap"
#elif defined(BAD_HALFKV)
#define BAD_NAME "halfkv"
#elif defined(BAD_LIAR)
#define BAD_NAME "liar"
#elif defined(BAD_NULLSELF)
#define BAD_NAME "nullself"
#else
#error "build with -DBAD_<WHAT>"
#endif

static loom_status bad_create(const loom_host *host, const void *config, void **self,
                              loom_error *err) {
    (void)host, (void)config, (void)err;
    *self = NULL;
    return LOOM_OK;
}

static void bad_destroy(void *self) { (void)self; }

#if defined(BAD_HALFKV)
/* A complete backend table (every REQUIRED member), so only the defect is wrong. */
static loom_status bad_load(void *s, const loom_model_view *m, const loom_quant_binding *q, loom_error *e) {
    return (void)s, (void)m, (void)q, (void)e, LOOM_ERR_UNSUPPORTED;
}
static size_t bad_kv_bytes(void *s, int32_t bs, loom_dtype t) { return (void)s, (void)bs, (void)t, 0; }
static loom_status bad_memory(void *s, loom_backend_memory *m, loom_error *e) {
    return (void)s, (void)m, (void)e, LOOM_ERR_UNSUPPORTED;
}
static loom_status bad_kv_alloc(void *s, const loom_kv_layout *l, loom_error *e) {
    return (void)s, (void)l, (void)e, LOOM_ERR_UNSUPPORTED;
}
static loom_status bad_forward(void *s, const loom_batch *b, float *l, loom_error *e) {
    return (void)s, (void)b, (void)l, (void)e, LOOM_ERR_UNSUPPORTED;
}
static loom_status bad_copy(void *s, const int32_t *p, int32_t n, loom_error *e) {
    return (void)s, (void)p, (void)n, (void)e, LOOM_ERR_UNSUPPORTED;
}
static loom_status bad_kv_read(void *s, const int32_t *b, int32_t n, void *buf, size_t len, loom_error *e) {
    return (void)s, (void)b, (void)n, (void)buf, (void)len, (void)e, LOOM_ERR_UNSUPPORTED;
}
static const loom_backend_ops bad_ops = {
    .struct_size = sizeof(loom_backend_ops), .create = bad_create, .destroy = bad_destroy, .load = bad_load,
    .kv_block_bytes = bad_kv_bytes, .memory = bad_memory, .kv_alloc = bad_kv_alloc, .forward = bad_forward,
    .copy_blocks = bad_copy, .kv_read_blocks = bad_kv_read};
#define BAD_KIND LOOM_KIND_BACKEND
#elif defined(BAD_LIAR) || defined(BAD_HALFSWAP)
/* A complete cache table (every REQUIRED member), so only the defect is wrong. */
static loom_status bad_init(void *s, const loom_cache_init *i, loom_kv_layout *l, loom_error *e) {
    (void)s, (void)i, (void)l, (void)e;
    return LOOM_ERR_UNSUPPORTED;
}
static int32_t bad_prefix(void *s, const loom_seq_info *q) { return (void)s, (void)q, 0; }
static loom_status bad_alloc(void *s, const loom_seq_info *q, int32_t n, loom_error *e) {
    return (void)s, (void)q, (void)n, (void)e, LOOM_ERR_NO_SPACE;
}
static void bad_truncate(void *s, const loom_seq_info *q, int32_t n) { (void)s, (void)q, (void)n; }
static void bad_free(void *s, loom_seq_id q) { (void)s, (void)q; }
static loom_status bad_fork(void *s, loom_seq_id a, loom_seq_id b, loom_error *e) {
    return (void)s, (void)a, (void)b, (void)e, LOOM_ERR_UNSUPPORTED;
}
static int32_t bad_table(void *s, loom_seq_id q, int32_t *o, int32_t c) { return (void)s, (void)q, (void)o, (void)c, 0; }
static int32_t bad_ops_take(void *s, loom_block_op *o, int32_t c) { return (void)s, (void)o, (void)c, 0; }
static int32_t bad_nfree(void *s) { return (void)s, 0; }
#if defined(BAD_HALFSWAP)
static loom_status bad_swap(void *s, loom_seq_id q, loom_error *e) { return (void)s, (void)q, (void)e, LOOM_ERR_NO_SPACE; }
#endif
static const loom_cache_ops bad_ops = {
    .struct_size = sizeof(loom_cache_ops), .create = bad_create, .destroy = bad_destroy, .init = bad_init,
    .acquire_prefix = bad_prefix, .allocate = bad_alloc, .truncate = bad_truncate, .free = bad_free,
    .fork = bad_fork, .block_table = bad_table, .take_block_ops = bad_ops_take, .num_free_blocks = bad_nfree,
#if defined(BAD_HALFSWAP)
    .swap_out = bad_swap,
#endif
};
#define BAD_KIND LOOM_KIND_CACHE
#else
#if !defined(BAD_NULLMETHOD)
static loom_status bad_sample(void *s, const loom_sample_batch *b, loom_sample_out *o, loom_error *e) {
    return (void)s, (void)b, (void)o, (void)e, LOOM_ERR_UNSUPPORTED;
}
#endif
static loom_status bad_probs(void *s, float *l, int32_t v, const loom_sample_row *r, loom_error *e) {
    return (void)s, (void)l, (void)v, (void)r, (void)e, LOOM_ERR_UNSUPPORTED;
}
static const loom_sampler_ops bad_ops = {
#if defined(BAD_SMALLOPS)
    .struct_size = 8,
#else
    .struct_size = sizeof(loom_sampler_ops),
#endif
    .create = bad_create,
    .destroy = bad_destroy,
#if !defined(BAD_NULLMETHOD)
    .sample = bad_sample,
#endif
    .probs = bad_probs};
#define BAD_KIND LOOM_KIND_SAMPLER
#endif

typedef struct bad_config {
    int64_t n;
} bad_config;

static const loom_param bad_params[] = {
#if defined(BAD_PARAM)
    {"n", LOOM_PARAM_INT, 64, "1", 1, 0, NULL, "offset 64 in an 8-byte struct"},
#else
    {"n", LOOM_PARAM_INT, offsetof(bad_config, n), "1", 1, 0, NULL, "an integer"},
#endif
    {0},
};

static const loom_component bad_components[] = {{
#if defined(BAD_SMALLCOMP)
    .struct_size = 8,
#else
    .struct_size = sizeof(loom_component),
#endif
    .kind = BAD_KIND,
    .name = BAD_NAME,
    .summary = "broken on purpose",
    .ops = &bad_ops,
    .params = bad_params,
    .config_size = sizeof(bad_config),
}};

static const loom_plugin_desc bad_desc = {
#if defined(BAD_SMALLDESC)
    .struct_size = 16,
#else
    .struct_size = sizeof(loom_plugin_desc),
#endif
#if defined(BAD_MAJOR)
    .abi_major = LOOM_ABI_MAJOR + 1,
    .abi_minor = 0,
#elif defined(BAD_MINOR)
    .abi_major = LOOM_ABI_MAJOR,
    .abi_minor = LOOM_ABI_MINOR + 1,
#else
    .abi_major = LOOM_ABI_MAJOR,
    .abi_minor = LOOM_ABI_MINOR,
#endif
#if defined(BAD_SIGNATURE)
    .build_signature = (4u << 16) | LOOM_TENSOR_LAYOUT_REV, /* a 32-bit build */
#else
    .build_signature = LOOM_BUILD_SIGNATURE,
#endif
    .name = "bad-" BAD_NAME,
    .version = "0.0.0",
    .num_components = 1,
    .components = bad_components,
};

#if defined(BAD_NOENTRY)
/* Looks like a plugin but exports the entry under another name. */
LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry_v0(void) { return &bad_desc; }
#else
LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &bad_desc; }
#endif
