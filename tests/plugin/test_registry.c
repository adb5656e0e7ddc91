/*
 * tests/plugin/test_registry.c — the loader: lookup by conventional name,
 * by descriptor scan and by path; every refusal (ABI major/minor, build
 * signature, entry symbol, not a shared object, struct sizes, bad params,
 * wrong kind, duplicates, not found) with its key content; listing that
 * tolerates broken files; live-instance counting across registry teardown.
 * Registries here search only the directories each test names.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "loom/sampler.h"
#include "loom/scheduler.h"
#include "loom/executor.h"
#include "loom/spec.h"
#include "plugin/host.h"
#include "plugin/registry.h"
#include "tp_util.h"

#define ISOLATED (LOOM_REGISTRY_NO_ENV | LOOM_REGISTRY_NO_BUILTIN)

static loom_registry *reg_over(const char *a, const char *b) {
    const char *dirs[2] = {a, b};
    loom_registry *reg = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_registry_create(dirs, b ? 2 : 1, "test", ISOLATED, &reg, &err), LOOM_OK,
                 "%s", err.message);
    return reg;
}

static loom_registry *good_reg(void) { return reg_over(tp_env("LOOM_TEST_GOOD_DIR"), NULL); }
static loom_registry *bad_reg(void) { return reg_over(tp_env("LOOM_TEST_BAD_DIR"), NULL); }

/* Find must fail with `code` and a message containing every needle. */
static void expect_fail(loom_registry *reg, loom_kind kind, const char *name, loom_status code,
                        const char *const *needles) {
    const loom_component *c = (const loom_component *)1;
    loom_plugin *p = (loom_plugin *)1;
    loom_error err = {0};
    loom_status st = loom_registry_find(reg, kind, name, &c, &p, &err);
    cr_assert_eq(st, code, "find %s: status %d, want %d: %s", name, st, code, err.message);
    cr_assert_null(c);
    cr_assert_null(p);
    for (; *needles; needles++)
        cr_assert_not_null(strstr(err.message, *needles), "message lacks \"%s\":\n%s", *needles,
                           err.message);
}

/* "MAJOR.MINOR" of this SDK, as the loader prints it */
#define LOOM_TEST_STR_(x) #x
#define LOOM_TEST_STR(x) LOOM_TEST_STR_(x)
#define LOOM_TEST_ABI LOOM_TEST_STR(LOOM_ABI_MAJOR) "." LOOM_TEST_STR(LOOM_ABI_MINOR)
#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A test that the bad plugin `plugin` (a `kind`) fails to load with
 * `status` and a message holding every one of the needles. */
#define BAD_PLUGIN_TEST(test, kind, plugin, status, ...)                                           \
    Test(plugin_registry, test) {                                                                  \
        loom_registry *reg = bad_reg();                                                            \
        expect_fail(reg, kind, plugin, status, NEEDLES(__VA_ARGS__));                              \
        loom_registry_destroy(reg);                                                                \
    }

/* ------------------------------------------------------------- lookups */

Test(plugin_registry, finds_each_kind_by_conventional_name) {
    loom_registry *reg = good_reg();
    static const struct {
        loom_kind kind;
        const char *name;
    } want[] = {{LOOM_KIND_BACKEND, "tback"},   {LOOM_KIND_EXECUTOR, "texec"},
                {LOOM_KIND_SCHEDULER, "tsched"}, {LOOM_KIND_CACHE, "tcache"},
                {LOOM_KIND_QUANTIZER, "tquant"}, {LOOM_KIND_SAMPLER, "tsamp"},
                {LOOM_KIND_SPECULATOR, "tspec"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const loom_component *c = NULL;
        loom_plugin *p = NULL;
        loom_error err = {0};
        cr_assert_eq(loom_registry_find(reg, want[i].kind, want[i].name, &c, &p, &err), LOOM_OK,
                     "%s", err.message);
        cr_assert_eq(c->kind, want[i].kind);
        cr_assert_str_eq(c->name, want[i].name);
        char file[64];
        snprintf(file, sizeof file, "/loom-%s-%s.so", loom_kind_name(want[i].kind), want[i].name);
        cr_assert_not_null(strstr(loom_plugin_path(p), file), "%s", loom_plugin_path(p));
        cr_assert_eq(loom_plugin_desc_of(p)->abi_major, LOOM_ABI_MAJOR);
    }
    loom_registry_destroy(reg);
}

Test(plugin_registry, falls_back_to_scanning_descriptors) {
    loom_registry *reg = good_reg();
    const loom_component *c = NULL;
    loom_plugin *p = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_registry_find(reg, LOOM_KIND_SAMPLER, "msamp", &c, &p, &err), LOOM_OK, "%s",
                 err.message);
    cr_assert_str_eq(c->name, "msamp");
    cr_assert_not_null(strstr(loom_plugin_path(p), "/libmulti.so"));
    const loom_component *c2 = NULL;
    loom_plugin *p2 = NULL;
    cr_assert_eq(loom_registry_find(reg, LOOM_KIND_SCHEDULER, "msched", &c2, &p2, &err), LOOM_OK);
    cr_assert_eq(p2, p, "one object, opened once");
    loom_registry_destroy(reg);
}

Test(plugin_registry, loads_by_path) {
    loom_registry *reg = reg_over("/nonexistent-dir", NULL);
    char *path = tp_join(tp_env("LOOM_TEST_GOOD_DIR"), "libmulti.so");
    const loom_component *c = NULL;
    loom_plugin *p = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_registry_find(reg, LOOM_KIND_SAMPLER, path, &c, &p, &err), LOOM_OK, "%s",
                 err.message);
    cr_assert_str_eq(c->name, "msamp");
    cr_assert_eq(loom_registry_find(reg, LOOM_KIND_SCHEDULER, path, &c, &p, &err), LOOM_OK);
    cr_assert_str_eq(c->name, "msched");
    expect_fail(reg, LOOM_KIND_CACHE, path, LOOM_ERR_INVALID,
                NEEDLES("provides no cache", "sampler msamp", "scheduler msched"));
    expect_fail(reg, LOOM_KIND_CACHE, "/no/such/plugin.so", LOOM_ERR_NOT_FOUND,
                NEEDLES("/no/such/plugin.so", "No such file"));
    free(path);
    loom_registry_destroy(reg);
}

Test(plugin_registry, not_found_lists_every_place) {
    loom_registry *reg = reg_over(tp_env("LOOM_TEST_GOOD_DIR"), "/nonexistent-loom-dir");
    expect_fail(reg, LOOM_KIND_SAMPLER, "nope", LOOM_ERR_NOT_FOUND,
                NEEDLES("no sampler plugin named 'nope'", "loom-sampler-nope.so",
                        tp_env("LOOM_TEST_GOOD_DIR"), "/nonexistent-loom-dir", "missing",
                        "loom plugins", "LOOM_PLUGIN_PATH"));
    expect_fail(reg, LOOM_KIND_SAMPLER, "tsmap", LOOM_ERR_NOT_FOUND,
                NEEDLES("did you mean 'tsamp'?"));
    loom_registry_destroy(reg);
}

Test(plugin_registry, empty_search_path_says_so) {
    loom_registry *reg = NULL;
    cr_assert_eq(loom_registry_create(NULL, 0, NULL, ISOLATED, &reg, NULL), LOOM_OK);
    cr_assert_eq(loom_registry_num_dirs(reg), 0);
    expect_fail(reg, LOOM_KIND_CACHE, "paged", LOOM_ERR_NOT_FOUND,
                NEEDLES("the search path is empty"));
    loom_registry_destroy(reg);
}

/* ------------------------------------------------------------- refusals */

Test(plugin_registry, abi_major_mismatch) {
    loom_registry *reg = bad_reg();
    char both[64];
    snprintf(both, sizeof both, "plugin ABI %d.0, host ABI %s", LOOM_ABI_MAJOR + 1, LOOM_TEST_ABI);
    expect_fail(reg, LOOM_KIND_SAMPLER, "badmajor", LOOM_ERR_ABI,
                NEEDLES(both, "loom-sampler-badmajor.so", "rebuild"));
    loom_registry_destroy(reg);
}

Test(plugin_registry, abi_minor_newer_than_host) {
    loom_registry *reg = bad_reg();
    char want[96];
    snprintf(want, sizeof want, "plugin ABI %d.%d is newer than host ABI %s", LOOM_ABI_MAJOR, LOOM_ABI_MINOR + 1,
             LOOM_TEST_ABI);
    expect_fail(reg, LOOM_KIND_SAMPLER, "newminor", LOOM_ERR_ABI, NEEDLES(want));
    loom_registry_destroy(reg);
}

Test(plugin_registry, build_signature_mismatch) {
    loom_registry *reg = bad_reg();
    char host_sig[32];
    snprintf(host_sig, sizeof host_sig, "host 0x%x", (unsigned)LOOM_BUILD_SIGNATURE);
    expect_fail(reg, LOOM_KIND_SAMPLER, "badsig", LOOM_ERR_ABI,
                NEEDLES("not binary compatible", "plugin build signature 0x40001",
                        "32-bit pointers", host_sig));
    loom_registry_destroy(reg);
}

BAD_PLUGIN_TEST(no_entry_symbol, LOOM_KIND_SAMPLER, "noentry", LOOM_ERR_FORMAT,
                "no entry symbol 'loom_plugin_entry'", "loom-sampler-noentry.so")

/* dlerror's own words follow the path; then the hint. */
BAD_PLUGIN_TEST(not_a_shared_object, LOOM_KIND_SAMPLER, "text", LOOM_ERR_FORMAT,
                "loom-sampler-text.so' is not a loadable shared object: ",
                "is it a loom plugin built for this machine?")

BAD_PLUGIN_TEST(descriptor_too_small, LOOM_KIND_SAMPLER, "smalldesc", LOOM_ERR_ABI,
                "descriptor struct_size is 16 bytes", "LOOM_PLUGIN_DESC_HEADER")

BAD_PLUGIN_TEST(component_too_small, LOOM_KIND_SAMPLER, "smallcomp", LOOM_ERR_ABI,
                "component #0 has struct_size 8", "loom_component")

Test(plugin_registry, ops_table_too_small) {
    loom_registry *reg = bad_reg();
    char want[64];
    snprintf(want, sizeof want, "ops table is %zu bytes", loom_kind_min_ops_size(LOOM_KIND_SAMPLER));
    expect_fail(reg, LOOM_KIND_SAMPLER, "smallops", LOOM_ERR_ABI,
                NEEDLES("sampler 'smallops' ops table struct_size is 8 bytes", want));
    loom_registry_destroy(reg);
}

BAD_PLUGIN_TEST(null_required_method, LOOM_KIND_SAMPLER, "nullsample", LOOM_ERR_FORMAT,
                "sampler 'nullsample' has no sample() (NULL)",
                "loom/sampler.h marks it REQUIRED")

BAD_PLUGIN_TEST(half_a_swap_pair, LOOM_KIND_CACHE, "halfswap", LOOM_ERR_FORMAT,
                "cache 'halfswap' has only one of swap_out() and swap_in()")

BAD_PLUGIN_TEST(half_a_kv_image_pair, LOOM_KIND_BACKEND, "halfkv", LOOM_ERR_FORMAT,
                "backend 'halfkv' has only one of kv_read_blocks() and kv_write_blocks()")

BAD_PLUGIN_TEST(param_outside_config, LOOM_KIND_SAMPLER, "badparam", LOOM_ERR_FORMAT,
                "parameter 'n' lies outside the config struct")

Test(plugin_registry, wrong_kind_for_slot) {
    loom_registry *reg = good_reg();
    expect_fail(reg, LOOM_KIND_SCHEDULER, "tcache", LOOM_ERR_INVALID,
                NEEDLES("'tcache' is a cache plugin, but the scheduler slot needs a scheduler"));
    expect_fail(reg, LOOM_KIND_CACHE, "texec", LOOM_ERR_INVALID,
                NEEDLES("'texec' is an executor plugin, but the cache slot needs a cache"));
    expect_fail(reg, LOOM_KIND_CACHE, "msamp", LOOM_ERR_INVALID,
                NEEDLES("'msamp' is a sampler plugin", "libmulti.so"));
    loom_registry_destroy(reg);
    /* The file is named like a scheduler but holds a cache. */
    reg = bad_reg();
    expect_fail(reg, LOOM_KIND_SCHEDULER, "liar", LOOM_ERR_INVALID,
                NEEDLES("'liar' is a cache plugin, but the scheduler slot needs a scheduler"));
    loom_registry_destroy(reg);
}

Test(plugin_registry, duplicate_name_in_two_files) {
    char *a = tp_mkdtemp(), *b = tp_mkdtemp();
    char *src = tp_join(tp_env("LOOM_TEST_GOOD_DIR"), "loom-sampler-tsamp.so");
    char *fa = tp_join(a, "loom-sampler-tsamp.so"), *fb = tp_join(b, "loom-sampler-tsamp.so");
    tp_copy(src, fa);
    tp_copy(src, fb);
    loom_registry *reg = reg_over(a, b);
    expect_fail(reg, LOOM_KIND_SAMPLER, "tsamp", LOOM_ERR_INVALID,
                NEEDLES("two plugins provide sampler 'tsamp'", fa, fb));
    loom_registry_destroy(reg);

    /* Unconventional names: found by the descriptor scan and by listing. */
    char *msrc = tp_join(tp_env("LOOM_TEST_GOOD_DIR"), "libmulti.so");
    char *ma = tp_join(a, "libone.so"), *mb = tp_join(b, "libtwo.so");
    tp_copy(msrc, ma);
    tp_copy(msrc, mb);
    reg = reg_over(a, b);
    expect_fail(reg, LOOM_KIND_SAMPLER, "msamp", LOOM_ERR_INVALID,
                NEEDLES("two plugins provide sampler 'msamp'", ma, mb));
    int n = 0;
    const loom_registry_item *items = loom_registry_list(reg, &n);
    int dups = 0;
    for (int i = 0; i < n; i++)
        if (items[i].desc && items[i].status != LOOM_OK && strstr(items[i].error, "duplicate"))
            dups++;
    cr_assert_eq(dups, 4, "each of the 4 files names its twin (got %d)", dups);
    loom_registry_destroy(reg);

    tp_rm_rf(a);
    tp_rm_rf(b);
    free(a), free(b), free(src), free(fa), free(fb), free(msrc), free(ma), free(mb);
}

Test(plugin_registry, scan_over_many_files) {
    /* More files than the loader's first cache allocation: results found
     * early in a scan must survive the cache growing behind them. */
    char *dir = tp_mkdtemp();
    char *msrc = tp_join(tp_env("LOOM_TEST_GOOD_DIR"), "libmulti.so");
    char *first = tp_join(dir, "aaa-multi.so");
    tp_copy(msrc, first);
    char *bsrc = tp_join(tp_env("LOOM_TEST_GOOD_DIR"), "loom-backend-tback.so");
    for (int i = 0; i < 40; i++) {
        char name[32];
        snprintf(name, sizeof name, "z%02d.so", i);
        char *dst = tp_join(dir, name);
        tp_copy(bsrc, dst);
        free(dst);
    }
    loom_registry *reg = reg_over(dir, NULL);
    const loom_component *c = NULL;
    loom_plugin *p = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_registry_find(reg, LOOM_KIND_SAMPLER, "msamp", &c, &p, &err), LOOM_OK, "%s",
                 err.message);
    cr_assert_str_eq(c->name, "msamp");
    cr_assert_not_null(strstr(loom_plugin_path(p), "/aaa-multi.so"));
    loom_registry_destroy(reg);
    tp_rm_rf(dir);
    free(dir), free(msrc), free(first), free(bsrc);
}

Test(plugin_registry, same_dir_twice_is_not_a_duplicate) {
    const char *good = tp_env("LOOM_TEST_GOOD_DIR");
    loom_registry *reg = reg_over(good, good);
    cr_assert_eq(loom_registry_num_dirs(reg), 1);
    setenv("LOOM_PLUGIN_PATH", good, 1);
    loom_registry *reg2 = NULL;
    const char *dirs[] = {good};
    cr_assert_eq(loom_registry_create(dirs, 1, "test", LOOM_REGISTRY_NO_BUILTIN, &reg2, NULL),
                 LOOM_OK);
    const loom_component *c = NULL;
    loom_plugin *p = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_registry_find(reg2, LOOM_KIND_SAMPLER, "tsamp", &c, &p, &err), LOOM_OK, "%s",
                 err.message);
    loom_registry_destroy(reg2);
    loom_registry_destroy(reg);
}

Test(plugin_registry, env_path_and_origins) {
    setenv("LOOM_PLUGIN_PATH", "/env/one::/env/two/", 1);
    const char *dirs[] = {"/yaml/dir"};
    loom_registry *reg = NULL;
    cr_assert_eq(loom_registry_create(dirs, 1, "plugin_path in x.yaml", LOOM_REGISTRY_NO_BUILTIN,
                                      &reg, NULL),
                 LOOM_OK);
    cr_assert_eq(loom_registry_num_dirs(reg), 3);
    const char *origin = NULL;
    bool exists = true;
    cr_assert_str_eq(loom_registry_dir(reg, 0, &origin, &exists), "/yaml/dir");
    cr_assert_str_eq(origin, "plugin_path in x.yaml");
    cr_assert_not(exists);
    cr_assert_str_eq(loom_registry_dir(reg, 1, &origin, NULL), "/env/one");
    cr_assert_str_eq(origin, "LOOM_PLUGIN_PATH");
    cr_assert_str_eq(loom_registry_dir(reg, 2, NULL, NULL), "/env/two");
    loom_registry_destroy(reg);
    /* Default places are added unless LOOM_PLUGIN_PATH_ONLY is set. */
    unsetenv("LOOM_PLUGIN_PATH_ONLY");
    unsetenv("LOOM_PLUGIN_PATH");
    cr_assert_eq(loom_registry_create(NULL, 0, NULL, LOOM_REGISTRY_DEFAULT, &reg, NULL), LOOM_OK);
    cr_assert_geq(loom_registry_num_dirs(reg), 1);
    const char *o = NULL;
    loom_registry_dir(reg, 0, &o, NULL);
    cr_assert(strcmp(o, "build tree") == 0, "in-tree libloom searches the build tree, got %s", o);
    loom_registry_destroy(reg);
}

/* -------------------------------------------------------------- listing */

Test(plugin_registry, list_tolerates_broken_files) {
    loom_registry *reg = reg_over(tp_env("LOOM_TEST_GOOD_DIR"), tp_env("LOOM_TEST_BAD_DIR"));
    int n = 0;
    const loom_registry_item *items = loom_registry_list(reg, &n);
    int good = 0, broken = 0;
    bool saw_text = false, saw_multi = false;
    for (int i = 0; i < n; i++) {
        if (items[i].desc) {
            cr_assert_eq(items[i].status, LOOM_OK, "%s: %s", items[i].path, items[i].error);
            good++;
            if (strstr(items[i].path, "libmulti.so")) saw_multi = true;
        } else {
            cr_assert_neq(items[i].status, LOOM_OK);
            cr_assert_gt(strlen(items[i].error), 10);
            broken++;
            if (strstr(items[i].path, "loom-sampler-text.so")) saw_text = true;
        }
    }
    cr_assert_eq(good, 8 + 2, "7 kinds + libmulti + bad/loom-scheduler-liar.so + bad/loom-sampler-nullself.so "
                 "(good: %d)", good);
    cr_assert_eq(broken, 12, "11 broken plugins + the text file (broken: %d)", broken);
    cr_assert(saw_text && saw_multi);
    int n2 = 0;
    cr_assert_eq(loom_registry_list(reg, &n2), items, "cached");
    cr_assert_eq(n2, n);
    loom_registry_destroy(reg);
}

/* ------------------------------------------------------------ instances */

Test(plugin_registry, instances_keep_object_loaded) {
    loom_registry *reg = good_reg();
    const loom_component *c = NULL;
    loom_plugin *p = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_registry_find(reg, LOOM_KIND_SAMPLER, "tsamp", &c, &p, &err), LOOM_OK);
    void *config = calloc(1, c->config_size);
    loom_diag diag;
    loom_diag_init(&diag);
    cr_assert(loom_cfg_bind(NULL, "sampler", c->params, NULL, config, c->config_size, &diag));
    loom_diag_free(&diag);

    loom_metrics_reset();
    void *a = NULL, *b = NULL;
    cr_assert_eq(loom_plugin_create_instance(p, c, NULL, config, &a, &err), LOOM_OK, "%s",
                 err.message);
    cr_assert_eq(loom_plugin_create_instance(p, c, loom_host_default(), config, &b, &err), LOOM_OK);
    cr_assert_eq(loom_plugin_live_instances(p), 2);
    cr_assert_eq(loom_metrics_get("test.tsamp.created"), 2.0);
    cr_assert_eq(loom_metrics_get("test.tsamp.size"), 8.0, "default bound");
    free(config); /* borrowed only during create */

    /* The registry goes; the object must stay mapped for a and b. */
    loom_registry_destroy(reg);
    cr_assert_eq(loom_plugin_live_instances(p), 2);
    loom_plugin_destroy_instance(p, c, a);
    cr_assert_eq(loom_plugin_live_instances(p), 1);
    cr_assert_eq(loom_metrics_get("test.tsamp.destroyed"), 1.0);
    loom_plugin_destroy_instance(p, c, b); /* last reference: dlclose */
    cr_assert_eq(loom_metrics_get("test.tsamp.destroyed"), 2.0);
}

Test(plugin_registry, failed_create_leaves_nothing) {
    loom_registry *reg = good_reg();
    const loom_component *c = NULL;
    loom_plugin *p = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_registry_find(reg, LOOM_KIND_CACHE, "tcache", &c, &p, &err), LOOM_OK);
    loom_cfg_node *root = loom_cfg_load_string("cache: {plugin: tcache, fail: true, label: boom}",
                                               "inline.yaml", NULL);
    cr_assert_not_null(root);
    void *config = calloc(1, c->config_size);
    const char *ignore[] = {"plugin", NULL};
    cr_assert(loom_cfg_bind(loom_cfg_get(root, "cache"), "cache", c->params, ignore, config,
                            c->config_size, NULL));
    void *self = (void *)1;
    cr_assert_eq(loom_plugin_create_instance(p, c, NULL, config, &self, &err), LOOM_ERR_INVALID);
    cr_assert_null(self);
    cr_assert_not_null(strstr(err.message, "cache 'tcache'"), "%s", err.message);
    cr_assert_not_null(strstr(err.message, "asked to fail (label boom)"), "%s", err.message);
    cr_assert_eq(loom_plugin_live_instances(p), 0);
    free(config);
    loom_cfg_free(root);
    loom_registry_destroy(reg);
}

/* create() returning LOOM_OK with *self NULL breaks loom_create_fn's
 * contract (the instance is how destroy, and the plugin's reference, are
 * reached): refused, naming the plugin, and nothing is left behind. */
Test(plugin_registry, create_without_instance_is_refused) {
    loom_registry *reg = bad_reg();
    const loom_component *c = NULL;
    loom_plugin *p = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_registry_find(reg, LOOM_KIND_SAMPLER, "nullself", &c, &p, &err), LOOM_OK, "%s",
                 err.message);
    void *config = calloc(1, c->config_size);
    void *self = (void *)1;
    cr_assert_eq(loom_plugin_create_instance(p, c, NULL, config, &self, &err), LOOM_ERR_INTERNAL, "%s",
                 err.message);
    cr_assert_null(self);
    cr_assert_not_null(strstr(err.message, "sampler 'nullself'"), "%s", err.message);
    cr_assert_not_null(strstr(err.message, "loom-sampler-nullself.so"), "%s", err.message);
    cr_assert_not_null(strstr(err.message, "without an instance"), "%s", err.message);
    cr_assert_eq(loom_plugin_live_instances(p), 0);
    free(config);
    loom_registry_destroy(reg); /* the last reference: the object is closed */
}

Test(plugin_registry, abi_helpers) {
    /* the minimum is every member of a 2.0 table: the whole table of every
     * kind but the sampler's, whose check() came in 2.1, the backend's,
     * whose load_stage() came in 2.3 (and kv_groups() in 2.4), and the
     * cache's, whose group_table() came in 2.4 */
    cr_assert_eq(loom_kind_min_ops_size(LOOM_KIND_BACKEND), offsetof(loom_backend_ops, load_stage));
    cr_assert_eq(loom_kind_min_ops_size(LOOM_KIND_EXECUTOR), sizeof(loom_executor_ops));
    cr_assert_eq(loom_kind_min_ops_size(LOOM_KIND_SCHEDULER), sizeof(loom_scheduler_ops));
    cr_assert_eq(loom_kind_min_ops_size(LOOM_KIND_CACHE), offsetof(loom_cache_ops, group_table));
    cr_assert_eq(loom_kind_min_ops_size(LOOM_KIND_QUANTIZER), sizeof(loom_quant_ops));
    cr_assert_eq(loom_kind_min_ops_size(LOOM_KIND_SAMPLER), offsetof(loom_sampler_ops, check));
    cr_assert_eq(loom_kind_min_ops_size(LOOM_KIND_SPECULATOR), sizeof(loom_spec_ops));
    cr_assert_eq(loom_kind_min_ops_size((loom_kind)99), 0);
    /* the first REQUIRED member left NULL, by name; optional ones may be */
    loom_sampler_ops ops = {.struct_size = sizeof ops};
    cr_assert_str_eq(loom_ops_missing(LOOM_KIND_SAMPLER, &ops), "create");
    loom_cache_ops cops = {.struct_size = sizeof cops};
    cr_assert_str_eq(loom_ops_missing(LOOM_KIND_CACHE, &cops), "create");
    cr_assert_null(loom_ops_missing((loom_kind)99, &ops));
    /* a 2.0 table is read only up to its struct_size */
    struct {
        loom_sampler_ops ops;
    } old = {.ops = {.struct_size = offsetof(loom_sampler_ops, check), .create = (loom_create_fn *)1,
                     .destroy = (loom_destroy_fn *)1, .sample = (void *)1, .probs = (void *)1}};
    cr_assert_null(loom_ops_missing(LOOM_KIND_SAMPLER, &old.ops));
    cr_assert_str_eq(loom_kind_name(LOOM_KIND_QUANTIZER), "quantizer");
    cr_assert_null(loom_kind_name((loom_kind)99));
    cr_assert_str_eq(loom_kind_with_article(LOOM_KIND_EXECUTOR), "an executor");
    cr_assert_eq(loom_kind_from_name("cache"), LOOM_KIND_CACHE);
    cr_assert_eq(loom_kind_from_name("nope"), 0);
    cr_assert_eq(loom_name_distance("schedular", "scheduler"), 1);
}
