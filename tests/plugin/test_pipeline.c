/*
 * tests/plugin/test_pipeline.c — pipeline files: a good pipeline bound end
 * to end (slots, configs, model/engine settings, instances); every error
 * reported together with exact line:col; overrides; includes (an A/B pair
 * differing in one key); path expansion; plugins by path; the resolved
 * print reading back to the same configs.
 * YAML files are written to a temporary directory with plugin_path set to
 * the good test plugins; nothing else is searched (LOOM_PLUGIN_PATH_ONLY).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "good/test_plugin.h"
#include "pipeline/pipeline.h"
#include "plugin/host.h"
#include "tp_util.h"

static char *g_tmp;

static void setup(void) {
    g_tmp = tp_mkdtemp();
    unsetenv("LOOM_PLUGIN_PATH");
}

static void teardown(void) {
    tp_rm_rf(g_tmp);
    free(g_tmp);
}

TestSuite(plugin_pipeline, .init = setup, .fini = teardown);

/* Write tmp/name with "plugin_path: GOOD\n" prepended; returns the path. */
static char *yaml(const char *name, const char *body) {
    char *path = tp_join(g_tmp, name);
    tp_writef(path, "plugin_path: %s\n%s", tp_env("LOOM_TEST_GOOD_DIR"), body);
    return path;
}

static const char *k_good =
    "model: {format: dummy, shape: tiny, seed: 7}\n"
    "engine: {threads: 2}\n"
    "backend: {plugin: tback, size: 16}\n"
    "scheduler: {plugin: tsched, policy: priority, ratio: 0.25}\n"
    "cache: {plugin: tcache, verbose: true, label: \"paged blocks\"}\n"
    "sampler: {plugin: tsamp}\n";

static loom_pipeline *load_ok(const char *path, const char *const *ov, int n) {
    loom_diag diag;
    loom_diag_init(&diag);
    loom_pipeline *p = NULL;
    loom_status st = loom_pipeline_load(path, ov, n, &p, &diag);
    if (st != LOOM_OK) loom_diag_print(&diag, stderr);
    cr_assert_eq(st, LOOM_OK, "load %s failed with %d errors", path, diag.count);
    cr_assert_eq(diag.count, 0);
    loom_diag_free(&diag);
    return p;
}

static const tp_config *cfg_of(const loom_pipeline *p, loom_kind k) {
    const loom_pipeline_slot *s = loom_pipeline_slot_get(p, k);
    cr_assert_not_null(s, "slot %s missing", loom_kind_name(k));
    return s->config;
}

/* The entry whose message contains `needle`; fails when absent. */
static const loom_diag_entry *find_diag(const loom_diag *d, const char *needle) {
    for (int i = 0; i < d->count; i++)
        if (strstr(d->entries[i].message, needle)) return &d->entries[i];
    loom_diag_print(d, stderr);
    cr_assert_fail("no diagnostic contains \"%s\"", needle);
    return NULL;
}

static void expect_at(const loom_diag *d, const char *needle, int line, int col) {
    const loom_diag_entry *e = find_diag(d, needle);
    cr_assert_eq(e->mark.line, line, "\"%s\": line %d, want %d", needle, e->mark.line, line);
    cr_assert_eq(e->mark.col, col, "\"%s\": col %d, want %d", needle, e->mark.col, col);
}

/* --------------------------------------------------------------- good */

Test(plugin_pipeline, good_pipeline_binds_everything) {
    char *path = yaml("good.yaml", k_good);
    loom_pipeline *p = load_ok(path, NULL, 0);
    cr_assert_eq(loom_pipeline_num_slots(p), 4);
    static const loom_kind order[] = {LOOM_KIND_BACKEND, LOOM_KIND_SCHEDULER, LOOM_KIND_CACHE,
                                      LOOM_KIND_SAMPLER};
    for (int i = 0; i < 4; i++) {
        const loom_pipeline_slot *s = loom_pipeline_slot_at(p, i);
        cr_assert_eq(s->kind, order[i]);
        cr_assert_str_eq(s->section, loom_kind_name(order[i]));
        cr_assert_not_null(strstr(s->path, "/loom-"), "%s", s->path);
        cr_assert_eq(s->mark.line, 4 + i, "section %s at line %d", s->section, s->mark.line);
    }
    cr_assert_null(loom_pipeline_slot_get(p, LOOM_KIND_SPECULATOR));
    cr_assert_null(loom_pipeline_slot_get(p, LOOM_KIND_EXECUTOR));

    const tp_config *b = cfg_of(p, LOOM_KIND_BACKEND);
    cr_assert_eq(b->size, 16);
    cr_assert_eq(b->ratio, 0.5, "default");
    cr_assert_str_eq(b->label, "none");
    const tp_config *s = cfg_of(p, LOOM_KIND_SCHEDULER);
    cr_assert_eq(s->policy, 1, "priority");
    cr_assert_eq(s->ratio, 0.25);
    const tp_config *c = cfg_of(p, LOOM_KIND_CACHE);
    cr_assert(c->verbose);
    cr_assert_str_eq(c->label, "paged blocks");

    const loom_model_settings *m = loom_pipeline_model(p);
    cr_assert_eq(m->format, LOOM_MODEL_FORMAT_DUMMY);
    cr_assert_str_eq(m->shape, "tiny");
    cr_assert_eq(m->seed, 7);
    cr_assert_eq(m->dtype, LOOM_DTYPE_F32);
    cr_assert_eq(m->chat_template, LOOM_CHAT_TEMPLATE_AUTO);
    cr_assert_str_eq(m->path, "");
    const loom_engine_settings *e = loom_pipeline_engine(p);
    cr_assert_eq(e->threads, 2);
    cr_assert_eq(e->max_model_len, 0);
    cr_assert_str_eq(loom_pipeline_file(p), path);
    cr_assert_str_eq(loom_pipeline_dir(p), g_tmp);
    cr_assert_not_null(loom_pipeline_tree(p));
    cr_assert_not_null(loom_pipeline_registry(p));
    loom_pipeline_destroy(p);
    free(path);
}

Test(plugin_pipeline, instances_from_slots) {
    char *path = yaml("good.yaml", k_good);
    loom_pipeline *p = load_ok(path, NULL, 0);
    loom_metrics_reset();
    void *self[4] = {0};
    const loom_pipeline_slot *slots[4];
    for (int i = 0; i < 4; i++) {
        slots[i] = loom_pipeline_slot_at(p, i);
        loom_error err = {0};
        cr_assert_eq(loom_pipeline_create_instance(slots[i], NULL, &self[i], &err), LOOM_OK, "%s",
                     err.message);
        cr_assert_not_null(self[i]);
        cr_assert_eq(loom_plugin_live_instances(slots[i]->plugin), 1);
    }
    cr_assert_eq(loom_metrics_get("test.tback.size"), 16.0);
    cr_assert_eq(loom_metrics_get("test.tsched.created"), 1.0);
    for (int i = 0; i < 4; i++) loom_pipeline_destroy_instance(slots[i], self[i]);
    cr_assert_eq(loom_metrics_get("test.tsamp.destroyed"), 1.0);
    loom_pipeline_destroy(p);
    free(path);
}

Test(plugin_pipeline, create_failure_names_the_slot) {
    char *path = yaml("fail.yaml",
                      "model: {format: dummy, shape: tiny}\n"
                      "backend: {plugin: tback}\n"
                      "scheduler: {plugin: tsched, fail: true}\n"
                      "cache: {plugin: tcache}\n"
                      "sampler: {plugin: tsamp}\n");
    loom_pipeline *p = load_ok(path, NULL, 0);
    const loom_pipeline_slot *s = loom_pipeline_slot_get(p, LOOM_KIND_SCHEDULER);
    void *self = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_pipeline_create_instance(s, NULL, &self, &err), LOOM_ERR_INVALID);
    cr_assert_null(self);
    cr_assert_not_null(strstr(err.message, "scheduler 'tsched' ("), "%s", err.message);
    cr_assert_not_null(strstr(err.message, "create failed: tsched: asked to fail"), "%s", err.message);
    cr_assert_eq(loom_plugin_live_instances(s->plugin), 0);
    loom_pipeline_destroy(p);
    free(path);
}

/* ------------------------------------------------------------- errors */

Test(plugin_pipeline, all_errors_reported_together_with_positions) {
    char *path = yaml("bad.yaml",                           /* line 1: plugin_path */
                      "model: {format: dummy, shape: tiny}\n" /* 2 */
                      "schedular: {plugin: tsched}\n"         /* 3 */
                      "backend: {plugin: nope}\n"             /* 4 */
                      "cache:\n"                              /* 5 */
                      "  plugin: tcache\n"                    /* 6 */
                      "  sise: 4\n"                           /* 7 */
                      "sampler:\n"                            /* 8 */
                      "  plugin: tsamp\n"                     /* 9 */
                      "  size: many\n"                        /* 10 */
                      "speculator:\n"                         /* 11 */
                      "  size: 3\n"                           /* 12 */
                      "quantizer: {plugin: tquant, policy: lifo, ratio: 2}\n"); /* 13 */
    loom_diag diag;
    loom_diag_init(&diag);
    loom_pipeline *p = (loom_pipeline *)1;
    cr_assert_eq(loom_pipeline_load(path, NULL, 0, &p, &diag), LOOM_ERR_INVALID);
    cr_assert_null(p);
    loom_diag_print(&diag, stderr);
    expect_at(&diag, "unknown top-level key 'schedular'; did you mean 'scheduler'?", 3, 1);
    expect_at(&diag, "backend.plugin: no backend plugin named 'nope'", 4, 19);
    expect_at(&diag, "cache.sise", 7, 3);
    find_diag(&diag, "did you mean 'size'");
    expect_at(&diag, "sampler.size", 10, 9);
    expect_at(&diag, "section 'speculator' has no `plugin:` key", 12, 3);
    expect_at(&diag, "quantizer.policy", 13, 37);
    expect_at(&diag, "quantizer.ratio", 13, 50);
    const loom_diag_entry *miss = find_diag(&diag, "missing required section 'scheduler'");
    cr_assert_str_eq(miss->mark.file, path);
    cr_assert_eq(diag.count, 8, "every problem once (got %d)", diag.count);
    for (int i = 0; i < diag.count; i++)
        cr_assert_str_eq(diag.entries[i].mark.file, path, "entry %d: %s", i,
                         diag.entries[i].message);
    loom_diag_free(&diag);
    free(path);
}

Test(plugin_pipeline, missing_sections) {
    char *path = yaml("empty.yaml", "engine: {threads: 1}\n");
    loom_diag diag;
    loom_diag_init(&diag);
    loom_pipeline *p = NULL;
    cr_assert_eq(loom_pipeline_load(path, NULL, 0, &p, &diag), LOOM_ERR_INVALID);
    find_diag(&diag, "missing required section 'model'");
    find_diag(&diag, "missing required section 'backend' (or 'executor')");
    find_diag(&diag, "missing required section 'scheduler'");
    find_diag(&diag, "missing required section 'cache'");
    find_diag(&diag, "missing required section 'sampler'");
    cr_assert_eq(diag.count, 5);
    loom_diag_free(&diag);
    free(path);
}

Test(plugin_pipeline, bad_section_shapes_and_wrong_kind) {
    char *path = yaml("shapes.yaml",
                      "model: {format: dummy}\n"            /* 2: dummy needs shape */
                      "executor: {plugin: texec}\n"         /* 3: executor alone is fine */
                      "scheduler: {plugin: tcache}\n"       /* 4: wrong kind */
                      "cache: tcache\n"                     /* 5: not a map */
                      "sampler: {plugin: [a, b]}\n");       /* 6: plugin not a name */
    loom_diag diag;
    loom_diag_init(&diag);
    loom_pipeline *p = NULL;
    cr_assert_eq(loom_pipeline_load(path, NULL, 0, &p, &diag), LOOM_ERR_INVALID);
    loom_diag_print(&diag, stderr);
    find_diag(&diag, "model.shape is required when model.format is dummy");
    expect_at(&diag, "'tcache' is a cache plugin, but the scheduler slot needs a scheduler", 4, 21);
    expect_at(&diag, "section 'cache' must be a map", 5, 8);
    expect_at(&diag, "sampler.plugin must be a plugin name", 6, 19);
    cr_assert_eq(diag.count, 4);
    loom_diag_free(&diag);
    free(path);
}

Test(plugin_pipeline, missing_file_and_yaml_syntax) {
    loom_diag diag;
    loom_diag_init(&diag);
    loom_pipeline *p = NULL;
    cr_assert_eq(loom_pipeline_load("/no/such/pipeline.yaml", NULL, 0, &p, &diag),
                 LOOM_ERR_NOT_FOUND);
    find_diag(&diag, "cannot open pipeline '/no/such/pipeline.yaml'");
    loom_diag_free(&diag);
    char *path = yaml("syntax.yaml", "model: {format: dummy\n");
    loom_diag_init(&diag);
    cr_assert_eq(loom_pipeline_load(path, NULL, 0, &p, &diag), LOOM_ERR_FORMAT);
    cr_assert_gt(diag.count, 0);
    cr_assert_gt(diag.entries[0].mark.line, 0);
    loom_diag_free(&diag);
    free(path);
}

/* ---------------------------------------------------- overrides, includes */

Test(plugin_pipeline, overrides) {
    char *path = yaml("good.yaml", k_good);
    const char *ov[] = {"scheduler.size=32", "sampler.policy=random", "engine.threads=3",
                        "speculator.plugin=tspec"};
    loom_pipeline *p = load_ok(path, ov, 4);
    cr_assert_eq(cfg_of(p, LOOM_KIND_SCHEDULER)->size, 32);
    cr_assert_eq(cfg_of(p, LOOM_KIND_SAMPLER)->policy, 2);
    cr_assert_eq(loom_pipeline_engine(p)->threads, 3);
    cr_assert_not_null(loom_pipeline_slot_get(p, LOOM_KIND_SPECULATOR), "added from the command line");
    loom_pipeline_destroy(p);

    const char *off[] = {"speculator.plugin=tspec", "speculator=null"};
    p = load_ok(path, off, 2);
    cr_assert_null(loom_pipeline_slot_get(p, LOOM_KIND_SPECULATOR), "null turns a slot off");
    loom_pipeline_destroy(p);

    const char *bad[] = {"scheduler.size=2000", "scheduler.bogus=1"};
    loom_diag diag;
    loom_diag_init(&diag);
    cr_assert_eq(loom_pipeline_load(path, bad, 2, &p, &diag), LOOM_ERR_INVALID);
    loom_diag_print(&diag, stderr);
    const loom_diag_entry *e = find_diag(&diag, "scheduler.bogus");
    cr_assert_str_eq(e->mark.file, "<command line>");
    cr_assert_eq(e->mark.col, 2, "second override");
    e = find_diag(&diag, "scheduler.size");
    cr_assert_str_eq(e->mark.file, "<command line>");
    cr_assert_eq(e->mark.col, 1);
    cr_assert_eq(diag.count, 2);
    loom_diag_free(&diag);
    free(path);
}

Test(plugin_pipeline, include_ab_pair_differs_in_one_key) {
    char *base = yaml("base.yaml", k_good);
    char *a = tp_join(g_tmp, "a.yaml"), *b = tp_join(g_tmp, "b.yaml");
    tp_write(a, "include: base.yaml\n");
    tp_write(b, "include: base.yaml\nscheduler: {policy: random}\n");
    loom_pipeline *pa = load_ok(a, NULL, 0), *pb = load_ok(b, NULL, 0);
    cr_assert_eq(loom_pipeline_num_slots(pa), loom_pipeline_num_slots(pb));
    for (int i = 0; i < loom_pipeline_num_slots(pa); i++) {
        const loom_pipeline_slot *sa = loom_pipeline_slot_at(pa, i), *sb = loom_pipeline_slot_at(pb, i);
        cr_assert_eq(sa->component, sb->component, "same plugin from the base");
        int differs = memcmp(sa->config, sb->config, sizeof(tp_config)) != 0;
        cr_assert_eq(differs, sa->kind == LOOM_KIND_SCHEDULER, "slot %s", sa->section);
    }
    cr_assert_eq(cfg_of(pa, LOOM_KIND_SCHEDULER)->policy, 1);
    cr_assert_eq(cfg_of(pb, LOOM_KIND_SCHEDULER)->policy, 2);
    cr_assert_eq(cfg_of(pb, LOOM_KIND_SCHEDULER)->ratio, 0.25, "rest of the base section kept");
    loom_pipeline_destroy(pa);
    loom_pipeline_destroy(pb);
    free(base), free(a), free(b);
}

/* ---------------------------------------------------------------- paths */

Test(plugin_pipeline, model_path_expansion) {
    char *conf = tp_join(g_tmp, "conf");
    char *models = tp_join(conf, "models");
    cr_assert_eq(mkdir(conf, 0700), 0);
    cr_assert_eq(mkdir(models, 0700), 0);
    char *model = tp_join(models, "m.gguf");
    tp_write(model, "not really gguf");
    const char *slots = "backend: {plugin: tback}\nscheduler: {plugin: tsched}\n"
                        "cache: {plugin: tcache}\nsampler: {plugin: tsamp}\n";

    /* Relative to the file that wrote it: conf/base.yaml, included from tmp/. */
    char *base = tp_join(conf, "base.yaml");
    tp_writef(base, "plugin_path: %s\nmodel: {path: models/m.gguf}\n%s",
              tp_env("LOOM_TEST_GOOD_DIR"), slots);
    char *top = tp_join(g_tmp, "top.yaml");
    tp_write(top, "include: conf/base.yaml\n");
    loom_pipeline *p = load_ok(top, NULL, 0);
    cr_assert_str_eq(loom_pipeline_model(p)->path, model);
    cr_assert_eq(loom_pipeline_model(p)->format, LOOM_MODEL_FORMAT_AUTO);
    loom_pipeline_destroy(p);

    /* ${VAR}, ${VAR:-default} with ~ in the default, ~. */
    setenv("LOOM_TEST_MODELS", models, 1);
    setenv("HOME", conf, 1);
    unsetenv("LOOM_TEST_UNSET");
    const char *forms[] = {"${LOOM_TEST_MODELS}/m.gguf", "${LOOM_TEST_UNSET:-~/models}/m.gguf",
                           "~/models/m.gguf"};
    for (int i = 0; i < 3; i++) {
        char body[512];
        snprintf(body, sizeof body, "model: {path: \"%s\", format: gguf, dtype: bf16}\n%s",
                 forms[i], slots);
        char *y = yaml("exp.yaml", body);
        p = load_ok(y, NULL, 0);
        cr_assert_str_eq(loom_pipeline_model(p)->path, model, "form %s", forms[i]);
        cr_assert_eq(loom_pipeline_model(p)->dtype, LOOM_DTYPE_BF16);
        loom_pipeline_destroy(p);
        free(y);
    }

    /* Errors: unset variable without default; file that is not there. */
    char body[512];
    snprintf(body, sizeof body, "model:\n  path: ${LOOM_TEST_UNSET}/m.gguf\n%s", slots);
    char *y = yaml("unset.yaml", body);
    loom_diag diag;
    loom_diag_init(&diag);
    cr_assert_eq(loom_pipeline_load(y, NULL, 0, &p, &diag), LOOM_ERR_INVALID);
    expect_at(&diag, "environment variable LOOM_TEST_UNSET is not set", 3, 9);
    loom_diag_free(&diag);
    free(y);
    snprintf(body, sizeof body, "model: {path: gone.gguf}\n%s", slots);
    y = yaml("gone.yaml", body);
    loom_diag_init(&diag);
    cr_assert_eq(loom_pipeline_load(y, NULL, 0, &p, &diag), LOOM_ERR_INVALID);
    find_diag(&diag, "model.path: cannot open");
    find_diag(&diag, "/gone.gguf");
    loom_diag_free(&diag);
    free(y);
    free(conf), free(models), free(model), free(base), free(top);
}

Test(plugin_pipeline, plugin_by_path_relative_to_yaml) {
    char *dir = tp_join(g_tmp, "plugins");
    cr_assert_eq(mkdir(dir, 0700), 0);
    char *src = tp_join(tp_env("LOOM_TEST_GOOD_DIR"), "libmulti.so");
    char *dst = tp_join(dir, "libmulti.so");
    tp_copy(src, dst);
    char *y = yaml("bypath.yaml",
                   "model: {format: dummy, shape: tiny}\n"
                   "backend: {plugin: tback}\n"
                   "scheduler: {plugin: ./plugins/libmulti.so}\n"
                   "cache: {plugin: tcache}\n"
                   "sampler: {plugin: plugins/libmulti.so, k: 5}\n");
    loom_pipeline *p = load_ok(y, NULL, 0);
    const loom_pipeline_slot *s = loom_pipeline_slot_get(p, LOOM_KIND_SAMPLER);
    cr_assert_str_eq(s->component->name, "msamp");
    cr_assert_str_eq(s->path, dst);
    cr_assert_eq(*(const int64_t *)s->config, 5);
    cr_assert_str_eq(loom_pipeline_slot_get(p, LOOM_KIND_SCHEDULER)->component->name, "msched");
    loom_pipeline_destroy(p);
    free(dir), free(src), free(dst), free(y);
}

Test(plugin_pipeline, plugin_path_list_relative_to_yaml) {
    char *sub = tp_join(g_tmp, "sub");
    cr_assert_eq(mkdir(sub, 0700), 0);
    char *path = tp_join(sub, "p.yaml");
    setenv("LOOM_TEST_GOOD", tp_env("LOOM_TEST_GOOD_DIR"), 1);
    tp_writef(path,
              "plugin_path: [extra, \"${LOOM_TEST_GOOD}\"]\n"
              "model: {format: dummy, shape: tiny}\n"
              "backend: {plugin: tback}\nscheduler: {plugin: tsched}\n"
              "cache: {plugin: tcache}\nsampler: {plugin: tsamp}\n");
    loom_pipeline *p = load_ok(path, NULL, 0);
    loom_registry *reg = loom_pipeline_registry(p);
    cr_assert_eq(loom_registry_num_dirs(reg), 2);
    const char *origin = NULL;
    bool exists = true;
    char *extra = tp_join(sub, "extra");
    cr_assert_str_eq(loom_registry_dir(reg, 0, &origin, &exists), extra);
    cr_assert_str_eq(origin, "plugin_path");
    cr_assert_not(exists);
    cr_assert_str_eq(loom_registry_dir(reg, 1, NULL, &exists), tp_env("LOOM_TEST_GOOD_DIR"));
    cr_assert(exists);
    loom_pipeline_destroy(p);

    tp_writef(path, "plugin_path: {a: 1}\nmodel: {format: dummy, shape: tiny}\n");
    loom_diag diag;
    loom_diag_init(&diag);
    cr_assert_eq(loom_pipeline_load(path, NULL, 0, &p, &diag), LOOM_ERR_INVALID);
    expect_at(&diag, "plugin_path must be a directory or a list of directories", 1, 14);
    loom_diag_free(&diag);
    free(sub), free(path), free(extra);
}

/* -------------------------------------------------------------- printing */

Test(plugin_pipeline, print_reads_back_to_the_same_configs) {
    char *path = yaml("good.yaml", k_good);
    const char *ov[] = {"sampler.label=\"two words: yes\"", "sampler.ratio=0.1"};
    loom_pipeline *p = load_ok(path, ov, 2);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    loom_pipeline_print(p, f);
    fclose(f);
    cr_assert_not_null(strstr(text, "  plugin: tsched  # "), "%s", text);
    cr_assert_not_null(strstr(text, "  policy: priority\n"), "%s", text);
    cr_assert_not_null(strstr(text, "  label: \"two words: yes\"\n"), "%s", text);
    cr_assert_not_null(strstr(text, "  ratio: 0.1\n"), "%s", text);
    cr_assert_not_null(strstr(text, "  shape: tiny\n"), "%s", text);
    char want[4096];
    snprintf(want, sizeof want, "plugin_path:\n  - %s\n", tp_env("LOOM_TEST_GOOD_DIR"));
    cr_assert_not_null(strstr(text, want), "%s", text);
    char *again = tp_join(g_tmp, "printed.yaml");
    tp_write(again, text);
    loom_pipeline *q = load_ok(again, NULL, 0); /* finds plugins through the printed plugin_path */
    cr_assert_eq(loom_pipeline_num_slots(q), loom_pipeline_num_slots(p));
    for (int i = 0; i < loom_pipeline_num_slots(p); i++) {
        const loom_pipeline_slot *a = loom_pipeline_slot_at(p, i), *b = loom_pipeline_slot_at(q, i);
        cr_assert_eq(memcmp(a->config, b->config, sizeof(tp_config)), 0, "slot %s", a->section);
    }
    cr_assert_eq(memcmp(loom_pipeline_engine(p), loom_pipeline_engine(q),
                        sizeof(loom_engine_settings)), 0);
    loom_pipeline_destroy(q);
    loom_pipeline_destroy(p);
    free(text), free(again), free(path);
}
