/*
 * tests/cli/test_cli.c — the built `loom` binary (LOOM_BIN): exit codes and
 * output of --help / --version / usage errors, `plugins` (text, --params,
 * --json) over the good and broken test plugins, and `check` on good, bad
 * and A/B configs with --set. Each run is a child process with its stdout
 * and stderr captured to files.
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/plugin.h"
#include "cli_run.h"
#include "tp_util.h"

/* "MAJOR.MINOR" of this SDK, as `loom` prints it */
#define LOOM_TEST_STR_(x) #x
#define LOOM_TEST_STR(x) LOOM_TEST_STR_(x)
#define LOOM_TEST_ABI LOOM_TEST_STR(LOOM_ABI_MAJOR) "." LOOM_TEST_STR(LOOM_ABI_MINOR)

/* Run LOOM_BIN with args (NULL-terminated) in an environment that searches
 * only the good test plugins (plus `extra_path`, may be NULL). */
static cli_out run(const char *extra_path, const char *const *args) {
    char path[8192];
    snprintf(path, sizeof path, "LOOM_PLUGIN_PATH=%s%s%s", tp_env("LOOM_TEST_GOOD_DIR"),
             extra_path ? ":" : "", extra_path ? extra_path : "");
    return cli_run(tp_env("LOOM_BIN"), NULL, (const char *const[]){path, "LOOM_PLUGIN_PATH_ONLY=1", NULL},
                   args);
}

static void has(const char *text, const char *needle) {
    cr_assert_not_null(strstr(text, needle), "output lacks \"%s\":\n%s", needle, text);
}

/* Some line of text contains every word of `words` (NULL-terminated). */
static void has_line(const char *text, const char *const *words) {
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[4096];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        bool all = true;
        for (const char *const *w = words; *w && all; w++) all = strstr(buf, *w) != NULL;
        if (all) return;
        line = end ? end + 1 : NULL;
    }
    cr_assert_fail("no line has all of \"%s\", \"%s\", ...:\n%s", words[0], words[1] ? words[1] : "",
                   text);
}

static char *data(const char *name) { return tp_join(tp_env("LOOM_CLI_DATA"), name); }

/* ------------------------------------------------------------ top level */

Test(cli, help) {
    cli_out r = run(NULL, ARGS("--help"));
    cr_assert_eq(r.code, 0);
    has(r.out, "usage: loom");
    has(r.out, "plugins");
    has(r.out, "check");
    has(r.out, "LOOM_PLUGIN_PATH");
    cli_out_free(&r);
    r = run(NULL, ARGS("help", "check"));
    cr_assert_eq(r.code, 0);
    has(r.out, "usage: loom check CONFIG");
    cli_out_free(&r);
}

Test(cli, version) {
    cli_out r = run(NULL, ARGS("--version"));
    cr_assert_eq(r.code, 0);
    has(r.out, "loom 0.1.0");
    has(r.out, "plugin ABI " LOOM_TEST_ABI);
    has(r.out, "CUDA: ");
    cli_out_free(&r);
}

Test(cli, usage_errors_exit_2) {
    cli_out r = run(NULL, NULL);
    cr_assert_eq(r.code, 2);
    has(r.err, "no command given");
    has(r.err, "usage: loom");
    cli_out_free(&r);
    r = run(NULL, ARGS("frobnicate"));
    cr_assert_eq(r.code, 2);
    has(r.err, "unknown command 'frobnicate'");
    has(r.err, "usage: loom");
    cli_out_free(&r);
    r = run(NULL, ARGS("--frob"));
    cr_assert_eq(r.code, 2);
    has(r.err, "unknown option '--frob'");
    cli_out_free(&r);
    r = run(NULL, ARGS("plugins", "--bogus"));
    cr_assert_eq(r.code, 2);
    has(r.err, "loom plugins: unknown option '--bogus'");
    has(r.err, "usage: loom plugins");
    cli_out_free(&r);
    r = run(NULL, ARGS("plugins", "extra"));
    cr_assert_eq(r.code, 2);
    cli_out_free(&r);
    r = run(NULL, ARGS("check"));
    cr_assert_eq(r.code, 2);
    has(r.err, "no pipeline file given");
    cli_out_free(&r);
    r = run(NULL, ARGS("check", "a.yaml", "b.yaml"));
    cr_assert_eq(r.code, 2);
    has(r.err, "unexpected argument 'b.yaml'");
    cli_out_free(&r);
    r = run(NULL, ARGS("check", "a.yaml", "--set"));
    cr_assert_eq(r.code, 2);
    has(r.err, "option '--set' needs a value");
    cli_out_free(&r);
    r = run(NULL, ARGS("check", "-x"));
    cr_assert_eq(r.code, 2);
    has(r.err, "unknown option '-x'");
    cli_out_free(&r);
}

/* -------------------------------------------------------------- plugins */

Test(cli, plugins_lists_good_and_broken) {
    cli_out r = run(tp_env("LOOM_TEST_BAD_DIR"), ARGS("plugins"));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err);
    has(r.out, "plugin search path:");
    has(r.out, "KIND");
    has_line(r.out, ARGS("sampler ", " tsamp ", " 0.0.1 ", " " LOOM_TEST_ABI " ", "/loom-sampler-tsamp.so"));
    has_line(r.out, ARGS("scheduler ", " msched ", " 1.2.3 ", " " LOOM_TEST_ABI " ", "/libmulti.so"));
    has(r.out, "broken plugin files");
    char both[64];
    snprintf(both, sizeof both, "plugin ABI %d.0, host ABI %s", LOOM_ABI_MAJOR + 1, LOOM_TEST_ABI);
    has(r.out, both);
    has(r.out, "has no sample() (NULL)");
    has(r.out, "not binary compatible");
    has(r.out, "is not a loadable shared object");
    has(r.out, "no entry symbol");
    cli_out_free(&r);
}

Test(cli, plugins_params) {
    cli_out r = run(NULL, ARGS("plugins", "--params"));
    cr_assert_eq(r.code, 0);
    has(r.out, "sampler tsamp — test tsamp (does nothing)");
    has(r.out, "KEY");
    has_line(r.out, ARGS("size ", " int ", " 8 ", " [1, 1024] ", "an integer in [1, 1024]"));
    has(r.out, "fcfs|priority|random");
    has(r.out, "an integer in [1, 1024]");
    has(r.out, "(no parameters)"); /* msched */
    has(r.out, "engine (core)"); /* the core's own switches are declared too */
    has_line(r.out, ARGS("log_level ", " enum ", " warn ", "debug|info|warn|error"));
    cli_out_free(&r);
}

Test(cli, plugins_json) {
    cli_out r = run(tp_env("LOOM_TEST_BAD_DIR"), ARGS("plugins", "--json", "--params"));
    cr_assert_eq(r.code, 0);
    cJSON *root = cJSON_Parse(r.out);
    cr_assert_not_null(root, "not JSON:\n%s", r.out);
    cJSON *plugins = cJSON_GetObjectItem(root, "plugins");
    cJSON *broken = cJSON_GetObjectItem(root, "broken");
    cr_assert_eq(cJSON_GetArraySize(broken), 12);
    bool found = false;
    cJSON *p;
    cJSON_ArrayForEach(p, plugins) {
        cJSON *comps = cJSON_GetObjectItem(p, "components");
        cJSON *c0 = cJSON_GetArrayItem(comps, 0);
        if (strcmp(cJSON_GetObjectItem(c0, "name")->valuestring, "tsamp") != 0) continue;
        found = true;
        cr_assert_str_eq(cJSON_GetObjectItem(p, "abi")->valuestring, LOOM_TEST_ABI);
        cr_assert_str_eq(cJSON_GetObjectItem(c0, "kind")->valuestring, "sampler");
        cJSON *params = cJSON_GetObjectItem(c0, "params");
        cr_assert_eq(cJSON_GetArraySize(params), 6);
        cJSON *size = cJSON_GetArrayItem(params, 0);
        cr_assert_str_eq(cJSON_GetObjectItem(size, "key")->valuestring, "size");
        cr_assert_eq(cJSON_GetObjectItem(size, "max")->valuedouble, 1024.0);
        cJSON *policy = cJSON_GetArrayItem(params, 4);
        cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(policy, "choices")), 3);
    }
    cr_assert(found);
    cJSON_Delete(root);
    cli_out_free(&r);
}

/* ---------------------------------------------------------------- check */

Test(cli, check_good) {
    char *good = data("good.yaml");
    cli_out r = run(NULL, ARGS("check", good));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err);
    has(r.out, "scheduler:\n  plugin: tsched  # ");
    has(r.out, "/loom-scheduler-tsched.so (plugin test-tsched 0.0.1, ABI " LOOM_TEST_ABI ")");
    has(r.out, "  policy: priority\n");
    has(r.out, "  size: 8\n");
    cli_out_free(&r);
    r = run(NULL, ARGS("check", "--set", "scheduler.size=99", good, "-s", "engine.threads=2"));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err);
    has(r.out, "  size: 99\n");
    has(r.out, "engine:\n  threads: 2\n");
    cli_out_free(&r);
    r = run(NULL, ARGS("check", "--quiet", good));
    cr_assert_eq(r.code, 0);
    cr_assert_str_eq(r.out, "");
    cli_out_free(&r);
    free(good);
}

/* Issue 29: `loom check /dev/stdin` with a pipe failed in realpath. */
Test(cli, check_from_stdin_pipe) {
    char *good = data("good.yaml");
    char path[8192], bin[8192];
    snprintf(path, sizeof path, "LOOM_PLUGIN_PATH=%s", tp_env("LOOM_TEST_GOOD_DIR"));
    snprintf(bin, sizeof bin, "LOOM_CHECK_BIN=%s", tp_env("LOOM_BIN"));
    cli_out r = cli_run("/bin/sh", NULL, (const char *const[]){path, "LOOM_PLUGIN_PATH_ONLY=1", bin, NULL},
                        ARGS("-c", "cat \"$1\" | \"$LOOM_CHECK_BIN\" check /dev/stdin", "sh", good));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err);
    has(r.out, "  policy: priority\n");
    cli_out_free(&r);
    free(good);
}

/* check creates every plugin: a create() that refuses its configuration
 * (the test plugins' `fail` switch) fails the check, naming the section and
 * the plugin's own reason; every failing one is reported. */
Test(cli, check_creates_every_plugin) {
    char *good = data("good.yaml");
    cli_out r = run(NULL, ARGS("check", good, "--set", "scheduler.fail=true", "--set", "sampler.fail=true",
                                  "--set", "sampler.label=why"));
    cr_assert_eq(r.code, 1, "a failing create passed the check: %s", r.out);
    cr_assert_str_eq(r.out, "");
    has(r.err, "error: scheduler 'tsched' (");
    has(r.err, "create failed: tsched: asked to fail");
    has(r.err, "create failed: tsamp: asked to fail (label why)");
    has(r.err, "2 plugins could not be created");
    cli_out_free(&r);
    free(good);
}

Test(cli, check_bad_reports_every_error) {
    char *bad = data("bad.yaml");
    cli_out r = run(NULL, ARGS("check", bad));
    cr_assert_eq(r.code, 1);
    cr_assert_str_eq(r.out, "");
    char want[4096];
    snprintf(want, sizeof want, "%s:2:1: error: unknown top-level key 'schedular'", bad);
    has(r.err, want);
    snprintf(want, sizeof want, "%s:3:19: error: backend.plugin: no backend plugin named 'nope'", bad);
    has(r.err, want);
    snprintf(want, sizeof want, "%s:4:25: error: cache.sise: unknown key", bad);
    has(r.err, want);
    snprintf(want, sizeof want, "%s:5:32: error: sampler.size: expected an integer", bad);
    has(r.err, want);
    snprintf(want, sizeof want, "%s: error: missing required section 'scheduler'", bad);
    has(r.err, want);
    has(r.err, "5 errors");
    cli_out_free(&r);

    char *good = data("good.yaml");
    r = run(NULL, ARGS("check", good, "--set", "scheduler.size=0"));
    cr_assert_eq(r.code, 1);
    has(r.err, "<command line> (argument 1): error: scheduler.size");
    cli_out_free(&r);
    r = run(NULL, ARGS("check", "/no/such/file.yaml"));
    cr_assert_eq(r.code, 1);
    has(r.err, "cannot open pipeline '/no/such/file.yaml'");
    cli_out_free(&r);
    free(bad), free(good);
}

Test(cli, check_ab_pair) {
    char *a = data("good.yaml"), *b = data("b.yaml");
    cli_out ra = run(NULL, ARGS("check", a)), rb = run(NULL, ARGS("check", b));
    cr_assert_eq(ra.code, 0);
    cr_assert_eq(rb.code, 0, "%s", rb.err);
    has(ra.out, "  policy: priority\n");
    has(rb.out, "  policy: random\n");
    /* Beyond the first line (the file name) only the scheduler policy differs. */
    const char *pa = strchr(ra.out, '\n'), *pb = strchr(rb.out, '\n');
    int diffs = 0;
    while (pa && pb && *pa && *pb) {
        const char *ea = strchr(pa + 1, '\n'), *eb = strchr(pb + 1, '\n');
        size_t la = ea ? (size_t)(ea - pa) : strlen(pa), lb = eb ? (size_t)(eb - pb) : strlen(pb);
        if (la != lb || memcmp(pa, pb, la) != 0) diffs++;
        pa = ea, pb = eb;
    }
    cr_assert_eq(diffs, 1, "A and B differ in %d lines", diffs);
    cli_out_free(&ra), cli_out_free(&rb);
    free(a), free(b);
}

/* ---------------------------------------------------------- plugin-test */

/* --check TEXT that no check's name contains is an error naming TEXT, not
 * a run whose every check was "skipped". */
Test(cli, plugin_test_unknown_check_is_not_found) {
    char *so = tp_join(tp_env("LOOM_TEST_GOOD_DIR"), "loom-sampler-tsamp.so");
    cli_out r = run(NULL, ARGS("plugin-test", so, "--quick", "--check", "no-such-check"));
    cr_assert_eq(r.code, 1, "exit %d\nstdout: %s\nstderr: %s", r.code, r.out, r.err);
    has(r.err, "no check");
    has(r.err, "'no-such-check'");
    cr_assert_null(strstr(r.err, "skipped"), "stderr: %s", r.err);
    cli_out_free(&r);
    free(so);
}
