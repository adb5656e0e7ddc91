/*
 * tests/engine/test_engine_cli.c — `loom run` and `loom bench` end to end:
 * the built binary (LOOM_CLI) as a child process, stdout and stderr
 * captured to files. Real-model runs skip when LOOM_TEST_MODEL is unset;
 * bench runs use the tiny dummy pipeline and always run.
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "model/gguf.h"
#include "tokenizer/tokenizer.h"
#include "eng_util.h"

/* Run LOOM_CLI with NULL-terminated args (stdin from /dev/null). */
static cli_out cli(const char *const *args) {
    const char *bin = getenv("LOOM_CLI");
    cr_assert(bin && bin[0], "LOOM_CLI is not set (run through meson test)");
    return cli_run(bin, NULL, NULL, args);
}

static char *default_config(void) {
    const char *src = getenv("LOOM_SOURCE_DIR");
    cr_assert(src);
    char *p = malloc(strlen(src) + 32);
    sprintf(p, "%s/configs/default.yaml", src);
    return p;
}

/* ------------------------------------------------------------ run */

Test(cli, run_paris) {
    const char *model = eng_need_model();
    char *cfg = default_config();
    char set_model[1024];
    snprintf(set_model, sizeof set_model, "model.path=%s", model);
    /* default.yaml as documented, with a small KV pool and context, and
     * float32 weights: the expected text is the float model's (8-bit block
     * activations, the default, may pick another first token here) */
    const char *args[] = {"run", cfg, "--chat", "-p", "What is the capital of France?", "-n", "20", "--set",
                          set_model, "--set", "cache.memory_gib=0.25", "--set", "engine.max_model_len=1024",
                          "--set", "backend.weight_dtype=f32", NULL};
    cli_out r = cli(args);
    cr_assert_eq(r.code, 0, "exit %d, stderr: %s", r.code, r.err);
    cr_assert(strstr(r.out, "Paris"), "stdout lacks Paris: '%s'", r.out);
    cr_assert(strstr(r.err, "finish: end of generation"), "stderr: %s", r.err);
    cli_out_free(&r);
    /* --stream and -q print the same text. */
    const char *args2[] = {"run", cfg, "--chat", "-p", "What is the capital of France?", "-n", "20", "--stream", "-q",
                           "--set", set_model, "--set", "cache.memory_gib=0.25", "--set",
                           "engine.max_model_len=1024", "--set", "backend.weight_dtype=f32", NULL};
    cli_out s = cli(args2);
    cr_assert_eq(s.code, 0, "stderr: %s", s.err);
    cr_assert(strstr(s.out, "Paris"), "stdout: '%s'", s.out);
    cr_assert_eq(s.err[0], 0, "-q should leave stderr empty, got '%s'", s.err);
    cli_out_free(&s);
    free(cfg);
}

Test(cli, run_stop_and_samples) {
    const char *model = eng_need_model();
    char *cfg = default_config();
    char set_model[1024];
    snprintf(set_model, sizeof set_model, "model.path=%s", model);
    const char *args[] = {"run", cfg, "--chat", "-p", "What is the capital of France?", "-n", "20", "--stop", "Paris",
                          "--samples", "2", "--set", set_model, "--set", "cache.memory_gib=0.25", "--set",
                          "engine.max_model_len=1024", "--set", "backend.weight_dtype=f32", NULL};
    cli_out r = cli(args);
    cr_assert_eq(r.code, 0, "exit %d, stderr: %s", r.code, r.err);
    cr_assert(strstr(r.out, "--- sample 0 ---\nThe capital of France is \n--- sample 1 ---\nThe capital of France is \n"),
              "stdout: '%s'", r.out);
    cr_assert(strstr(r.err, "finish: stop string"), "stderr: %s", r.err);
    cli_out_free(&r);
    free(cfg);
}

Test(cli, run_errors) {
    const char *a1[] = {"run", "/nonexistent/pipeline.yaml", "-p", "hi", NULL};
    cli_out r = cli(a1);
    cr_assert_eq(r.code, 1, "nonexistent config: exit %d", r.code);
    cr_assert(strstr(r.err, "/nonexistent/pipeline.yaml"), "stderr does not name the file: '%s'", r.err);
    cli_out_free(&r);

    const char *a2[] = {"run", "--help", NULL};
    r = cli(a2);
    cr_assert_eq(r.code, 0);
    cr_assert(strstr(r.out, "Usage: loom run CONFIG"), "'%s'", r.out);
    cli_out_free(&r);

    const char *a3[] = {"run", NULL};
    r = cli(a3);
    cr_assert_eq(r.code, 2, "no config: exit %d", r.code);
    cr_assert(strstr(r.err, "no pipeline file"), "'%s'", r.err);
    cli_out_free(&r);

    char *tiny = eng_data("tiny.yaml");
    const char *a4[] = {"run", tiny, "-p", "hello", NULL};
    r = cli(a4);
    cr_assert_eq(r.code, 1, "text prompt on a dummy model: exit %d", r.code);
    cr_assert(strstr(r.err, "no tokenizer"), "'%s'", r.err);
    cli_out_free(&r);

    const char *a5[] = {"run", tiny, "-p", "hello", "--bogus", NULL};
    r = cli(a5);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "--bogus"), "'%s'", r.err);
    cli_out_free(&r);

    const char *a6[] = {"run", tiny, "-p", "hello", "-n", "0", NULL};
    r = cli(a6);
    cr_assert_eq(r.code, 1);
    cr_assert(strstr(r.err, "-n"), "'%s'", r.err);
    cli_out_free(&r);
    free(tiny);
}

/* ---------------------------------------------------------- bench */

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsNumber(v), "JSON has no number '%s'", key);
    return v->valuedouble;
}

static void check_bench_doc(const cJSON *j) {
    cr_assert_eq(num(j, "num_requests"), 8);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "a_results");
    cr_assert(cJSON_IsObject(a));
    cr_assert_gt(num(a, "throughput_req_s"), 0);
    cr_assert_gt(num(a, "output_tokens_s_tok_s"), 0);
    cr_assert_gt(num(a, "total_tokens_s_tok_s"), num(a, "output_tokens_s_tok_s"));
    cr_assert_eq(num(a, "output_tokens"), 64, "8 requests x 8 tokens");
    cr_assert_eq(num(a, "errors"), 0);
    cr_assert_eq(num(a, "prefill_tokens") + num(a, "cached_prompt_tokens"), 128);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(j, "b_results"));
}

/* --json FILE: the values. */
Test(cli, bench_json_file) {
    char *tiny = eng_data("tiny.yaml");
    char dir[] = "/tmp/loom-eng-json-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/r.json", dir);
    const char *args[] = {"bench", tiny, "--num-requests", "8", "--input-len", "16", "--output-len", "8",
                          "--json", path, "--no-progress", NULL};
    cli_out r = cli(args);
    cr_assert_eq(r.code, 0, "exit %d, stderr: %s", r.code, r.err);
    cr_assert(strstr(r.out, "throughput"), "no table on stdout: '%s'", r.out);
    char *text = test_slurp(path, NULL);
    cJSON *j = cJSON_Parse(text);
    cr_assert_not_null(j, "%s is not JSON: '%s'", path, text);
    check_bench_doc(j);
    cJSON_Delete(j);
    free(text);
    unlink(path);
    rmdir(dir);
    cli_out_free(&r);
    free(tiny);
}

/* `--json -` writes the document to stdout: stdout must then parse as JSON
 * on its own (scripts pipe it to jq), so the human-readable table has to
 * go elsewhere (stderr). */
Test(cli, bench_json_stdout) {
    char *tiny = eng_data("tiny.yaml");
    const char *args[] = {"bench", tiny, "--num-requests", "8", "--input-len", "16", "--output-len", "8",
                          "--json", "-", "--no-progress", NULL};
    cli_out r = cli(args);
    cr_assert_eq(r.code, 0, "exit %d, stderr: %s", r.code, r.err);
    cJSON *j = cJSON_Parse(r.out);
    cr_assert_not_null(j, "`loom bench --json -`: stdout is not valid JSON (the table precedes the document):\n%s",
                       r.out);
    check_bench_doc(j);
    cJSON_Delete(j);
    cli_out_free(&r);
    free(tiny);
}

/* --warmup: the untimed requests run first and none of their tokens or
 * prompt counts leak into the results. */
Test(cli, bench_warmup_not_counted) {
    char *tiny = eng_data("tiny.yaml");
    const char *args[] = {"bench", tiny, "--num-requests", "8", "--input-len", "16", "--output-len", "8",
                          "--warmup", "5", "--json", "-", "--no-progress", NULL};
    cli_out r = cli(args);
    cr_assert_eq(r.code, 0, "exit %d, stderr: %s", r.code, r.err);
    cJSON *j = cJSON_Parse(r.out);
    cr_assert_not_null(j, "stdout is not JSON:\n%s", r.out);
    check_bench_doc(j);
    cJSON_Delete(j);
    cli_out_free(&r);
    const char *bad[] = {"bench", tiny, "--warmup", "-1", NULL};
    r = cli(bad);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "--warmup expects"), "stderr: %s", r.err);
    cli_out_free(&r);
    free(tiny);
}

Test(cli, bench_compare) {
    char *a = eng_data("tiny.yaml"), *b = eng_data("tiny_contiguous.yaml");
    const char *args[] = {"bench", "--compare", a, b, "--num-requests", "6", "--input-len", "8:24",
                          "--output-len", "4:8", "--no-progress", NULL};
    cli_out r = cli(args);
    cr_assert_eq(r.code, 0, "exit %d, stderr: %s", r.code, r.err);
    cr_assert(strstr(r.out, "B/A"), "no B/A column: '%s'", r.out);
    const char *row = strstr(r.out, "\nthroughput ");
    cr_assert(row, "no throughput row: '%s'", r.out);
    double x, y, ratio;
    cr_assert_eq(sscanf(row, "\nthroughput %lf %lf %lfx", &x, &y, &ratio), 3, "row: %.80s", row + 1);
    cr_assert_gt(x, 0);
    cr_assert_gt(y, 0);
    cr_assert_float_eq(ratio, y / x, 0.01 + 0.01 * (y / x));
    cr_assert(strstr(r.out, "A counts:") && strstr(r.out, "B counts:"), "'%s'", r.out);
    cli_out_free(&r);

    const char *bad[] = {"bench", "--compare", a, NULL};
    r = cli(bad);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "--compare needs two pipeline files"), "'%s'", r.err);
    cli_out_free(&r);
    free(a);
    free(b);
}

/* `loom bench ARGS` (with --json -) that must exit 0 and print a "levels"
 * list of n entries: the document (cJSON_Delete it) and *levels in it; *r
 * for the caller to free. */
static cJSON *bench_levels(const char *const *args, int n, cli_out *r, const cJSON **levels) {
    *r = cli(args);
    cr_assert_eq(r->code, 0, "exit %d, stderr: %s", r->code, r->err);
    cJSON *j = cJSON_Parse(r->out);
    cr_assert_not_null(j, "stdout is not JSON:\n%s", r->out);
    *levels = cJSON_GetObjectItemCaseSensitive(j, "levels");
    cr_assert(cJSON_IsArray(*levels) && cJSON_GetArraySize(*levels) == n, "no %d levels: %s", n, r->out);
    return j;
}

/* --concurrency: a closed loop, once per level on one engine. At level 1
 * no step runs two sequences (the warm-up included: the peak is the
 * engine's since it opened), at level 3 at most three; each level runs its
 * own --num-requests count; levels must ascend, counts match levels. */
Test(cli, bench_concurrency_levels) {
    char *tiny = eng_data("tiny.yaml");
    const char *args[] = {"bench", tiny, "--num-requests", "2,7", "--input-len", "16", "--output-len", "5",
                          "--concurrency", "1,3", "--warmup", "2", "--json", "-", "--no-progress", NULL};
    cli_out r;
    const cJSON *levels;
    cJSON *j = bench_levels(args, 2, &r, &levels);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(j, "a_results"), "results belong to the levels");
    const int want[2] = {1, 3}, nreq[2] = {2, 7};
    for (int k = 0; k < 2; k++) {
        const cJSON *l = cJSON_GetArrayItem(levels, k), *a = cJSON_GetObjectItemCaseSensitive(l, "a_results");
        cr_assert_eq(num(l, "concurrency"), want[k]);
        cr_assert_eq(num(l, "num_requests"), nreq[k]);
        cr_assert(cJSON_IsObject(a));
        cr_assert_eq(num(a, "output_tokens"), 5 * nreq[k], "level %d: %d requests x 5 tokens", want[k], nreq[k]);
        cr_assert_eq(num(a, "prefill_tokens") + num(a, "cached_prompt_tokens"), 16 * nreq[k], "level %d", want[k]);
        cr_assert_leq(num(a, "max_running"), want[k], "level %d ran more sequences in a step", want[k]);
        cr_assert_eq(num(a, "errors"), 0);
    }
    cr_assert(strstr(r.err, "at most 3 in flight"), "no level header: %s", r.err);
    cJSON_Delete(j);
    cli_out_free(&r);
    const char *bad[] = {"bench", tiny, "--concurrency", "4,2", NULL};
    r = cli(bad);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "--concurrency expects") && strstr(r.err, "'4,2'"), "stderr: %s", r.err);
    cli_out_free(&r);
    const char *mismatch[] = {"bench", tiny, "--num-requests", "2,7", "--concurrency", "4", NULL};
    r = cli(mismatch);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "--num-requests gives 2 counts"), "stderr: %s", r.err);
    cli_out_free(&r);
    free(tiny);
}

/* Each level runs its own requests: a workload file of prompts of 5, 7 and
 * 9 tokens with counts 1,2 gives level 1 the first (5 prompt tokens) and
 * level 2 the other two (16); counts beyond the file are refused. */
Test(cli, bench_concurrency_slices) {
    char *tiny = eng_data("tiny.yaml");
    char dir[] = "/tmp/loom-eng-lv-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/w.jsonl", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"prompt_tokens\": [5, 6, 7, 8, 9], \"output_len\": 3}\n"
          "{\"prompt_tokens\": [15, 16, 17, 18, 19, 20, 21], \"output_len\": 3}\n"
          "{\"prompt_tokens\": [25, 26, 27, 28, 29, 30, 31, 32, 33], \"output_len\": 3}\n",
          f);
    fclose(f);
    const char *args[] = {"bench", tiny, "--workload", path, "--concurrency", "1,2", "--num-requests", "1,2",
                          "--json", "-", "--no-progress", NULL};
    cli_out r;
    const cJSON *levels;
    cJSON *j = bench_levels(args, 2, &r, &levels);
    const int prompt[2] = {5, 16}, out[2] = {3, 6};
    for (int k = 0; k < 2; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(levels, k), "a_results");
        cr_assert_eq(num(a, "prefill_tokens") + num(a, "cached_prompt_tokens"), prompt[k], "level %d", k);
        cr_assert_eq(num(a, "output_tokens"), out[k], "level %d", k);
    }
    cJSON_Delete(j);
    cli_out_free(&r);
    const char *over[] = {"bench", tiny, "--workload", path, "--concurrency", "1,2", "--num-requests", "2,2", NULL};
    r = cli(over);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "asks for 4 requests over its levels") && strstr(r.err, "holds 3"), "stderr: %s", r.err);
    cli_out_free(&r);
    const char *uncounted[] = {"bench", tiny, "--workload", path, "--concurrency", "1,2", NULL};
    r = cli(uncounted);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "needs --num-requests N,N"), "stderr: %s", r.err);
    cli_out_free(&r);
    unlink(path);
    rmdir(dir);
    free(tiny);
}

/* A generated workload at several levels with one --num-requests: each
 * level its own slice of fresh prompts (three 16-token blocks each, so a
 * prompt seen at an earlier level would come from the prefix cache), after
 * warm-ups of their own. */
Test(cli, bench_concurrency_generated_slices) {
    char *tiny = eng_data("tiny.yaml");
    const char *args[] = {"bench", tiny, "--num-requests", "2", "--input-len", "48", "--output-len", "4",
                          "--concurrency", "1,3", "--warmup", "3", "--json", "-", "--no-progress", NULL};
    cli_out r;
    const cJSON *levels;
    cJSON *j = bench_levels(args, 2, &r, &levels);
    for (int k = 0; k < 2; k++) {
        const cJSON *l = cJSON_GetArrayItem(levels, k), *a = cJSON_GetObjectItemCaseSensitive(l, "a_results");
        cr_assert_eq(num(l, "num_requests"), 2);
        cr_assert_eq(num(a, "output_tokens"), 8, "level %d", k);
        cr_assert_eq(num(a, "cached_prompt_tokens"), 0, "level %d ran prompts of an earlier level", k);
        cr_assert_eq(num(a, "prefill_tokens"), 96, "level %d", k);
    }
    cJSON_Delete(j);
    cli_out_free(&r);
    free(tiny);
}

/* A closed loop counts TTFT from when a request entered, not from the
 * workload's start: at one in flight, six requests in a row each wait for
 * the one before, and counted from the start their median TTFT would be
 * about 5/12 of the wall time; from entry it is one prefill, a small share.
 * The median, not p99: on a loaded machine one slow first request can be
 * half of a run this short. */
Test(cli, bench_concurrency_ttft_from_entry) {
    char *tiny = eng_data("tiny.yaml");
    const char *args[] = {"bench", tiny, "--num-requests", "6", "--input-len", "16", "--output-len", "8",
                          "--concurrency", "1", "--json", "-", "--no-progress", NULL};
    cli_out r;
    const cJSON *levels;
    cJSON *j = bench_levels(args, 1, &r, &levels);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(levels, 0), "a_results");
    cr_assert(cJSON_IsObject(a));
    cr_assert_lt(num(a, "TTFT_p50_ms"), 0.25 * 1e3 * num(a, "wall_time_s"), "TTFT p50 %.3f ms of a %.3f ms run",
                 num(a, "TTFT_p50_ms"), 1e3 * num(a, "wall_time_s"));
    cJSON_Delete(j);
    cli_out_free(&r);
    free(tiny);
}

/* Issue 29 (13): generated text may hold NUL (byte 0 is a token of
 * SmolLM2's byte-level vocabulary, "Ā"); `loom run` printed it with
 * C-string calls and cut it. The test sampler "lazy" with force=ID makes
 * the model generate exactly that token, three times. */
Test(cli, run_prints_nul_bytes) {
    const char *model = eng_need_model();
    loom_gguf *g = NULL;
    loom_tokenizer *t = NULL;
    cr_assert_eq(loom_gguf_open(model, &g, NULL), LOOM_OK);
    cr_assert_eq(loom_tokenizer_from_gguf(g, &t, NULL), LOOM_OK);
    int32_t nul = loom_tokenizer_find(t, "\xC4\x80"); /* byte 0 */
    loom_tokenizer_free(t);
    loom_gguf_close(g);
    cr_assert_geq(nul, 0);
    char *cfg = default_config(), set_model[1024], force[64];
    snprintf(set_model, sizeof set_model, "model.path=%s", model);
    snprintf(force, sizeof force, "sampler.force=%d", (int)nul);
    for (int stream = 0; stream < 2; stream++) {
        const char *args[] = {"run", cfg, "-p", "Hi", "-n", "3", "-q", "--set", set_model, "--set",
                              "cache.memory_gib=0.25", "--set", "engine.max_model_len=256", "--set",
                              "sampler.plugin=lazy", "--set", force, stream ? "--stream" : NULL, NULL};
        cli_out r = cli(args);
        cr_assert_eq(r.code, 0, "exit %d, stderr: %s", r.code, r.err);
        cr_assert_eq(r.out_len, 4, "%s: stdout has %zu bytes, expected 3 NULs and a newline", stream ? "--stream" : "run",
                     r.out_len);
        cr_assert(memcmp(r.out, "\0\0\0\n", 4) == 0, "stdout is not 3 NULs and a newline");
        cli_out_free(&r);
    }
    free(cfg);
}
