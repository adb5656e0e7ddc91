/*
 * tests/plugin/bad/bad_plugin.c — deliberately broken plugins, one per
 * -DBAD_<WHAT> flag, each a sampler named after its defect. The registry
 * must refuse every one with a message naming what is wrong (both versions,
 * both signatures, both sizes) and never crash reading them.
 *
 *   BAD_MAJOR       ABI major 2                    -> "plugin ABI 2.0, host ABI 1.0"
 *   BAD_MINOR       ABI minor host+1               -> "newer than host"
 *   BAD_SIGNATURE   32-bit pointer signature       -> "not binary compatible"
 *   BAD_NOENTRY     exports the wrong symbol       -> "no entry symbol"
 *   BAD_SMALLDESC   descriptor struct_size 16      -> "descriptor struct_size"
 *   BAD_SMALLCOMP   component struct_size 8        -> "component #0 has struct_size"
 *   BAD_SMALLOPS    ops struct_size 8              -> "ops table struct_size"
 *   BAD_PARAM       param offset past config_size  -> "lies outside the config struct"
 *   BAD_LIAR        file says scheduler, component is a cache named "liar"
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
#elif defined(BAD_LIAR)
#define BAD_NAME "liar"
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

#if defined(BAD_LIAR)
static const loom_cache_ops bad_ops = {
    .struct_size = sizeof(loom_cache_ops), .create = bad_create, .destroy = bad_destroy};
#define BAD_KIND LOOM_KIND_CACHE
#else
static const loom_sampler_ops bad_ops = {
#if defined(BAD_SMALLOPS)
    .struct_size = 8,
#else
    .struct_size = sizeof(loom_sampler_ops),
#endif
    .create = bad_create,
    .destroy = bad_destroy};
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
