/*
 * tests/config/test_config.c — core/config: parsing with exact file:line:col,
 * includes and deep merge, --set overrides, typed readers, binding to a
 * parameter table, printing and re-parsing.
 *
 * Every test writes its YAML into a fresh mkdtemp directory (removed in
 * fini) or loads it from a string; positions are asserted exactly.
 */
#include <criterion/criterion.h>

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"

/* Under -Db_sanitize=address each test checks for leaks itself: Criterion
 * runs tests in worker processes whose LeakSanitizer report would not fail
 * the test. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define LOOM_TEST_LEAK_CHECK() __lsan_do_recoverable_leak_check()
#else
#define LOOM_TEST_LEAK_CHECK() 0
#endif

/* ------------------------------------------------------------ fixtures */

static char g_dir[PATH_MAX];
static char g_files[16][PATH_MAX + 64];
static int g_nfiles;

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "%s/loom-cfg-XXXXXX", P_tmpdir);
    cr_assert_not_null(mkdtemp(g_dir), "mkdtemp failed");
    g_nfiles = 0;
}

static void teardown(void) {
    for (int i = 0; i < g_nfiles; i++) unlink(g_files[i]);
    rmdir(g_dir);
}

TestSuite(config, .init = setup, .fini = teardown);

/* A test whose body is followed by the leak check (an assertion in .fini
 * would not fail the test). */
#define CFG_TEST(name)                                                                             \
    static void name##_body(void);                                                                 \
    Test(config, name) {                                                                           \
        name##_body();                                                                             \
        cr_assert_eq(LOOM_TEST_LEAK_CHECK(), 0, "memory leaked (see the LeakSanitizer report)");   \
    }                                                                                              \
    static void name##_body(void)

/* Write `text` to g_dir/name; returns the path (static storage). */
static const char *write_file(const char *name, const char *text) {
    cr_assert_lt(g_nfiles, 16);
    char *path = g_files[g_nfiles++];
    snprintf(path, PATH_MAX + 64, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    return path;
}

static char *path_in_dir(const char *name) {
    static char buf[4][PATH_MAX + 64];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, PATH_MAX + 64, "%s/%s", g_dir, name);
    return b;
}

/* Assert diag entry i: file, line, col and the exact message. */
static void expect_diag(const loom_diag *d, int i, const char *file, int line, int col,
                        const char *msg) {
    cr_assert_lt(i, d->count, "expected diag entry %d, have %d", i, d->count);
    const loom_diag_entry *e = &d->entries[i];
    if (file)
        cr_assert_str_eq(e->mark.file, file, "entry %d file", i);
    else
        cr_assert_null(e->mark.file, "entry %d should have no file", i);
    cr_assert_eq(e->mark.line, line, "entry %d: line %d, expected %d (%s)", i, e->mark.line, line,
                 e->message);
    cr_assert_eq(e->mark.col, col, "entry %d: col %d, expected %d (%s)", i, e->mark.col, col,
                 e->message);
    cr_assert_str_eq(e->message, msg, "entry %d message", i);
}

static loom_cfg_node *load_ok(const char *text) {
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *r = loom_cfg_load_string(text, "t.yaml", &d);
    if (d.count) loom_diag_print(&d, stderr);
    cr_assert_not_null(r);
    cr_assert_eq(d.count, 0);
    loom_diag_free(&d);
    return r;
}

static void expect_mark(const loom_cfg_node *n, const char *file, int line, int col) {
    cr_assert_not_null(n);
    const loom_cfg_mark *m = loom_cfg_mark_of(n);
    cr_assert_str_eq(m->file, file);
    cr_assert_eq(m->line, line, "line %d, expected %d", m->line, line);
    cr_assert_eq(m->col, col, "col %d, expected %d", m->col, col);
}

/* ------------------------------------------------------- a param table */

typedef struct sched_cfg {
    int64_t max_num_seqs;
    double temperature;
    bool chunked;
    char name[LOOM_PARAM_STRING_MAX];
    int64_t policy;
    int64_t block_size;
} sched_cfg;

static const char *const policies[] = {"fcfs", "priority", NULL};

static const loom_param sched_params[] = {
    {"max_num_seqs", LOOM_PARAM_INT, offsetof(sched_cfg, max_num_seqs), "256", 1, 4096, NULL,
     "most sequences per step"},
    {"temperature", LOOM_PARAM_FLOAT, offsetof(sched_cfg, temperature), "0.7", 0.0, 2.0, NULL,
     "sampling temperature"},
    {"chunked", LOOM_PARAM_BOOL, offsetof(sched_cfg, chunked), "yes", 0, -1, NULL, "chunk"},
    {"name", LOOM_PARAM_STRING, offsetof(sched_cfg, name), "default-name", 0, -1, NULL, "name"},
    {"policy", LOOM_PARAM_ENUM, offsetof(sched_cfg, policy), "fcfs", 0, -1, policies, "order"},
    {"block_size", LOOM_PARAM_INT, offsetof(sched_cfg, block_size), NULL, 1, 128, NULL, "req"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

static const char *const ignore_plugin[] = {"plugin", NULL};

/* ----------------------------------------------------------- syntax errors */

CFG_TEST(syntax_unclosed_flow_sequence) {
    const char *path = write_file("p.yaml", "a: 1\nb:\n  c: [1, 2\n");
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_file(path, &d));
    cr_assert_eq(d.count, 1);
    expect_diag(&d, 0, path, 4, 1,
                "did not find expected ',' or ']' (while parsing a flow sequence at line 3, "
                "column 6)");
    loom_diag_free(&d);
}

CFG_TEST(syntax_bad_indentation) {
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string("a:\n  b: 1\n c: 2\n", "p.yaml", &d));
    cr_assert_eq(d.count, 1);
    expect_diag(&d, 0, "p.yaml", 3, 2,
                "did not find expected key (while parsing a block mapping at line 1, column 1)");
    loom_diag_free(&d);
}

CFG_TEST(syntax_tab_and_mapping_value) {
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string("a: 1\nb:\n\tc: 2\n", "p.yaml", &d));
    expect_diag(&d, 0, "p.yaml", 3, 1,
                "found character that cannot start any token (while scanning for the next "
                "token)");
    loom_diag_free(&d);
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string("a: 1\n b: 2\n", "p.yaml", &d));
    expect_diag(&d, 0, "p.yaml", 2, 3, "mapping values are not allowed in this context");
    loom_diag_free(&d);
}

CFG_TEST(syntax_invalid_utf8_position) {
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string("a: 1\nbb: \xff\n", "p.yaml", &d));
    expect_diag(&d, 0, "p.yaml", 2, 5,
                "invalid leading UTF-8 octet (byte 0xff); save the file as UTF-8");
    loom_diag_free(&d);
}

CFG_TEST(root_must_be_a_map_and_empty_is_empty_map) {
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string("\n- 1\n- 2\n", "p.yaml", &d));
    expect_diag(&d, 0, "p.yaml", 2, 1,
                "the top level must be a map of sections ('key: value' lines), got a list");
    loom_diag_free(&d);

    loom_cfg_node *r = load_ok("# nothing here\n");
    cr_assert_eq(loom_cfg_type_of(r), LOOM_CFG_MAP);
    cr_assert_eq(loom_cfg_size(r), 0);
    loom_cfg_free(r);
}

CFG_TEST(duplicate_key_reports_both_positions) {
    loom_diag d;
    loom_diag_init(&d);
    const char *y = "scheduler:\n"
                    "  max_num_seqs: 8\n"
                    "  policy: fcfs\n"
                    "  max_num_seqs: 9\n"
                    "top: 1\n"
                    "top: 2\n";
    cr_assert_null(loom_cfg_load_string(y, "p.yaml", &d));
    cr_assert_eq(d.count, 2, "both duplicates are reported");
    expect_diag(&d, 0, "p.yaml", 4, 3,
                "duplicate key 'max_num_seqs' (first defined at p.yaml:2:3); remove one of them");
    expect_diag(&d, 1, "p.yaml", 6, 1,
                "duplicate key 'top' (first defined at p.yaml:5:1); remove one of them");
    loom_diag_free(&d);
}

CFG_TEST(multiple_documents_and_missing_file) {
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string("a: 1\n---\nb: 2\n", "p.yaml", &d));
    expect_diag(&d, 0, "p.yaml", 2, 1,
                "a second YAML document ('---') is not supported; put everything in one "
                "document or use 'include:'");
    loom_diag_free(&d);

    loom_diag_init(&d);
    const char *missing = path_in_dir("nope.yaml");
    cr_assert_null(loom_cfg_load_file(missing, &d));
    expect_diag(&d, 0, missing, 0, 0, "cannot read pipeline file: No such file or directory");
    loom_diag_free(&d);
}

CFG_TEST(marks_scalars_nulls_and_tree_api) {
    loom_cfg_node *r = load_ok("model:\n"
                               "  path: /m/x.gguf\n"
                               "  tags: [a, \"null\"]\n"
                               "empty:\n"
                               "tilde: ~\n");
    cr_assert_eq(loom_cfg_size(r), 3);
    loom_cfg_node *path = loom_cfg_get_path(r, "model.path");
    cr_assert_str_eq(loom_cfg_scalar(path), "/m/x.gguf");
    expect_mark(path, "t.yaml", 2, 9);
    expect_mark(loom_cfg_get(r, "model"), "t.yaml", 2, 3);
    loom_cfg_node *tags = loom_cfg_get_path(r, "model.tags");
    cr_assert_eq(loom_cfg_type_of(tags), LOOM_CFG_SEQ);
    cr_assert_eq(loom_cfg_size(tags), 2);
    const char *key = "x";
    loom_cfg_node *t1 = loom_cfg_child(tags, 1, &key);
    cr_assert_null(key);
    cr_assert_eq(loom_cfg_type_of(t1), LOOM_CFG_SCALAR, "quoted \"null\" is text");
    cr_assert_str_eq(loom_cfg_scalar(t1), "null");
    expect_mark(t1, "t.yaml", 3, 13);
    cr_assert_eq(loom_cfg_type_of(loom_cfg_get(r, "empty")), LOOM_CFG_NULL);
    cr_assert_eq(loom_cfg_type_of(loom_cfg_get(r, "tilde")), LOOM_CFG_NULL);
    cr_assert_null(loom_cfg_get_path(r, "model.nothing"));
    cr_assert_null(loom_cfg_get_path(r, "model.path.deeper"));
    cr_assert_null(loom_cfg_child(r, 3, &key));
    cr_assert_not_null(loom_cfg_child(r, 2, &key));
    cr_assert_str_eq(key, "tilde");
    const loom_cfg_mark *km = loom_cfg_key_mark(r, 2);
    cr_assert_eq(km->line, 5);
    cr_assert_eq(km->col, 1);
    loom_cfg_free(r);
}

CFG_TEST(anchors_aliases_and_merge_keys) {
    loom_cfg_node *r = load_ok("base: &b\n"
                               "  max_num_seqs: 8\n"
                               "  policy: fcfs\n"
                               "copy: *b\n"
                               "sched:\n"
                               "  <<: *b\n"
                               "  policy: priority\n");
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "copy.max_num_seqs")), "8");
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "sched.max_num_seqs")), "8");
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "sched.policy")), "priority");
    cr_assert_eq(loom_cfg_size(loom_cfg_get(r, "sched")), 2);
    loom_cfg_free(r);

    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string("a: 1\nb: *missing\n", "p.yaml", &d));
    expect_diag(&d, 0, "p.yaml", 2, 4,
                "alias '*missing' refers to no anchor defined before it (define '&missing' "
                "first)");
    loom_diag_free(&d);
}

/* ---------------------------------------------------------------- binding */

CFG_TEST(bind_collects_every_error_with_positions) {
    const char *path = write_file("pipeline.yaml", "# pipeline\n"
                                                   "scheduler:\n"
                                                   "  plugin: continuous\n"
                                                   "  max_num_seqs: lots\n"
                                                   "  temperature: 2.5\n"
                                                   "  policy: fcsf\n"
                                                   "  max_num_seq: 3\n"
                                                   "  chunked: maybe\n");
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *r = loom_cfg_load_file(path, &d);
    cr_assert_not_null(r);
    sched_cfg cfg;
    cr_assert_not(loom_cfg_bind(loom_cfg_get(r, "scheduler"), "scheduler", sched_params,
                                ignore_plugin, &cfg, sizeof cfg, &d));
    cr_assert_eq(d.count, 6);
    expect_diag(&d, 0, path, 7, 3,
                "scheduler.max_num_seq: unknown key; did you mean 'max_num_seqs'? valid keys: "
                "max_num_seqs, temperature, chunked, name, policy, block_size");
    expect_diag(&d, 1, path, 4, 17, "scheduler.max_num_seqs: expected an integer, got \"lots\"");
    expect_diag(&d, 2, path, 5, 16, "scheduler.temperature: 2.5 is out of range [0, 2]");
    expect_diag(&d, 3, path, 8, 12,
                "scheduler.chunked: expected a boolean (true/false, yes/no, on/off), got "
                "\"maybe\"");
    expect_diag(&d, 4, path, 6, 11,
                "scheduler.policy: unknown choice \"fcsf\"; did you mean 'fcfs'? expected one of: "
                "fcfs, priority");
    expect_diag(&d, 5, path, 3, 3, "missing required key 'block_size' in section 'scheduler'");

    /* The printed form is what a user sees. */
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    loom_diag_print(&d, f);
    fclose(f);
    char first[PATH_MAX + 256];
    snprintf(first, sizeof first,
             "%s:4:17: error: scheduler.max_num_seqs: expected an integer, got \"lots\"\n", path);
    cr_assert_not_null(strstr(out, first), "printed diag:\n%s", out);
    free(out);

    loom_error err = {0};
    cr_assert_eq(loom_diag_to_error(&d, LOOM_ERR_INVALID, &err), LOOM_ERR_INVALID);
    cr_assert_eq(err.code, LOOM_ERR_INVALID);
    cr_assert_not_null(strstr(err.message, ":7:3: scheduler.max_num_seq: unknown key"));
    cr_assert_not_null(strstr(err.message, " (and 5 more errors)"), "%s", err.message);
    loom_diag_free(&d);
    loom_cfg_free(r);
}

CFG_TEST(bind_out_of_range_int_and_float) {
    loom_cfg_node *r = load_ok("s:\n"
                               "  block_size: 16\n"
                               "  max_num_seqs: 0\n"
                               "  temperature: -0.5\n");
    loom_diag d;
    loom_diag_init(&d);
    sched_cfg cfg;
    cr_assert_not(
        loom_cfg_bind(loom_cfg_get(r, "s"), "s", sched_params, NULL, &cfg, sizeof cfg, &d));
    cr_assert_eq(d.count, 2);
    expect_diag(&d, 0, "t.yaml", 3, 17, "s.max_num_seqs: 0 is out of range [1, 4096]");
    expect_diag(&d, 1, "t.yaml", 4, 16, "s.temperature: -0.5 is out of range [0, 2]");
    loom_diag_free(&d);
    loom_cfg_free(r);
}

CFG_TEST(bind_defaults_filled_and_values_typed) {
    loom_cfg_node *r = load_ok("s:\n"
                               "  plugin: x\n"
                               "  block_size: 0x10\n"
                               "  name: \"my sched\"\n"
                               "  temperature: 1\n"
                               "  chunked:\n");
    loom_diag d;
    loom_diag_init(&d);
    sched_cfg cfg;
    memset(&cfg, 0xab, sizeof cfg);
    cr_assert(loom_cfg_bind(loom_cfg_get(r, "s"), "s", sched_params, ignore_plugin, &cfg,
                            sizeof cfg, &d));
    cr_assert_eq(d.count, 0);
    cr_assert_eq(cfg.block_size, 16);
    cr_assert_eq(cfg.max_num_seqs, 256, "default");
    cr_assert_float_eq(cfg.temperature, 1.0, 1e-12);
    cr_assert_eq(cfg.chunked, true, "null value -> default 'yes'");
    cr_assert_str_eq(cfg.name, "my sched");
    cr_assert_eq(cfg.policy, 0, "default 'fcfs' is index 0");

    /* NULL section: all defaults; the required key is still missing. */
    cr_assert_not(loom_cfg_bind(NULL, "s", sched_params, NULL, &cfg, sizeof cfg, &d));
    cr_assert_eq(d.count, 1);
    expect_diag(&d, 0, NULL, 0, 0, "missing required key 'block_size' in section 's'");
    cr_assert_eq(cfg.max_num_seqs, 256);
    cr_assert_float_eq(cfg.temperature, 0.7, 1e-12);
    cr_assert_str_eq(cfg.name, "default-name");
    loom_diag_free(&d);
    loom_cfg_free(r);
}

CFG_TEST(bind_enum_string_section_and_plugin_bugs) {
    char longname[400];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    char y[1024];
    snprintf(y, sizeof y,
             "a:\n"
             "  block_size: 4\n"
             "  policy: priority\n"
             "  name: %s\n"
             "b: [1, 2]\n"
             "c:\n"
             "  block_size: 4\n"
             "  name: [x]\n"
             "  policy: {k: v}\n",
             longname);
    loom_cfg_node *r = load_ok(y);
    loom_diag d;
    loom_diag_init(&d);
    sched_cfg cfg;
    cr_assert_not(
        loom_cfg_bind(loom_cfg_get(r, "a"), "a", sched_params, NULL, &cfg, sizeof cfg, &d));
    cr_assert_eq(d.count, 1);
    expect_diag(&d, 0, "t.yaml", 4, 9, "a.name: string is 399 bytes long; at most 255 allowed");
    cr_assert_eq(cfg.policy, 1);

    cr_assert_not(
        loom_cfg_bind(loom_cfg_get(r, "b"), "b", sched_params, NULL, &cfg, sizeof cfg, &d));
    expect_diag(&d, 1, "t.yaml", 5, 4,
                "section 'b' must be a map of parameters ('key: value' lines), got a list");

    cr_assert_not(
        loom_cfg_bind(loom_cfg_get(r, "c"), "c", sched_params, NULL, &cfg, sizeof cfg, &d));
    cr_assert_eq(d.count, 4);
    expect_diag(&d, 2, "t.yaml", 8, 9, "c.name: expected a string, got a list");
    expect_diag(&d, 3, "t.yaml", 9, 11,
                "c.policy: unknown choice a map; expected one of: fcfs, priority");

    /* A table whose offsets overrun the struct, or whose default is bad. */
    static const loom_param bad[] = {
        {"n", LOOM_PARAM_INT, 8, "1", 0, -1, NULL, NULL},
        {"m", LOOM_PARAM_INT, 0, "many", 0, -1, NULL, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
    };
    int64_t one = 0;
    loom_diag_free(&d);
    loom_diag_init(&d);
    cr_assert_not(loom_cfg_bind(NULL, "q", bad, NULL, &one, sizeof one, &d));
    cr_assert_eq(d.count, 2);
    expect_diag(&d, 0, NULL, 0, 0,
                "q.n: parameter table entry does not fit the config struct (offset 8, 8 bytes, "
                "struct 8 bytes; plugin bug)");
    expect_diag(&d, 1, NULL, 0, 0,
                "invalid default value \"many\" in the parameter table (plugin bug): q.m: "
                "expected an integer, got \"many\"");

    /* No parameters at all: every key is unknown, no suggestion. */
    cr_assert_not(loom_cfg_bind(loom_cfg_get(r, "a"), "a", NULL, NULL, NULL, 0, &d));
    expect_diag(&d, 2, "t.yaml", 2, 3, "a.block_size: unknown key; this component takes no "
                                       "parameters");
    cr_assert_eq(d.count, 5);
    loom_diag_free(&d);
    loom_cfg_free(r);
}

CFG_TEST(typed_readers) {
    loom_cfg_node *r = load_ok("b: [true, FALSE, Yes, no, ON, off, 1, truth]\n"
                               "i: [0, -7, +12, 0x1F, -0x10, 9223372036854775807,\n"
                               "    -9223372036854775808, 9223372036854775808, 1e3, 1.0, 12abc,\n"
                               "    0x, \" 5\", -]\n"
                               "d: [1, -2.5, 1e3, .inf, -.inf, 0x10, nan, 1e999, abc, \"\", 1.5x]\n");
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *b = loom_cfg_get(r, "b");
    const bool bexp[] = {true, false, true, false, true, false};
    for (int i = 0; i < 6; i++) {
        bool v = !bexp[i];
        cr_assert(loom_cfg_as_bool(loom_cfg_child(b, i, NULL), "b", &v, &d), "bool %d", i);
        cr_assert_eq(v, bexp[i], "bool %d", i);
    }
    cr_assert_not(loom_cfg_as_bool(loom_cfg_child(b, 6, NULL), "b", NULL, &d));
    cr_assert_not(loom_cfg_as_bool(loom_cfg_child(b, 7, NULL), "b", NULL, &d));
    cr_assert_eq(d.count, 2);
    expect_diag(&d, 0, "t.yaml", 1, 36,
                "b: expected a boolean (true/false, yes/no, on/off), got \"1\"");

    loom_cfg_node *in = loom_cfg_get(r, "i");
    const int64_t iexp[] = {0, -7, 12, 31, -16, INT64_MAX, INT64_MIN};
    for (int i = 0; i < 7; i++) {
        int64_t v = 42;
        cr_assert(loom_cfg_as_int(loom_cfg_child(in, i, NULL), "i", &v, &d), "int %d", i);
        cr_assert_eq(v, iexp[i], "int %d", i);
    }
    int before = d.count;
    for (int i = 7; i < loom_cfg_size(in); i++)
        cr_assert_not(loom_cfg_as_int(loom_cfg_child(in, i, NULL), "i", NULL, &d), "int %d", i);
    cr_assert_eq(d.count - before, 7);
    expect_diag(&d, before, "t.yaml", 3, 27,
                "i: expected an integer that fits in 64 bits, got \"9223372036854775808\"");
    expect_diag(&d, before + 1, "t.yaml", 3, 48, "i: expected an integer, got \"1e3\"");

    loom_cfg_node *dn = loom_cfg_get(r, "d");
    const double dexp[] = {1, -2.5, 1000, INFINITY, -INFINITY, 16};
    for (int i = 0; i < 6; i++) {
        double v = 42;
        cr_assert(loom_cfg_as_double(loom_cfg_child(dn, i, NULL), "d", &v, &d), "double %d", i);
        cr_assert(v == dexp[i], "double %d: %g", i, v);
    }
    before = d.count;
    for (int i = 6; i < loom_cfg_size(dn); i++)
        cr_assert_not(loom_cfg_as_double(loom_cfg_child(dn, i, NULL), "d", NULL, &d), "dbl %d", i);
    cr_assert_eq(d.count - before, 5);
    cr_assert_str_eq(d.entries[before + 1].message,
                     "d: expected a number within double range, got \"1e999\"");
    /* Non-scalars and missing nodes. */
    cr_assert_not(loom_cfg_as_int(dn, "d", NULL, &d));
    cr_assert_str_eq(d.entries[d.count - 1].message, "d: expected an integer, got a list");
    cr_assert_not(loom_cfg_as_double(NULL, NULL, NULL, &d));
    cr_assert_str_eq(d.entries[d.count - 1].message, "value: expected a number, got nothing");
    cr_assert_null(d.entries[d.count - 1].mark.file);
    loom_diag_free(&d);
    loom_cfg_free(r);
}

/* -------------------------------------------------------- large inputs */

/* "k0: 0\nk1: 1\n..." with n keys, then `tail` (static buffer reused). */
static char *many_keys(int n, const char *fmt, const char *tail) {
    size_t cap = (size_t)n * 48 + strlen(tail) + 1, o = 0;
    char *s = malloc(cap);
    cr_assert_not_null(s);
    for (int i = 0; i < n; i++) o += (size_t)snprintf(s + o, cap - o, fmt, i, i, i);
    snprintf(s + o, cap - o, "%s", tail);
    return s;
}

/* Issue 29: duplicate-key and anchor lookups scanned linearly, so a 1 MB
 * file of 80k keys took minutes. 80k keys, and 40k anchors with their
 * aliases, must now parse well inside the timeout; duplicates are still
 * found with both places. */
static void many_keys_parse_fast_body(void);
Test(config, many_keys_parse_fast, .timeout = 20) {
    many_keys_parse_fast_body();
    cr_assert_eq(LOOM_TEST_LEAK_CHECK(), 0, "memory leaked (see the LeakSanitizer report)");
}
static void many_keys_parse_fast_body(void) {
    enum { N = 80000 };
    char *text = many_keys(N, "key_%d: %d\n", "");
    loom_cfg_node *r = load_ok(text);
    cr_expect_eq(loom_cfg_size(r), N);
    cr_expect_str_eq(loom_cfg_scalar(loom_cfg_get(r, "key_79999")), "79999");
    loom_cfg_free(r);
    free(text);

    text = many_keys(N, "key_%d: %d\n", "key_1234: again\n");
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string(text, "t.yaml", &d));
    cr_assert_eq(d.count, 1);
    expect_diag(&d, 0, "t.yaml", N + 1, 1,
                "duplicate key 'key_1234' (first defined at t.yaml:1235:1); remove one of them");
    loom_diag_free(&d);
    free(text);

    text = many_keys(N / 2, "a%d: &x%d v%d\n", "");
    size_t len = strlen(text), cap = len + (size_t)N * 32;
    text = realloc(text, cap);
    for (int i = 0; i < N / 2; i++) len += (size_t)snprintf(text + len, cap - len, "b%d: *x%d\n", i, N / 2 - 1 - i);
    r = load_ok(text);
    cr_expect_eq(loom_cfg_size(r), N);
    cr_expect_str_eq(loom_cfg_scalar(loom_cfg_get(r, "b0")), "v39999");
    loom_cfg_free(r);
    free(text);
}

/* --------------------------------------------------------------- includes */

CFG_TEST(include_deep_merge) {
    const char *base = write_file("base.yaml", "model:\n"
                                               "  path: /models/base.gguf\n"
                                               "  dtype: f16\n"
                                               "scheduler:\n"
                                               "  max_num_seqs: 64\n"
                                               "  policy: fcfs\n"
                                               "stop: [a, b]\n");
    const char *child = write_file("child.yaml", "include: base.yaml\n"
                                                 "scheduler:\n"
                                                 "  max_num_seqs: 128\n"
                                                 "stop: [c]\n"
                                                 "extra: 1\n");
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *r = loom_cfg_load_file(child, &d);
    if (d.count) loom_diag_print(&d, stderr);
    cr_assert_not_null(r);
    cr_assert_eq(d.count, 0);
    cr_assert_null(loom_cfg_get(r, "include"), "include key is consumed");
    const char *k0, *k1, *k2, *k3;
    loom_cfg_child(r, 0, &k0);
    loom_cfg_child(r, 1, &k1);
    loom_cfg_child(r, 2, &k2);
    loom_cfg_child(r, 3, &k3);
    cr_assert_eq(loom_cfg_size(r), 4);
    cr_assert_str_eq(k0, "model");
    cr_assert_str_eq(k1, "scheduler");
    cr_assert_str_eq(k2, "stop");
    cr_assert_str_eq(k3, "extra");
    loom_cfg_node *n = loom_cfg_get_path(r, "model.path");
    cr_assert_str_eq(loom_cfg_scalar(n), "/models/base.gguf");
    expect_mark(n, base, 2, 9);
    n = loom_cfg_get_path(r, "scheduler.max_num_seqs");
    cr_assert_str_eq(loom_cfg_scalar(n), "128");
    expect_mark(n, child, 3, 17);
    n = loom_cfg_get_path(r, "scheduler.policy");
    cr_assert_str_eq(loom_cfg_scalar(n), "fcfs");
    expect_mark(n, base, 6, 11);
    n = loom_cfg_get(r, "stop");
    cr_assert_eq(loom_cfg_size(n), 1, "sequences replace, not append");
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_child(n, 0, NULL)), "c");

    /* An error in a value that came from the base points into the base. */
    sched_cfg cfg;
    static const loom_param only_seqs[] = {
        {"max_num_seqs", LOOM_PARAM_INT, offsetof(sched_cfg, max_num_seqs), "1", 1, 100, NULL,
         NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
    };
    cr_assert_not(loom_cfg_bind(loom_cfg_get(r, "scheduler"), "scheduler", only_seqs, NULL, &cfg,
                                sizeof cfg, &d));
    cr_assert_eq(d.count, 2);
    expect_diag(&d, 0, base, 6, 3,
                "scheduler.policy: unknown key; valid keys: max_num_seqs");
    expect_diag(&d, 1, child, 3, 17, "scheduler.max_num_seqs: 128 is out of range [1, 100]");
    loom_diag_free(&d);
    loom_cfg_free(r);
}

CFG_TEST(include_list_in_order_and_nested_dirs) {
    write_file("base.yaml", "model:\n  path: /a\n  dtype: f16\n");
    write_file("over.yaml", "model:\n  dtype: q4\n");
    char sub[PATH_MAX + 8];
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    const char *top = write_file("sub/top.yaml", "include:\n"
                                                 "  - ../base.yaml\n"
                                                 "  - ../over.yaml\n"
                                                 "model:\n"
                                                 "  path: /b\n");
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *r = loom_cfg_load_file(top, &d);
    cr_assert_not_null(r);
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "model.dtype")), "q4");
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "model.path")), "/b");
    expect_mark(loom_cfg_get_path(r, "model.dtype"), path_in_dir("sub/../over.yaml"), 2, 10);
    loom_cfg_free(r);
    loom_diag_free(&d);
    unlink(top);
    g_nfiles--;
    rmdir(sub);
}

CFG_TEST(include_cycle_reports_chain) {
    const char *a = write_file("a.yaml", "include: b.yaml\nx: 1\n");
    const char *b = write_file("b.yaml", "y: 2\ninclude: a.yaml\n");
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_file(a, &d));
    cr_assert_eq(d.count, 1);
    char msg[3 * PATH_MAX];
    snprintf(msg, sizeof msg, "include cycle: %s -> %s -> %s; remove one of these includes", a, b,
             a);
    expect_diag(&d, 0, b, 2, 10, msg);
    loom_diag_free(&d);

    const char *self = write_file("self.yaml", "a: 1\ninclude: [self.yaml]\n");
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_file(self, &d));
    snprintf(msg, sizeof msg, "include cycle: %s -> %s; remove one of these includes", self, self);
    expect_diag(&d, 0, self, 2, 11, msg);
    loom_diag_free(&d);
}

/* Write g_dir/<prefix><i>.yaml for i < n: each includes the next `fan`
 * times (the last includes nothing). Returns the first path (static). */
static const char *write_include_chain(const char *prefix, int n, int fan) {
    static char first[PATH_MAX + 64];
    for (int i = 0; i < n; i++) {
        char name[64], text[2048];
        snprintf(name, sizeof name, "%s%d.yaml", prefix, i);
        int o = snprintf(text, sizeof text, "k%d: %d\n", i, i);
        if (i + 1 < n) {
            o += snprintf(text + o, sizeof text - (size_t)o, "include:\n");
            for (int k = 0; k < fan; k++) o += snprintf(text + o, sizeof text - (size_t)o, "  - %s%d.yaml\n", prefix, i + 1);
        }
        FILE *f = fopen(path_in_dir(name), "w");
        cr_assert_not_null(f);
        fputs(text, f);
        fclose(f);
    }
    snprintf(first, sizeof first, "%s/%s0.yaml", g_dir, prefix);
    return first;
}

static void remove_include_chain(const char *prefix, int n) {
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s%d.yaml", prefix, i);
        unlink(path_in_dir(name));
    }
}

/* Issue 29: a long include chain recursed without bound (8000 files
 * overflowed the stack); now at most 32 levels, an error naming the file. */
CFG_TEST(include_depth_is_limited) {
    const char *top = write_include_chain("deep", 33, 1); /* 32 levels of include: fine */
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *r = loom_cfg_load_file(top, &d);
    if (d.count) loom_diag_print(&d, stderr);
    cr_assert_not_null(r);
    cr_expect_str_eq(loom_cfg_scalar(loom_cfg_get(r, "k32")), "32");
    loom_cfg_free(r);
    loom_diag_free(&d);
    remove_include_chain("deep", 33);
    top = write_include_chain("deeper", 40, 1);
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_file(top, &d));
    cr_assert_eq(d.count, 1);
    char msg[2 * PATH_MAX];
    snprintf(msg, sizeof msg, "cannot include '%s': includes nest more than 32 levels deep (is there a "
             "runaway chain of includes?)", path_in_dir("deeper33.yaml"));
    expect_diag(&d, 0, path_in_dir("deeper32.yaml"), 3, 5, msg);
    loom_diag_free(&d);
    remove_include_chain("deeper", 40);
}

/* Issue 29: 12 files each including the next 10 times is 10^11 loads (a
 * hang); the files loaded for one configuration are now capped at 256. */
static void include_count_is_limited_body(void);
Test(config, include_count_is_limited, .timeout = 20) {
    include_count_is_limited_body();
    cr_assert_eq(LOOM_TEST_LEAK_CHECK(), 0, "memory leaked (see the LeakSanitizer report)");
}
static void include_count_is_limited_body(void) {
    const char *top = write_include_chain("fan", 12, 10);
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_file(top, &d));
    cr_assert_geq(d.count, 1);
    cr_expect(strstr(d.entries[0].message, "more than 256 files") != NULL, "%s", d.entries[0].message);
    cr_expect(strstr(d.entries[0].message, "fan") != NULL, "%s", d.entries[0].message);
    loom_diag_free(&d);
    remove_include_chain("fan", 12);
}

/* Issue 29: a pipe (/dev/stdin, /dev/fd/N) failed in realpath ("No such
 * file"); it is now read like a file. */
CFG_TEST(load_from_a_pipe) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    const char *text = "scheduler:\n  policy: fcfs\n";
    cr_assert_eq(write(fds[1], text, strlen(text)), (ssize_t)strlen(text));
    close(fds[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *r = loom_cfg_load_file(path, &d);
    if (d.count) loom_diag_print(&d, stderr);
    cr_assert_not_null(r);
    cr_expect_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "scheduler.policy")), "fcfs");
    loom_cfg_free(r);
    loom_diag_free(&d);
    close(fds[0]);
}

CFG_TEST(missing_include_at_value_position) {
    write_file("base.yaml", "a: 1\n");
    const char *top = write_file("top.yaml", "x: 1\n"
                                             "include:\n"
                                             "  - base.yaml\n"
                                             "  - nothere.yaml\n"
                                             "  - {a: 1}\n");
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_file(top, &d));
    cr_assert_eq(d.count, 2);
    char msg[2 * PATH_MAX];
    snprintf(msg, sizeof msg, "cannot read included file '%s': No such file or directory",
             path_in_dir("nothere.yaml"));
    expect_diag(&d, 0, top, 4, 5, msg);
    expect_diag(&d, 1, top, 5, 5, "'include' entries must be file names, got a map");
    loom_diag_free(&d);
}

/* -------------------------------------------------------------- overrides */

CFG_TEST(overrides_set_create_and_replace) {
    loom_cfg_node *r = load_ok("scheduler:\n"
                               "  max_num_seqs: 8\n"
                               "model:\n");
    loom_diag d;
    loom_diag_init(&d);
    /* argument k + 2 of the command line */
    static const char *const sets[] = {"scheduler.max_num_seqs=32", "scheduler.policy=priority",
                                       "cache.kv.block_size=16",   "model.path=/m/a.gguf",
                                       "stop=[1, 2]",              "sampler={top_k: 5, top_p: 0.9}",
                                       "cleared=",                 "url=a=b"};
    for (int k = 0; k < 8; k++)
        cr_assert_eq(loom_cfg_set_override(r, sets[k], k + 2, &d), LOOM_OK, "%s", sets[k]);
    cr_assert_eq(d.count, 0);

    loom_cfg_node *n = loom_cfg_get_path(r, "scheduler.max_num_seqs");
    cr_assert_str_eq(loom_cfg_scalar(n), "32");
    expect_mark(n, "<command line>", 0, 2);
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "scheduler.policy")), "priority");
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "cache.kv.block_size")), "16");
    cr_assert_eq(loom_cfg_type_of(loom_cfg_get(r, "cache")), LOOM_CFG_MAP);
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "model.path")), "/m/a.gguf");
    n = loom_cfg_get(r, "stop");
    cr_assert_eq(loom_cfg_type_of(n), LOOM_CFG_SEQ);
    cr_assert_eq(loom_cfg_size(n), 2);
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "sampler.top_p")), "0.9");
    cr_assert_eq(loom_cfg_type_of(loom_cfg_get(r, "cleared")), LOOM_CFG_NULL);
    cr_assert_not_null(loom_cfg_get(r, "cleared"));
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get(r, "url")), "a=b");

    /* A bad value given on the command line is reported there. */
    cr_assert_eq(loom_cfg_set_override(r, "scheduler.max_num_seqs=many", 11, &d), LOOM_OK);
    sched_cfg cfg;
    cr_assert_not(loom_cfg_bind(loom_cfg_get(r, "scheduler"), "scheduler", sched_params, NULL,
                                &cfg, sizeof cfg, &d));
    expect_diag(&d, 0, "<command line>", 0, 11,
                "scheduler.max_num_seqs: expected an integer, got \"many\"");
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    loom_diag_print(&d, f);
    fclose(f);
    cr_assert_not_null(strstr(out, "<command line> (argument 11): error: scheduler.max_num_seqs: "
                                   "expected an integer, got \"many\"\n"),
                       "%s", out);
    free(out);
    loom_diag_free(&d);
    loom_cfg_free(r);
}

CFG_TEST(overrides_errors) {
    loom_cfg_node *r = load_ok("scheduler:\n"
                               "  max_num_seqs: 8\n"
                               "list: [1]\n");
    loom_diag d;
    loom_diag_init(&d);
    /* argument k + 1 of the command line, refused with message msg */
    static const struct {
        const char *set, *msg;
    } bad[] = {
        {"scheduler.max_num_seqs.x=1",
         "--set 'scheduler.max_num_seqs.x=1': cannot set a key inside "
         "'scheduler.max_num_seqs', which is \"8\" (set at t.yaml:2:17), not a map"},
        {"list.a=1", "--set 'list.a=1': cannot set a key inside 'list', which is a list (set at "
                     "t.yaml:3:7), not a map"},
        {"noequals", "--set 'noequals': expected KEY.PATH=VALUE, e.g. scheduler.max_num_seqs=64"},
        {"=5", "--set '=5': expected KEY.PATH=VALUE, e.g. scheduler.max_num_seqs=64"},
        {"a..b=5", "--set 'a..b=5': key path 'a..b' has an empty component; expected "
                   "KEY.PATH=VALUE, e.g. scheduler.max_num_seqs=64"},
        {"a.=5", "--set 'a.=5': key path 'a.' has an empty component; expected KEY.PATH=VALUE, "
                 "e.g. scheduler.max_num_seqs=64"},
        {"x=[1, 2", "in --set 'x=[1, 2': did not find expected ',' or ']' (while parsing a flow "
                    "sequence)"},
    };
    const int nbad = (int)(sizeof bad / sizeof bad[0]);
    for (int k = 0; k < nbad; k++)
        cr_assert_eq(loom_cfg_set_override(r, bad[k].set, k + 1, &d), LOOM_ERR_INVALID, "%s",
                     bad[k].set);
    cr_assert_eq(d.count, 7);
    for (int k = 0; k < nbad; k++) expect_diag(&d, k, "<command line>", 0, k + 1, bad[k].msg);
    /* Nothing was changed by the failed overrides. */
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "scheduler.max_num_seqs")), "8");
    cr_assert_null(loom_cfg_get(r, "a"));
    cr_assert_null(loom_cfg_get(r, "x"));
    cr_assert_eq(loom_cfg_size(r), 2);
    loom_diag_free(&d);
    loom_cfg_free(r);
}

CFG_TEST(override_into_empty_root) {
    loom_cfg_node *r = loom_cfg_new_map(NULL);
    cr_assert_not_null(r);
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_eq(loom_cfg_set_override(r, "a.b.c=true", 1, &d), LOOM_OK);
    bool v = false;
    cr_assert(loom_cfg_as_bool(loom_cfg_get_path(r, "a.b.c"), "a.b.c", &v, &d));
    cr_assert(v);
    loom_diag_free(&d);
    loom_cfg_free(r);
}

/* --------------------------------------------------------------- printing */

static char *print_to_string(const loom_cfg_node *r) {
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    loom_cfg_print(r, f);
    fclose(f);
    return out;
}

static void assert_same_tree(const loom_cfg_node *a, const loom_cfg_node *b, const char *where) {
    cr_assert_eq(loom_cfg_type_of(a), loom_cfg_type_of(b), "%s: type", where);
    if (loom_cfg_type_of(a) == LOOM_CFG_SCALAR)
        cr_assert_str_eq(loom_cfg_scalar(a), loom_cfg_scalar(b), "%s: text", where);
    cr_assert_eq(loom_cfg_size(a), loom_cfg_size(b), "%s: size", where);
    for (int i = 0; i < loom_cfg_size(a); i++) {
        const char *ka, *kb;
        const loom_cfg_node *ca = loom_cfg_child(a, i, &ka), *cb = loom_cfg_child(b, i, &kb);
        if (ka || kb) {
            cr_assert(ka && kb, "%s[%d]: key presence", where, i);
            cr_assert_str_eq(ka, kb, "%s[%d]: key", where, i);
        }
        char sub[256];
        snprintf(sub, sizeof sub, "%s/%s", where, ka ? ka : "[]");
        assert_same_tree(ca, cb, sub);
    }
}

CFG_TEST(print_simple_exact) {
    loom_cfg_node *r = load_ok("b: 1\na:\n  y: [1, two]\n  x: {}\nn:\ns: 'null'\n");
    char *out = print_to_string(r);
    cr_assert_str_eq(out, "b: 1\n"
                          "a:\n"
                          "  y:\n"
                          "  - 1\n"
                          "  - two\n"
                          "  x: {}\n"
                          "n: null\n"
                          "s: 'null'\n");
    free(out);
    loom_cfg_free(r);
}

CFG_TEST(print_reparse_round_trip) {
    const char *y = "model:\n"
                    "  path: \"/models/a b.gguf\"\n"
                    "  q1: \"null\"\n"
                    "  q2: '~'\n"
                    "  colon: \"key: value\"\n"
                    "  hash: \"x #comment\"\n"
                    "  lead: \" padded \"\n"
                    "  dash: \"- item\"\n"
                    "  star: \"*notalias\"\n"
                    "  empty: \"\"\n"
                    "  unicode: \"héllo ✓\"\n"
                    "  ctrl: \"tab\\there\\u0001\"\n"
                    "  multi: |\n"
                    "    line one\n"
                    "    line two\n"
                    "  yes: yes\n"
                    "  num: -12.5e3\n"
                    "  \"<<\": not a merge\n"
                    "  \"a: b\": weird key\n"
                    "seq:\n"
                    "  - [1, [2, 3]]\n"
                    "  - {k: v, e: {}}\n"
                    "  - ~\n"
                    "  - []\n"
                    "nothing:\n";
    loom_cfg_node *a = load_ok(y);
    char *out = print_to_string(a);
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *b = loom_cfg_load_string(out, "printed.yaml", &d);
    if (!b) loom_diag_print(&d, stderr);
    cr_assert_not_null(b, "printed YAML does not re-parse:\n%s", out);
    assert_same_tree(a, b, "");
    /* And printing is stable. */
    char *out2 = print_to_string(b);
    cr_assert_str_eq(out, out2);
    free(out);
    free(out2);
    loom_diag_free(&d);
    loom_cfg_free(a);
    loom_cfg_free(b);
}

CFG_TEST(diag_formatting) {
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_mark full = {"f.yaml", 3, 7}, nocol = {"f.yaml", 3, 0}, fileonly = {"f.yaml", 0, 0},
                  arg = {"<command line>", 0, 4};
    loom_diag_add(&d, &full, "one %d", 1);
    loom_diag_add(&d, &nocol, "two");
    loom_diag_add(&d, &fileonly, "three");
    loom_diag_add(&d, &arg, "four");
    loom_diag_add(&d, NULL, "five");
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    loom_diag_print(&d, f);
    fclose(f);
    cr_assert_str_eq(out, "f.yaml:3:7: error: one 1\n"
                          "f.yaml:3: error: two\n"
                          "f.yaml: error: three\n"
                          "<command line> (argument 4): error: four\n"
                          "error: five\n");
    free(out);
    loom_error err;
    cr_assert_eq(loom_diag_to_error(&d, LOOM_ERR_FORMAT, &err), LOOM_ERR_FORMAT);
    cr_assert_str_eq(err.message, "f.yaml:3:7: one 1 (and 4 more errors)");
    loom_diag_free(&d);
    cr_assert_eq(d.count, 0);
    cr_assert_null(d.entries);
    cr_assert_eq(loom_diag_to_error(&d, LOOM_ERR_FORMAT, &err), LOOM_ERR_FORMAT);
}

CFG_TEST(parser_rejections_and_limits) {
    loom_diag d;
    loom_diag_init(&d);
    /* Several independent problems in one file are all reported. */
    cr_assert_null(loom_cfg_load_string("[a, b]: 1\n"
                                        "? {k: v}\n"
                                        ": 2\n"
                                        "\"\": 3\n"
                                        "m:\n"
                                        "  <<: [1]\n"
                                        "n: \"a\\0b\"\n"
                                        "*x : 4\n",
                                        "p.yaml", &d));
    cr_assert_eq(d.count, 6);
    expect_diag(&d, 0, "p.yaml", 1, 1, "keys must be plain text, not a map or a list");
    expect_diag(&d, 1, "p.yaml", 2, 3, "keys must be plain text, not a map or a list");
    expect_diag(&d, 2, "p.yaml", 4, 1, "empty key; write a name before ':'");
    expect_diag(&d, 3, "p.yaml", 6, 7, "merge key '<<' needs a map or a list of maps, got a list");
    expect_diag(&d, 4, "p.yaml", 7, 4,
                "text contains a NUL character, which configuration values cannot hold");
    expect_diag(&d, 5, "p.yaml", 8, 1, "an alias cannot be used as a key; write the key out");
    loom_diag_free(&d);

    /* Nesting depth. */
    char deep[700];
    int o = snprintf(deep, sizeof deep, "a: ");
    for (int i = 0; i < 300; i++) deep[o++] = '[';
    for (int i = 0; i < 300; i++) deep[o++] = ']';
    deep[o] = '\0';
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string(deep, "p.yaml", &d));
    cr_assert_eq(d.count, 1);
    expect_diag(&d, 0, "p.yaml", 1, 204, "nested more than 200 levels deep");
    loom_diag_free(&d);

    /* Alias expansion bomb ("billion laughs"). */
    char bomb[2048];
    o = snprintf(bomb, sizeof bomb, "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for (int i = 1; i < 10; i++)
        o += snprintf(bomb + o, sizeof bomb - (size_t)o,
                      "a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n",
                      i, i, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string(bomb, "p.yaml", &d));
    cr_assert_eq(d.count, 1);
    cr_assert_not_null(strstr(d.entries[0].message, "configuration has more than 1000000 nodes"),
                       "%s", d.entries[0].message);
    loom_diag_free(&d);
}

CFG_TEST(include_from_string_and_bad_include_value) {
    /* Strings resolve includes against the current directory. */
    const char *base = write_file("base.yaml", "a: 1\nb: {c: 2}\n");
    char text[PATH_MAX + 64];
    snprintf(text, sizeof text, "include: %s\nb: {d: 3}\n", base);
    loom_cfg_node *r = load_ok(text);
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get(r, "a")), "1");
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "b.c")), "2");
    cr_assert_str_eq(loom_cfg_scalar(loom_cfg_get_path(r, "b.d")), "3");
    loom_cfg_free(r);

    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_string("include: {a: b}\n", "s.yaml", &d));
    expect_diag(&d, 0, "s.yaml", 1, 10,
                "'include' takes a file name or a list of file names, got a map");
    loom_diag_free(&d);

    /* A syntax error inside an included file points into that file. */
    const char *broken = write_file("broken.yaml", "x: [1\n");
    const char *top = write_file("top.yaml", "include: broken.yaml\n");
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_file(top, &d));
    cr_assert_eq(d.count, 1);
    expect_diag(&d, 0, broken, 2, 1,
                "did not find expected ',' or ']' (while parsing a flow sequence at line 1, "
                "column 4)");
    loom_diag_free(&d);
}

/* Issue 29 (parsers take bytes): a buffer that is not NUL-terminated parses
 * to its length; includes are relative to the given directory, or refused
 * when it is NULL (no file is read for untrusted text). */
CFG_TEST(load_buffer_reads_its_length_and_roots_includes) {
    const char text[] = "a: 1\nb: 2\nTRAILING: [";
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *r = loom_cfg_load_buffer(text, 10, "buf.yaml", NULL, &d); /* "a: 1\nb: 2\n" */
    if (d.count) loom_diag_print(&d, stderr);
    cr_assert_not_null(r);
    cr_expect_eq(loom_cfg_size(r), 2);
    cr_expect_str_eq(loom_cfg_scalar(loom_cfg_get(r, "b")), "2");
    loom_cfg_free(r);

    write_file("base.yaml", "a: 1\nc: 3\n");
    const char inc[] = "include: base.yaml\na: 2\n";
    r = loom_cfg_load_buffer(inc, strlen(inc), "buf.yaml", g_dir, &d);
    if (d.count) loom_diag_print(&d, stderr);
    cr_assert_not_null(r);
    cr_expect_str_eq(loom_cfg_scalar(loom_cfg_get(r, "a")), "2");
    cr_expect_str_eq(loom_cfg_scalar(loom_cfg_get(r, "c")), "3");
    loom_cfg_free(r);

    cr_assert_null(loom_cfg_load_buffer(inc, strlen(inc), "buf.yaml", NULL, &d));
    expect_diag(&d, 0, "buf.yaml", 1, 10,
                "'include' is not allowed here: buf.yaml is read without access to files");
    loom_diag_free(&d);

    /* a NUL inside the given length is an error, not the end of the text */
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_buffer("a: 1\0b: 2\n", 10, "nul.yaml", NULL, &d));
    cr_assert_geq(d.count, 1);
    loom_diag_free(&d);
}

/* The byte limit of a file holds for a buffer too (64 MiB). */
CFG_TEST(load_buffer_is_size_limited) {
    size_t n = (64u << 20) + 1;
    char *big = malloc(n);
    cr_assert_not_null(big);
    memset(big, '#', n); /* one long comment: would parse */
    loom_diag d;
    loom_diag_init(&d);
    cr_assert_null(loom_cfg_load_buffer(big, n, "big.yaml", NULL, &d));
    cr_assert_eq(d.count, 1);
    cr_expect(strstr(d.entries[0].message, "total more than 67108864 bytes"), "%s", d.entries[0].message);
    loom_diag_free(&d);
    free(big);
}
